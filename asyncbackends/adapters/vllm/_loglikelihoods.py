"""The ``vllm`` adapter's loglikelihood requests: texts encoded, planned to fit the model, scored per adapter.

A request's texts are encoded by the tokenizer's batch call in a worker thread (`TextEncoder`), planned by the
shared scoring plan (`adapters/_scoring`: the scored tokens, a context too long truncated from the left, a
rolling text cut in windows of the model's length) and scored by the scorer of the request's LoRA adapter
(`AdapterPaths`, `EngineScoring`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._tasks import all_or_nothing
from ..._text import split_of
from ..._types import LoglikelihoodRequest, LoglikelihoodResult, RollingLoglikelihoodRequest
from ...errors import ContextLengthError, InvalidRequestError
from .._scoring import aplan_loglikelihood, plan_rolling, scored_result
from ._lora import AdapterPaths
from ._text_encoder import TextEncoder

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

__all__ = ["Loglikelihoods"]


class Loglikelihoods:
    """Scores one engine's loglikelihood requests (see the module docstring).

    Args:
        tokenizer: The engine's tokenizer.
        model: The model's name, for errors.
        max_model_len: The engine's context length.
        adapters: The scorers of the base and of each LoRA adapter.
        backend: The backend's name, for errors.

    Raises:
        InvalidRequestError: The tokenizer has neither a BOS nor an EOS token (an empty context needs one).
    """

    def __init__(
        self, tokenizer: Any, *, model: str, max_model_len: int, adapters: AdapterPaths, backend: str
    ) -> None:
        self._tokenizer = tokenizer
        self._adapters = adapters
        self._backend = backend
        self._max_model_len = max_model_len
        # The engine refuses a prompt that leaves no room for one generated token.
        self._max_prompt_tokens = max_model_len - 1
        bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
        probe = tokenizer.encode("a", add_special_tokens=True)
        # Scoring mirrors generation: the special tokens the tokenizer puts in front of a text (Llama's BOS)
        # are in front of a scored context too. Detected once, instead of trusting add_special_tokens to
        # add nothing at the end (some tokenizers append EOS, which would break the tail split).
        self._prefix: tuple[int, ...] = (bos,) if bos is not None and probe[:1] == [bos] else ()
        stand_in = bos if bos is not None else eos
        if stand_in is None:
            raise InvalidRequestError(f"model {model!r}: its tokenizer has neither a BOS nor an EOS token")
        self.stand_in: int = stand_in
        """The one-token context of an empty context (and of a rolling text's first window)."""
        # Encoded in a worker thread, many requests' at once: on the loop thread that encoding bounded
        # scoring however many engines there were (docs/benchmarks.md). It makes its futures and worker on
        # the loop that runs the requests (the shared loop).
        self._encoder = TextEncoder(self.encode_texts)

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """The texts' token ids, no special tokens, as ``encode`` gives them."""
        # The tokenizer's batch call, not encode() text by text: a fast tokenizer encodes the batch in Rust
        # across the cores with the GIL released, and its ids are encode()'s (tested).
        ids: list[list[int]] = self._tokenizer(texts, add_special_tokens=False)["input_ids"]
        return ids

    async def score(self, request: LoglikelihoodRequest, lora: LoRARequest | None) -> LoglikelihoodResult:
        """The continuation's loglikelihood given the context (see `VLLMBackend.loglikelihood`).

        Raises:
            ContextLengthError: The continuation alone does not fit in the model.
        """
        plan = await aplan_loglikelihood(
            request.context,
            request.continuation,
            encode=self._encoder.encode,
            prefix=self._prefix,
            empty_context_token=self.stand_in,
            max_prompt_tokens=self._max_prompt_tokens,
            split=split_of(request),
        )
        if plan is None:
            raise ContextLengthError(
                f"continuation does not fit in max_model_len={self._max_model_len}",
                backend=self._backend,
                request_id=request.request_id,
            )
        scoring = self._adapters.scoring(lora)
        return scored_result(request.request_id, await scoring.score(plan, request.request_id))

    async def score_rolling(
        self, request: RollingLoglikelihoodRequest, lora: LoRARequest | None
    ) -> LoglikelihoodResult:
        """A whole text's loglikelihood in windows of the model's length, every token once."""
        score = self._adapters.scoring(lora).score_prompt
        [ids] = await self._encoder.encode([request.text], keep=False)  # a whole document: not worth keeping
        plans = plan_rolling(ids, prefix_token=self.stand_in, max_prompt_tokens=self._max_prompt_tokens)
        windows = await all_or_nothing([score(plan, request.request_id) for plan in plans])
        return scored_result(request.request_id, [item for window in windows for item in window])
