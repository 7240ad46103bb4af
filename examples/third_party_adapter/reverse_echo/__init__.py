"""`ReverseEchoBackend` (name ``reverse-echo``): a small, real third-party adapter for asyncbackends.

Its "model" reads one character as one token (token id = code point) and greedily answers with the prompt
reversed, over and over, one token every ``token_delay`` seconds, like a streaming engine. Sampling
(temperature > 0) shuffles the reversed prompt with a generator seeded from ``seed`` and the completion's
index. It refuses what it cannot do (chat prompts, loglikelihood, prompts over ``max_prompt_chars``) with
the library's error types, holds its API key in `asyncbackends.Secret`, and passes the contract suite.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import asyncbackends as ab
from asyncbackends.abc import refuse_unclaimed_chat

__all__ = ["ReverseEchoBackend"]


class ReverseEchoBackend(ab.BaseBackend):
    """Answers each prompt with the prompt reversed.

    Args:
        token_delay: Seconds spent on each generated token.
        max_prompt_chars: Longest prompt accepted; longer ones raise `RequestRejectedError`.
        api_key: A credential, held masked (nothing checks it: it shows how adapters keep secrets).
        model: The model name reported in results and the cache fingerprint.
    """

    name = "reverse-echo"

    def __init__(
        self,
        *,
        token_delay: float = 0.002,
        max_prompt_chars: int = 4096,
        api_key: str | None = None,
        model: str = "reverse-1",
    ) -> None:
        if token_delay < 0 or max_prompt_chars < 1:
            raise ab.InvalidRequestError("token_delay must be >= 0 and max_prompt_chars >= 1")
        self.token_delay = float(token_delay)
        self.max_prompt_chars = max_prompt_chars
        self.model = model
        self._api_key = ab.Secret(api_key or "")
        self.capabilities = ab.Capabilities(n_samples=True, seed=True, token_ids=True, stop=True)

    @property
    def fingerprint(self) -> dict[str, str]:
        """What changes this backend's outputs, for the response cache (never the API key)."""
        return {"name": self.name, "model": self.model}

    def _prompt_text(self, request: ab.GenerationRequest) -> str:
        if request.prompt_kind == "chat":
            # Capabilities say chat=False: refuse with our type instead of guessing a template.
            raise ab.RequestRejectedError(
                "reverse-echo does not take chat prompts", backend=self.name, request_id=request.request_id
            )
        if request.prompt_kind == "tokens":
            text = "".join(chr(0x20 + t % 95) for t in request.prompt)  # type: ignore[operator]
        else:
            text = request.prompt  # type: ignore[assignment]
        if len(text) > self.max_prompt_chars:
            raise ab.RequestRejectedError(
                f"prompt of {len(text)} characters is longer than max_prompt_chars={self.max_prompt_chars}",
                backend=self.name,
                request_id=request.request_id,
            )
        return text  # type: ignore[return-value]

    async def _complete(
        self, source: str, params: ab.SamplingParams, index: int, request_id: str | None
    ) -> ab.Completion:
        chars = list(source)
        if not params.greedy:
            seed = params.seed if params.seed is not None else random.getrandbits(64)
            random.Random(f"{seed}:{index}").shuffle(chars)
        out = ""
        finish = "length"
        for char in itertools.islice(itertools.cycle(chars), params.max_tokens):
            await asyncio.sleep(self.token_delay)  # a cancellation lands here and propagates as itself
            self._check_open(request_id)  # closed meanwhile: end in BackendClosedError, not a result
            out += char
            cuts = [out.find(stop) for stop in params.stop if stop in out]
            if cuts:
                out, finish = out[: min(cuts)], "stop"
                break
        return ab.Completion(out, tuple(map(ord, out)), None, finish)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        """Answer with the prompt reversed (greedy) or a seeded shuffle of it (sampling), ``n`` times."""
        self._check_open(request.request_id)
        refused = self.capabilities.unsupported(request.params)
        if refused:  # never run a request without a setting it asked for
            raise ab.RequestRejectedError(
                f"reverse-echo cannot honour {', '.join(refused)}",
                backend=self.name,
                request_id=request.request_id,
            )
        # Images and tools it does not claim are refused too, naming them, before anything is done.
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name)
        text = self._prompt_text(request)
        completions = [
            await self._complete(text[::-1], request.params, i, request.request_id)
            for i in range(request.params.n)
        ]
        return ab.GenerationResult(
            request.request_id, tuple(completions), prompt_tokens=len(text), model=self.model
        )
