"""`RoutedBackend`: the base of every backend that sends each attempt to one of several replicas.

`PoolBackend` (replica backends in this process) and `RayBackend` (replicas as Ray actors) differ in how
their replicas are built, read and lost; everything else is here, once:

- **Routing**: each attempt goes through the backend's `Router` (load, cool-downs, probes, failover).
- **Capabilities**: a routed backend honours only what every replica does, so a request the intersection
  lacks (an optional sampling field, a token-id or chat prompt, loglikelihood, rolling loglikelihood) is
  refused with `RequestRejectedError` before anything is sent, as a single backend refuses it; which replica
  is picked never decides whether a request works. So is a request naming a LoRA adapter unless every
  replica claims ``adapters`` (`Router` then sends it only to replicas that serve that name, where they
  list their names). A loglikelihood result's ``is_greedy`` is ``None`` unless
  every replica can tell it.
- **One loop**: the router's state (in-flight counts, probe tasks, the wake-up future) lives on the shared
  loop, whichever loop a caller awaits from (``asyncio.run``, a notebook, the shared loop itself).
- **Closing**: `aclose` stops the probes and releases attempts waiting for a healthy replica; an attempt in
  flight when the backend closes ends with `BackendClosedError`, never retried.
- **Adaptive concurrency**: a run with ``concurrency="adaptive"`` (or ``ab.limited`` with it) holds its
  attempts to `_adaptive_limit`: the sum of one adaptive limit per replica, each moved only by its own
  replica's answers, so one small server's refusals never cut what the others may take.
- **Readiness**: `check_ready` returns while any replica is healthy, so a routed backend can itself be a
  replica (of a pool, say).
- **Resizing**: a subclass that resizes (the ``ray`` backend's ``aresize``) adds replicas with
  `ReplicaSet.add` (routed to once their probe passes) and removes them with `ReplicaSet.drain` (their
  in-flight attempts end first), on its router's ``replicas``; `replica_stats` shows a replica being
  removed as ``draining``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .._adaptive import AdaptiveConcurrency, ChangeReason
from .._loop import get_loop_manager
from .._protocol import BaseBackend
from .._refusals import refuse_unclaimed_adapter, refuse_unclaimed_chat, refuse_unsupported
from .._side_doors import shared
from .._types import (
    Capabilities,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
    RollingLoglikelihoodRequest,
)
from ..errors import BackendClosedError, BackendError, BackendUnavailableError, RequestRejectedError
from .replica import ReplicaStats
from .replica_limits import PoolLimit
from .router import Router

__all__ = ["RoutedBackend"]

# The capability a prompt kind needs (by `GenerationRequest.prompt_kind`), and its name in errors.
_PROMPT_CAPABILITIES = {"tokens": ("token_ids", "token-id"), "chat": ("chat", "chat")}


class RoutedBackend(BaseBackend):
    """A backend whose attempts a `Router` sends to replicas; subclasses set ``_router`` and ``capabilities``.

    Subclass hooks: `_before_route` (checks before each attempt, on the shared loop) and `_close_replicas`
    (release the replicas once the router stopped).
    """

    name = "routed"
    capabilities: Capabilities
    _router: Router

    @property
    def router(self) -> Router:
        """The router (its replicas, their state and figures)."""
        return self._router

    # -- what the replicas share (`asyncbackends.abc` side doors): AttributeError where not all have it --

    @property
    def tokenizer(self) -> Any:
        """The replicas' tokenizer (`SupportsTokenizer`), where every replica has one."""
        return shared([r.backend for r in self._router.replicas], "tokenizer")

    @property
    def max_model_len(self) -> int | None:
        """The smallest of the replicas' context lengths (`SupportsMaxModelLen`), where every one knows it."""
        length: int | None = shared([r.backend for r in self._router.replicas], "max_model_len")
        return length

    def replica_stats(self) -> list[ReplicaStats]:
        """Each replica's figures: state, in flight, requests, failures, cool-downs (see `ReplicaStats`)."""
        return self._router.replicas.stats()

    def _adaptive_limit(
        self, settings: AdaptiveConcurrency, on_change: Callable[[int, ChangeReason], None] | None = None
    ) -> PoolLimit:
        """The adaptive limit a run (or ``ab.limited``) holds this backend's attempts to.

        Per replica: each replica gets its own adaptive limit with ``settings`` (unless the backend has them
        already, from ``replica_concurrency`` or an earlier run: they stay on), moved only by its answers.
        The returned limit is their sum and learns nothing by itself, so it never fights them.

        Args:
            settings: The run's adaptive settings, used for each replica's limit when they are turned on.
            on_change: Called with ``(new_sum, reason)`` each time the sum moves.
        """
        return PoolLimit(self._router.replicas.limit_replicas(settings), on_change)

    # -- requests ------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """See `AsyncBackend.generate`: one attempt, on the replica the router picks.

        Raises:
            RequestRejectedError: The request needs something not every replica honours.
        """
        caps, rid = self.capabilities, request.request_id
        # Refused here, not by whichever replica is picked: the backend honours only what every replica does.
        refuse_unsupported(request.params, caps, backend=self.name, request_id=rid)
        refuse_unclaimed_chat(request, caps, backend=self.name)
        needed, kind = _PROMPT_CAPABILITIES.get(request.prompt_kind, (None, ""))
        if needed is not None and not getattr(caps, needed):
            raise RequestRejectedError(
                f"not every replica of this {self.name} accepts {kind} prompts",
                backend=self.name,
                request_id=rid,
            )
        result: GenerationResult = await self._route("generate", request, True)
        return result

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """See `AsyncBackend.loglikelihood`: one attempt, on the replica the router picks."""
        result: LoglikelihoodResult = await self._route(
            "loglikelihood", request, self.capabilities.loglikelihood
        )
        return self._greedy_as_promised(result)

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Rolling loglikelihood, where every replica supports it."""
        result: LoglikelihoodResult = await self._route(
            "loglikelihood_rolling", request, self.capabilities.rolling_loglikelihood
        )
        return self._greedy_as_promised(result)

    def _greedy_as_promised(self, result: LoglikelihoodResult) -> LoglikelihoodResult:
        # A replica that can tell is_greedy must not make the answer depend on which replica was picked.
        if self.capabilities.is_greedy or result.is_greedy is None:
            return result
        return dataclasses.replace(result, is_greedy=None)

    async def _route(self, method: str, request: Request, capable: bool) -> Any:
        self._check_open(request.request_id)
        # `gather` checks this too; a direct call must not reach a replica that would answer from its base.
        refuse_unclaimed_adapter(request, self.capabilities, backend=self.name)
        if not capable:
            raise RequestRejectedError(
                f"not every replica of this {self.name} supports {method}",
                backend=self.name,
                request_id=request.request_id,
            )
        # The router's state lives on the shared loop, whichever loop the caller awaits from.
        return await get_loop_manager().arun(self._attempt(method, request))

    async def _attempt(self, method: str, request: Request) -> Any:
        await self._before_route(request)
        try:
            result = await self._router.call(method, request)
        except BackendError as exc:
            if not self._closed:
                raise
            # Closed under the request: whatever the replica said (the router marks a closed replica's error
            # retryable, to fail over), the backend is gone, so the request ends here, never retried.
            raise self._closed_in_flight(request) from exc
        if self._closed:
            # An answer that came while the pool closed (the router closes first, with awaits, then the
            # replicas): a request in flight at aclose() ends in BackendClosedError, whichever came first.
            raise self._closed_in_flight(request)
        return result

    def _closed_in_flight(self, request: Request) -> BackendClosedError:
        return BackendClosedError(
            f"the {self.name} backend was closed while this request was in flight",
            backend=self.name,
            request_id=request.request_id,
        )

    async def _before_route(self, request: Request) -> None:
        """Subclass hook, awaited on the shared loop before each attempt: raise to refuse it."""

    async def check_ready(self) -> None:
        """Return while any replica is healthy (a routed backend can be a replica of a router too).

        Raises:
            BackendUnavailableError: No replica is healthy now.
        """
        self._check_open()
        if not self._router.replicas.healthy():
            raise BackendUnavailableError(f"no healthy replica in the {self.name} backend", backend=self.name)

    # -- lifetime ------------------------------------------------------------------------------------

    async def _aclose(self) -> None:
        await get_loop_manager().arun(self._close_all())

    async def _close_all(self) -> None:
        await self._router.aclose()
        await self._close_replicas()

    async def _close_replicas(self) -> None:
        """Subclass hook: release the replicas (the router's probes are stopped already)."""
