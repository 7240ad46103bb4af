"""`Router`: the one router over replicas of one model (load, health, cool-down, failover, affinity).

A replica is any object with the backend methods (``generate``, ``loglikelihood``, optionally
``loglikelihood_rolling``): an adapter, or a proxy to a Ray actor. It may also define the readiness probe

```python
async def check_ready(self) -> None: ...   # returns when it can serve; raises a BackendError otherwise
```

(TGI's ``GET /health``, an OpenAI server's ``GET /v1/models``, a vLLM engine's liveness). Without one, the
router probes with a one-token generation.

What the router does with one attempt (`Router.call`):

- **Load**: the attempt goes to the healthy replica with the fewest requests in flight relative to its
  capacity (ties broken at random); with more than `POWER_OF_TWO_ABOVE` candidates, to the less loaded
  of two drawn at random (power of two choices). A slow replica holds its requests longer,
  so by Little's law it is sent fewer per second: in-flight counts are the speed signal, no latency
  estimate is needed.
- **Health**: a replica fault (refused or dropped connection, 5xx, 429, a timeout, a dead engine) cools the
  replica down at once: it gets no attempt until a background probe (`check_ready`, then the ``verify`` hook
  the owner gives) succeeds after the cool-down. Cool-downs double with each fault in a row (from
  ``cooldown`` up to ``max_cooldown``) and honour ``Retry-After``. Cooling down at the first fault is what
  defeats the trap of least-loaded routing, where a replica that fails fast looks idle and is sent the most.
- **Failover**: an attempt refused before anything was sent (`sent_nothing`: connection refused) goes to
  the next healthy replica inside the same attempt; any other replica fault is raised retryable while
  another replica is healthy, so `gather`'s retry goes elsewhere. With no healthy replica, an attempt waits
  up to ``wait`` seconds for one to be taken back before failing with `BackendUnavailableError`.
- **Per-replica limits** (``replica_concurrency``, or `ReplicaSet.limit_replicas` for an adaptive run):
  each replica's own adaptive limit (`asyncbackends._routing.replica_limits`); an attempt goes only to a
  replica with room under it, else waits (untimed) for the first free slot. A 429 cuts that limit instead
  of cooling the replica down, and the attempt goes at once to another replica with room, if one has.
- **Siblings together** (either routing): a loglikelihood request whose context is in flight on a candidate
  (another choice of the same question: harnesses send them together) goes to that replica, bounded by load
  as affinity is (below), so the choices of one question meet one prefix cache, and an adapter that scores a
  question in one engine request (vLLM) sees them all. Questions still spread by load: only a context in
  flight binds.
- **Adapter affinity** (either routing): a request naming a LoRA adapter goes to the least loaded replica
  that was sent that adapter lately (so holds it in its adapter slots: a vLLM engine holds ``max_loras`` and
  swaps the others in), while that replica holds at most ``affinity_slack`` times its share of the requests
  in flight; otherwise to the least loaded, which then holds it too. A replica is taken to hold the
  adapters of its last ``max_loras`` (its backend's attribute, else `ADAPTER_SLOTS`) adapter attempts. Only
  replicas that may serve the adapter are candidates: where a replica's backend lists its names
  (``adapters``), those that list it. Requests without an adapter route as before.
- **Affinity** (``routing="affinity"``): requests whose first ``affinity_chars`` characters match go to one
  replica (rendezvous hashing of that prefix), so its prefix cache serves them, while it has room: below
  its capacity, or (full, or of unknown capacity) below ``affinity_slack`` times its share of the requests
  in flight (consistent hashing with bounded loads); otherwise the next replica in the prefix's order.

Everything loop-bound (probe tasks, the wake-up future) is created lazily on the loop that calls `call`:
the shared loop, where `RoutedBackend` (`asyncbackends._routing._routed`) moves every call. `Router.aclose`
stops the probes and ends attempts waiting for a replica; closing the replicas is the owner's job. Each router
reports its replicas' state under its own `Router.name`.

A router is two parts: ``router.replicas``, its `ReplicaSet` (`asyncbackends._routing.replica_set`: the
replicas and their life, joined, cooled, probed, drained, with the health rules above), and the router itself,
which chooses one of them for each attempt and sends it.

- **Resizing**: ``router.replicas.add`` takes a replica in while runs go (routed to once its first probe
  passes); ``router.replicas.drain`` routes nothing more to one and returns once its in-flight attempts
  ended, then removes it.

A replica's state, figures and fault rules live in `asyncbackends._routing.replica`, the two ways of
choosing one in `asyncbackends._routing.choice`; this module ties them into the policy above (their public
names are importable from here as well).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._adaptive import AdaptiveConcurrency
from .._clock import attempt_timed_out, waiting_for_slot
from .._observability.observe import note_replica
from .._types import Request, Result
from ..errors import (
    BackendClosedError,
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    RateLimitedError,
)
from .choice import POWER_OF_TWO_ABOVE as POWER_OF_TWO_ABOVE
from .choice import ROUTINGS as ROUTINGS
from .choice import Routing as Routing
from .choice import adapter_home, affine, affinity_key, has_room, least_loaded, sibling_key
from .replica import ADAPTER_SLOTS as ADAPTER_SLOTS
from .replica import DRAINING, HEALTHY, REFUSED, for_retry
from .replica import Replica as Replica
from .replica import ReplicaStats as ReplicaStats
from .replica import is_replica_fault as is_replica_fault
from .replica import sent_nothing as sent_nothing
from .replica_set import ReplicaSet as ReplicaSet
from .router_options import DEFAULTS, check, replica_adaptive_settings
from .router_options import OPTIONS as OPTIONS

__all__ = ["Router"]

_ids = itertools.count(1)


class Router:
    """Routes attempts over replicas of one model; see the module docstring for the policy.

    Its replicas, their health and their life are ``replicas`` (a `ReplicaSet`); the router chooses one of
    them for each attempt (`choose`) and sends it (`call`).

    Args:
        replicas: The replica objects, or `Replica` wrappers (for labels and capacities).
        routing: ``"least_loaded"`` or ``"affinity"``.
        cooldown: Seconds of the first cool-down of a fault streak.
        max_cooldown: Longest cool-down, ``Retry-After`` included.
        wait: Seconds an attempt waits for a healthy replica when none is; then `BackendUnavailableError`.
        probe_timeout: Seconds one probe (readiness check plus ``verify``) may take.
        verify: Called by each probe after the readiness check, before a replica is taken back (the pool
            checks the model it serves): raising `InvalidRequestError` refuses the replica for good, any
            other exception counts as a failed probe.
        affinity_chars: Characters of the prompt that decide its replica under affinity routing.
        affinity_slack: Under affinity routing, a replica at or beyond its capacity (or of unknown capacity)
            takes a request while it holds fewer than this times its share of the requests in flight; under
            either routing, a replica holding a request's adapter takes it while it holds at most this times
            its share.
        seed: Seed of the tie-breaking and sampling generator.
        replica_concurrency: ``"adaptive"`` (or an `AdaptiveConcurrency`) for one adaptive limit per
            replica, moved only by that replica's answers; ``None`` (default) for none.
        name: What the router's owner is (``"pool"``, ``"ray"``); the router's `name` is this plus a number
            unique in the process, the ``pool`` attribute its replicas' state is reported under.

    Raises:
        InvalidRequestError: No replicas, an unknown routing, or a bad option.
    """

    def __init__(
        self,
        replicas: Sequence[Any],
        *,
        routing: str = "least_loaded",
        cooldown: float = 1.0,
        max_cooldown: float = 60.0,
        wait: float = 30.0,
        probe_timeout: float = 10.0,
        verify: Callable[[Replica], Awaitable[None]] | None = None,
        affinity_chars: int = 256,
        affinity_slack: float = 1.25,
        seed: int | None = None,
        replica_concurrency: str | AdaptiveConcurrency | None = None,
        name: str = "router",
    ) -> None:
        if not replicas:
            raise InvalidRequestError("a router needs at least one replica")
        tuning = (cooldown, max_cooldown, wait, probe_timeout, affinity_chars, affinity_slack, seed)
        check(routing, *tuning, replica_concurrency)
        # Each router reports its replicas under its own name: two pools never overwrite each other's gauge.
        self.name = f"{name}-{next(_ids)}"
        self.replicas = ReplicaSet(
            replicas,
            name=self.name,
            cooldown=cooldown,
            max_cooldown=max_cooldown,
            probe_timeout=probe_timeout,
            verify=verify,
        )
        self.routing = routing
        self.wait = float(wait)
        self.affinity_chars, self.affinity_slack = affinity_chars, float(affinity_slack)
        self._rng = random.Random(seed)
        # In-flight loglikelihood contexts (`sibling_key`): the replica each went to, and how many are there.
        self._siblings: dict[bytes, tuple[Replica, int]] = {}
        settings = replica_adaptive_settings(replica_concurrency)
        if settings is not None:
            self.replicas.limit_replicas(settings)

    @classmethod
    def check_options(cls, routing: str = "least_loaded", **options: Any) -> None:
        """Check router options without building a router (a backend refuses bad ones before starting).

        Args:
            routing: ``"least_loaded"`` or ``"affinity"``.
            **options: Any of ``cooldown``, ``max_cooldown``, ``wait``, ``probe_timeout``, ``affinity_chars``,
                ``affinity_slack``, ``seed``, ``replica_concurrency``.

        Raises:
            InvalidRequestError: An unknown routing or option, or a value out of range.
        """
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidRequestError(f"unknown router option(s) {unknown}; known: {', '.join(OPTIONS)}")
        check(routing, *(options.get(name, default) for name, default in DEFAULTS.items()))

    # -- routing -------------------------------------------------------------------------------------

    def choose(self, request: Request, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The replica the next attempt of ``request`` goes to; ``None`` when none is healthy (with room)."""
        return self._choose(request, exclude, sibling_key(request))

    def _choose(self, request: Request, exclude: Sequence[Replica], key: bytes | None) -> Replica | None:
        # ``key``: the request's `sibling_key`, digested once per call rather than once per look.
        candidates = [r for r in self.replicas if r.state == HEALTHY and r not in exclude]
        limits = self.replicas.limits
        if limits is not None:
            candidates = [r for r in candidates if limits.has_room(r)]
        adapter = request.adapter
        if adapter is not None and candidates:
            candidates = self._serving(adapter, candidates)
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        if key is not None and key in self._siblings:
            replica = self._siblings[key][0]
            if replica in candidates and has_room(replica, candidates, self.affinity_slack):
                return replica
        if adapter is not None:
            # Where the adapter is loaded already, bounded by load; else (new, or its replicas too full,
            # cooling or gone) the least loaded, which loads it and becomes one of its replicas.
            home = adapter_home(adapter, candidates, self.affinity_slack, self._rng)
            return home if home is not None else least_loaded(candidates, self._rng)
        if self.routing == "affinity":
            prefix = affinity_key(request, self.affinity_chars)
            if prefix is not None:
                return affine(prefix, candidates, self.affinity_slack, self._rng)
        return least_loaded(candidates, self._rng)

    def _serving(self, adapter: str, candidates: list[Replica]) -> list[Replica]:
        """The candidates that may serve ``adapter``: those whose names hold it, or that name none.

        Empty when none of them does but another replica does (the attempt waits for it, as for a healthy
        replica); all of them when no replica names it, so one refuses it with its own error (naming its
        adapters) instead of the attempt waiting for a replica that never comes.
        """
        serving = [r for r in candidates if r.serves(adapter)]
        if serving:
            return serving
        # A replica refused for good or leaving never takes the attempt: waiting for it would only time out.
        live = (r for r in self.replicas if r.state not in (REFUSED, DRAINING))
        return [] if any(r.serves(adapter) for r in live) else candidates

    # -- one attempt ---------------------------------------------------------------------------------

    async def call(self, method: str, request: Request) -> Result:
        """Send one attempt of ``request`` through ``replica.<method>(request)`` on the chosen replica.

        Args:
            method: ``"generate"``, ``"loglikelihood"`` or ``"loglikelihood_rolling"``.
            request: The request.

        Raises:
            BackendUnavailableError: No replica became healthy within ``wait`` seconds.
            BackendError: The replica's own error; a replica fault is retryable while another replica is
                healthy, so the retry goes there.
        """
        tried: list[Replica] = []
        key = sibling_key(request)
        while True:
            replica = self._choose(request, tried, key)
            if replica is None:
                replica = await self._wait_for_replica(request, tried, key)
            tried.append(replica)
            note_replica(replica.label)  # the run's observers say which replica served the attempt
            limits = self.replicas.limits
            ticket = limits.take(replica) if limits is not None else None
            outcome: BaseException | None = None  # what the replica's own limit learns from
            replica.in_flight += 1
            replica.requests += 1
            epoch = replica._epoch
            self._sibling_sent(key, replica)
            if request.adapter is not None:
                replica.hold_adapter(request.adapter)  # loaded there now: its next requests prefer it
            try:
                result: Result = await getattr(replica.backend, method)(request)
            except asyncio.CancelledError as exc:
                outcome = exc
                if attempt_timed_out():
                    # gather's per-attempt timeout: a replica that accepts requests and never answers is at
                    # fault, else it looks idle once the cancel drops its in-flight count and gets the retry.
                    replica.failures += 1
                    outcome = BackendTimeoutError("an attempt timed out on it")
                    self.replicas.fault(replica, outcome)
                raise
            except Exception as exc:
                outcome = exc
                replica.failures += 1
                if not is_replica_fault(exc):
                    raise
                if limits is not None and isinstance(exc, RateLimitedError):
                    # Its own limit takes the refusal (cut, Retry-After paused) instead of a cool-down.
                    if self._choose(request, tried, key) is not None:
                        continue  # refused at its limit: another replica with room, same attempt
                    raise
                self.replicas.fault(replica, exc)
                if sent_nothing(exc) and any(r.state == HEALTHY for r in self.replicas if r not in tried):
                    continue  # refused before anything was sent: the next replica, same attempt
                others = any(r.state not in (REFUSED, DRAINING) for r in self.replicas if r is not replica)
                error = for_retry(replica, exc, others)
                if error is exc:
                    raise
                raise error from exc
            finally:
                replica.in_flight -= 1
                if key is not None:
                    self._sibling_ended(key, replica)
                if ticket is not None and limits is not None:
                    limits.give(replica, ticket, outcome)
                self.replicas.attempt_ended(replica)
            replica.successes += 1
            if replica._epoch == epoch and replica.state == HEALTHY:
                replica._streak = 0
            return result

    def _sibling_sent(self, key: bytes | None, replica: Replica) -> None:
        if key is not None:
            held = self._siblings.get(key)
            # A sibling that had to go elsewhere (its replica full or cooling) moves the binding with it.
            count = held[1] + 1 if held is not None and held[0] is replica else 1
            self._siblings[key] = (replica, count)

    def _sibling_ended(self, key: bytes, replica: Replica) -> None:
        held = self._siblings.get(key)
        if held is None or held[0] is not replica:
            return  # the binding moved on with a later sibling: its count is the new replica's
        if held[1] <= 1:
            del self._siblings[key]
        else:
            self._siblings[key] = (replica, held[1] - 1)

    async def _wait_for_replica(self, request: Request, tried: list[Replica], key: bytes | None) -> Replica:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while True:
            replica = self._choose(request, tried, key) or (self._choose(request, (), key) if tried else None)
            if replica is not None:
                return replica
            if self.replicas.closed:
                raise BackendClosedError(
                    "the router was closed while this attempt waited for a healthy replica",
                    request_id=request.request_id,
                )
            if all(r.state == REFUSED for r in self.replicas):
                raise InvalidRequestError(
                    "every replica was refused: "
                    + "; ".join(f"{r.label}: {r.last_error}" for r in self.replicas)
                )
            limits = self.replicas.limits
            room_wait = limits.room_wait() if limits is not None else None
            if room_wait is not None:
                # Healthy replicas, each at its own limit: wait for the first free slot (or the end of a
                # Retry-After pause), untimed like any wait for a slot, then look again.
                async with waiting_for_slot():
                    await self.replicas.wait_for_change(None if room_wait == float("inf") else room_wait)
                deadline = loop.time() + self.wait
                continue
            left = deadline - loop.time()
            if left <= 0:
                errors = "; ".join(f"{r.label}: {r.last_error or r.state}" for r in self.replicas)
                raise BackendUnavailableError(
                    f"no healthy replica among {len(self.replicas)} after waiting {self.wait:g} s ({errors})",
                    request_id=request.request_id,
                )
            await self.replicas.wait_for_change(left)

    async def aclose(self) -> None:
        """Stop the replicas' probes and end attempts waiting for one (idempotent).

        The replicas themselves are the owner's to close.
        """
        await self.replicas.aclose()
