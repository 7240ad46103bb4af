"""`RayBackend` (name ``ray``): replicas of any backend, each a long-lived Ray actor, on one or many nodes.

```python
backend = ab.create_backend(
    "ray", backend="vllm", replicas=2, options={"model": "meta-llama/Llama-3.1-8B"},
    actor_options={"num_gpus": 1},
)
```

Each replica is a `ReplicaActor` (`_actor`) hosting the backend named by ``backend``, built inside the
actor through the registry (built-ins and third-party entry points alike) with ``options``. Requests are
routed by the project's one router (`asyncbackends._routing.router.Router`, as in a pool: load, health,
cool-down, failover, affinity), each actor a replica whose readiness probe is the actor's liveness plus the
hosted backend's ``check_ready``; results come back as each finishes, awaited on the shared loop (never
``ray.get``). An actor or node lost mid-run: its in-flight requests go to the survivors inside the same
attempt (they were never answered, so nothing is duplicated), and the replica is restarted or dropped per
``on_replica_loss``, with a warning in the log and counts in `replica_events`.

Start-up reserves one placement-group bundle per replica first, so a cluster too small for the request fails
within ``placement_timeout`` with a message saying what is missing, instead of waiting forever; it then
logs each replica as it is placed and as its engine becomes ready (``progress=True`` also draws a bar).

`RayBackend.resize` (``aresize``) adds or removes replicas while runs go. A replica added gets a
placement group of its own (one bundle, placed on any node with room: a node that joined since start-up
included) unless a start-up bundle is free (a replica removed earlier left it), and is routed to once its
probe passes. Removing drains the highest-index replicas (no new request goes to them; those in flight are
answered) and then stops their actors: a replica's own group is removed at once; a start-up bundle stays
reserved (Ray cannot shrink a placement group) for the next grow, until the backend closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from ray.util.placement_group import PlacementGroup

from ..._loop import get_loop_manager
from ..._routing._routed import RoutedBackend
from ..._routing.replica import ReplicaStats
from ..._routing.router import Replica, Router
from ..._types import Capabilities, Request
from ...errors import BackendUnavailableError, InvalidRequestError
from ._cluster import Cluster, bundle_for, connect, release, reserve
from ._slot import ActorSlot
from ._start import Spawn, spawner, start_all

__all__ = ["RayBackend"]

log = logging.getLogger("asyncbackends.adapters.ray")

OnReplicaLoss = Literal["restart", "drop"]
_DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "max_concurrency": 10_000}
# A lost replica's engine may take minutes to restart: the router waits and probes that long.
_DEFAULT_ROUTER_OPTIONS: dict[str, Any] = {"wait": 60.0, "probe_timeout": 600.0}


class RayBackend(RoutedBackend):
    """Replicas of one backend as Ray actors. Build it with ``create_backend("ray", backend=..., ...)``.

    Args:
        replicas: The replica slots, each with its started actor.
        cluster: The cluster, and whether this backend started it.
        group: The start-up placement group, holding one bundle per first replica.
        spawn: Starts a replica's actor in a bundle (for restarts and `aresize`).
        bundle: The resources one replica needs (a new replica's placement group).
        placement_timeout: Seconds a grow waits for the cluster to hold a new replica.
        on_replica_loss: ``"restart"`` a lost replica in its bundle, or ``"drop"`` it.
        routing: The router's policy, ``"least_loaded"`` or ``"affinity"``.
        router_options: Other `Router` options (``cooldown``, ``wait``, ``probe_timeout``, ...).
    """

    name = "ray"

    def __init__(
        self,
        replicas: list[ActorSlot],
        *,
        cluster: Cluster,
        group: PlacementGroup | None,
        spawn: Spawn,
        bundle: Mapping[str, float],
        placement_timeout: float = 120.0,
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
        self._spawn, self._bundle, self._placement_timeout = spawn, dict(bundle), placement_timeout
        self._next_index = 1 + max(slot.index for slot in replicas)  # indexes (and labels) are never reused
        self._free_bundles: list[int] = []  # start-up bundles whose replica a resize removed
        self._resizing: asyncio.Lock | None = None
        self._capacity = capacity = first.capabilities.max_concurrency
        self._router = Router(
            [Replica(slot, label=f"ray-{slot.index}", capacity=capacity) for slot in self._slots],
            routing=routing,
            name=self.name,
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
        connect_timeout: float = 5.0,
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
            address: ``None`` joins ``RAY_ADDRESS`` or a cluster started on this machine (Ray's address
                file), else starts a local one; ``"auto"``, ``"HOST:PORT"`` or ``"ray://host:10001"`` join
                one.
            connect_timeout: Seconds a cluster's address has to answer before joining it. An address file
                left by a dead cluster is then reported in the log and a local cluster started; any other
                address that does not answer fails with `BackendUnavailableError`.
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
            Router.check_options(routing, **(router_options or {}))
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"router_options: {exc}") from None
        hosted_options = dict(options or {})
        ray_options = {**_DEFAULT_ACTOR_OPTIONS, **(actor_options or {})}
        strategy = str(ray_options.pop("placement_strategy", "PACK")).upper()
        if not isinstance(connect_timeout, (int, float)) or isinstance(connect_timeout, bool):
            raise InvalidRequestError(f"connect_timeout must be a number of seconds, got {connect_timeout!r}")
        if not connect_timeout > 0:
            raise InvalidRequestError(f"connect_timeout must be > 0, got {connect_timeout!r}")
        cluster = await connect(address, init_options or {}, connect_timeout)
        group: PlacementGroup | None = None
        try:
            bundle = bundle_for(ray_options)
            group = await reserve(replicas, bundle, strategy, placement_timeout)
            spawn = spawner(ray_options, backend, hosted_options, start_timeout)
            started = await start_all(spawn, [(i, group, i) for i in range(replicas)], progress)
            slots = [ActorSlot(i, one, spawn=spawn, group=group, bundle=i) for i, one in enumerate(started)]
            return cls(
                slots,
                cluster=cluster,
                group=group,
                spawn=spawn,
                bundle=bundle,
                placement_timeout=placement_timeout,
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
    def replicas(self) -> list[ActorSlot]:
        """The replica slots not dropped (a slot being restarted, or drained by a resize, included)."""
        return [slot for slot in self._slots if not slot.dropped]

    def replica_stats(self) -> list[ReplicaStats]:
        """Each replica's figures as the router sees them, with the Ray node its actor runs on now.

        A replica restarted after its node was lost shows its new node; one dropped is ``"refused"``; one
        being removed by a resize is ``"draining"`` until its in-flight requests are answered.
        """
        return [
            dataclasses.replace(replica.stats(), node=replica.backend.info.get("node_id"))
            for replica in self._router.replicas
        ]

    @property
    def replica_events(self) -> Counter[str]:
        """Counts of replicas ``lost``, ``restarted``, ``dropped``, and of requests ``resent``.

        A request is resent when a lost replica never answered it: the router sends it to another.
        """
        return self._events + Counter({"resent": sum(slot.unanswered for slot in self._slots)})

    def __repr__(self) -> str:
        return f"RayBackend({self.hosted!r}, replicas={len(self.replicas)})"

    # -- requests --------------------------------------------------------------------------------------

    async def _before_route(self, request: Request) -> None:
        if all(slot.dropped for slot in self._slots):
            raise BackendUnavailableError(
                "every Ray replica was lost and dropped", backend="ray", request_id=request.request_id
            )

    # -- losses ----------------------------------------------------------------------------------------

    def _replica(self, slot: ActorSlot) -> Replica:
        return next(r for r in self._router.replicas if r.backend is slot)

    def _lost(self, slot: ActorSlot, exc: BaseException) -> None:
        self._events["lost"] += 1
        if self._closed:
            return
        if slot.draining:  # being removed: its in-flight requests go to the others, nothing restarts
            log.warning("ray: replica %d lost while draining; it is removed", slot.index)
            slot.drop()
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
            self._router.replicas.refuse(self._replica(slot), "lost; dropped (on_replica_loss='drop')")

    def _restarted(self, slot: ActorSlot, error: BaseException | None) -> None:
        if error is not None:
            self._events["dropped"] += 1
            log.error("ray: replica %d could not be restarted (%s); dropped", slot.index, error)
            self._router.replicas.refuse(self._replica(slot), f"lost; restart failed: {error}")
            return
        self._events["restarted"] += 1
        log.warning(
            "ray: replica %d restarted (pid %s); taken back once its probe passes", slot.index, slot.pid
        )

    # -- resizing --------------------------------------------------------------------------------------

    def resize(self, replicas: int) -> None:
        """Blocking `aresize`, run on the shared loop: for sync code."""
        get_loop_manager().run(self.aresize(replicas))

    async def aresize(self, replicas: int) -> None:
        """Grow or shrink to ``replicas`` replicas while runs go; return once the change is done.

        Growing starts the new actors (each in a free start-up bundle, else in a placement group of its own
        on any node with room, a node that joined the cluster since start-up included) and returns once
        every one is routed to. Shrinking drains the highest-index replicas: no new request goes to them,
        their in-flight requests are answered (none is cut or resent), then their actors are stopped and
        their resources released. Replicas lost and dropped are removed first, so they are made up for.
        Concurrent calls run one after the other, in call order; cancelling one leaves it to finish.

        Args:
            replicas: The number of replicas wanted, ``>= 1``.

        Raises:
            InvalidRequestError: ``replicas`` is not an int ``>= 1``.
            BackendClosedError: The backend is closed.
            BackendUnavailableError: The cluster cannot hold the new replicas within ``placement_timeout``,
                or a new replica's probe has not passed within the router's ``probe_timeout`` (nothing is
                added then: the new actors are stopped).
            BackendError: A new replica's hosted backend failed to start (nothing is added then).
        """
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InvalidRequestError(f"replicas must be an int >= 1, got {replicas!r}")
        self._check_open()
        await get_loop_manager().arun(self._resize_shielded(replicas))

    async def _resize_shielded(self, replicas: int) -> None:
        # Half a resize (actors started but not routed, replicas drained but not stopped) helps nobody.
        await asyncio.shield(asyncio.ensure_future(self._resize(replicas)))

    async def _resize(self, replicas: int) -> None:
        if self._resizing is None:
            self._resizing = asyncio.Lock()
        async with self._resizing:
            self._check_open()
            await asyncio.gather(*(self._remove(slot) for slot in self._slots if slot.dropped))
            live = sorted(self._slots, key=lambda slot: slot.index)
            before = len(live)
            if replicas > before:
                await self._grow(replicas - before)
            elif replicas < before:
                await self._shrink(live[replicas:])
            total = self._capacity * replicas if self._capacity else None
            self.capabilities = dataclasses.replace(self.capabilities, max_concurrency=total)
            log.info("ray: resized from %d to %d replica(s)", before, replicas)

    async def _grow(self, count: int) -> None:
        reused = [self._free_bundles.pop(0) for _ in range(min(count, len(self._free_bundles)))]
        reserving = [
            reserve(1, self._bundle, "PACK", self._placement_timeout) for _ in range(count - len(reused))
        ]
        reserved = await asyncio.gather(*reserving, return_exceptions=True)
        groups = [group for group in reserved if isinstance(group, PlacementGroup)]
        start_up = [(self._group, bundle) for bundle in reused if self._group is not None]
        bundles = start_up + [(group, 0) for group in groups]
        places = [(self._next_index + i, group, bundle) for i, (group, bundle) in enumerate(bundles)]
        try:
            failed = next((e for e in reserved if isinstance(e, BaseException)), None)
            if failed is not None:
                raise failed
            started = await start_all(self._spawn, places)
        except BaseException:
            self._free_bundles = sorted(self._free_bundles + reused)
            await asyncio.gather(*(release(group) for group in groups), return_exceptions=True)
            raise
        self._next_index += count
        added: list[tuple[ActorSlot, Replica]] = []
        for (index, group, bundle), one in zip(places, started, strict=True):
            slot = ActorSlot(index, one, spawn=self._spawn, group=group, bundle=bundle, on_lost=self._lost)
            self._slots.append(slot)
            replica = self._router.replicas.add(Replica(slot, label=f"ray-{index}", capacity=self._capacity))
            added.append((slot, replica))
            log.info("ray: replica %d added on node %s", index, slot.info.get("node_id"))
        try:
            # A new replica whose probes keep failing would hold the resize forever: one probe window.
            replicas = self._router.replicas
            await replicas.taken_in(*(r for _, r in added), timeout=replicas.probe_timeout)
        except BaseException as failed:
            self._check_open()  # closed meanwhile: the close stops every actor, the new ones included
            # Nothing is added: every new replica goes, one taken in meanwhile once its attempts are answered.
            log.warning("ray: a new replica was not taken in (%s); removing the new replicas", failed)
            removing = (self._remove(slot) for slot, _ in added)
            removals = await asyncio.gather(*removing, return_exceptions=True)
            for (slot, _), outcome in zip(added, removals, strict=True):
                if isinstance(outcome, BaseException):
                    log.warning("ray: removing new replica %d failed: %r", slot.index, outcome)
            raise

    async def _shrink(self, slots: list[ActorSlot]) -> None:
        for slot in slots:
            slot.draining = True
        log.info("ray: draining replica(s) %s", ", ".join(str(slot.index) for slot in slots))
        await asyncio.gather(*(self._remove(slot) for slot in slots))

    async def _remove(self, slot: ActorSlot) -> None:
        """Drain ``slot``'s replica from the router, stop its actor and release (or keep) its bundle."""
        slot.draining = True
        replica = next((r for r in self._router.replicas if r.backend is slot), None)
        if replica is not None:
            await self._router.replicas.drain(replica)
        await slot.aclose()
        self._slots.remove(slot)
        self._events["resent"] += slot.unanswered  # still counted once the slot is gone
        if slot.group is self._group:
            self._free_bundles.append(slot.bundle)  # Ray cannot shrink a group: kept for the next grow
        else:
            await release(slot.group)
        log.info("ray: replica %d removed", slot.index)

    # -- lifetime --------------------------------------------------------------------------------------

    async def _close_replicas(self) -> None:
        await asyncio.gather(*(slot.aclose() for slot in self._slots), return_exceptions=True)
        for slot in self._slots:
            if slot.group is not self._group:
                await release(slot.group)
        await release(self._group)
        self._group = None
        await self._cluster.shutdown()
