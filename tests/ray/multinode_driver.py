"""The driver of a multi-node run, as its own process: ``python -m tests.ray.multinode_driver CONFIG.json``.

The test process may already be joined to the session's one-node cluster, and a process joins one cluster
only, so the run against the multi-node cluster happens here. It joins through ``address=``, runs the
requests, kills the node named ``kill`` (by its process group, given by the test that started it) once that
node's replica holds requests in flight, and writes what it saw to ``CONFIG.out.json``: the results, the
replicas' nodes before and after, ``replica_stats()`` and ``replica_events``.

With ``grow`` in the config, the run is held by the replicas' gate file once ``after`` requests are answered;
the driver writes ``ready_file``, waits for the test to write ``added_file`` (it starts a node meanwhile),
resizes the backend to ``to`` replicas (``grown``: the replicas' nodes then) and lets the run go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ray

import asyncbackends as ab
from asyncbackends.adapters.ray import RayBackend

from .recording import read_events


def node_names() -> dict[str, str]:
    """Ray node id -> the node's custom name (``node_a``, ...)."""
    return {
        n["NodeID"]: next((k for k in n["Resources"] if k.startswith("node_")), "?")
        for n in ray.nodes()
        if n["Alive"]
    }


def where(backend: RayBackend) -> list[str | None]:
    names = node_names()
    return [names.get(s.node or "", s.node) for s in backend.replica_stats()]


async def wait_until(condition: Any, what: str, timeout: float = 120.0) -> None:
    """Poll another process's state (the actors' logs, the router's figures) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def run(config: dict[str, Any]) -> dict[str, Any]:
    backend = await ab.acreate_backend("ray", **config["backend"])
    assert isinstance(backend, RayBackend)
    out: dict[str, Any] = {"before": where(backend)}
    requests = [
        ab.GenerationRequest(text, config["params"], request_id=f"r{i}")
        for i, text in enumerate(config["prompts"])
    ]
    results: list[Any] = [None] * len(requests)
    kill = config.get("kill")
    killed = False
    grow = config.get("grow")
    growing = asyncio.ensure_future(grow_mid_run(backend, config, out)) if grow else None
    try:
        async for index, result in ab.as_completed(backend, requests, concurrency=config["concurrency"]):
            results[index] = result
            answered = sum(r is not None for r in results)
            if kill and not killed and answered >= config["kill_after"]:
                killed = True
                await lose_node(backend, config, kill)
        if growing is not None:
            await growing
        out["after"] = where(backend)
        if kill:
            await notice_loss(backend, config["params"])
            # The lost replica restarted (or dropped): wait for the state the docs promise.
            await wait_until(
                lambda: backend.replica_events["restarted"] + backend.replica_events["dropped"] >= 1,
                "restart",
            )
            await wait_until(lambda: all(s.state != "cooling" for s in backend.replica_stats()), "probe")
            out["after"] = where(backend)
        # One more request per replica after the loss: the run goes on without restarting.
        extra = [ab.GenerationRequest(f"after {i}", config["params"], request_id=f"x{i}") for i in range(4)]
        out["extra"] = [r.text for r in await ab.gather(backend, extra)]
        out["stats"] = [dataclass_dict(s) for s in backend.replica_stats()]
        out["events"] = dict(backend.replica_events)
    finally:
        await backend.aclose()
    out["results"] = [[r.request_id, r.text, list(r.completions[0].token_ids)] for r in results]
    return out


async def grow_mid_run(backend: RayBackend, config: dict[str, Any], out: dict[str, Any]) -> None:
    """Hold the run, have the test start a node, resize onto it, let the run go on (see the docstring)."""
    grow, options = config["grow"], config["backend"]["options"]
    log_dir, gate = Path(options["log_dir"]), Path(options["gate_file"])

    def answered() -> int:
        return sum(e == "done" for per_actor in read_events(log_dir).values() for e, _ in per_actor)

    try:
        await wait_until(lambda: answered() >= grow["after"], "the run held at its gate")
        Path(grow["ready_file"]).write_text("ready")  # noqa: ASYNC240
        await wait_until(lambda: Path(grow["added_file"]).exists(), "the test to add a node", timeout=300)
        await backend.aresize(grow["to"])
        out["grown"] = where(backend)
    finally:
        gate.unlink(missing_ok=True)  # noqa: ASYNC240 - the run goes on over the grown backend (or ends)


async def lose_node(backend: RayBackend, config: dict[str, Any], node: str) -> None:
    """Kill ``node`` while its replica certainly holds requests it has not answered."""
    names = node_names()
    (index,) = [i for i, s in enumerate(backend.replica_stats()) if names.get(s.node or "") == node]
    slot = backend.replicas[index]
    replica = backend.router.replicas[index]
    log_dir = config["backend"]["options"].get("log_dir")
    if log_dir:
        Path(config["backend"]["options"]["hold_file"]).write_text(str(slot.pid))  # noqa: ASYNC240
        log_file = Path(log_dir) / f"{slot.pid}.log"

        def held() -> int:
            return sum(e == "held" for e, _ in read_events(Path(log_dir)).get(slot.pid, []))

        # Every request it answered came back (what is in flight on it is exactly what it holds).
        await wait_until(lambda: log_file.exists() and held() >= 2 and replica.in_flight == held(), "held")
    else:
        await wait_until(lambda: replica.in_flight >= 2, "in flight")
    os.killpg(config["kill_pgid"], signal.SIGKILL)


def lost(backend: RayBackend) -> bool:
    return backend.replica_events["lost"] >= 1


async def notice_loss(backend: RayBackend, params: ab.SamplingParams) -> None:
    """Send requests until the router has met the lost replica, if the run itself never did.

    A replica that does not hold its requests (vLLM answers 8 tokens in milliseconds) may have answered
    everything it had before its node went, and the router sends nothing more to it while the other replica
    takes the rest of the run: then no request has failed on it yet. Requests in pairs reach both replicas
    (least loaded), so the next pair meets the dead one; each is resent to the survivor in its attempt.
    """
    for i in range(50):
        if lost(backend):
            return
        pair = [ab.GenerationRequest(f"probe {i} {j}", params, request_id=f"p{i}.{j}") for j in range(2)]
        await ab.gather(backend, pair)
    raise TimeoutError("no request met the lost replica")


def dataclass_dict(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    path = Path(sys.argv[1])
    config = json.loads(path.read_text())
    config["params"] = ab.SamplingParams(**config.get("params", {}))
    out = ab.get_loop_manager().run(run(config))
    path.with_suffix(".out.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
