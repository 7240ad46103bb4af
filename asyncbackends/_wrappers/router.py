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
- **Affinity** (``routing="affinity"``): requests whose first ``affinity_chars`` characters match go to one
  replica (rendezvous hashing of that prefix), so its prefix cache serves them, while it has room: below
  its capacity, or (full, or of unknown capacity) below ``affinity_slack`` times its share of the requests
  in flight (consistent hashing with bounded loads); otherwise the next replica in the prefix's order.

Everything loop-bound (probe tasks, the wake-up future) is created lazily on the loop that calls `call`,
the shared loop under `gather`. `Router.aclose` stops the probes; closing the replicas is the owner's job.

A replica's state, figures and fault rules live in `asyncbackends._wrappers.replica`, the two ways of
choosing one in `asyncbackends._wrappers.routing`; this module ties them into the policy above (their public
names are importable from here as well).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._observability.observe import note_replica
from .._observability.telemetry import record_replica_state
from .._types import GenerationRequest, Request, Result, SamplingParams
from ..errors import BackendError, BackendUnavailableError, InvalidRequestError
from .replica import COOLING, HEALTHY, REFUSED
from .replica import Replica as Replica
from .replica import ReplicaStats as ReplicaStats
from .replica import is_replica_fault as is_replica_fault
from .replica import sent_nothing as sent_nothing
from .routing import POWER_OF_TWO_ABOVE as POWER_OF_TWO_ABOVE
from .routing import ROUTINGS as ROUTINGS
from .routing import Routing as Routing
from .routing import affine, affinity_key, least_loaded

__all__ = ["Router"]

log = logging.getLogger(__name__)

_PROBE_REQUEST = GenerationRequest("Hello", SamplingParams(max_tokens=1), request_id="asyncbackends-probe")


class Router:
    """Routes attempts over replicas of one model; see the module docstring for the policy.

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
            takes a request while it holds fewer than this times its share of the requests in flight.
        seed: Seed of the tie-breaking and sampling generator.

    Raises:
        InvalidRequestError: No replicas, or an unknown routing.
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
    ) -> None:
        if not replicas:
            raise InvalidRequestError("a router needs at least one replica")
        if routing not in ROUTINGS:
            raise InvalidRequestError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        for name, value in (("cooldown", cooldown), ("max_cooldown", max_cooldown), ("wait", wait)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise InvalidRequestError(f"{name} must be a number >= 0, got {value!r}")
        if not isinstance(probe_timeout, (int, float)) or not probe_timeout > 0:
            raise InvalidRequestError(f"probe_timeout must be a number > 0, got {probe_timeout!r}")
        if not isinstance(affinity_slack, (int, float)) or not affinity_slack >= 1:
            raise InvalidRequestError(f"affinity_slack must be a number >= 1, got {affinity_slack!r}")
        if not isinstance(affinity_chars, int) or affinity_chars < 1:
            raise InvalidRequestError(f"affinity_chars must be an int >= 1, got {affinity_chars!r}")
        self.replicas: list[Replica] = [
            r if isinstance(r, Replica) else Replica(r, label=f"replica-{i}") for i, r in enumerate(replicas)
        ]
        self.routing = routing
        self.cooldown, self.max_cooldown, self.wait = float(cooldown), float(max_cooldown), float(wait)
        self.probe_timeout = float(probe_timeout)
        self.verify = verify
        self.affinity_chars, self.affinity_slack = affinity_chars, float(affinity_slack)
        self._rng = random.Random(seed)
        self._taken_back: asyncio.Future[None] | None = None
        self._closed = False
        for replica in self.replicas:  # the asyncbackends.replica.state gauge, where OpenTelemetry is set up
            record_replica_state("pool", replica.label, replica.state)

    # -- routing -------------------------------------------------------------------------------------

    def healthy(self) -> list[Replica]:
        """The replicas that take attempts now."""
        return [r for r in self.replicas if r.state == HEALTHY]

    def choose(self, request: Request, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The replica the next attempt of ``request`` goes to, or ``None`` when none is healthy."""
        candidates = [r for r in self.replicas if r.state == HEALTHY and r not in exclude]
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        if self.routing == "affinity":
            key = affinity_key(request, self.affinity_chars)
            if key is not None:
                return affine(key, candidates, self.affinity_slack, self._rng)
        return least_loaded(candidates, self._rng)

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
        while True:
            replica = self.choose(request, tried)
            if replica is None:
                replica = await self._wait_for_replica(request, tried)
            tried.append(replica)
            note_replica(replica.label)  # the run's observers say which replica served the attempt
            replica.in_flight += 1
            replica.requests += 1
            epoch = replica._epoch
            try:
                result: Result = await getattr(replica.backend, method)(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                replica.failures += 1
                if not is_replica_fault(exc):
                    raise
                self.fault(replica, exc)
                if sent_nothing(exc) and any(r.state == HEALTHY for r in self.replicas if r not in tried):
                    continue  # refused before anything was sent: the next replica, same attempt
                error = self._for_retry(replica, exc)
                if error is exc:
                    raise
                raise error from exc
            finally:
                replica.in_flight -= 1
            replica.successes += 1
            if replica._epoch == epoch and replica.state == HEALTHY:
                replica._streak = 0
            return result

    def _for_retry(self, replica: Replica, exc: Exception) -> Exception:
        """The error to raise for a replica fault: retryable while another replica can take the retry."""
        others = any(r.state != REFUSED for r in self.replicas if r is not replica)
        if isinstance(exc, BackendError):
            if others and not exc.retryable:
                exc.retryable = True  # a dead or closed replica; the pool itself still serves
            return exc
        error = BackendError(f"replica {replica.label}: {type(exc).__name__}: {exc}", retryable=others)
        error.__cause__ = exc
        return error

    async def _wait_for_replica(self, request: Request, tried: list[Replica]) -> Replica:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while True:
            replica = self.choose(request, tried) or (self.choose(request) if tried else None)
            if replica is not None:
                return replica
            if all(r.state == REFUSED for r in self.replicas):
                raise InvalidRequestError(
                    "every replica was refused: "
                    + "; ".join(f"{r.label}: {r.last_error}" for r in self.replicas)
                )
            left = deadline - loop.time()
            if left <= 0:
                errors = "; ".join(f"{r.label}: {r.last_error or r.state}" for r in self.replicas)
                raise BackendUnavailableError(
                    f"no healthy replica among {len(self.replicas)} after waiting {self.wait:g} s ({errors})",
                    request_id=request.request_id,
                )
            if self._taken_back is None or self._taken_back.done():
                self._taken_back = loop.create_future()
            await asyncio.wait([self._taken_back], timeout=left)

    # -- health --------------------------------------------------------------------------------------

    def fault(self, replica: Replica, exc: BaseException) -> None:
        """Cool ``replica`` down for ``exc`` and start probing it (nothing if it already cools down).

        Many attempts failing together (a server gone with requests in flight) count as one fault.
        """
        if replica.state != HEALTHY or self._closed:
            return
        replica._streak += 1
        length = min(self.max_cooldown, self.cooldown * 2.0 ** (replica._streak - 1))
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(retry_after, (int, float)) and retry_after > length:
            length = min(self.max_cooldown, float(retry_after))
        replica.state = COOLING
        record_replica_state("pool", replica.label, COOLING, HEALTHY)
        replica.cooldowns += 1
        replica.cooled_until = time.monotonic() + length
        replica.last_error = f"{type(exc).__name__}: {exc}"
        log.info("replica %s cooled down for %.2f s: %s", replica.label, length, replica.last_error)
        self._start_probe(replica)

    def refuse(self, replica: Replica, reason: str) -> None:
        """Take ``replica`` out of service for good (it serves another model, say)."""
        record_replica_state("pool", replica.label, REFUSED, replica.state)
        replica.state = REFUSED
        replica.last_error = reason
        log.warning("replica %s refused: %s", replica.label, reason)
        self._wake()

    def _start_probe(self, replica: Replica) -> None:
        if replica._probe is None or replica._probe.done():
            replica._probe = asyncio.get_running_loop().create_task(self._probe(replica))

    async def _probe(self, replica: Replica) -> None:
        while not self._closed:
            await asyncio.sleep(max(0.0, replica.cooled_until - time.monotonic()))
            try:
                await asyncio.wait_for(self._check(replica), self.probe_timeout)
            except asyncio.CancelledError:
                raise
            except InvalidRequestError as exc:
                self.refuse(replica, str(exc))
                return
            except Exception as exc:
                replica._streak += 1
                length = min(self.max_cooldown, self.cooldown * 2.0 ** (replica._streak - 1))
                replica.cooled_until = time.monotonic() + length
                replica.last_error = f"probe: {type(exc).__name__}: {exc}"
                continue
            replica.state = HEALTHY
            record_replica_state("pool", replica.label, HEALTHY, COOLING)
            replica._epoch += 1
            log.info("replica %s taken back", replica.label)
            self._wake()
            return

    async def _check(self, replica: Replica) -> None:
        check = getattr(replica.backend, "check_ready", None)
        if callable(check):
            await check()
        else:
            await replica.backend.generate(_PROBE_REQUEST)
        if self.verify is not None:
            await self.verify(replica)

    def _wake(self) -> None:
        if self._taken_back is not None and not self._taken_back.done():
            self._taken_back.set_result(None)

    # -- figures and lifecycle -----------------------------------------------------------------------

    def stats(self) -> list[ReplicaStats]:
        """Every replica's figures, in replica order."""
        return [r.stats() for r in self.replicas]

    async def aclose(self) -> None:
        """Stop the background probes (idempotent). The replicas themselves are the owner's to close."""
        self._closed = True
        probes = [r._probe for r in self.replicas if r._probe is not None and not r._probe.done()]
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._wake()
