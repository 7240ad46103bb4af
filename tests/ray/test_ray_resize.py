"""The ``ray`` backend resized while a run goes, on the session's local cluster: 1 -> 3 -> 1 replicas.

The replicas host `RecordingBackend` (tests/ray/recording.py), whose gate file holds the run's requests on
whichever replica has them and lets a given number go: the test grows and shrinks the backend at states it
chose (requests held on the replicas being drained), never at a moment guessed by the clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.ray import RayBackend

from .conftest import make_ray_backend, run
from .recording import read_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]

RECORDING = "tests.ray.recording:RecordingBackend"


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Poll a state (the router's figures, the actors' logs) until it holds; the timeout is a safety net."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waiting for {what}"
        time.sleep(0.02)


def test_grown_and_shrunk_while_a_run_goes_answers_every_input_once(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    logs, hold, gate = tmp_path / "logs", tmp_path / "hold", tmp_path / "gate"
    logs.mkdir()
    gate.write_text("0")  # nothing goes on until the test says so
    backend = make_ray_backend(
        RECORDING, replicas=1, options={"log_dir": str(logs), "hold_file": str(hold), "gate_file": str(gate)}
    )
    assert isinstance(backend, RayBackend)
    router = backend.router
    requests = [ab.GenerationRequest(f"p{i}", request_id=f"k{i}") for i in range(300)]
    try:
        # One attempt each: a request lost by the resize would surface as an error, not be retried away.
        running = ab.get_loop_manager().submit(
            ab.gather(backend, requests, concurrency=9, retry=ab.RetryPolicy(max_attempts=1))
        )
        first = router.replicas[0]
        wait_for(lambda: first.in_flight == 9, "nine requests held on the only replica")

        backend.resize(3)  # returns once both new replicas are routed to
        assert [(s.label, s.state) for s in backend.replica_stats()] == [
            ("ray-0", "healthy"),
            ("ray-1", "healthy"),
            ("ray-2", "healthy"),
        ]
        added = router.replicas[1:]
        grown = [slot.group for slot in backend.replicas[1:]]
        assert all(group is not backend.replicas[0].group for group in grown)  # a group of its own each
        assert all(s.node for s in backend.replica_stats())
        capacity = first.capacity
        assert backend.capabilities.max_concurrency == (None if capacity is None else 3 * capacity)

        gate.write_text("60")  # sixty go on, then the run is held again, spread over the three

        def held_again() -> bool:
            answered = sum(e == "done" for per_actor in read_events(logs).values() for e, _ in per_actor)
            return answered >= 60 and sum(r.in_flight for r in router.replicas) == 9

        wait_for(held_again, "sixty answered and the run held again")
        assert all(r.successes > 0 for r in added)  # the new replicas took requests once ready

        shrinking = ab.get_loop_manager().submit(backend.aresize(1))
        wait_for(
            lambda: [s.state for s in backend.replica_stats()] == ["healthy", "draining", "draining"], "drain"
        )
        at_drain = [(r.requests, r.in_flight) for r in added]
        assert sum(in_flight for _, in_flight in at_drain) >= 1  # they hold requests: the drain waits
        assert not shrinking.done()
        gate.unlink()  # everything goes: the drained replicas answer what they hold, the rest goes to ray-0
        shrinking.result(timeout=120)
        results = running.result(timeout=120)
    finally:
        backend.close()

    assert [s.label for s in backend.replica_stats()] == ["ray-0"]
    assert [(r.requests, r.successes, r.failures) for r in added] == [(n, n, 0) for n, _ in at_drain]
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert [r.text for r in results] == [f"p{i}" for i in range(300)]
    # Counted on the replicas' side: each input answered exactly once, by three actors in all; each drained
    # replica answered every request it started (none cut), and nothing after its drain began.
    events = read_events(logs)
    done = Counter(rid for per_actor in events.values() for event, rid in per_actor if event == "done")
    assert done == Counter({r.request_id: 1 for r in requests})
    assert len(events) == 3
    drained = set(events) - {_pid_of(first)}
    for pid in drained:
        started = sorted(rid for event, rid in events[pid] if event == "start")
        assert started == sorted(rid for event, rid in events[pid] if event == "done")  # none cut
    answered = sorted(sum(event == "done" for event, _ in events[pid]) for pid in drained)
    assert answered == sorted(n for n, _ in at_drain)  # nothing sent to them once their drain began
    # The grown replicas' own placement groups were removed: their resources are the cluster's again.
    assert [ray.util.placement_group_table(group)["state"] for group in grown] == ["REMOVED", "REMOVED"]


def _pid_of(replica: Any) -> int:
    return int(replica.backend.info["pid"])


def test_resize_refuses_bad_sizes_and_runs_concurrent_calls_in_order(ray_cluster: Any) -> None:
    backend = make_ray_backend(replicas=1)
    assert isinstance(backend, RayBackend)
    try:
        for bad in (0, -1, 1.5, "2", True, None):
            with pytest.raises(ab.InvalidRequestError, match="replicas must be an int >= 1"):
                backend.resize(bad)  # type: ignore[arg-type]

        async def both() -> None:
            await asyncio.gather(backend.aresize(2), backend.aresize(1))

        run(both())
        # In call order: grown to two, then back to one. Run together, the second would have seen one
        # replica (nothing to do) and the first added one after it.
        assert [s.label for s in backend.replica_stats()] == ["ray-0"]
        backend.resize(2)
        assert [s.label for s in backend.replica_stats()] == ["ray-0", "ray-2"]  # names are never reused
        results = ab.run_batch(backend, [ab.GenerationRequest(f"q{i}") for i in range(20)], concurrency=4)
        assert [r.text for r in results] == [f"q{i}" for i in range(20)]
        assert all(s.successes > 0 for s in backend.replica_stats())
    finally:
        backend.close()
    with pytest.raises(ab.BackendClosedError):
        backend.resize(2)


def test_a_grown_replica_never_ready_fails_the_resize_and_nothing_is_added(
    ray_cluster: Any, tmp_path: Path
) -> None:
    import ray

    logs, not_ready = tmp_path / "logs", tmp_path / "not-ready"
    logs.mkdir()
    options = {"log_dir": str(logs), "hold_file": str(tmp_path / "hold"), "not_ready_file": str(not_ready)}
    # The window (and each probe's bound) is generous for a loaded machine; each failed probe is followed by
    # another after a 0.05 s cool-down until it closes.
    router_options = {"probe_timeout": 10.0, "cooldown": 0.05, "max_cooldown": 0.05}
    backend = make_ray_backend(RECORDING, replicas=1, options=options, router_options=router_options)
    assert isinstance(backend, RayBackend)
    try:
        first_pid = _pid_of(backend.router.replicas[0])
        capabilities = backend.capabilities
        groups_before = set(ray.util.placement_group_table())
        not_ready.touch()  # from now on every readiness check fails: the new replica's probes never pass
        with pytest.raises(ab.BackendUnavailableError, match=r"ray-1 was not taken in within 10 s"):
            backend.resize(2)

        def probed() -> dict[int, int]:
            return {
                pid: sum(e == "probe" for e, _ in ev)
                for pid, ev in read_events(logs).items()
                if pid != first_pid
            }

        wait_for(lambda: any(probed().values()), "the new replica's probe in its log")
        (new_pid,) = probed()  # only the new replica was probed, and it was refused each time
        # Nothing added: the new replica left the router, its actor was stopped, its group removed.
        assert [s.label for s in backend.replica_stats()] == ["ray-0"]
        assert len(backend.replicas) == 1 and backend.capabilities == capabilities
        wait_for(lambda: not _running(new_pid), "the new replica's actor process to end")
        grown = {k: g["state"] for k, g in ray.util.placement_group_table().items() if k not in groups_before}
        assert list(grown.values()) == ["REMOVED"]
        not_ready.unlink()
        backend.resize(2)  # the same call, now that new replicas pass, works; names are never reused
        assert [(s.label, s.state) for s in backend.replica_stats()] == [
            ("ray-0", "healthy"),
            ("ray-2", "healthy"),
        ]
        results = ab.run_batch(backend, [ab.GenerationRequest(f"q{i}") for i in range(8)], concurrency=4)
        assert [r.text for r in results] == [f"q{i}" for i in range(8)]
    finally:
        backend.close()


def test_a_backend_closed_while_a_grow_waits_for_its_new_replica_ends_the_grow(
    ray_cluster: Any, tmp_path: Path
) -> None:
    logs, not_ready = tmp_path / "logs", tmp_path / "not-ready"
    logs.mkdir()
    not_ready.touch()  # the new replica's probes never pass: only the close ends the grow's wait
    options = {"log_dir": str(logs), "hold_file": str(tmp_path / "hold"), "not_ready_file": str(not_ready)}
    backend = make_ray_backend(RECORDING, replicas=1, options=options)
    assert isinstance(backend, RayBackend)
    first_pid = _pid_of(backend.router.replicas[0])
    growing = ab.get_loop_manager().submit(backend.aresize(2))
    try:
        wait_for(lambda: set(read_events(logs)) - {first_pid}, "the new replica probed")
        (new_pid,) = set(read_events(logs)) - {first_pid}
        assert not growing.done()  # waiting for a replica that is never ready (600 s window)
    finally:
        backend.close()
    with pytest.raises(ab.BackendClosedError):
        growing.result(timeout=120)
    wait_for(lambda: not _running(new_pid), "the new replica's actor process to end")


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (the local cluster's actors are this machine's processes)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
