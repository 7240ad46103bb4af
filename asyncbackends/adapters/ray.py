"""`RayBackend` (name ``ray``): replicas of any backend, each a long-lived Ray actor, on one or many nodes.

```python
backend = ab.create_backend(
    "ray", backend="vllm", replicas=2, options={"model": "meta-llama/Llama-3.1-8B"},
    actor_options={"num_gpus": 1},
)
```

Each replica is a `ReplicaActor` (`_ray_actor`) hosting the backend named by ``backend``, built inside the
actor through the registry (built-ins and third-party entry points alike) with ``options``. Requests are
routed by the project's one router (`asyncbackends._wrappers.router.Router`, as in a pool: load, health,
cool-down, failover, affinity), each actor a replica whose readiness probe is the actor's liveness plus the
hosted backend's ``check_ready``; results come back as each finishes, awaited on the shared loop (never
``ray.get``). An actor or node lost mid-run: its in-flight requests go to the survivors inside the same
attempt (they were never answered, so nothing is duplicated), and the replica is restarted or dropped per
``on_replica_loss``, with a warning in the log and counts in `replica_events`.

Start-up reserves one placement-group bundle per replica first, so a cluster too small for the request fails
within ``placement_timeout`` with a message saying what is missing, instead of waiting forever; it then
logs each replica as it is placed and as its engine becomes ready (``progress=True`` also draws a bar).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .._loop import get_loop_manager
from .._protocol import BaseBackend
from .._types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from .._wrappers.router import Replica, ReplicaStats, Router
from ..errors import BackendBrokenError, BackendUnavailableError, InvalidRequestError
from ._ray_actor import ReplicaActor
from ._ray_cluster import Cluster, bundle_for, connect, release, reserve
from ._ray_replica import ActorReplica, Started

__all__ = ["RayBackend"]

log = logging.getLogger("asyncbackends.adapters.ray")

OnReplicaLoss = Literal["restart", "drop"]
_DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "max_concurrency": 10_000}
# A lost replica's engine may take minutes to restart: the router waits and probes that long.
_DEFAULT_ROUTER_OPTIONS: dict[str, Any] = {"wait": 60.0, "probe_timeout": 600.0}


class RayBackend(BaseBackend):
    """Replicas of one backend as Ray actors. Build it with ``create_backend("ray", backend=..., ...)``.

    Args:
        replicas: The replica slots, each with its started actor.
        cluster: The cluster, and whether this backend started it.
        group: The placement group holding one bundle per replica.
        on_replica_loss: ``"restart"`` a lost replica in its bundle, or ``"drop"`` it.
        routing: The router's policy, ``"least_loaded"`` or ``"affinity"``.
        router_options: Other `Router` options (``cooldown``, ``wait``, ``probe_timeout``, ...).
    """

    name = "ray"

    def __init__(
        self,
        replicas: list[ActorReplica],
        *,
        cluster: Cluster,
        group: PlacementGroup | None,
        on_replica_loss: OnReplicaLoss = "restart",
        routing: str = "least_loaded",
        router_options: Mapping[str, Any] | None = None,
    ) -> None:
        first = replicas[0]
        self.hosted = first.hosted
        self._fingerprint = first.fingerprint
        self._cluster, self._group = cluster, group
        self.on_replica_loss: OnReplicaLoss = on_replica_loss
        self._slots = list(replicas)
        capacity = first.capabilities.max_concurrency
        self._router = Router(
            [Replica(slot, label=f"ray-{slot.index}", capacity=capacity) for slot in self._slots],
            routing=routing,
            **{**_DEFAULT_ROUTER_OPTIONS, **(router_options or {})},
        )
        for slot in self._slots:
            slot.on_lost = self._lost
        total = capacity * len(replicas) if capacity else None
        self.capabilities: Capabilities = dataclasses.replace(first.capabilities, max_concurrency=total)
        self._events: Counter[str] = Counter()

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
        routing: str = "least_loaded",
        router_options: Mapping[str, Any] | None = None,
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
            routing: ``"least_loaded"`` (default) or ``"affinity"`` (prompt prefixes kept on one replica).
            router_options: Other `Router` options: ``cooldown``, ``max_cooldown``, ``wait`` (60 s here),
                ``probe_timeout`` (600 s here: a probe waits for a restarting engine), ``affinity_chars``, ...
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
        try:  # refuse bad router options before anything starts
            Router([object()], routing=routing, **(router_options or {}))
        except TypeError as exc:
            raise InvalidRequestError(f"router_options: {exc}") from None
        hosted_options = dict(options or {})
        ray_options = {**_DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
        strategy = str(ray_options.pop("placement_strategy", "PACK")).upper()
        cluster = await connect(address, init_options or {})
        group: PlacementGroup | None = None
        try:
            group = await reserve(replicas, bundle_for(ray_options), strategy, placement_timeout)
            spawn = _spawner(group, ray_options, backend, hosted_options, start_timeout)
            started = await _start_all(spawn, replicas, progress)
            slots = [ActorReplica(i, one, spawn=spawn) for i, one in enumerate(started)]
            return cls(
                slots,
                cluster=cluster,
                group=group,
                on_replica_loss=on_replica_loss,
                routing=routing,
                router_options=router_options,
            )
        except BaseException:
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
        """The replica slots not dropped (a slot being restarted included)."""
        return [slot for slot in self._slots if not slot.dropped]

    @property
    def router(self) -> Router:
        """The router (its replicas' state and figures)."""
        return self._router

    def replica_stats(self) -> list[ReplicaStats]:
        """Each replica's figures as the router sees them: state, in flight, requests, failures."""
        return self._router.stats()

    @property
    def replica_events(self) -> Counter[str]:
        """Counts of replicas ``lost``, ``restarted``, ``dropped``, and of requests ``resent``.

        A request is resent when a lost replica never answered it: the router sends it to another.
        """
        return self._events + Counter({"resent": sum(slot.unanswered for slot in self._slots)})

    def __repr__(self) -> str:
        return f"RayBackend({self.hosted!r}, replicas={len(self.replicas)})"

    # -- requests --------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate on the replica the router picks."""
        return await self._route("generate", request)  # type: ignore[no-any-return]

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score on the replica the router picks."""
        return await self._route("loglikelihood", request)  # type: ignore[no-any-return]

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text on the replica the router picks."""
        return await self._route("loglikelihood_rolling", request)  # type: ignore[no-any-return]

    async def _route(self, method: str, request: Any) -> Any:
        self._check_open(request.request_id)
        if all(slot.dropped for slot in self._slots):
            raise BackendUnavailableError(
                "every Ray replica was lost and dropped", backend="ray", request_id=request.request_id
            )
        # The router's state lives on the shared loop, whichever loop the caller awaits from.
        return await get_loop_manager().arun(self._router.call(method, request))

    async def check_ready(self) -> None:
        """Return while any replica is healthy (a Ray backend can be a replica of a pool too).

        Raises:
            BackendUnavailableError: No replica is healthy now.
        """
        self._check_open()
        if not self._router.healthy():
            raise BackendUnavailableError("no healthy Ray replica", backend=self.name)

    # -- losses ----------------------------------------------------------------------------------------

    def _replica(self, slot: ActorReplica) -> Replica:
        return self._router.replicas[self._slots.index(slot)]

    def _lost(self, slot: ActorReplica, exc: BaseException) -> None:
        self._events["lost"] += 1
        if self._closed:
            return
        restart = self.on_replica_loss == "restart"
        log.warning(
            "ray: replica %d (pid %s) lost (%s); its in-flight requests go to the others; %s",
            slot.index,
            slot.info.get("pid"),
            type(exc.__cause__ or exc).__name__,
            "restarting it" if restart else "dropping it (on_replica_loss='drop')",
        )
        if restart:
            slot.restart(self._restarted)
        else:
            slot.drop()
            self._events["dropped"] += 1
            self._router.refuse(self._replica(slot), "lost; dropped (on_replica_loss='drop')")

    def _restarted(self, slot: ActorReplica, error: BaseException | None) -> None:
        if error is not None:
            self._events["dropped"] += 1
            log.error("ray: replica %d could not be restarted (%s); dropped", slot.index, error)
            self._router.refuse(self._replica(slot), f"lost; restart failed: {error}")
            return
        self._events["restarted"] += 1
        log.warning(
            "ray: replica %d restarted (pid %s); taken back once its probe passes", slot.index, slot.pid
        )

    # -- lifetime --------------------------------------------------------------------------------------

    async def _aclose(self) -> None:
        await get_loop_manager().arun(self._close_all())

    async def _close_all(self) -> None:
        await self._router.aclose()
        await asyncio.gather(*(slot.aclose() for slot in self._slots), return_exceptions=True)
        await release(self._group)
        self._group = None
        await self._cluster.shutdown()


def _spawner(
    group: PlacementGroup,
    ray_options: Mapping[str, Any],
    backend: str,
    hosted_options: Mapping[str, Any],
    start_timeout: float | None,
) -> Callable[[int], Awaitable[Started]]:
    """A function starting the actor of replica ``index`` in its bundle, reporting progress in the log."""
    actor_class: Any = ray.remote(ReplicaActor)  # Ray's generic handle types do not model .options()

    async def spawn(index: int) -> Started:
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
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


async def _start_all(
    spawn: Callable[[int], Awaitable[Started]], replicas: int, progress: bool
) -> list[Started]:
    """Start every replica at once; on any failure (or cancellation) kill the ones that started."""
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
