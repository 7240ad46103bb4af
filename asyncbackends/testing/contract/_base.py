"""What every contract mixin shares: the fixtures an author overrides, the knobs, helpers, the override guard.

Contract checks fail through `expect` (``pytest.fail``), not ``assert``: the suite ships in the wheel, where
pytest does not rewrite assertions and ``python -O`` would strip them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

import pytest

from ..._gather import RetryPolicy, run_batch
from ..._loop import get_loop_manager
from ..._protocol import AsyncBackend
from ..._types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    Request,
    RollingLoglikelihoodRequest,
    SamplingParams,
)

__all__ = [
    "CONTRACT_VERSION",
    "GUARD_TEST",
    "ContractBase",
    "added_in",
    "contract_tests",
    "expect",
    "is_contract_class",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

CONTRACT_VERSION = 3
"""The suite's version: raised by one whenever a contract test is added or made stricter.

Pin it (``contract_version = 1`` on your test class) to run only the contracts of that version and older:
newer ones skip, naming the version that added them, so a library upgrade cannot turn your CI red before you
choose to meet its new contracts.
"""

GUARD_TEST = "test_no_overrides_DO_NOT_OVERRIDE"
_CONTRACT_PACKAGE = __name__.rpartition(".")[0]


def expect(condition: bool, message: str) -> None:
    """Fail the current contract test with ``message`` unless ``condition`` holds."""
    if not condition:
        pytest.fail(message, pytrace=False)


def is_contract_class(cls: type) -> bool:
    """Whether ``cls`` is one of the suite's own classes (not an author's subclass)."""
    return cls.__module__ == _CONTRACT_PACKAGE or cls.__module__.startswith(_CONTRACT_PACKAGE + ".")


def contract_tests(cls: type) -> dict[str, type]:
    """Every contract test ``cls`` inherits, mapped to the suite class that defines it."""
    tests: dict[str, type] = {}
    for klass in reversed(cls.__mro__):
        if is_contract_class(klass):
            tests.update({name: klass for name in vars(klass) if name.startswith("test_")})
    return tests


def added_in(version: int) -> Callable[[F], F]:
    """Mark a contract test as added (or made stricter) in suite version ``version``."""

    def mark(test: F) -> F:
        test.__contract_version__ = version  # type: ignore[attr-defined]
        return test

    return mark


def version_of_test(cls: type, name: str) -> int:
    """The suite version that added contract test ``name`` (1 for the first suite's tests)."""
    owner = contract_tests(cls).get(name)
    test = vars(owner).get(name) if owner is not None else None
    return int(getattr(test, "__contract_version__", 1))


def _xfail_reason(function: object) -> str | None:
    for mark in getattr(function, "pytestmark", ()):
        if getattr(mark, "name", None) == "xfail":
            reason = mark.kwargs.get("reason") or (mark.args[1] if len(mark.args) > 1 else None)
            if isinstance(reason, str) and reason.strip():
                return reason
    return None


def describe_error(error: BaseException) -> str:
    """``module.Type: message``: enough to tell a raw exception from one of the library's."""
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}: {error}"


def request_method(backend: Any, request: Request) -> Callable[[Any], Coroutine[Any, Any, Any]] | None:
    """The backend's method for ``request`` (``generate``, ``loglikelihood``...), or ``None``."""
    name = {
        GenerationRequest: "generate",
        LoglikelihoodRequest: "loglikelihood",
        RollingLoglikelihoodRequest: "loglikelihood_rolling",
    }[type(request)]
    return getattr(backend, name, None)


def close_enough(a: float, b: float, tolerance: float) -> bool:
    """Equal within ``tolerance``, absolute and relative (batched and single scores differ a little)."""
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


class ContractBase:
    """Fixtures and knobs shared by every contract mixin.

    Fixtures to override (plain ``@pytest.fixture`` methods; give them the scope your backend needs):

    - ``backend`` (required): the backend under test. Never closed by the suite, so a ``class`` or
      ``session`` scoped fixture can share one expensive engine.
    - ``make_backend``: a zero-argument callable building a *fresh* backend (``lambda:
      ab.create_backend(...)``), or ``None`` (default) to skip the tests that close a backend.
    - ``failing_backend``: a callable building a backend whose every request fails in its transport or
      engine (a server URL on a closed port), or ``None`` (default) to skip that check.
    - ``rejected_requests``: requests your backend must refuse (a prompt longer than its context, a token id
      outside its vocabulary); each must raise `InvalidRequestError` or `RequestRejectedError`.
    - ``secret``: a credential the backend was built with, which must appear in no repr, fingerprint or
      error; ``None`` (default) checks only the `Secret` objects the backend holds.
    - ``prompts``: short text prompts the generation checks use.
    - ``token_prompt``: a token-id prompt valid for your model (used when ``capabilities.token_ids``).
    - ``decode``: token ids to text (``tokenizer.decode(ids, skip_special_tokens=True)``), or ``None``;
      given, each greedy completion's text must equal the decoding of its token ids.
    - ``make_slot_limited_backend``: for adapters that queue on slots of their own (a connection pool, engine
      seats): a callable ``limit -> backend`` building a fresh backend holding at most ``limit`` requests at
      once (``lambda limit: ab.create_backend("tgi", url=..., max_connections=limit)``), or ``None``
      (default) to skip the timeout-semantics check.

    Knobs (class attributes): ``max_tokens``, ``long_max_tokens``, ``concurrency``, ``cancel_after``,
    ``cancel_timeout``, ``request_timeout``, ``score_tolerance``, ``greedy_batch_invariant``,
    ``loop_stall_threshold``, ``loop_stalls_allowed``, ``varied_samples``, ``contract_version``.
    """

    max_tokens: ClassVar[int] = 8
    """Tokens generated by most checks: keep generation cheap on a CPU engine."""
    long_max_tokens: ClassVar[int] = 256
    """Tokens asked of the request the cancellation check cancels (it must still be running then)."""
    concurrency: ClassVar[int] = 8
    """Requests sent at once by the ordering checks."""
    cancel_after: ClassVar[float] = 0.05
    """Seconds a request runs before the cancellation check cancels it."""
    cancel_timeout: ClassVar[float] = 5.0
    """Seconds a cancelled request may take to end: "promptly"."""
    request_timeout: ClassVar[float] = 120.0
    """Seconds any one call may take before the check fails instead of hanging."""
    score_tolerance: ClassVar[float] = 1e-3
    """Absolute and relative tolerance between loglikelihoods that must agree."""
    greedy_batch_invariant: ClassVar[bool] = True
    """Whether greedy output is the same batched and alone (set False where batching changes numerics)."""
    loop_stall_threshold: ClassVar[float] = 0.1
    """Seconds the shared loop may stall inside the adapter before the stall counts against it."""
    loop_stalls_allowed: ClassVar[int] = 2
    """Stalls over the threshold tolerated per probe batch (a loaded machine preempts the loop thread)."""
    varied_samples: ClassVar[int] = 6
    """Samples asked per prompt at temperature 1 by the check that samples are not copies of one."""
    contract_version: ClassVar[int | None] = None
    """Run only the contract tests of this suite version and older (`CONTRACT_VERSION`); None runs all."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not is_contract_class(cls) and GUARD_TEST in vars(cls):
            raise TypeError(
                f"{cls.__qualname__} overrides {GUARD_TEST}, which guards the contract suite itself"
            )

    @pytest.fixture(autouse=True)
    def _contract_version_pin(self, request: pytest.FixtureRequest) -> None:
        pinned = self.contract_version
        if pinned is None:
            return
        added = version_of_test(type(self), request.node.originalname)
        if added > pinned:
            pytest.skip(
                f"added in contract version {added}; this class pins contract_version = {pinned} "
                f"(the suite is at {CONTRACT_VERSION}: raise the pin to run it)"
            )

    # -- fixtures the author overrides -------------------------------------------------------------------

    @pytest.fixture
    def backend(self) -> AsyncBackend:
        """The backend under test: override this fixture."""
        pytest.fail(
            f"{type(self).__qualname__} must override the `backend` fixture to return the backend under test",
            pytrace=False,
        )

    @pytest.fixture
    def make_backend(self) -> Callable[[], AsyncBackend] | None:
        """Builds a fresh backend for the checks that close one; ``None`` skips them."""
        return None

    @pytest.fixture
    def failing_backend(self) -> Callable[[], AsyncBackend] | None:
        """Builds a backend whose requests fail at the transport or engine; ``None`` skips that check."""
        return None

    @pytest.fixture
    def make_slot_limited_backend(self) -> Callable[[int], AsyncBackend] | None:
        """Builds a fresh backend holding at most ``limit`` requests at once; ``None`` skips that check."""
        return None

    @pytest.fixture
    def rejected_requests(self) -> Sequence[Request]:
        """Requests the backend must refuse with `InvalidRequestError` or `RequestRejectedError`."""
        return ()

    @pytest.fixture
    def secret(self) -> str | None:
        """A credential that must never show in a repr, a fingerprint or an error message."""
        return None

    @pytest.fixture
    def prompts(self) -> Sequence[str]:
        """Short text prompts for the generation checks."""
        return ("The capital of France is", "Once upon a time, there was", "def fibonacci(n):", "1, 2, 3, 4,")

    @pytest.fixture
    def token_prompt(self) -> tuple[int, ...]:
        """A token-id prompt valid for the backend's model."""
        return (10, 20, 30, 40, 50)

    @pytest.fixture
    def decode(self) -> Callable[[Sequence[int]], str] | None:
        """Token ids to text, where the test knows the tokenizer; ``None`` skips the exact check."""
        return None

    # -- helpers -------------------------------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one adapter call on the shared loop, as `gather` would, failing after ``request_timeout``."""

        async def bounded() -> T:
            try:
                return await asyncio.wait_for(coro, self.request_timeout)
            except TimeoutError:
                pytest.fail(
                    f"the call took longer than request_timeout={self.request_timeout} s", pytrace=False
                )

        return get_loop_manager().run(bounded())

    def outcome(self, backend: AsyncBackend, request: Request) -> tuple[Any, BaseException | None]:
        """``(result, None)`` or ``(None, exception)`` of one direct call; ``(None, None)`` if no method."""
        method = request_method(backend, request)
        if method is None:
            return None, None
        try:
            return self.call(method(request)), None
        except pytest.fail.Exception:
            raise
        except BaseException as exc:  # the point is to see whatever escapes the adapter
            return None, exc

    def batch(
        self, backend: AsyncBackend, requests: Sequence[Request], concurrency: int | None = None
    ) -> list[Any]:
        """`run_batch` with no retries (the contract is about the adapter, not the retry policy)."""
        return run_batch(
            backend,
            requests,
            concurrency=concurrency or max(1, len(requests)),
            retry=RetryPolicy(max_attempts=1),
            timeout=self.request_timeout,
        )

    def generate(
        self, backend: AsyncBackend, prompt: Any, request_id: str = "contract", **params: Any
    ) -> GenerationResult:
        """One generation, called directly on the adapter; ``params`` default to greedy ``max_tokens``."""
        params.setdefault("max_tokens", self.max_tokens)
        request = GenerationRequest(prompt, SamplingParams(**params), request_id=request_id)
        result = self.call(backend.generate(request))
        expect(
            isinstance(result, GenerationResult),
            f"generate() returned {type(result).__name__}, not a GenerationResult",
        )
        expect(
            result.request_id == request_id,
            f"generate() answered request_id={result.request_id!r} for a request with id {request_id!r}",
        )
        return result

    @staticmethod
    def require(backend: AsyncBackend, capability: str) -> None:
        """Skip the calling test unless ``backend.capabilities.<capability>`` is true."""
        if not getattr(backend.capabilities, capability):
            pytest.skip(f"capabilities.{capability} is False for backend {backend.name!r}")

    # -- the guard -----------------------------------------------------------------------------------------

    def test_no_overrides_DO_NOT_OVERRIDE(self) -> None:
        """Every contract test runs as written, or is overridden as an expected failure with a reason."""
        cls = type(self)
        problems = []
        for name, owner in sorted(contract_tests(cls).items()):
            definer = next(klass for klass in cls.__mro__ if name in vars(klass))
            if is_contract_class(definer):
                continue
            attribute = vars(definer)[name]
            if not callable(attribute):
                problems.append(f"{name} (from {owner.__name__}) was deleted in {definer.__qualname__}")
            elif _xfail_reason(attribute) is None:
                problems.append(
                    f"{name} (from {owner.__name__}) is overridden in {definer.__qualname__} without "
                    "@pytest.mark.xfail(reason=...)"
                )
        expect(
            not problems,
            "contract tests may only be overridden as expected failures with a reason:\n  "
            + "\n  ".join(problems),
        )
