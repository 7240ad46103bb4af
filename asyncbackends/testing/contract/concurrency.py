"""`ConcurrencyContract`: an adapter shares one event loop and one per-attempt clock with everything else.

The shared loop serves every backend of the process: an adapter that blocks it (a sync client called inside
``async def``) stalls all of them. And ``gather``'s per-attempt timeout times the request, so an adapter that
queues on slots of its own (a connection pool, engine seats) must take them with ``held_slot``, which keeps
the wait off the clock; otherwise queued requests time out before they are even sent.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ..._gather import RetryPolicy, run_batch
from ..._protocol import AsyncBackend
from ..._types import GenerationRequest, LoglikelihoodRequest, Request, SamplingParams
from ...errors import BackendTimeoutError
from ._base import ContractBase, added_in, describe_error, expect
from ._stalls import Frame, Stall, adapter_code, in_adapter, watch_loop

__all__ = ["ConcurrencyContract"]

_ROUNDS = 4
_SLOT_LIMIT = 2
_MAX_WAVES = 64
_TIMEOUT_FACTOR = 5


def _where(blamed: list[tuple[Stall, Frame]]) -> list[str]:
    places = Counter(str(frame) for _, frame in blamed)
    lines = []
    for place, count in places.most_common(3):
        stall = next(s for s, f in blamed if str(f) == place)
        lines.append(f"{count} x {place}")
        innermost = stall.stack[-1] if stall.stack else None
        if innermost is not None and str(innermost) != place:
            lines.append(f"      blocked in {innermost}")
    return lines


class ConcurrencyContract(ContractBase):
    """Sharing the loop and the clock: no blocking calls; no timing of the adapter's own queues."""

    @added_in(2)
    def test_does_not_block_the_event_loop(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """While the adapter serves a batch, the shared loop never stalls inside the adapter's code."""
        requests: list[Request] = [
            GenerationRequest(
                prompts[i % len(prompts)], SamplingParams(max_tokens=self.max_tokens), request_id=f"loop-{i}"
            )
            for i in range(2 * self.concurrency)
        ]
        if backend.capabilities.loglikelihood:
            requests += [
                LoglikelihoodRequest(prompts[i % len(prompts)], " the end", request_id=f"loop-ll-{i}")
                for i in range(self.concurrency // 2)
            ]
        self.batch(backend, requests[: self.concurrency])  # lazy set-up (imports, sessions) is not counted
        threshold = self.loop_stall_threshold
        with watch_loop(threshold) as watch:
            # Separate rounds: a blocking adapter stalls the loop in each, however its calls bunch up.
            for _ in range(_ROUNDS):
                self.batch(backend, requests, concurrency=self.concurrency)
        codes, files = adapter_code(backend)
        blamed = [
            (stall, frame) for stall in watch.stalls if (frame := in_adapter(stall.stack, codes, files))
        ]
        if len(blamed) <= self.loop_stalls_allowed:
            return
        seconds = sorted((stall.seconds for stall, _ in blamed), reverse=True)
        shown = ", ".join(f"{s:.2f}" for s in seconds[:6]) + (", ..." if len(seconds) > 6 else "")
        expect(
            False,
            f"the shared event loop stalled {len(blamed)} times for more than loop_stall_threshold="
            f"{threshold} s inside the adapter while it served {_ROUNDS} x {len(requests)} requests "
            f"({shown} s; {sum(seconds):.2f} s in all): every other backend and the whole run stood still "
            "meanwhile. Where the loop thread was, sampled mid-stall:\n  "
            + "\n  ".join(_where(blamed))
            + "\nnever block in an async method: await an async client (aiohttp, httpx.AsyncClient), or move "
            "blocking and CPU-heavy work off the loop (await asyncio.to_thread(...)). Only stalls over the "
            f"threshold with the loop thread in your adapter's code count, and {self.loop_stalls_allowed} "
            "are forgiven, so a loaded machine does not trip this",
        )

    @added_in(2)
    def test_timeout_excludes_waiting_for_a_slot(
        self, make_slot_limited_backend: Callable[[int], AsyncBackend] | None, prompts: Sequence[str]
    ) -> None:
        """A per-attempt timeout times the request, not the wait for a slot the adapter itself queues on."""
        if make_slot_limited_backend is None:
            pytest.skip(
                "no make_slot_limited_backend fixture: give `lambda limit: <a fresh backend holding at most "
                "limit requests at once>` (e.g. max_connections=limit) to check that the adapter's own "
                "queue is not timed"
            )
        limited = make_slot_limited_backend(_SLOT_LIMIT)
        try:

            def request(i: int) -> GenerationRequest:
                return GenerationRequest(
                    prompts[i % len(prompts)],
                    SamplingParams(max_tokens=self.max_tokens),
                    request_id=f"slot-{i}",
                )

            self.batch(limited, [request(0)])  # lazy set-up is not a request's service time

            async def timed(one: GenerationRequest) -> float:
                started = time.monotonic()
                await limited.generate(one)
                return time.monotonic() - started

            service = statistics.median(self.call(timed(request(i))) for i in range(3))
            timeout = max(_TIMEOUT_FACTOR * service, 0.25)
            waves = math.ceil(3 * timeout / service) + 1 if service > 0 else _MAX_WAVES + 1
            if waves > _MAX_WAVES:
                pytest.skip(
                    f"one request takes {service:.4f} s: too quick to tell a wait for one of {_SLOT_LIMIT} "
                    f"slots from the request within {_MAX_WAVES} waves; make requests slower (max_tokens, "
                    "a look-alike server's latency)"
                )
            count = _SLOT_LIMIT * waves
            outcomes: list[Any] = run_batch(
                limited,
                [request(i) for i in range(count)],
                concurrency=count,
                retry=RetryPolicy(max_attempts=1),
                timeout=timeout,
                return_exceptions=True,
            )
        finally:
            self.call(limited.aclose())
        timed_out = [o for o in outcomes if isinstance(o, BackendTimeoutError)]
        failed = [
            o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, BackendTimeoutError)
        ]
        expect(
            not failed,
            f"{len(failed)} of {count} requests sent at once to a backend with {_SLOT_LIMIT} slots failed: "
            + "; ".join(sorted({describe_error(e) for e in failed})[:3]),
        )
        forgiven = count // 4
        expect(
            len(timed_out) <= forgiven,
            f"with the adapter's own limit of {_SLOT_LIMIT} slots, {count} requests sent at once with a "
            f"per-attempt timeout of {timeout:.2f} s ({timeout / service:.0f}x one request's "
            f"{service:.3f} s): "
            f"{len(timed_out)} timed out. The queued ones ran out of time while waiting for a slot, before "
            "being sent: the timeout must measure the request, not that wait. Take the slot with "
            "`async with held_slot(semaphore)` (asyncbackends._clock; a semaphore sized like your pool, "
            "around the request): the wait is then not timed. (A correct adapter times out none here; "
            f"up to {forgiven} are forgiven for a loaded machine)",
        )
