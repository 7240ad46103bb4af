"""`ReplicaSet`: the replicas a router routes over, and each one's life: joined, cooled, probed, drained.

A `Router` (`asyncbackends._routing.router`) holds one as its ``replicas`` and chooses among them; what
happens to a replica between attempts lives here:

- **Membership**: the set reads as a sequence of `Replica` (``router.replicas[0]``, ``for r in
  router.replicas``), in the order they joined.
- **Health**: `ReplicaSet.fault` cools a replica down and starts its background probe (``check_ready``, then
  the owner's ``verify``); a probe that passes takes it back; `ReplicaSet.refuse` takes it out for good.
- **Joining**: `ReplicaSet.add` takes a new replica in while runs go. It joins ``cooling`` (``last_error``
  says ``joining``) and gets its first probe at once: it is routed to once that probe passes, never before,
  so a replica still starting takes no attempt; `ReplicaSet.taken_in` waits for that. Labels are unique over
  the set's whole life: a label once used (even by a replica removed since) is refused.
- **Draining**: `ReplicaSet.drain` takes a replica out of routing (state ``draining``: no new attempt goes
  to it, no probe takes it back) and returns once its in-flight attempts have ended, answered, then removes
  it. Its requests are neither cut nor resent: the caller (the ``ray`` backend's ``resize``) stops it
  afterwards.
- **Per-replica limits**: `ReplicaSet.limit_replicas` gives each replica its own adaptive limit
  (`asyncbackends._routing.replica_limits`), a replica added later included.
- **Wake-ups**: one future that attempts waiting for a replica (or for room, or a drain) wait on
  (`ReplicaSet.wait_for_change`), set by each change that may let them go on.

Everything loop-bound (probe tasks, the wake-up future) is created lazily on the loop that uses it: the
shared loop, where `RoutedBackend` moves every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, overload

from .._adaptive import AdaptiveConcurrency
from .._observability.telemetry import record_replica_state
from .._types import GenerationRequest, SamplingParams
from ..errors import BackendUnavailableError, InvalidRequestError
from .replica import COOLING, DRAINING, HEALTHY, REFUSED, REMOVED, Replica, ReplicaStats
from .replica_limits import ReplicaLimits

__all__ = ["ReplicaSet"]

# The router's logger: a user's log settings for routing cover the replicas' joins, faults and drains too.
log = logging.getLogger("asyncbackends._routing.router")

_PROBE_REQUEST = GenerationRequest("Hello", SamplingParams(max_tokens=1), request_id="asyncbackends-probe")


class ReplicaSet(Sequence[Replica]):
    """The replicas of one router and their state changes; see the module docstring.

    `Router` builds one from its options, after checking them (`Router.check_options`).

    Args:
        replicas: The replica objects, or `Replica` wrappers (for labels and capacities).
        name: The name its replicas' state is reported under (the router's `Router.name`).
        cooldown: Seconds of the first cool-down of a fault streak.
        max_cooldown: Longest cool-down, ``Retry-After`` included.
        probe_timeout: Seconds one probe (readiness check plus ``verify``) may take.
        verify: Called by each probe after the readiness check, before a replica is taken back: raising
            `InvalidRequestError` refuses the replica for good, any other exception counts as a failed probe.
    """

    def __init__(
        self,
        replicas: Sequence[Any],
        *,
        name: str,
        cooldown: float = 1.0,
        max_cooldown: float = 60.0,
        probe_timeout: float = 10.0,
        verify: Callable[[Replica], Awaitable[None]] | None = None,
    ) -> None:
        self._replicas = [
            r if isinstance(r, Replica) else Replica(r, label=f"replica-{i}") for i, r in enumerate(replicas)
        ]
        self._labels = {r.label for r in self._replicas}
        self.name = name
        self.cooldown, self.max_cooldown = float(cooldown), float(max_cooldown)
        self.probe_timeout = float(probe_timeout)
        self.verify = verify
        self.limits: ReplicaLimits | None = None
        self._taken_back: asyncio.Future[None] | None = None
        self._closed = False
        for replica in self._replicas:  # the asyncbackends.replica.state gauge, where OpenTelemetry is set up
            record_replica_state(self.name, replica.label, replica.state)

    # -- the sequence ---------------------------------------------------------------------------------

    @overload
    def __getitem__(self, index: int) -> Replica: ...

    @overload
    def __getitem__(self, index: slice) -> list[Replica]: ...

    def __getitem__(self, index: int | slice) -> Replica | list[Replica]:
        return self._replicas[index]

    def __len__(self) -> int:
        return len(self._replicas)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._replicas)

    def __contains__(self, replica: object) -> bool:
        return replica in self._replicas

    def __repr__(self) -> str:
        return f"ReplicaSet({self.name!r}, {self._replicas!r})"

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called: no probe runs, no replica joins, waits end."""
        return self._closed

    def healthy(self) -> list[Replica]:
        """The replicas that take attempts now."""
        return [r for r in self._replicas if r.state == HEALTHY]

    def limit_replicas(self, settings: AdaptiveConcurrency) -> ReplicaLimits:
        """Give every replica its own adaptive limit with ``settings``; the limits it has already, if any.

        Once on, the limits stay: what they learned is each server's capacity, which the next run needs too.
        """
        if self.limits is None:
            self.limits = ReplicaLimits(settings, self, self.name, self.wake)
        return self.limits

    # -- membership ----------------------------------------------------------------------------------

    def add(self, backend: Any, *, label: str | None = None, capacity: int | None = None) -> Replica:
        """Take a new replica in while runs go; it is routed to once its first probe passes.

        Call it on the router's loop (the shared loop). With per-replica limits on, it gets its own.

        Args:
            backend: The replica object, or a `Replica` wrapper (then ``label`` and ``capacity`` are its).
            label: Its name in reports; by default ``replica-<n>``, ``n`` one past the highest used.
            capacity: Requests it serves at once, for load ratios.

        Raises:
            InvalidRequestError: The label was used already by this router, or the router is closed.
        """
        if self._closed:
            raise InvalidRequestError("a closed router takes no new replica")
        if isinstance(backend, Replica):
            replica = backend
        else:
            if label is None:
                n = len(self._labels)
                while f"replica-{n}" in self._labels:
                    n += 1
                label = f"replica-{n}"
            replica = Replica(backend, label=label, capacity=capacity)
        if replica.label in self._labels:
            raise InvalidRequestError(f"replica label {replica.label!r} is used already in {self.name}")
        self._labels.add(replica.label)
        replica.state = COOLING  # out of routing until its first probe passes
        replica._taken_in = False
        replica.last_error = "joining: waiting for its first probe"
        replica.cooled_until = 0.0
        self._replicas.append(replica)
        record_replica_state(self.name, replica.label, COOLING)
        if self.limits is not None:
            self.limits.add(replica)
        log.info("replica %s joins %s; taken into routing once its probe passes", replica.label, self.name)
        self._start_probe(replica)
        return replica

    async def taken_in(self, *replicas: Replica, timeout: float | None = None) -> None:
        """Wait until every replica given to `add` is routed to (its probe passed).

        The first one that cannot be ends the wait at once.

        Args:
            replicas: Replicas returned by `add`.
            timeout: Seconds to wait at most; ``None`` waits as long as their probes keep failing.

        Raises:
            BackendUnavailableError: One was refused (its ``verify`` failed for good) or drained, the router
                closed, or one was not taken in within ``timeout`` (it stays in the set, still probed: the
                caller decides whether to drain it).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = list(replicas)
        # One taken in and cooled since (its first requests met a 503, say) counts: it joined, and its probe
        # brings it back as for any replica.
        while waiting := [r for r in waiting if not r._taken_in]:
            for replica in waiting:
                if replica.state != COOLING or self._closed:
                    raise BackendUnavailableError(
                        f"replica {replica.label} was not taken in ({replica.state}: {replica.last_error})"
                    )
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                first = waiting[0]
                raise BackendUnavailableError(
                    f"replica {first.label} was not taken in within {timeout:g} s ({first.last_error})"
                )
            await self.wait_for_change(left)

    async def drain(self, replica: Replica) -> None:
        """Route nothing more to ``replica``, wait for its in-flight attempts to end, then remove it.

        Its attempts end as they would have (answered, or failed over if it is lost meanwhile); none is
        cut. Idempotent; ends early (removing it) if the router is closed meanwhile.

        Raises:
            InvalidRequestError: ``replica`` is not one of this router's.
        """
        if replica not in self._replicas:
            raise InvalidRequestError(f"replica {replica.label} is not in {self.name}")
        if replica.state != DRAINING:
            record_replica_state(self.name, replica.label, DRAINING, replica.state)
            replica.state = DRAINING
            log.info("replica %s draining: %d in flight", replica.label, replica.in_flight)
            if replica._probe is not None and not replica._probe.done():
                replica._probe.cancel()  # a draining replica is never taken back
        while replica.in_flight and not self._closed:
            await self.wait_for_change(None)
        if replica in self._replicas:
            self._replicas.remove(replica)
            record_replica_state(self.name, replica.label, REMOVED, DRAINING)
            log.info("replica %s drained and removed from %s", replica.label, self.name)
        self.wake()

    def attempt_ended(self, replica: Replica) -> None:
        """Called by the router as each attempt on ``replica`` ends: a drain waits for the last one."""
        if replica.state == DRAINING and not replica.in_flight:
            self.wake()

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
        record_replica_state(self.name, replica.label, COOLING, HEALTHY)
        replica.cooldowns += 1
        replica.cooled_until = time.monotonic() + length
        replica.last_error = f"{type(exc).__name__}: {exc}"
        log.info("replica %s cooled down for %.2f s: %s", replica.label, length, replica.last_error)
        self._start_probe(replica)

    def refuse(self, replica: Replica, reason: str) -> None:
        """Take ``replica`` out of service for good (it serves another model, say); one draining stays so."""
        replica.last_error = reason
        if replica.state != DRAINING:
            record_replica_state(self.name, replica.label, REFUSED, replica.state)
            replica.state = REFUSED
        log.warning("replica %s refused: %s", replica.label, reason)
        self.wake()

    def _start_probe(self, replica: Replica) -> None:
        if replica._probe is None or replica._probe.done():
            replica._probe = asyncio.get_running_loop().create_task(self._probe(replica))

    async def _probe(self, replica: Replica) -> None:
        while not self._closed and replica.state == COOLING:
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
            if replica.state != COOLING:
                return  # drained or refused while the probe ran
            replica.state = HEALTHY
            replica._taken_in = True
            record_replica_state(self.name, replica.label, HEALTHY, COOLING)
            replica._epoch += 1
            log.info("replica %s taken back", replica.label)
            self.wake()
            return

    async def _check(self, replica: Replica) -> None:
        check = getattr(replica.backend, "check_ready", None)
        if callable(check):
            await check()
        else:
            await replica.backend.generate(_PROBE_REQUEST)
        if self.verify is not None:
            await self.verify(replica)

    # -- wake-ups ------------------------------------------------------------------------------------

    async def wait_for_change(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for a replica taken back, refused or drained, or a slot freed."""
        if self._taken_back is None or self._taken_back.done():
            self._taken_back = asyncio.get_running_loop().create_future()
        await asyncio.wait([self._taken_back], timeout=timeout)

    def wake(self) -> None:
        """Let every attempt waiting in `wait_for_change` look again."""
        if self._taken_back is not None and not self._taken_back.done():
            self._taken_back.set_result(None)

    # -- figures and lifecycle -----------------------------------------------------------------------

    def stats(self) -> list[ReplicaStats]:
        """Every replica's figures, in replica order (a draining one until it is removed)."""
        return [r.stats() for r in self._replicas]

    async def aclose(self) -> None:
        """Stop the background probes (idempotent). The replicas themselves are the owner's to close."""
        self._closed = True
        probes = [r._probe for r in self._replicas if r._probe is not None and not r._probe.done()]
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.wake()
