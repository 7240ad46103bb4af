"""`GenerationContract`: what ``generate`` must do, alone and under concurrency."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import pytest

from ..._protocol import AsyncBackend
from ..._types import (
    Capabilities,
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
    SamplingParams,
)
from ._base import ContractBase, added_in, close_enough, expect

__all__ = ["GenerationContract"]


def _order_prompt(index: int) -> str:
    # Each prompt is the previous one plus a word, so reported prompt sizes must grow along the batch.
    return "count " + " ".join(str(k) for k in range(index + 1))


def _describe(completion: Completion) -> str:
    return f"text={completion.text!r} ids={completion.token_ids!r} finish_reason={completion.finish_reason!r}"


def _pick_stops(text: str) -> list[str]:
    # Stop strings that occur in the greedy text after its start, so the expected cut is non-trivial.
    stops = []
    for char in text[1:]:
        if not char.isspace() and char != "\ufffd" and text.find(char) >= 1:
            stops.append(char)
            break
    middle = len(text) // 2
    longer = text[middle : middle + 3]
    if len(longer) == 3 and "\ufffd" not in longer and text.find(longer) >= 1 and longer not in stops:
        stops.append(longer)
    return stops


class GenerationContract(ContractBase):
    """Generation: ordering under concurrency, ``n``, seeds, greedy, ``max_tokens``, stop, token ids."""

    def _check_completion(self, completion: Completion, params: SamplingParams, caps: Capabilities) -> None:
        expect(
            isinstance(completion, Completion),
            f"a completion is a {type(completion).__name__}, not Completion",
        )
        expect(
            isinstance(completion.text, str), f"completion text is {type(completion.text).__name__}, not str"
        )
        expect(
            completion.finish_reason is None or isinstance(completion.finish_reason, str),
            f"finish_reason must be a str or None, got {completion.finish_reason!r}",
        )
        if completion.token_ids:
            expect(
                len(completion.token_ids) <= params.max_tokens,
                f"max_tokens={params.max_tokens} but the completion has {len(completion.token_ids)} tokens: "
                + _describe(completion),
            )
            if completion.finish_reason == "length":
                expect(
                    len(completion.token_ids) == params.max_tokens,
                    f"finish_reason='length' after {len(completion.token_ids)} tokens, not "
                    f"max_tokens={params.max_tokens}",
                )
        elif caps.token_ids and completion.text:
            expect(False, "capabilities.token_ids is True but a non-empty completion reports no token ids")

    def test_generate_returns_one_result(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A plain request gets one `GenerationResult` with exactly one completion and its own request_id."""
        result = self.generate(backend, prompts[0], request_id="contract-one")
        expect(len(result.completions) == 1, f"n=1 but the result has {len(result.completions)} completions")
        self._check_completion(
            result.completions[0], SamplingParams(max_tokens=self.max_tokens), backend.capabilities
        )
        expect(
            result.prompt_tokens is None
            or (isinstance(result.prompt_tokens, int) and result.prompt_tokens > 0),
            f"prompt_tokens must be a positive int or None, got {result.prompt_tokens!r}",
        )

    def test_results_in_order_exactly_once(self, backend: AsyncBackend) -> None:
        """Concurrent requests each get their own result, in input order: none swapped, lost or repeated."""
        requests: list[Request] = []
        for index in range(self.concurrency):
            requests.append(
                GenerationRequest(
                    _order_prompt(index),
                    SamplingParams(max_tokens=self.max_tokens),
                    request_id=f"order-gen-{index}",
                )
            )
            if backend.capabilities.loglikelihood:
                requests.append(
                    LoglikelihoodRequest(_order_prompt(index), " done", request_id=f"order-ll-{index}")
                )
        alone = self.batch(backend, requests, concurrency=1)
        together = self.batch(backend, requests)
        expect(len(together) == len(requests), f"{len(requests)} requests gave {len(together)} results")
        for index, (request, single, result) in enumerate(zip(requests, alone, together, strict=True)):
            expected_type = (
                GenerationResult if isinstance(request, GenerationRequest) else LoglikelihoodResult
            )
            expect(
                isinstance(result, expected_type),
                f"results[{index}] is a {type(result).__name__} for a {type(request).__name__}",
            )
            expect(
                result.request_id == request.request_id,
                f"results[{index}] answers request {result.request_id!r}, not {request.request_id!r}: "
                "results were swapped, lost or repeated under concurrency",
            )
            if isinstance(result, GenerationResult) and self.greedy_batch_invariant:
                expect(
                    [c.text for c in result.completions] == [c.text for c in single.completions],
                    f"results[{index}] ({request.request_id}): greedy text {result.text!r} under "
                    f"concurrency, {single.text!r} alone",
                )
            if isinstance(result, LoglikelihoodResult):
                expect(
                    close_enough(result.logprob, single.logprob, self.score_tolerance),
                    f"results[{index}] ({request.request_id}): logprob {result.logprob} under concurrency, "
                    f"{single.logprob} alone",
                )
        sizes = [r.prompt_tokens for r in together if isinstance(r, GenerationResult)]
        if all(size is not None for size in sizes):
            expect(
                all(a < b for a, b in itertools.pairwise(sizes)),  # type: ignore[operator]
                f"prompts grow by one word each, but prompt_tokens along the batch are {sizes}",
            )

    def test_n_completions_exactly(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """``n`` asks for exactly ``n`` completions."""
        self.require(backend, "n_samples")
        for n in (2, 3):
            params = SamplingParams(max_tokens=self.max_tokens, temperature=1.0, n=n)
            result = self.generate(backend, prompts[0], request_id=f"contract-n{n}", **_fields(params))
            expect(
                len(result.completions) == n, f"asked for n={n}, got {len(result.completions)} completion(s)"
            )
            for completion in result.completions:
                self._check_completion(completion, params, backend.capabilities)

    @added_in(2)
    def test_n_samples_vary(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """``n`` samples at temperature 1 are drawn independently: not one sample repeated ``n`` times."""
        self.require(backend, "n_samples")
        n, budget = self.varied_samples, max(16, self.max_tokens)
        params = SamplingParams(max_tokens=budget, temperature=1.0, n=n)
        seen: list[str] = []
        for index, prompt in enumerate(prompts):
            result = self.generate(backend, prompt, request_id=f"vary-{index}", **_fields(params))
            if len(result.completions) < 2:
                pytest.skip(f"n={n} gave {len(result.completions)} completion(s): test_n_completions_exactly")
            samples = {(c.text, tuple(c.token_ids)) for c in result.completions}
            if len(samples) > 1:
                return
            seen.append(f"{prompt!r} -> {n} x {result.completions[0].text!r}")
        expect(
            False,
            f"asked for n={n} samples of up to {budget} tokens at temperature=1.0, and for every one of "
            f"{len(prompts)} prompts all {n} samples were identical:\n  "
            + "\n  ".join(seen)
            + "\ndraw each sample independently (a seed per sample, seed + i where the engine takes one "
            "seed), never copy one sample n times. A correct engine trips this only if it gives the "
            f"same {budget}-token continuation {n} times in a row for every prompt: for a model with any "
            "uncertainty on these prompts that is vanishingly unlikely (override `prompts` if yours is "
            "that certain)",
        )

    def test_seeded_sampling_reproducible(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """The same seed gives the same samples, sequentially and when sent together."""
        self.require(backend, "seed")
        n = 2 if backend.capabilities.n_samples else 1
        params = SamplingParams(max_tokens=self.max_tokens, temperature=1.0, seed=1234, n=n)
        first = self.generate(backend, prompts[1], request_id="seed-a", **_fields(params))
        second = self.generate(backend, prompts[1], request_id="seed-b", **_fields(params))
        expect(
            first.completions == second.completions,
            f"seed=1234 gave different samples: {first.completions} then {second.completions}",
        )
        copies = [GenerationRequest(prompts[1], params, request_id=f"seed-{i}") for i in range(4)]
        for index, result in enumerate(self.batch(backend, copies)):
            expect(
                result.completions == first.completions,
                f"seed=1234 sent 4 times at once: copy {index} gave {result.completions}, "
                f"alone {first.completions}",
            )

    def test_greedy_deterministic(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Greedy decoding (temperature 0) gives the same completion every time."""
        for prompt in prompts[:2]:
            first = self.generate(backend, prompt, request_id="greedy-a")
            second = self.generate(backend, prompt, request_id="greedy-b")
            expect(
                (first.text, first.completions[0].token_ids)
                == (second.text, second.completions[0].token_ids),
                f"greedy output for {prompt!r} changed: {_describe(first.completions[0])} then "
                f"{_describe(second.completions[0])}",
            )

    def test_max_tokens_respected(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """No completion is longer than ``max_tokens``; a shorter greedy run is a prefix of a longer one."""
        short = self.generate(backend, prompts[0], request_id="max-1", max_tokens=1)
        full = self.generate(backend, prompts[0], request_id="max-n")
        for result, limit in ((short, 1), (full, self.max_tokens)):
            self._check_completion(
                result.completions[0], SamplingParams(max_tokens=limit), backend.capabilities
            )
        short_ids, full_ids = short.completions[0].token_ids, full.completions[0].token_ids
        if short_ids and full_ids:
            expect(
                full_ids[: len(short_ids)] == short_ids,
                f"greedy with max_tokens=1 gave {short_ids}, with max_tokens={self.max_tokens} {full_ids}",
            )

    def test_stop_respected(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A stop string ends the completion where it first occurs and is not part of the text."""
        self.require(backend, "stop")
        budget = max(16, self.max_tokens)
        plain = self.generate(backend, prompts[0], request_id="stop-none", max_tokens=budget)
        stops = _pick_stops(plain.text)
        if not stops:
            pytest.skip(f"the greedy output {plain.text!r} is too short to pick a stop string from")
        for stop in stops:
            result = self.generate(backend, prompts[0], request_id="stop", max_tokens=budget, stop=(stop,))
            expected = plain.text[: plain.text.find(stop)]
            expect(
                result.text == expected,
                f"greedy text without stop is {plain.text!r}; with stop={stop!r} expected {expected!r}, "
                f"got {result.text!r}",
            )
            reason = result.completions[0].finish_reason
            expect(reason in (None, "stop"), f"stopped by {stop!r} but finish_reason={reason!r}")

    def test_token_ids_match_text(
        self,
        backend: AsyncBackend,
        prompts: Sequence[str],
        token_prompt: tuple[int, ...],
        decode: Callable[[Sequence[int]], str] | None,
    ) -> None:
        """Token ids and text agree, and a token-id prompt is accepted and counted exactly."""
        self.require(backend, "token_ids")
        from_text = self.generate(backend, prompts[0], request_id="ids-text")
        from_ids = self.generate(backend, token_prompt, request_id="ids-ids")
        expect(
            from_ids.prompt_tokens in (None, len(token_prompt)),
            f"a prompt of {len(token_prompt)} token ids reported prompt_tokens={from_ids.prompt_tokens}",
        )
        for result in (from_text, from_ids):
            completion = result.completions[0]
            expect(
                result.completion_tokens == len(completion.token_ids),
                f"completion_tokens={result.completion_tokens} but {len(completion.token_ids)} token ids",
            )
            if decode is not None:
                decoded = decode(completion.token_ids)
                expect(
                    decoded == completion.text,
                    f"token ids {completion.token_ids} decode to {decoded!r}, "
                    f"but the text is {completion.text!r}",
                )

    def test_logprobs_of_generated_tokens(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Asked for, each generated token gets one finite, non-positive logprob."""
        self.require(backend, "logprobs")
        completion = self.generate(backend, prompts[0], request_id="logprobs", logprobs=True).completions[0]
        expect(completion.logprobs is not None, "logprobs=True but the completion has logprobs=None")
        assert completion.logprobs is not None
        if completion.token_ids:
            expect(
                len(completion.logprobs) == len(completion.token_ids),
                f"{len(completion.logprobs)} logprobs for {len(completion.token_ids)} token ids",
            )
        bad = [lp for lp in completion.logprobs if not (math.isfinite(lp) and lp <= 1e-6)]
        expect(not bad, f"token logprobs must be finite and <= 0, got {bad}")

    def test_chat_prompt(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A chat-message prompt is answered like any other."""
        self.require(backend, "chat")
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompts[0]}]
        result = self.generate(backend, messages, request_id="chat")
        expect(len(result.completions) == 1, f"a chat prompt gave {len(result.completions)} completions")
        self._check_completion(
            result.completions[0], SamplingParams(max_tokens=self.max_tokens), backend.capabilities
        )


def _fields(params: SamplingParams) -> dict[str, object]:
    return {name: getattr(params, name) for name in SamplingParams.__dataclass_fields__}
