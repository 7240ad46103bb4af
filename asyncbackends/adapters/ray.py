"""`RayBackend` (name ``ray``): replicas of any backend, each a long-lived Ray actor, on one or many nodes.

```python
backend = ab.create_backend(
    "ray", backend="vllm", replicas=2, options={"model": "meta-llama/Llama-3.1-8B"},
    actor_options={"num_gpus": 1},
)
```

Each replica is a `ReplicaActor` (`_ray_actor`) hosting the backend named by ``backend``, built inside the
actor through the registry (built-ins and third-party entry points alike) with ``options``. Requests go to
the least busy live replica; results come back as each finishes, awaited on the shared loop (never
``ray.get``). An actor or node lost mid-run: its in-flight requests are sent again to the survivors (they
were never answered, so nothing is duplicated), and the replica is restarted or dropped per
``on_replica_loss``, with a warning in the log and a count in `replica_events`.

Start-up reserves one placement-group bundle per replica first, so a cluster too small for the request fails
within ``placement_timeout`` with a message saying what is missing, instead of waiting forever; it then
logs each replica as it is placed and as its engine becomes ready (``progress=True`` also draws a bar).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..errors import BackendBrokenError, BackendUnavailableError, InvalidRequestError
from ..loop import get_loop_manager
from ..protocol import BaseBackend
from ..types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ._ray_actor import ReplicaActor
from ._ray_cluster import Cluster, bundle_for, connect, release, reserve
from ._ray_replica import ActorReplica, ReplicaLostError
from ._ray_router import ReplicaSet

__all__ = ["RayBackend"]

log = logging.getLogger("asyncbackends.adapters.ray")

OnReplicaLoss = Literal["restart", "drop"]
# Options of ours inside actor_options; the rest go to Ray's `.options()` as they are.
_OUR_ACTOR_OPTIONS = ("placement_strategy",)
_DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "max_concurrency": 10_000}


class RayBackend(BaseBackend):
    """Replicas of one backend as Ray actors. Build it with ``create_backend("ray", backend=..., ...)``.

    Args:
        replicas: The started replicas.
        spawn: Starts a replacement actor for a replica index (used when ``on_replica_loss="restart"``).
        cluster: The cluster, and whether this backend started it.
        group: The placement group holding one bundle per replica.
        on_replica_loss: ``"restart"`` a lost replica in its bundle, or ``"drop"`` it.
    """

    name = "ray"

    def __init__(
        self,
        replicas: list[ActorReplica],
        *,
        spawn: Any,
        cluster: Cluster,
        group: PlacementGroup | None,
        on_replica_loss: OnReplicaLoss = "restart",
    ) -> None:
        first = replicas[0]
        self.hosted = first.hosted
        self._fingerprint = first.fingerprint
        self._spawn = spawn
        self._cluster, self._group = cluster, group
        self.on_replica_loss: OnReplicaLoss = on_replica_loss
        self._replicas = ReplicaSet(replicas)
        hint = first.capabilities.max_concurrency
        self.capabilities: Capabilities = _scaled(first.capabilities, hint * len(replicas) if hint else None)
        self.replica_events: Counter[str] = Counter()
        """Counts of ``lost``, ``restarted``, ``dropped`` replicas and ``resent`` requests."""
        self._restarts: set[asyncio.Task[None]] = set()

    @classmethod
    async def create(
        cls,
        *,
        backend: str,
        replicas: int = 1,
        options: Mapping[str, Any] | None = None,
        address: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        on_replica_loss: OnReplicaLoss = "restart",
        init_options: Mapping[str, Any] | None = None,
        placement_timeout: float = 120.0,
        start_timeout: float | None = None,
        progress: bool = False,
    ) -> RayBackend:
        """Start ``replicas`` actors hosting ``backend`` and wait until every one is ready.

        Args:
            backend: The hosted backend's registry name (or ``"module:Class"``), resolved inside the actors.
            replicas: How many actors.
            options: The hosted backend's options, as ``create_backend(backend, **options)`` takes them.
            address: ``None`` joins ``RAY_ADDRESS`` or a cluster started on this machine, else starts a
                local one; ``"auto"`` or ``"ray://host:10001"`` join one.
            actor_options: Ray's actor options (``num_gpus``, ``num_cpus``, ``memory``, ``resources``,
                ``runtime_env``, ...) plus ``placement_strategy`` (``"PACK"`` by default, ``"SPREAD"``,
                ``"STRICT_PACK"``, ``"STRICT_SPREAD"``). ``num_cpus`` defaults to 1.
            on_replica_loss: ``"restart"`` a lost replica (in its reserved bundle) or ``"drop"`` it.
            init_options: ``ray.init`` options for a cluster this backend starts (``num_cpus``,
                ``object_store_memory``, ``include_dashboard``, ...).
            placement_timeout: Seconds to wait for the cluster to hold every replica before failing.
            start_timeout: Seconds each replica's engine may take to start; ``None`` waits as long as needed.
            progress: Draw a progress bar of replicas ready.

        Raises:
            InvalidRequestError: Bad options.
            BackendUnavailableError: The cluster cannot be reached or cannot hold the replicas.
            BackendError: A replica's hosted backend failed to start (its own error, e.g. a missing model).
        """
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InvalidRequestError(f"replicas must be an int >= 1, got {replicas!r}")
        if on_replica_loss not in ("restart", "drop"):
            raise InvalidRequestError(f"on_replica_loss must be 'restart' or 'drop', got {on_replica_loss!r}")
        if not isinstance(backend, str) or not backend or backend == "ray":
            raise InvalidRequestError(f"backend must name the backend each replica hosts, got {backend!r}")
        hosted_options = dict(options or {})
        ray_options = {**_DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
        strategy = str(ray_options.pop("placement_strategy", "PACK")).upper()
        cluster = await connect(address, init_options or {})
        group: PlacementGroup | None = None
        started: list[ActorReplica] = []
        try:
            group = await reserve(replicas, bundle_for(ray_options), strategy, placement_timeout)
            actor_class: Any = ray.remote(ReplicaActor)  # Ray's generic handle types do not model .options()

            async def spawn(index: int) -> ActorReplica:
                strategy_ = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
                )
                actor = actor_class.options(
                    scheduling_strategy=strategy_, max_restarts=0, max_task_retries=0, **ray_options
                ).remote(index)
                try:
                    where = await actor.where.remote()
                    log.info("ray: replica %d placed on %s (pid %s)", index, where["host"], where["pid"])
                    began = time.monotonic()
                    starting = actor.start.remote(backend, hosted_options)
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
                log.info(
                    "ray: replica %d ready: %s in %.1f s", index, value["name"], time.monotonic() - began
                )
                return ActorReplica(index, actor, value)

            started = await _start_all(spawn, replicas, progress)
            return cls(started, spawn=spawn, cluster=cluster, group=group, on_replica_loss=on_replica_loss)
        except BaseException:
            await asyncio.gather(*(r.aclose() for r in started), return_exceptions=True)
            await release(group)
            await cluster.shutdown()
            raise

    # -- what the backend reports ------------------------------------------------------------------------

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The hosted backend's fingerprint: Ray replicas of a model share a cache with that model."""
        return dict(self._fingerprint)

    @property
    def replicas(self) -> list[ActorReplica]:
        """The live replicas."""
        return self._replicas.live()

    def __repr__(self) -> str:
        return f"RayBackend({self.hosted!r}, replicas={len(self._replicas.live())})"

    # -- requests --------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate on the least busy live replica."""
        return await self._route("generate", request)  # type: ignore[no-any-return]

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score on the least busy live replica."""
        return await self._route("loglikelihood", request)  # type: ignore[no-any-return]

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text on the least busy live replica."""
        return await self._route("loglikelihood_rolling", request)  # type: ignore[no-any-return]

    async def _route(self, method: str, request: Any) -> Any:
        # The replica set's state lives on the shared loop, whichever loop the caller awaits from.
        return await get_loop_manager().arun(self._send(method, request))

    async def _send(self, method: str, request: Any) -> Any:
        while True:
            self._check_open(request.request_id)
            replica = await self._replicas.pick(lambda: bool(self._restarts))
            self._check_open(request.request_id)
            if replica is None:
                raise BackendUnavailableError(
                    "every Ray replica was lost", backend="ray", request_id=request.request_id
                )
            try:
                return await getattr(replica, method)(request)
            except ReplicaLostError as exc:
                if self._closed:
                    raise
                self._lost(replica, exc)
                # Never answered: sending it again cannot duplicate it.
                self.replica_events["resent"] += 1

    def _lost(self, replica: ActorReplica, exc: BaseException) -> None:
        if not self._replicas.remove(replica):
            return  # another request already reported this replica
        self.replica_events["lost"] += 1
        action = self.on_replica_loss
        log.warning(
            "ray: replica %d (pid %s) lost (%s); its in-flight requests go to the %d other(s); %s",
            replica.index,
            replica.info.get("pid"),
            exc.__cause__.__class__.__name__ if exc.__cause__ else exc,
            len(self._replicas.live()),
            "restarting it" if action == "restart" else "dropping it",
        )
        with contextlib.suppress(Exception):
            ray.kill(replica.actor, no_restart=True)
        if action == "drop":
            self.replica_events["dropped"] += 1
            return
        task = asyncio.ensure_future(self._restart(replica.index))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)
        task.add_done_callback(lambda _: self._replicas.wake())

    async def _restart(self, index: int) -> None:
        try:
            replica = await self._spawn(index)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.replica_events["dropped"] += 1
            log.error("ray: replica %d could not be restarted (%s); dropped", index, exc)
            return
        if self._closed:
            await replica.aclose()
            return
        self._replicas.add(replica)
        self.replica_events["restarted"] += 1
        log.warning("ray: replica %d restarted (pid %s)", index, replica.pid)

    # -- lifetime --------------------------------------------------------------------------------------

    async def _aclose(self) -> None:
        await get_loop_manager().arun(self._close_all())

    async def _close_all(self) -> None:
        for task in list(self._restarts):
            task.cancel()
        if self._restarts:
            await asyncio.wait(list(self._restarts), timeout=30)
        replicas = self._replicas.close()
        await asyncio.gather(*(r.aclose() for r in replicas), return_exceptions=True)
        await release(self._group)
        self._group = None
        await self._cluster.shutdown()


async def _start_all(spawn: Any, replicas: int, progress: bool) -> list[ActorReplica]:
    bar: Any = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=replicas, desc="ray replicas ready", unit="replica")
    tasks = [asyncio.ensure_future(spawn(i)) for i in range(replicas)]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished
            if bar is not None:
                bar.update(1)
    except BaseException:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(r.aclose() for r in results if isinstance(r, ActorReplica)))
        raise
    finally:
        if bar is not None:
            bar.close()
    return [task.result() for task in tasks]


def _scaled(capabilities: Capabilities, max_concurrency: int | None) -> Capabilities:
    import dataclasses

    return dataclasses.replace(capabilities, max_concurrency=max_concurrency)
