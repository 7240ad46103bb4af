"""`PoolBackend` (name ``pool``) and `pool`: one model served by several replicas, behind one backend.

```python
backend = ab.pool([ab.create_backend("tgi", url=u) for u in urls])          # routing="least_loaded"
backend = ab.create_backend("pool", replicas=[{"backend": "tgi", "url": "http://a:8080"}, ...])
backend = ab.create_backend("pool", replicas="replicas.toml")               # the same, from a file
```

Each attempt goes through `asyncbackends._wrappers.router.Router` (load, cool-downs, probes, failover,
affinity), so `gather` stays the one fan-out path: its retries, timeouts, cache and metrics work unchanged.

**One model.** Before the first request the pool reads the model each replica serves (TGI's ``/info``
``model_id``, an adapter's ``model``, else its fingerprint without addresses). Replicas reporting different
models are refused with `InvalidRequestError` and nothing is sent; a replica unreachable then is cooled down
and checked by its probe before it is taken back (serving another model, it is refused for good). The pool's
``fingerprint`` is the shared model's identity, never an address, so one response cache serves any set of
replicas of that model. Its ``capabilities`` are the replicas' common ones; ``max_concurrency`` is the sum of
their capacities when every one is known.

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

from .._capabilities import refuse_unclaimed_chat, refuse_unsupported
from .._protocol import BaseBackend
from .._types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
    RollingLoglikelihoodRequest,
)
from ..errors import (
    BackendClosedError,
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    RequestRejectedError,
)
from .pool_replicas import (
    common_capabilities,
    replica_label,
    replica_model,
    static_identity,
)
from .pool_replicas import (
    load_replicas_file as load_replicas_file,
)
from .replica import HEALTHY, Replica, ReplicaStats
from .router import Router

__all__ = ["PoolBackend", "pool"]

_POOL_KEYS = ("capacity", "label")


class PoolBackend(BaseBackend):
    """Replicas of one model behind one backend; build it with `pool` or ``create_backend("pool", ...)``.

    Args:
        replicas: The replica backends (each closed by `aclose`).
        routing: ``"least_loaded"`` (default) or ``"affinity"`` (requests sharing a prompt prefix kept on one
            replica, bounded by load).
        capacities: Requests each replica serves at once (``None`` entries take the replica's
            ``capabilities.max_concurrency``); the router balances in-flight requests relative to them.
        labels: Each replica's name in reports (default: its URL, else ``name-index``).
        **router_options: `Router` options: ``cooldown``, ``max_cooldown``, ``wait``, ``probe_timeout``,
            ``affinity_chars``, ``affinity_slack``, ``seed``.

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
        self._router = Router(wrapped, routing=routing, verify=self._verify, **router_options)
        self._model: str | None = None
        self._mismatch: InvalidRequestError | None = None
        self._checked = False
        self._check_lock: asyncio.Lock | None = None
        self._identities = sorted(
            {json.dumps(static_identity(b), sort_keys=True, default=str) for b in backends}
        )
        self.capabilities = common_capabilities(backends, [r.capacity for r in wrapped])

    @classmethod
    async def create(
        cls,
        *,
        replicas: Sequence[Mapping[str, Any] | Any] | str | os.PathLike[str],
        routing: str | None = None,
        cooldown: float | None = None,
        max_cooldown: float | None = None,
        wait: float | None = None,
        probe_timeout: float | None = None,
        affinity_chars: int | None = None,
        affinity_slack: float | None = None,
    ) -> PoolBackend:
        """Build every replica, then the pool, and check the replicas serve one model.

        ``replicas`` is a list of ``{"backend": name, **options}`` (or backend objects), or a replicas file.
        Options given here override the replicas file's.

        Raises:
            InvalidRequestError: Bad replicas, or replicas serving different models (nothing sent).
        """
        options: dict[str, Any] = {}
        if isinstance(replicas, (str, os.PathLike)):
            data = load_replicas_file(replicas)
            replicas = data.pop("replicas")
            options.update(data)
        given = dict(
            routing=routing,
            cooldown=cooldown,
            max_cooldown=max_cooldown,
            wait=wait,
            probe_timeout=probe_timeout,
            affinity_chars=affinity_chars,
            affinity_slack=affinity_slack,
        )
        options.update({k: v for k, v in given.items() if v is not None})
        unknown = set(options) - set(given)
        if unknown:
            raise InvalidRequestError(f"unknown pool option(s) in the replicas file: {sorted(unknown)}")
        if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence) or not replicas:
            raise InvalidRequestError(
                "replicas must be a non-empty list of {'backend': name, ...} or a file path"
            )
        from .._registry import acreate_backend

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
            await backend.ready()
        except BaseException:
            await asyncio.gather(*(b.aclose() for b in built), return_exceptions=True)
            raise
        return backend

    def __repr__(self) -> str:
        return f"PoolBackend({[r.label for r in self._router.replicas]!r}, routing={self.routing!r})"

    @property
    def router(self) -> Router:
        """The router (its replicas, their state and figures)."""
        return self._router

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
        return {"name": self.name, "model": self._model, "replicas": self._identities}

    def replica_stats(self) -> list[ReplicaStats]:
        """Each replica's figures: state, in flight, requests, failures, cool-downs (see `ReplicaStats`)."""
        return self._router.stats()

    # -- one model -----------------------------------------------------------------------------------

    async def ready(self) -> None:
        """Read the model of every replica once, before any request.

        An unreachable replica is cooled down (its probe checks its model before taking it back).

        Raises:
            InvalidRequestError: Replicas serve different models; every later request raises it too.
        """
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
        timeout = self._router.probe_timeout
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(replica_model(r.backend), timeout) for r in replicas), return_exceptions=True
        )
        models: dict[str, list[str]] = {}
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, str):
                models.setdefault(outcome, []).append(replica.label)
            elif isinstance(outcome, Exception):
                self._router.fault(replica, outcome)
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

    # -- requests ------------------------------------------------------------------------------------

    async def _route(self, method: str, request: Request, capable: bool) -> Any:
        self._check_open(request.request_id)
        if not capable:
            raise RequestRejectedError(
                f"not every replica of this pool supports {method}",
                backend=self.name,
                request_id=request.request_id,
            )
        await self.ready()
        try:
            return await self._router.call(method, request)
        except BackendError as exc:
            if not self._closed:
                raise
            # Closed under the request: whatever the replica said (the router marks a closed replica's error
            # retryable, to fail over), the pool is gone, so the request ends here, never retried.
            raise BackendClosedError(
                "the pool was closed while this request was in flight",
                backend=self.name,
                request_id=request.request_id,
            ) from exc

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """See `AsyncBackend.generate`: one attempt, on the replica the router picks."""
        # Refused here, not by whichever replica is picked: the pool honours only what every replica does.
        refuse_unsupported(
            request.params, self.capabilities, backend=self.name, request_id=request.request_id
        )
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name)
        result: GenerationResult = await self._route("generate", request, True)
        return result

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """See `AsyncBackend.loglikelihood`: one attempt, on the replica the router picks."""
        result: LoglikelihoodResult = await self._route(
            "loglikelihood", request, self.capabilities.loglikelihood
        )
        return result

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Rolling loglikelihood, where every replica supports it."""
        result: LoglikelihoodResult = await self._route(
            "loglikelihood_rolling", request, self.capabilities.rolling_loglikelihood
        )
        return result

    async def check_ready(self) -> None:
        """Return while any replica is healthy (a pool can be a replica of a router too).

        Raises:
            BackendUnavailableError: No replica is healthy now.
        """
        self._check_open()
        if not any(r.state == HEALTHY for r in self._router.replicas):
            raise BackendUnavailableError("no healthy replica in the pool", backend=self.name)

    async def _aclose(self) -> None:
        await self._router.aclose()
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

    Called from sync code the replicas' models are read at once (on the shared loop); from a coroutine,
    before the first request (``await backend.ready()`` to do it sooner, or to check before a cached run).

    Raises:
        InvalidRequestError: Bad options, or (from sync code) replicas serving different models.
    """
    from .._loop import get_loop_manager

    backend = PoolBackend(backends, routing=routing, capacities=capacities, labels=labels, **router_options)
    manager = get_loop_manager()
    manager.track(backend)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        manager.run(backend.ready())  # sync code: check the models now, before anything is sent
    return backend
