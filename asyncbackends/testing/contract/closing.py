"""`ClosingContract`: ``aclose()`` is idempotent, final, and ends the requests in flight, promptly.

After ``aclose()`` nothing may come back as a success or as a retryable error (``gather`` would retry it on a
closed backend), and nothing may be re-opened: a session or socket created by a request that was already in
flight outlives the backend and leaks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ..._loop import get_loop_manager
from ..._protocol import AsyncBackend
from ..._types import GenerationRequest, LoglikelihoodRequest, Request, SamplingParams
from ...errors import BackendClosedError, BackendError
from ._base import ContractBase, added_in, describe_error, expect
from ._inspect import open_resources

__all__ = ["ClosingContract"]

_IN_FLIGHT = 3


def _verdict(request_id: str, task: asyncio.Future[Any]) -> str | None:
    """What is wrong with how one in-flight request ended, or ``None`` if it ended as it must."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is None:
        return (
            f"{request_id} came back as a result after aclose(): a request in flight when aclose() starts "
            "must end in BackendClosedError (or be cancelled)"
        )
    if isinstance(error, BackendClosedError) and error.retryable is False:
        return None
    if isinstance(error, BackendError) and error.retryable:
        return (
            f"{request_id} raised {describe_error(error)} with retryable=True: gather would retry it on a "
            "closed backend; raise BackendClosedError for requests cut off by aclose()"
        )
    return f"{request_id} raised {describe_error(error)}: expected BackendClosedError or cancellation"


class ClosingContract(ContractBase):
    """Closing a backend: idempotent, final, and prompt for the requests it cuts off."""

    def test_aclose_idempotent_then_closed(
        self, make_backend: Callable[[], AsyncBackend] | None, prompts: Sequence[str]
    ) -> None:
        """``aclose()`` may be called again and again; any request after it raises `BackendClosedError`."""
        if make_backend is None:
            pytest.skip("no make_backend fixture: give one that builds a fresh backend to check aclose()")
        for used in (True, False):
            fresh = make_backend()
            if used:
                self.generate(fresh, prompts[0], request_id="before-close")

            async def close_repeatedly(backend: AsyncBackend = fresh) -> None:
                await asyncio.gather(backend.aclose(), backend.aclose())
                await backend.aclose()

            self.call(close_repeatedly())
            when = "after being used" if used else "before any request"
            requests: list[Request] = [GenerationRequest(prompts[0], request_id="after-close")]
            if fresh.capabilities.loglikelihood:
                requests.append(LoglikelihoodRequest(prompts[0], " x", request_id="after-close-ll"))
            for request in requests:
                _, error = self.outcome(fresh, request)
                expect(
                    isinstance(error, BackendClosedError),
                    f"{type(request).__name__} on a backend closed {when}: expected BackendClosedError, got "
                    + (describe_error(error) if error is not None else "a result"),
                )
            with pytest.raises(BackendClosedError):
                self.batch(fresh, requests[:1])

    @added_in(2)
    def test_aclose_ends_requests_in_flight(
        self, make_backend: Callable[[], AsyncBackend] | None, prompts: Sequence[str]
    ) -> None:
        """Requests in flight during ``aclose()`` end promptly in `BackendClosedError` or cancellation."""
        if make_backend is None:
            pytest.skip("no make_backend fixture: give one that builds a fresh backend to check aclose()")
        fresh = make_backend()
        self.generate(fresh, prompts[0], request_id="before-close")  # sessions and engines exist from here
        params = SamplingParams(max_tokens=self.long_max_tokens, temperature=1.0, seed=0)
        requests = [
            GenerationRequest(prompts[i % len(prompts)], params, request_id=f"in-flight-{i}")
            for i in range(_IN_FLIGHT)
        ]

        async def probe() -> tuple[str, list[str], float]:
            tasks = [asyncio.ensure_future(fresh.generate(r)) for r in requests]
            await asyncio.sleep(self.cancel_after)
            if any(task.done() for task in tasks):
                await fresh.aclose()
                await asyncio.wait(tasks, timeout=self.request_timeout)
                return "finished early", [], 0.0
            started = time.monotonic()
            await asyncio.wait_for(fresh.aclose(), self.request_timeout)
            took = time.monotonic() - started
            _, running = await asyncio.wait(tasks, timeout=self.cancel_timeout)
            problems = [
                f"{r.request_id} was still running {self.cancel_timeout} s after aclose() returned"
                for r, task in zip(requests, tasks, strict=True)
                if task in running
            ]
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running, timeout=self.request_timeout)
            problems += [
                problem
                for r, task in zip(requests, tasks, strict=True)
                if task not in running and (problem := _verdict(str(r.request_id), task)) is not None
            ]
            return "closed", problems, took

        state, problems, took = get_loop_manager().run(probe())
        if state == "finished early":
            pytest.skip(
                f"a {self.long_max_tokens}-token request finished within cancel_after={self.cancel_after} s; "
                "raise long_max_tokens or lower cancel_after to check requests in flight at aclose()"
            )
        left_open = open_resources(fresh)
        if left_open:
            problems.append(
                "after aclose() and the requests in flight ended: "
                + "; ".join(left_open)
                + " (a request in flight re-opened it: check the closed state after each await)"
            )
        _, after = self.outcome(fresh, GenerationRequest(prompts[0], request_id="after-in-flight"))
        if not isinstance(after, BackendClosedError):
            got = describe_error(after) if after is not None else "a result"
            problems.append(f"a request after that: expected BackendClosedError, got {got}")
        expect(
            not problems,
            f"{_IN_FLIGHT} requests in flight when aclose() was called (it took {took:.2f} s):\n  "
            + "\n  ".join(problems),
        )
