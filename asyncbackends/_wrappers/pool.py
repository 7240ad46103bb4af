"""`PoolBackend` (name ``pool``) and `pool`: one model served by several replicas, behind one backend.

```python
backend = ab.pool([ab.create_backend("tgi", url=u) for u in urls])          # routing="least_loaded"
backend = ab.create_backend("pool", replicas=[{"backend": "tgi", "url": "http://a:8080"}, ...])
backend = ab.create_backend("pool", replicas="replicas.toml")               # the same, from a file
```

Each attempt goes through `asyncbackends._routing.router.Router` (load, cool-downs, probes, failover,
affinity), so `gather` stays the one fan-out path: its retries, timeouts, cache and metrics work unchanged.

**One model.** Before the first request the pool reads the model each replica serves (TGI's ``/info``
``model_id``, an adapter's ``model``, else its fingerprint without addresses). Replicas reporting different
models are refused with `InvalidRequestError` and nothing is sent; a replica unreachable then is cooled down
and checked by its probe before it is taken back (serving another model, it is refused for good). The pool's
``fingerprint`` is the shared model's identity, never an address, so one response cache serves any set of
replicas of that model. Its ``capabilities`` are the replicas' common ones; ``max_concurrency`` is the sum of
their capacities when every one is known.

**Adapters.** Requests naming a LoRA adapter go, under either routing, to a replica that holds it already
while its load allows (adapter affinity: `asyncbackends._routing.router`); the pool serves adapters only if
every replica claims ``capabilities.adapters`` (docs/pool.md, *Adapters*).

**Per-replica limits.** ``replica_concurrency="adaptive"`` (or an `AdaptiveConcurrency`) gives each replica
its own adaptive concurrency limit, moved only by that replica's answers, so a pool of unequal servers
settles each at its own capacity; a run with ``concurrency="adaptive"`` on a pool turns them on too (see
docs/adaptive.md). ``replica_stats()`` shows each one's ``limit``.

**Replicas file** (TOML, or JSON with the same shape): the pool's options at the top, one table per replica;
``capacity`` and ``label`` are the pool's, every other key goes to that replica's adapter.

```toml
routing = "least_loaded"

[[replicas]]
backend = "tgi"
url = "http://10.0.0.1:8080"
capacity = 16

[[replicas]]
backend = "tgi"
url = "http://10.0.0.2:8080"
capacity = 16
```
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._loop import get_loop_manager
from .._registry import acreate_backend, check_options
from .._routing._routed import RoutedBackend
from .._routing.replica import Replica
from .._routing.router import OPTIONS as ROUTER_OPTIONS
from .._routing.router import Router
from .._types import Request
from .._usage import pricing_of
from ..errors import InvalidRequestError
from .pool_replicas import (
    common_capabilities,
    replica_label,
    replica_model,
    static_identity,
)
from .pool_replicas import (
    load_replicas_file as load_replicas_file,
)

__all__ = ["PoolBackend", "pool"]

_POOL_KEYS = ("capacity", "label")


class PoolBackend(RoutedBackend):
    """Replicas of one model behind one backend; build it with `pool` or ``create_backend("pool", ...)``.

    Args:
        replicas: The replica backends (each closed by `aclose`).
        routing: ``"least_loaded"`` (default) or ``"affinity"`` (requests sharing a prompt prefix kept on one
            replica, bounded by load).
        capacities: Requests each replica serves at once (``None`` entries take the replica's
            ``capabilities.max_concurrency``); the router balances in-flight requests relative to them.
        labels: Each replica's name in reports (default: its URL, else ``name-index``).
        **router_options: `Router` options: ``cooldown``, ``max_cooldown``, ``wait``, ``probe_timeout``,
            ``affinity_chars``, ``affinity_slack``, ``seed``, ``replica_concurrency`` (``"adaptive"`` or an
            `AdaptiveConcurrency`: one adaptive limit per replica, moved only by its own answers).

    Raises:
        InvalidRequestError: No replicas, an unknown routing, or bad router options.
    """

    name = "pool"

    def __init__(
        self,
        replicas: Sequence[Any],
        *,
        routing: str = "least_loaded",
        capacities: Sequence[int | None] | None = None,
        labels: Sequence[str | None] | None = None,
        **router_options: Any,
    ) -> None:
        backends = list(replicas)
        if not backends:
            raise InvalidRequestError("a pool needs at least one replica")
        for i, backend in enumerate(backends):
            missing = [m for m in ("generate", "loglikelihood", "aclose") if not hasattr(backend, m)]
            if missing:
                raise InvalidRequestError(
                    f"replica {i} ({type(backend).__name__}) has no {', '.join(missing)}"
                )
        capacities = list(capacities) if capacities is not None else [None] * len(backends)
        labels = list(labels) if labels is not None else [None] * len(backends)
        if len(capacities) != len(backends) or len(labels) != len(backends):
            raise InvalidRequestError("capacities and labels must have one entry per replica")
        wrapped: list[Replica] = []
        seen: set[str] = set()
        for i, backend in enumerate(backends):
            capacity = capacities[i]
            if capacity is None:
                capacity = getattr(getattr(backend, "capabilities", None), "max_concurrency", None)
            if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
                raise InvalidRequestError(f"replica {i}: capacity must be an int >= 1, got {capacity!r}")
            label = labels[i] or replica_label(backend, i)
            if label in seen:
                label = f"{label}#{i}"
            seen.add(label)
            wrapped.append(Replica(backend, label=label, capacity=capacity))
        self.routing = routing
        self._router = Router(wrapped, routing=routing, verify=self._verify, name=self.name, **router_options)
        self._model: str | None = None
        self._mismatch: InvalidRequestError | None = None
        self._checked = False
        self._check_lock: asyncio.Lock | None = None
        self.capabilities = common_capabilities(backends, [r.capacity for r in wrapped])
        # One model served several times costs the same wherever it runs: the replicas' prices, when they
        # all state the same (a pool given its own `pricing=` holds that instead).
        prices = {pricing_of(backend) for backend in backends}
        self.pricing = prices.pop() if len(prices) == 1 else None

    @classmethod
    async def create(
        cls,
        *,
        replicas: Sequence[Mapping[str, Any] | Any] | str | os.PathLike[str],
        routing: str | None = None,
        **router_options: Any,
    ) -> PoolBackend:
        """Build every replica, then the pool, and check the replicas serve one model.

        ``replicas`` is a list of ``{"backend": name, **options}`` (or backend objects), or a replicas file.
        Options given here override the replicas file's (``replica_concurrency = "adaptive"`` in a file).

        Args:
            replicas: The replicas, or a replicas file.
            routing: ``"least_loaded"`` (default) or ``"affinity"``.
            **router_options: `Router` options, as `PoolBackend` takes them (``None`` leaves one unset).

        Raises:
            InvalidRequestError: Bad replicas, an unknown option, or replicas serving different models
                (nothing sent).
        """
        known = ("routing", *ROUTER_OPTIONS)
        check_options(cls.name, router_options, known)
        options: dict[str, Any] = {}
        if isinstance(replicas, (str, os.PathLike)):
            data = load_replicas_file(replicas)
            replicas = data.pop("replicas")
            options.update(data)
        given = {"routing": routing, **router_options}
        options.update({k: v for k, v in given.items() if v is not None})
        unknown = set(options) - set(known)
        if unknown:
            raise InvalidRequestError(f"unknown pool option(s) in the replicas file: {sorted(unknown)}")
        if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence) or not replicas:
            raise InvalidRequestError(
                "replicas must be a non-empty list of {'backend': name, ...} or a file path"
            )
        built: list[Any] = []
        capacities: list[int | None] = []
        labels: list[str | None] = []
        try:
            for i, spec in enumerate(replicas):
                if isinstance(spec, Mapping):
                    spec = dict(spec)
                    name = spec.pop("backend", None)
                    if not isinstance(name, str):
                        raise InvalidRequestError(f"replicas[{i}] needs a 'backend' name, got {name!r}")
                    if name == cls.name:
                        raise InvalidRequestError(f"replicas[{i}]: a pool's replica cannot be a pool")
                    capacities.append(spec.pop("capacity", None))
                    labels.append(spec.pop("label", None))
                    built.append(await acreate_backend(name, **spec))
                else:
                    capacities.append(None)
                    labels.append(None)
                    built.append(spec)
            backend = cls(built, capacities=capacities, labels=labels, **options)
        except BaseException:
            await asyncio.gather(*(b.aclose() for b in built), return_exceptions=True)
            raise
        try:
            await backend.ready()
        except BaseException:
            await (
                backend.aclose()
            )  # its probes as well as its replicas: a refused pool leaves nothing running
            raise
        return backend

    def __repr__(self) -> str:
        return f"PoolBackend({[r.label for r in self._router.replicas]!r}, routing={self.routing!r})"

    @property
    def model(self) -> str | None:
        """The model every replica serves; ``None`` until one replica was read."""
        return self._model

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The shared model's identity, never an address: one cache serves any replicas of that model.

        Read after `ready` (which the first request, and ``create_backend``, await); a pool used from a
        coroutine with a cache should ``await pool.ready()`` first, as ``gather`` reads the fingerprint
        before the first request.
        """
        # Read now, not when the pool was built: a replica's identity may be learned by `ready` (TGI's model).
        identities = {
            json.dumps(static_identity(r.backend), sort_keys=True, default=str) for r in self._router.replicas
        }
        return {"name": self.name, "model": self._model, "replicas": sorted(identities)}

    # -- one model -----------------------------------------------------------------------------------

    async def ready(self) -> None:
        """Read the model of every replica once, before any request.

        An unreachable replica is cooled down (its probe checks its model before taking it back).

        Raises:
            InvalidRequestError: Replicas serve different models; every later request raises it too.
        """
        # On the shared loop: a replica cooled down here is probed there, not on a loop that may end.
        await get_loop_manager().arun(self._ready())

    async def _ready(self) -> None:
        if not self._checked:
            if self._check_lock is None:
                self._check_lock = asyncio.Lock()
            async with self._check_lock:
                if not self._checked:
                    await self._read_models()
                    self._checked = True
        if self._mismatch is not None:
            raise self._mismatch

    async def _read_models(self) -> None:
        replicas = self._router.replicas
        timeout = replicas.probe_timeout
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(replica_model(r.backend), timeout) for r in replicas), return_exceptions=True
        )
        models: dict[str, list[str]] = {}
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, str):
                models.setdefault(outcome, []).append(replica.label)
            elif isinstance(outcome, Exception):
                replicas.fault(replica, outcome)
            else:
                raise outcome
        if len(models) > 1:
            listing = "; ".join(f"{m}: {', '.join(labels)}" for m, labels in models.items())
            self._mismatch = InvalidRequestError(f"the pool's replicas serve different models ({listing})")
        elif models:
            self._model = next(iter(models))

    async def _verify(self, replica: Replica) -> None:
        model = await replica_model(replica.backend)
        if self._model is None:
            self._model = model
        elif model != self._model:
            raise InvalidRequestError(f"it serves {model!r}, the pool serves {self._model!r}")

    # -- RoutedBackend hooks ---------------------------------------------------------------------------

    async def _before_route(self, request: Request) -> None:
        await self._ready()

    async def _close_replicas(self) -> None:
        outcomes = await asyncio.gather(
            *(r.backend.aclose() for r in self._router.replicas), return_exceptions=True
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]


def pool(
    backends: Sequence[Any],
    *,
    routing: str = "least_loaded",
    capacities: Sequence[int | None] | None = None,
    labels: Sequence[str | None] | None = None,
    **router_options: Any,
) -> PoolBackend:
    """Put replicas of one model behind one backend (see `PoolBackend`); `aclose` closes them.

    ``replica_concurrency="adaptive"`` (a router option) gives each replica its own adaptive limit:

    ```python
    backend = ab.pool([small, large], replica_concurrency="adaptive")
    [s.limit for s in backend.replica_stats()]   # each replica's limit, near its own capacity once settled
    ```

    Called from sync code the replicas' models are read at once (on the shared loop); from a coroutine,
    before the first request (``await backend.ready()`` to do it sooner, or to check before a cached run).

    A pool refused from sync code stops its probes; the replicas, still the caller's, stay open.

    Raises:
        InvalidRequestError: Bad options, or (from sync code) replicas serving different models.
    """
    Router.check_options(routing, **router_options)  # a misspelt option: this error, not a TypeError
    backend = PoolBackend(backends, routing=routing, capacities=capacities, labels=labels, **router_options)
    manager = get_loop_manager()
    manager.track(backend)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return backend
    try:
        manager.run(backend.ready())  # sync code: check the models now, before anything is sent
    except BaseException:
        manager.run(backend.router.aclose())  # no probe outlives a pool nobody can use
        raise
    return backend
