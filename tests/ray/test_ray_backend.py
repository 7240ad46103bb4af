"""The ``ray`` backend on a local Ray cluster, hosting the mock: order, spread, losses, errors, start-up."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.ray import RayBackend

from .conftest import ROOT, make_ray_backend, run
from .recording import read_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]

RECORDING = "tests.ray.recording:RecordingBackend"


@pytest.fixture(scope="module")
def three(ray_cluster: Any) -> Iterator[RayBackend]:
    backend = make_ray_backend(replicas=3, options={"latency": 0.05})
    assert isinstance(backend, RayBackend)
    yield backend
    backend.close()


def test_replicas_share_a_batch_in_order(three: RayBackend) -> None:
    requests = [ab.GenerationRequest(f"prompt {i}", request_id=f"r{i}") for i in range(60)]
    results = ab.run_batch(three, requests, concurrency=12)
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert [r.text for r in results] == [f"prompt {i}" for i in range(60)]  # the mock echoes greedily
    answered: Counter[str] = Counter()
    per_actor = []
    for replica in three.replicas:
        stats = run(replica.stats())
        per_actor.append(sum(stats["answered"].values()))
        answered.update({k: v for k, v in stats["answered"].items() if k.startswith("r")})
    assert answered == Counter({r.request_id: 1 for r in requests})  # each answered once, by one actor
    assert all(n > 0 for n in per_actor), per_actor  # every actor took a share
    routed = [s.successes for s in three.replica_stats()]  # the router's own figures agree
    assert sorted(routed) == sorted(per_actor)
    assert len({r.pid for r in three.replicas}) == 3  # three processes


def test_scoring_and_capabilities_come_from_the_hosted_backend(three: RayBackend) -> None:
    ll = ab.run_batch(three, [ab.LoglikelihoodRequest("ab", "cd", request_id="s")])[0]
    local = ab.run_batch(ab.create_backend("mock"), [ab.LoglikelihoodRequest("ab", "cd", request_id="s")])[0]
    assert ll == local
    assert three.capabilities.loglikelihood and three.capabilities.rolling_loglikelihood
    assert three.fingerprint == {"name": "mock", "model": "mock-echo"}
    assert three.name == "ray"


def test_errors_come_back_as_the_library_types(ray_cluster: Any) -> None:
    backend = make_ray_backend(
        replicas=1, options={"failure_rate": 1.0, "failure": "rate_limited", "retry_after": 2.5}
    )
    try:
        with pytest.raises(ab.RateLimitedError) as caught:
            run(backend.generate(ab.GenerationRequest("x", request_id="e1")))
        assert caught.value.retry_after == 2.5
        assert caught.value.request_id == "e1"
        assert caught.value.retryable
    finally:
        backend.close()


def test_cancellation_reaches_the_actor(ray_cluster: Any) -> None:
    slow = make_ray_backend(replicas=1, options={"latency": 60.0})  # still running when cancelled
    replica = slow.replicas[0]

    async def cancel_one() -> None:
        task = asyncio.ensure_future(slow.generate(ab.GenerationRequest("slow", request_id="cancel-me")))
        # Cancel once the actor has it in flight (its state, not a guess).
        while not (await replica.stats())["in_flight"]:  # noqa: ASYNC110 - polling another process
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        run(asyncio.wait_for(cancel_one(), 60))
        # The actor's own call ended (cancelled in the actor), long before the mock's 60 s.
        deadline = time.monotonic() + 30
        while run(replica.stats())["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = run(replica.stats())
        assert stats["in_flight"] == 0
        assert "cancel-me" not in stats["answered"]
    finally:
        slow.close()


@pytest.mark.parametrize("on_loss", ["restart", "drop"])
def test_actor_killed_mid_run_loses_nothing(ray_cluster: Any, tmp_path: Path, on_loss: str) -> None:
    logs, hold = tmp_path / "logs", tmp_path / "hold"
    logs.mkdir()
    backend = make_ray_backend(
        RECORDING,
        replicas=3,
        options={"log_dir": str(logs), "hold_file": str(hold), "latency": 0.05},
        on_replica_loss=on_loss,
    )
    assert isinstance(backend, RayBackend)
    victim_pid = backend.replicas[1].pid  # the slot gets a new pid when restarted: keep this one
    requests = [ab.GenerationRequest(f"p{i}", request_id=f"k{i}") for i in range(40)]
    # The victim holds whatever it starts: written before the run, so that no loaded machine's scheduling
    # lets the run finish before the victim reads it.
    hold.write_text(str(victim_pid))
    try:
        # Each attempt counts: without the failover, the kill would surface as an error (no retries here).
        future = ab.get_loop_manager().submit(
            ab.gather(backend, requests, concurrency=9, retry=ab.RetryPolicy(max_attempts=1))
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held = [rid for e, rid in read_events(logs).get(victim_pid, []) if e == "held"]
            if len(held) >= 2:
                break
            time.sleep(0.05)
        assert len(held) >= 2, "the victim never held requests"
        os.kill(victim_pid, signal.SIGKILL)
        results = future.result(timeout=120)
    finally:
        backend.close()
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert [r.text for r in results] == [f"p{i}" for i in range(40)]
    events = read_events(logs)
    done = Counter(rid for pid_events in events.values() for e, rid in pid_events if e == "done")
    assert done == Counter({r.request_id: 1 for r in requests})  # each request answered exactly once
    assert not any(rid in done and e == "done" for e, rid in events[victim_pid] if rid in held)
    assert backend.replica_events["lost"] == 1
    assert backend.replica_events["resent"] >= len(held)
    if on_loss == "drop":
        assert backend.replica_events["dropped"] == 1
        assert backend.replica_events["restarted"] == 0
    else:
        # The restart may still be under way when the batch ends; it is reported when it lands.
        assert backend.replica_events["dropped"] == 0


def test_restarted_replica_takes_requests_again(ray_cluster: Any) -> None:
    backend = make_ray_backend(replicas=2, options={"latency": 0.01})
    assert isinstance(backend, RayBackend)
    try:
        victim_pid = backend.replicas[0].pid
        os.kill(victim_pid, signal.SIGKILL)
        ab.run_batch(backend, [ab.GenerationRequest(f"a{i}") for i in range(8)], concurrency=4)
        deadline = time.monotonic() + 120
        # Restarted, then taken back by the router's probe (the actor's liveness and the mock's check).
        while backend.replica_stats()[0].state != "healthy" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert backend.replica_stats()[0].state == "healthy"
        assert backend.replica_events["restarted"] == 1
        assert backend.replica_stats()[0].cooldowns == 1
        assert sorted(r.index for r in backend.replicas) == [0, 1]
        assert victim_pid not in {r.pid for r in backend.replicas}  # a new actor serves slot 0
        ab.run_batch(backend, [ab.GenerationRequest(f"b{i}", request_id=f"b{i}") for i in range(20)])
        restarted = next(r for r in backend.replicas if r.index == 0)
        assert sum(run(restarted.stats())["answered"].values()) > 0
    finally:
        backend.close()


def test_too_few_resources_fails_clearly_and_frees_them(ray_cluster: Any) -> None:
    import ray

    before = set(ray.util.placement_group_table())
    started = time.monotonic()
    with pytest.raises(ab.BackendUnavailableError, match=r"GPU: needs 2, has 0") as caught:
        make_ray_backend(replicas=2, actor_options={"num_gpus": 1}, placement_timeout=2)
    assert time.monotonic() - started < 60
    assert "placement_timeout" in str(caught.value)
    table = ray.util.placement_group_table()
    ours = [table[g]["state"] for g in set(table) - before]  # other tests' backends may hold theirs
    assert ours == ["REMOVED"]


def test_unknown_hosted_backend_is_refused_with_the_registry_error(ray_cluster: Any) -> None:
    with pytest.raises(ab.BackendNotFoundError, match="no-such-backend"):
        make_ray_backend("no-such-backend", replicas=1)


def test_bad_options_are_refused_before_anything_starts() -> None:
    with pytest.raises(ab.InvalidRequestError, match="replicas"):
        ab.create_backend("ray", backend="mock", replicas=0)
    with pytest.raises(ab.InvalidRequestError, match="on_replica_loss"):
        ab.create_backend("ray", backend="mock", on_replica_loss="ignore")
    with pytest.raises(ab.InvalidRequestError, match="unknown option"):
        ab.create_backend("ray", backend="mock", replica=2)
    with pytest.raises(ab.InvalidRequestError, match="router_options"):
        ab.create_backend("ray", backend="mock", router_options={"cooldwn": 1})
    with pytest.raises(ab.InvalidRequestError, match="routing"):
        ab.create_backend("ray", backend="mock", routing="round_robin")
    for bad in (0, -1.0, "5", True):
        with pytest.raises(ab.InvalidRequestError, match="connect_timeout"):
            ab.create_backend("ray", backend="mock", connect_timeout=bad)


def test_a_second_driver_joins_through_ray_address_and_leaves_the_cluster_running(ray_cluster: Any) -> None:
    import ray

    script = (
        "import asyncbackends as ab\n"
        "b = ab.create_backend('ray', backend='mock', replicas=1, actor_options={'num_cpus': 0.1})\n"
        "print(ab.run_batch(b, [ab.GenerationRequest('joined')])[0].text)\n"
        "b.close()\n"
    )
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("joined")
    assert ray.cluster_resources()["CPU"] == 2  # still ours, still up


NOISE = "INFO a child process inherits stdout"  # the last line NoisyBackend writes, from a child process

SCRIPT_WITH_NOISY_ACTORS = f"""
import io, sys, time
import asyncbackends as ab


class Seen(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.text = stream, ""

    def write(self, text):
        self.text += text
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


sys.stdout, sys.stderr = Seen(sys.stdout), Seen(sys.stderr)
runtime_env = {{"env_vars": {{"PYTHONPATH": {str(ROOT)!r}}}}}
b = ab.create_backend(
    "ray", backend="tests.core.cli_noisy_backend:NoisyBackend", replicas=1,
    actor_options={{"num_cpus": 0.1, "runtime_env": runtime_env}},
)
answer = ab.run_batch(b, [ab.GenerationRequest("the answer")])[0].text
deadline = time.monotonic() + 120
while {NOISE!r} not in sys.stdout.text + sys.stderr.text and time.monotonic() < deadline:
    time.sleep(0.1)  # wait until Ray has forwarded the actor's output
b.close()
print(answer)
"""


def test_a_script_s_stdout_holds_only_its_own_output(ray_cluster: Any) -> None:
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT_WITH_NOISY_ACTORS],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["the answer"], out.stdout[-3000:]
    # The actor's output reached the driver, on stderr (print, file descriptor 1 and a child process).
    assert NOISE in out.stderr and "INFO a log line written to file descriptor 1" in out.stderr


def test_importing_asyncbackends_imports_no_ray() -> None:
    code = "import sys, asyncbackends; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_hung_replica_is_cooled_down_and_retries_go_elsewhere(ray_cluster: Any, tmp_path: Path) -> None:
    logs, hold = tmp_path / "logs", tmp_path / "hold"
    logs.mkdir()
    backend = make_ray_backend(
        RECORDING,
        replicas=2,
        options={"log_dir": str(logs), "hold_file": str(hold)},
        router_options={"cooldown": 600, "max_cooldown": 600},  # no probe takes it back during the run
    )
    try:
        hung = backend.replicas[0]
        hold.write_text(str(hung.pid))  # it accepts every request and answers none; its health check passes
        requests = [ab.GenerationRequest(f"p{i}", request_id=f"h{i}") for i in range(8)]
        retry = ab.RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=False)
        results = ab.run_batch(
            backend, requests, timeout=10, retry=retry, concurrency=4, return_exceptions=True
        )
        assert [getattr(r, "text", r) for r in results] == [f"p{i}" for i in range(8)]
        held = [rid for e, rid in read_events(logs).get(hung.pid, []) if e == "held"]
        stats = backend.replica_stats()[0]
        assert held and stats.requests == len(held)  # tried, timed out, and never tried again
        assert stats.state == "cooling" and stats.cooldowns == 1
        assert "BackendTimeoutError" in (stats.last_error or "")
    finally:
        backend.close()
