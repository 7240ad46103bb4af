"""Reasoning models on the ``vllm`` adapter: the thinking apart from the answer, as ``vllm serve`` splits it.

vLLM's in-process engine applies no reasoning parser; only its OpenAI server does, to chats (the adapter
splits chats only, `_backend`). With the adapter option ``reasoning_parser`` (vLLM's names, as ``vllm serve
--reasoning-parser``) the engine is built with that parser (so ``thinking_token_budget`` and structured
output's reasoning gate work as on the server) and each completion is split by the parser the server
composes (``ParserManager.get_parser``), constructed and called as its chat handler calls it:
``set_prompt_token_ids`` with the prompt, then ``parse(text, request, model_output_token_ids=...)``. Tool
calls are read from the answer afterwards (`_chat`).

``reasoning_tokens`` is the server's number for the same output: its chat handler's
``parser.count_reasoning_tokens(token_ids)`` on the parser it just parsed with (vLLM's own count, which the
``openai`` adapter reads from ``usage.completion_tokens_details``). It leaves out the markers, and a legacy
start/end-token parser (``deepseek_r1``) counts only tokens between a start and an end marker in the output:
0 for a template that opens the thought in the prompt, as DeepSeek-R1's does (docs/reasoning.md says what a
user gets). Where the thought ended (for ``reasoning_truncated`` and stop strings) is the generated token at
which the parser's ``is_reasoning_end_streaming`` says so (the check of the engine's structured-output gate).

Stop strings end generation only once thinking has ended (`ThoughtStops`): the engine is sent the request
without them and streams its output; once the parser sees the thought closed, the stops are searched in the
answer as vLLM's detokenizer searches its text (the stop completing earliest wins, ties by order), and the
request is aborted there. Imported by the adapter once vLLM is, like `_chat`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..._tasks import all_or_nothing
from ..._types import Completion
from .._reasoning_tags import earliest_stop
from ._chat import check_parser_name
from ._requests import completions

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM, as in _requests
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.sampling_params import RequestOutputKind

__all__ = ["REFUSALS", "ReasoningPath", "ThoughtStops", "check_reasoning_parser"]

REFUSALS = {
    "thinking_budget": "vLLM enforces it (its thinking_token_budget, in vLLM 0.26 and 0.32) only on an "
    "engine built with a reasoning parser: create the backend with reasoning_parser=NAME",
    "reasoning_effort": "an in-process engine has no effort setting (`vllm serve` hands it to chat templates "
    "that read one: use the openai adapter there)",
}
"""Why the ``vllm`` adapter refuses a reasoning parameter it does not claim."""


def check_reasoning_parser(name: str | None, *, backend: str) -> None:
    """Refuse a ``reasoning_parser`` vLLM does not know, naming the close ones.

    Raises:
        InvalidRequestError: ``name`` is not one of vLLM's reasoning parsers.
    """
    check_parser_name("reasoning_parser", name, ReasoningParserManager.list_registered(), backend=backend)


@dataclasses.dataclass
class ReasoningPath:
    """How one engine's outputs are split into thinking and answer.

    Args:
        engine: The ``AsyncLLM`` (built with ``reasoning_parser=name``), read once: its tokenizer and model
            configuration, which an engine started again with the same options shares.
        name: vLLM's name of the reasoning parser.
    """

    engine: dataclasses.InitVar[Any]
    name: str

    def __post_init__(self, engine: Any) -> None:
        self._tokenizer = engine.get_tokenizer()
        self._model_config = engine.model_config
        self._parser_cls = ParserManager.get_parser(
            reasoning_parser_name=self.name,
            model_name=self._model_config.model,
            tokenizer=self._tokenizer,
        )
        # The request a default chat completion is: the server hands it to parse(), and its chat template
        # arguments to the parser (a template's thinking switch, e.g. Qwen3's enable_thinking).
        self._request = ChatCompletionRequest.model_validate({"model": "asyncbackends", "messages": []})
        self._template_kwargs = dict(self._request.build_chat_params(None, "auto").chat_template_kwargs)

    def parser(self, prompt_ids: Sequence[int]) -> Any:
        """A fresh parser for one completion of a prompt (vLLM's parsers keep state: one per choice)."""
        parser = self._parser_cls(  # type: ignore[misc]
            self._tokenizer,
            None,
            chat_template_kwargs=self._template_kwargs,
            model_config=self._model_config,
        )
        parser.set_prompt_token_ids(prompt_ids)
        return parser

    def parse(self, parser: Any, text: str, token_ids: Sequence[int]) -> tuple[str | None, str | None]:
        """(reasoning, answer) of a whole output, as the server's chat handler reads them."""
        reasoning, content, _ = parser.parse(
            text, self._request, enable_auto_tools=False, model_output_token_ids=token_ids
        )
        return reasoning, content

    def split(self, completion: Completion, prompt_ids: Sequence[int]) -> Completion:
        """``completion`` with its thinking in ``reasoning`` and its answer alone in ``text``.

        An output cut off (``"length"``) before thinking ended has ``reasoning_truncated`` and no answer.
        """
        parser = self.parser(prompt_ids)
        reasoning, content = self.parse(parser, completion.text, completion.token_ids)
        # Counted as the server counts, right after the parse on the same parser (issue 53 item 12).
        spent = parser.count_reasoning_tokens(completion.token_ids)
        ended = thought_end(parser, prompt_ids, completion.token_ids)
        truncated = ended is None and reasoning is not None and completion.finish_reason == "length"
        return dataclasses.replace(
            completion,
            text="" if truncated else content or "",
            reasoning=reasoning,
            reasoning_tokens=spent,
            reasoning_truncated=truncated,
        )

    async def generate(
        self, run: Callable[..., Awaitable[Any]], prompt: Any, sampling: Any, *, logprobs: bool
    ) -> tuple[tuple[Completion, ...], Any]:
        """Run one request through ``run`` (the adapter's ``_run``): its completions, split, and an output.

        Without stop strings: one engine request, each completion split (`split`). With them: one streamed
        engine request per completion without the stop strings (for ``n > 1`` the seeds vLLM gives its
        parallel samples: ``seed + index``), watched by `ThoughtStops` and aborted where a stop string ends
        its answer.
        """
        if not sampling.stop:
            output = await run(prompt, sampling)
            ids = output.prompt_token_ids or ()
            return tuple(self.split(c, ids) for c in completions(output, logprobs=logprobs)), output
        results = await all_or_nothing(
            [self._stopped(run, prompt, sampling, i, logprobs) for i in range(sampling.n)]
        )
        return tuple(completion for completion, _ in results), results[0][1]

    async def _stopped(
        self, run: Callable[..., Awaitable[Any]], prompt: Any, sampling: Any, index: int, logprobs: bool
    ) -> tuple[Completion, Any]:
        params = sampling.clone()
        params.stop, params.n, params.output_kind = None, 1, RequestOutputKind.CUMULATIVE
        if sampling.seed is not None and sampling.n > 1:
            params.seed = sampling.seed + index
        prompt_ids = prompt if isinstance(prompt, list) else prompt["prompt_token_ids"]
        watchers: dict[str, ThoughtStops] = {}  # one per engine request: a restarted engine is sent it again

        def watch(output: Any) -> bool:
            watcher = watchers.get(output.request_id)
            if watcher is None:
                watchers.clear()
                watcher = watchers[output.request_id] = ThoughtStops(
                    self,
                    prompt_ids,
                    list(sampling.stop),
                    min_tokens=sampling.min_tokens,
                    skip_special_tokens=sampling.skip_special_tokens,
                )
            out = output.outputs[0]
            return watcher(out.text, out.token_ids)

        output = await run(prompt if isinstance(prompt, list) else dict(prompt), params, watch=watch)
        cut = watchers[output.request_id].cut if output.request_id in watchers else None
        [completion] = completions(output, logprobs=logprobs)
        ids = output.prompt_token_ids or prompt_ids
        if cut is None:
            return self.split(completion, ids), output
        kept = dataclasses.replace(
            completion,
            token_ids=completion.token_ids[: cut.tokens],
            logprobs=None if completion.logprobs is None else completion.logprobs[: cut.tokens],
            finish_reason="stop",
        )
        return dataclasses.replace(self.split(kept, ids), text=cut.answer), output


def thought_end(parser: Any, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> int | None:
    """How many generated tokens the thought took, its closing marker included.

    0 when the prompt had already closed it (or the parser has no reasoning), ``None`` when it did not end.
    """
    reasoner = parser.reasoning_parser
    if reasoner is None or reasoner.is_reasoning_end(list(prompt_ids)):
        return 0
    ids = list(prompt_ids)
    for count, token in enumerate(token_ids, 1):
        ids.append(token)
        if reasoner.is_reasoning_end_streaming(ids, [token]):
            return count
    return None


@dataclasses.dataclass
class _Cut:
    """Where a stop string ended the answer: the answer's kept text, and the generated tokens kept."""

    answer: str
    tokens: int


class ThoughtStops:
    """Watches one streamed completion and finds where a stop string ends its answer (never its thought).

    Args:
        path: The engine's `ReasoningPath`.
        prompt_ids: The prompt's token ids.
        stops: The stop strings.
        min_tokens: As vLLM, no stop string is looked for before this many tokens were generated.
        skip_special_tokens: How the engine decodes (to place a stop inside several tokens seen at once).
    """

    def __init__(
        self,
        path: ReasoningPath,
        prompt_ids: Sequence[int],
        stops: Sequence[str],
        *,
        min_tokens: int = 0,
        skip_special_tokens: bool = True,
    ) -> None:
        self._path, self._prompt, self._stops = path, list(prompt_ids), list(stops)
        self._min_tokens, self._skip = min_tokens, skip_special_tokens
        self._parser = path.parser(prompt_ids)
        self._reasoner = self._parser.reasoning_parser
        self._ids = list(prompt_ids)  # prompt + the tokens seen so far, for the parser's end check
        self._ended = self._reasoner is None or self._reasoner.is_reasoning_end(self._ids)
        self._seen = 0  # generated tokens looked at
        self._floor: int | None = None  # where in the answer stops may end (past min_tokens' text)
        self.cut: _Cut | None = None

    def __call__(self, text: str, token_ids: Sequence[int]) -> bool:
        """Look at the cumulative output so far; True once a stop string ended the answer (abort then)."""
        before = self._seen
        for token in token_ids[before:]:
            self._ids.append(token)
            if not self._ended and self._reasoner.is_reasoning_end_streaming(self._ids, [token]):
                self._ended = True
        self._seen = len(token_ids)
        if not self._ended or len(token_ids) <= self._min_tokens:
            return False
        if self._floor is None:  # as vLLM: a stop counts only if it ends past the first min_tokens' text
            self._floor = len(self._text_of(token_ids[: self._min_tokens])) if self._min_tokens else 0
        found = earliest_stop(self._answer(text, token_ids), self._stops, self._floor)
        if found is None:
            return False
        start, end = found
        tokens = len(token_ids)
        if tokens - before > 1:  # several tokens at once: the first whose text completes the stop
            for count in range(max(before, self._min_tokens) + 1, tokens + 1):
                if len(self._text_of(token_ids[:count])) >= end:
                    tokens = count
                    break
        self.cut = _Cut(self._answer(text, token_ids)[:start], tokens)
        return True

    def _text_of(self, token_ids: Sequence[int]) -> str:
        """The answer of the first generated tokens, decoded here (for outputs that added several at once)."""
        text = self._path._tokenizer.decode(list(token_ids), skip_special_tokens=self._skip)
        return self._answer(text, token_ids)

    def _answer(self, text: str, token_ids: Sequence[int]) -> str:
        # A fresh parser each time: parse() may keep state between calls.
        _, content = self._path.parse(self._path.parser(self._prompt), text, token_ids)
        return content or ""
