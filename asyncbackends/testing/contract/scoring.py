"""`LoglikelihoodContract`: scores sum their parts, are never positive and agree with greedy generation."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from ..._protocol import AsyncBackend
from ..._types import LoglikelihoodRequest, LoglikelihoodResult, RollingLoglikelihoodRequest
from ._base import ContractBase, close_enough, expect

__all__ = ["LoglikelihoodContract"]

# Continuations that do not start with any plausible one-token greedy continuation of the prompts' own text
# are only used where the greedy continuation was checked not to be their prefix.
_OTHER_CONTINUATIONS = (" zebra", " 42", "\n\n")


class LoglikelihoodContract(ContractBase):
    """Scoring checks, applied where ``capabilities.loglikelihood`` (and ``rolling_loglikelihood``) hold."""

    def _score(
        self, backend: AsyncBackend, context: str, continuation: str, request_id: str
    ) -> LoglikelihoodResult:
        request = LoglikelihoodRequest(context, continuation, request_id=request_id)
        result = self.call(backend.loglikelihood(request))
        expect(
            isinstance(result, LoglikelihoodResult),
            f"loglikelihood() returned {type(result).__name__}, not a LoglikelihoodResult",
        )
        expect(
            result.request_id == request_id,
            f"loglikelihood() answered request_id={result.request_id!r} for a request with id {request_id!r}",
        )
        return result

    def _check_score(self, result: LoglikelihoodResult, what: str) -> None:
        expect(
            isinstance(result.logprob, float | int) and math.isfinite(result.logprob),
            f"{what}: logprob must be a finite number, got {result.logprob!r}",
        )
        expect(result.logprob <= 1e-6, f"{what}: logprob {result.logprob} is positive: a probability above 1")
        expect(
            result.num_tokens >= 1, f"{what}: num_tokens={result.num_tokens}, but a non-empty text was scored"
        )
        expect(
            result.is_greedy is None or isinstance(result.is_greedy, bool),
            f"{what}: is_greedy must be a bool or None, got {result.is_greedy!r}",
        )
        parts = result.token_logprobs
        if parts is None:
            return
        expect(
            len(parts) == result.num_tokens,
            f"{what}: {len(parts)} token_logprobs for num_tokens={result.num_tokens}",
        )
        expect(
            all(math.isfinite(p) and p <= 1e-6 for p in parts),
            f"{what}: every token logprob must be finite and <= 0, got {list(parts)}",
        )
        expect(
            close_enough(math.fsum(parts), result.logprob, self.score_tolerance),
            f"{what}: logprob {result.logprob} is not the sum of its token_logprobs ({math.fsum(parts)})",
        )

    def test_loglikelihood_is_sum_of_parts(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Each score is finite, never positive, and the sum of its per-token parts where they are given."""
        self.require(backend, "loglikelihood")
        for index, context in enumerate(prompts):
            for continuation in (" the end", "\n"):
                what = f"loglikelihood({context!r}, {continuation!r})"
                result = self._score(backend, context, continuation, f"ll-{index}")
                self._check_score(result, what)
                again = self._score(backend, context, continuation, f"ll-{index}-again")
                expect(
                    close_enough(result.logprob, again.logprob, self.score_tolerance),
                    f"{what} scored {result.logprob}, then {again.logprob}",
                )

    def test_is_greedy_consistent_with_generation(
        self, backend: AsyncBackend, prompts: Sequence[str]
    ) -> None:
        """The greedy next token scores ``is_greedy=True``; text that does not start with it scores False."""
        self.require(backend, "loglikelihood")
        self.require(backend, "is_greedy")
        checked = 0
        for index, context in enumerate(prompts):
            greedy = self.generate(backend, context, request_id=f"greedy-{index}", max_tokens=1).text
            # A lone byte of a multi-byte character, or bare whitespace, does not re-tokenize to itself.
            if not greedy.strip() or "\ufffd" in greedy:
                continue
            checked += 1
            result = self._score(backend, context, greedy, f"isg-{index}")
            expect(
                result.is_greedy is True,
                f"greedy decoding continues {context!r} with {greedy!r}, but loglikelihood says "
                f"is_greedy={result.is_greedy!r}",
            )
            for other in _OTHER_CONTINUATIONS:
                if other.startswith(greedy):
                    continue
                other_result = self._score(backend, context, other, f"isg-{index}-other")
                expect(
                    other_result.is_greedy is False,
                    f"greedy decoding continues {context!r} with {greedy!r}, yet {other!r} scores "
                    f"is_greedy={other_result.is_greedy!r}",
                )
        if not checked:
            pytest.skip("no prompt's greedy next token was printable text to score")

    def test_rolling_loglikelihood(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A whole text's score is finite, never positive, and the sum of its parts where they are given."""
        self.require(backend, "rolling_loglikelihood")
        text = " ".join(prompts)
        method = getattr(backend, "loglikelihood_rolling", None)
        expect(
            callable(method),
            "capabilities.rolling_loglikelihood is True but there is no loglikelihood_rolling()",
        )
        assert method is not None
        result = self.call(method(RollingLoglikelihoodRequest(text, request_id="rolling")))
        expect(
            isinstance(result, LoglikelihoodResult),
            f"loglikelihood_rolling() returned {type(result).__name__}",
        )
        expect(
            result.request_id == "rolling",
            f"loglikelihood_rolling() answered request_id={result.request_id!r}",
        )
        self._check_score(result, f"loglikelihood_rolling({text[:30]!r}...)")
