"""Starting the ``ray`` backend's replica actors: one in a given placement-group bundle, or many at once.

`RayBackend` (`asyncbackends.adapters.ray`) starts its replicas with these at start-up, for a restart after
a loss (`ActorSlot.restart`) and when it grows (`RayBackend.aresize`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ...errors import BackendBrokenError, BackendUnavailableError
from ._actor import ReplicaActor
from ._slot import Started

__all__ = ["Spawn", "spawner", "start_all"]

log = logging.getLogger("asyncbackends.adapters.ray")

Spawn = Callable[[int, PlacementGroup, int], Awaitable[Started]]
"""Starts the actor of replica ``index`` in bundle ``bundle`` of ``group``, and waits until it is ready."""


def spawner(
    ray_options: Mapping[str, Any],
    backend: str,
    hosted_options: Mapping[str, Any],
    start_timeout: float | None,
) -> Spawn:
    """A function starting the actor of a replica in a bundle, reporting progress in the log."""
    actor_class: Any = ray.remote(ReplicaActor)  # Ray's generic handle types do not model .options()

    async def spawn(index: int, group: PlacementGroup, bundle: int) -> Started:
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=bundle, placement_group_capture_child_tasks=True
        )
        actor = actor_class.options(
            scheduling_strategy=strategy, max_restarts=0, max_task_retries=0, **ray_options
        ).remote(index)
        try:
            where = await actor.where.remote()
            log.info("ray: replica %d placed on %s (pid %s)", index, where["host"], where["pid"])
            began = time.monotonic()
            starting = actor.start.remote(backend, dict(hosted_options))
            ok, value = await asyncio.wait_for(starting, start_timeout)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            if isinstance(exc, TimeoutError):
                raise BackendUnavailableError(
                    f"Ray replica {index}: backend {backend!r} did not start in {start_timeout} s",
                    backend="ray",
                ) from None
            if isinstance(exc, ray.exceptions.RayError):
                raise BackendBrokenError(
                    f"Ray replica {index} died starting backend {backend!r}: {exc}", backend="ray"
                ) from exc
            raise
        if not ok:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise value
        log.info("ray: replica %d ready: %s in %.1f s", index, value["name"], time.monotonic() - began)
        return actor, value

    return spawn


async def start_all(
    spawn: Spawn, places: Sequence[tuple[int, PlacementGroup, int]], progress: bool = False
) -> list[Started]:
    """Start a replica at each ``(index, group, bundle)`` at once; on any failure kill those that started."""
    bar: Any = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(places), desc="ray replicas ready", unit="replica")
    tasks = [asyncio.ensure_future(spawn(*place)) for place in places]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished
            if bar is not None:
                bar.update(1)
    except BaseException:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, tuple):
                with contextlib.suppress(Exception):
                    ray.kill(outcome[0], no_restart=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return [task.result() for task in tasks]
