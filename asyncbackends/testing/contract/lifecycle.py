"""`LifecycleContract`: cancellation, error types, repeated runs and event loops."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pytest

from ..._gather import as_completed, gather
from ..._loop import get_loop_manager
from ..._protocol import AsyncBackend
from ..._types import (
    Capabilities,
    GenerationRequest,
    LoglikelihoodRequest,
    Request,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from ...errors import (
    AsyncBackendsError,
    BackendError,
    InvalidRequestError,
    RequestRejectedError,
)
from ._base import ContractBase, expect
from ._base import describe_error as _name
from ._inspect import foreign_loop_state

__all__ = ["LifecycleContract", "unsupported_requests"]

_REFUSALS = (InvalidRequestError, RequestRejectedError)


def unsupported_requests(caps: Capabilities, prompt: str) -> list[tuple[str, Request]]:
    """Requests for features the capabilities disclaim: an honest backend refuses each."""
    unsupported: list[tuple[str, Request]] = []
    if not caps.chat:
        unsupported.append(
            ("chat", GenerationRequest(({"role": "user", "content": prompt},), request_id="no-chat"))
        )
    if not caps.token_ids:
        unsupported.append(("token_ids", GenerationRequest((1, 2, 3), request_id="no-ids")))
    if not caps.n_samples:
        params = SamplingParams(max_tokens=4, temperature=1.0, n=3)
        unsupported.append(("n_samples", GenerationRequest(prompt, params, request_id="no-n")))
    if not caps.loglikelihood:
        unsupported.append(("loglikelihood", LoglikelihoodRequest(prompt, " x", request_id="no-ll")))
    if not caps.rolling_loglikelihood:
        unsupported.append(
            ("rolling_loglikelihood", RollingLoglikelihoodRequest(prompt, request_id="no-roll"))
        )
    return unsupported


class LifecycleContract(ContractBase):
    """Checks on everything around a request: cancelling it, failing it, closing, loops and secrets."""

    def test_backend_shape(self, backend: AsyncBackend) -> None:
        """The backend has the protocol's members, a name, capabilities, and a JSON-able fingerprint."""
        expect(isinstance(backend, AsyncBackend), f"{type(backend).__name__} lacks AsyncBackend members")
        expect(
            isinstance(backend.name, str) and bool(backend.name),
            f"name must be a non-empty str: {backend.name!r}",
        )
        caps = backend.capabilities
        expect(
            isinstance(caps, Capabilities), f"capabilities is a {type(caps).__name__}, not ab.Capabilities"
        )
        limit = caps.max_concurrency
        expect(
            limit is None or (isinstance(limit, int) and limit >= 1),
            f"capabilities.max_concurrency must be None or an int >= 1, got {limit!r}",
        )
        if hasattr(type(backend), "fingerprint") or "fingerprint" in vars(backend):
            fingerprint = backend.fingerprint  # type: ignore[attr-defined]
            expect(
                isinstance(fingerprint, Mapping),
                f"fingerprint must be a mapping, got {type(fingerprint).__name__}",
            )
            try:
                json.dumps(fingerprint, sort_keys=True)
            except TypeError as exc:
                expect(False, f"fingerprint must be JSON-able (the cache keys on it): {exc}")

    def test_cancellation_is_prompt_and_harmless(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Cancelling an in-flight request ends it promptly as a cancellation; the backend keeps working."""
        params = SamplingParams(max_tokens=self.long_max_tokens, temperature=1.0, seed=0)
        request = GenerationRequest(prompts[0], params, request_id="cancel-me")

        async def probe() -> tuple[str, Any]:
            task = asyncio.ensure_future(backend.generate(request))
            await asyncio.sleep(self.cancel_after)
            if task.done():
                return "finished early", None
            started = time.monotonic()
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=self.cancel_timeout)
            took = time.monotonic() - started
            if not done:
                await asyncio.wait([task], timeout=self.request_timeout)  # do not leave it running
                return "slow", took
            if task.cancelled():
                return "cancelled", took
            error = task.exception()
            return ("raised", error) if error is not None else ("returned", task.result())

        outcome, detail = get_loop_manager().run(probe())
        if outcome == "finished early":
            pytest.skip(
                f"a {self.long_max_tokens}-token request finished within cancel_after={self.cancel_after} s; "
                "raise long_max_tokens or lower cancel_after to check cancellation"
            )
        expect(outcome != "slow", f"a cancelled request was still running {self.cancel_timeout} s later")
        expect(
            outcome != "returned",
            "generate() swallowed the cancellation: it returned a result after its task was cancelled",
        )
        expect(
            outcome == "cancelled",
            f"cancellation must propagate as asyncio.CancelledError, but generate() raised {_name(detail)}",
        )
        follow_up = [
            GenerationRequest(p, SamplingParams(max_tokens=self.max_tokens), request_id=f"after-{i}")
            for i, p in enumerate(prompts)
        ]
        results = self.batch(backend, follow_up)
        expect(
            [r.request_id for r in results] == [r.request_id for r in follow_up],
            "after a cancellation the backend answered the wrong requests",
        )

    def test_refusals_are_library_errors(
        self, backend: AsyncBackend, prompts: Sequence[str], rejected_requests: Sequence[Request]
    ) -> None:
        """Unsupported features and the author's rejected requests raise our refusal types, nothing raw."""
        cases = [
            (f"capabilities.{name} is False", r)
            for name, r in unsupported_requests(backend.capabilities, prompts[0])
        ]
        cases += [(f"rejected_requests[{i}]", r) for i, r in enumerate(rejected_requests)]
        if not cases:
            pytest.skip("the backend claims every capability and the rejected_requests fixture is empty")
        problems = []
        for why, request in cases:
            result, error = self.outcome(backend, request)
            if error is None and result is None:
                continue  # no method for it at all: gather itself refuses the request
            if error is None:
                problems.append(f"{why}: {type(request).__name__} was answered instead of refused")
            elif not isinstance(error, _REFUSALS):
                hint = (
                    ""
                    if isinstance(error, AsyncBackendsError)
                    else " (a raw exception leaked from the adapter)"
                )
                problems.append(
                    f"{why}: expected InvalidRequestError or RequestRejectedError, got {_name(error)}{hint}"
                )
        expect(not problems, "requests the backend must refuse:\n  " + "\n  ".join(problems))

    def test_transport_failures_are_library_errors(
        self,
        failing_backend: Callable[[], AsyncBackend] | None,
        prompts: Sequence[str],
        secret: str | None,
    ) -> None:
        """A backend that cannot reach its engine raises `BackendError` subclasses, never raw exceptions."""
        if failing_backend is None:
            pytest.skip("no failing_backend fixture: give one that points at nothing to check error mapping")
        broken = failing_backend()
        try:
            requests: list[Request] = [
                GenerationRequest(prompts[0], SamplingParams(max_tokens=4), request_id="f")
            ]
            if broken.capabilities.loglikelihood:
                requests.append(LoglikelihoodRequest(prompts[0], " x", request_id="f-ll"))
            for request in requests:
                _, error = self.outcome(broken, request)
                expect(error is not None, f"the failing backend answered a {type(request).__name__}")
                assert error is not None
                expect(
                    isinstance(error, BackendError),
                    f"a failed {type(request).__name__} raised {_name(error)}: map engine and transport "
                    "errors to asyncbackends errors at the adapter boundary (raise ... from exc)",
                )
                retryable = getattr(error, "retryable", None)
                expect(isinstance(retryable, bool), f"{_name(error)} has retryable={retryable!r}")
                if secret:
                    expect(
                        secret not in f"{error!s} {error!r}", f"the secret appears in the error {type(error)}"
                    )
        finally:
            self.call(broken.aclose())

    def test_repeated_run_batch(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Batch after batch from sync code, each through a fresh `run_batch` call, gives the same answers."""
        requests = [
            GenerationRequest(p, SamplingParams(max_tokens=self.max_tokens), request_id=f"rb-{i}")
            for i, p in enumerate(prompts[:2])
        ]
        first = self.batch(backend, requests)
        for round_ in range(2):
            again = self.batch(backend, requests)
            expect(
                [r.text for r in again] == [r.text for r in first],
                f"run_batch round {round_ + 2} gave {[r.text for r in again]}, "
                f"round 1 {[r.text for r in first]}",
            )

    def test_foreign_event_loops(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """``asyncio.run(ab.gather(...))`` works again and again, and leaves the backend fine for sync use."""
        requests = [
            GenerationRequest(p, SamplingParams(max_tokens=self.max_tokens), request_id=f"fl-{i}")
            for i, p in enumerate(prompts[:2])
        ]
        reference = [r.text for r in self.batch(backend, requests)]

        async def from_another_loop() -> tuple[list[str], list[str]]:
            gathered: list[Any] = await gather(backend, requests, timeout=self.request_timeout)
            streamed: list[str] = [""] * len(requests)
            async for index, result in as_completed(backend, requests, timeout=self.request_timeout):
                streamed[index] = cast(Any, result).text  # generation requests only
            return [r.text for r in gathered], streamed

        for round_ in range(2):
            gathered, streamed = asyncio.run(from_another_loop())
            expect(
                gathered == reference and streamed == reference,
                f"from a foreign loop (asyncio.run #{round_ + 1}) gather gave {gathered} and as_completed "
                f"{streamed}; run_batch gave {reference}",
            )
        after = [r.text for r in self.batch(backend, requests)]
        expect(after == reference, f"run_batch after foreign loops gave {after}, before {reference}")

    def test_loop_bound_state_on_shared_loop(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Everything the backend holds that is bound to an event loop is bound to the shared loop."""
        self.generate(backend, prompts[0], request_id="warm-up")  # lazily created state exists from here on
        asyncio.run(gather(backend, [GenerationRequest(prompts[0], SamplingParams(max_tokens=2))]))
        shared = get_loop_manager().loop
        found = foreign_loop_state(backend, shared)
        expect(
            not found,
            "loop-bound state outside the shared loop (create it lazily, on the calling loop):\n  "
            + "\n  ".join(found),
        )
