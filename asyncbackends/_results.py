"""Results: `Completion`, `GenerationResult` and `LoglikelihoodResult`, validated at construction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ._chat import ToolCall
from ._field_checks import as_floats, as_ints, check_request_id, is_int, set_field
from ._usage import Usage
from .errors import InvalidRequestError

__all__ = ["Completion", "FinishReason", "GenerationResult", "LoglikelihoodResult", "Result"]

FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "abort", "error"] | str


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated completion.

    Args:
        text: The generated text (the prompt not included; stop strings not included).
        token_ids: The generated token ids, where the backend reports them.
        logprobs: Each generated token's logprob, when asked for and available.
        finish_reason: Why generation stopped: ``"stop"``, ``"length"``, ``"tool_calls"`` (set when
            ``tool_calls`` holds any and the backend said ``"stop"`` or nothing), or the backend's word.
        tool_calls: The tool calls the model made (`ToolCall`; the arguments as the JSON text it produced).
        reasoning: A reasoning model's thinking, apart from its answer (``text``); ``None`` where the model
            or backend gave none.
        reasoning_tokens: Tokens spent thinking (0 where none or unknown).
        reasoning_truncated: Generation stopped before thinking ended (``max_tokens``): there is no answer,
            so ``text`` is ``""``, never the unfinished thought.
        token_texts: Each generated token's text as the backend reported it, where it names tokens by text
            (servers do with logprobs: OpenAI's ``logprobs.content[].token``); ``()`` otherwise.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    finish_reason: FinishReason | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_truncated: bool = False
    token_texts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Checked cheaply (results are built once per request on the hot path) but enough that every
        # completion the constructor accepts survives the response cache's round trip unchanged.
        if not isinstance(self.text, str):
            raise InvalidRequestError(f"text must be a str, got {type(self.text).__name__}")
        if type(self.token_ids) is not tuple:
            # None is "not reported", like (): one value for it, so a cached copy compares equal.
            set_field(
                self, "token_ids", as_ints("token_ids", () if self.token_ids is None else self.token_ids)
            )
        if self.logprobs is not None and type(self.logprobs) is not tuple:
            set_field(self, "logprobs", as_floats("logprobs", self.logprobs))
        if self.finish_reason is not None and not isinstance(self.finish_reason, str):
            raise InvalidRequestError(f"finish_reason must be a str or None, got {self.finish_reason!r}")
        if self.tool_calls:
            if type(self.tool_calls) is not tuple:
                if isinstance(self.tool_calls, (str, bytes)) or not isinstance(self.tool_calls, Sequence):
                    raise InvalidRequestError("tool_calls must be a sequence of ToolCall")
                set_field(self, "tool_calls", tuple(self.tool_calls))
            if not all(type(c) is ToolCall for c in self.tool_calls):
                raise InvalidRequestError("tool_calls must be a sequence of ToolCall")
            if self.finish_reason in (None, "stop"):
                set_field(self, "finish_reason", "tool_calls")
        elif type(self.tool_calls) is not tuple:
            set_field(self, "tool_calls", ())
        if self.reasoning is not None or self.reasoning_tokens or self.reasoning_truncated:
            self._check_reasoning()
        if self.token_texts or type(self.token_texts) is not tuple:
            self._check_token_texts()

    def _check_token_texts(self) -> None:
        texts = () if self.token_texts is None else self.token_texts  # None: not reported, as for token_ids
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise InvalidRequestError(f"token_texts must be a sequence of str, got {type(texts).__name__}")
        if not all(isinstance(t, str) for t in texts):
            raise InvalidRequestError("token_texts must hold only str")
        if texts is not self.token_texts or type(texts) is not tuple:
            set_field(self, "token_texts", tuple(texts))

    def _check_reasoning(self) -> None:
        if self.reasoning is not None and not isinstance(self.reasoning, str):
            raise InvalidRequestError(f"reasoning must be a str or None, got {type(self.reasoning).__name__}")
        if not is_int(self.reasoning_tokens) or self.reasoning_tokens < 0:
            raise InvalidRequestError(f"reasoning_tokens must be an int >= 0, got {self.reasoning_tokens!r}")
        if not isinstance(self.reasoning_truncated, bool):
            raise InvalidRequestError(f"reasoning_truncated must be a bool, got {self.reasoning_truncated!r}")
        if self.reasoning_truncated and self.text:
            raise InvalidRequestError(
                "a completion cut off while thinking has no answer: its text must be '' (the thought goes in "
                "reasoning)"
            )


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The result of one `GenerationRequest`.

    Args:
        request_id: The request's id.
        completions: Exactly ``params.n`` completions, in index order.
        prompt_tokens: Tokens in the prompt, where known.
        model: The model that answered, where known.
        generated_tokens: Generated tokens over all completions as the backend counted them (a server's
            ``usage.completion_tokens``), where it reports a count; ``None`` otherwise. Set it where the
            completions carry no token ids: `completion_tokens` reads it first.
        cached_prompt_tokens: Of the prompt tokens, those read from a prefix cache (vLLM's
            ``num_cached_tokens``, a server's ``usage.prompt_tokens_details.cached_tokens``), where the
            backend reports them; ``None`` otherwise.
    """

    request_id: str | None
    completions: tuple[Completion, ...]
    prompt_tokens: int | None = None
    model: str | None = None
    generated_tokens: int | None = None
    cached_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        # Built once per request on the hot path: the common case (a str id, a tuple) costs no call.
        if self.request_id is not None and type(self.request_id) is not str:
            check_request_id(self.request_id)
        if type(self.completions) is not tuple:
            if isinstance(self.completions, (str, bytes)) or not isinstance(self.completions, Sequence):
                raise InvalidRequestError("completions must be a sequence of Completion")
            set_field(self, "completions", tuple(self.completions))
        for completion in self.completions:  # a loop, not all(...): no generator per result
            if type(completion) is not Completion:
                raise InvalidRequestError("completions must be a sequence of Completion")
        if self.prompt_tokens is not None and not is_int(self.prompt_tokens):
            raise InvalidRequestError(f"prompt_tokens must be an int or None, got {self.prompt_tokens!r}")
        if self.model is not None and not isinstance(self.model, str):
            raise InvalidRequestError(f"model must be a str or None, got {type(self.model).__name__}")
        generated = self.generated_tokens
        if generated is not None and (not is_int(generated) or generated < 0):
            raise InvalidRequestError(
                f"generated_tokens must be an int >= 0 or None, got {self.generated_tokens!r}"
            )
        cached = self.cached_prompt_tokens
        if cached is not None and (not is_int(cached) or cached < 0):
            raise InvalidRequestError(f"cached_prompt_tokens must be an int >= 0 or None, got {cached!r}")

    @property
    def text(self) -> str:
        """The first completion's text."""
        return self.completions[0].text

    @property
    def completion_tokens(self) -> int:
        """Generated tokens over all completions.

        The backend's count (`generated_tokens`) where it gave one, else the token ids counted (0 where it
        gave neither).
        """
        if self.generated_tokens is not None:
            return self.generated_tokens
        return sum(len(c.token_ids) for c in self.completions)

    @property
    def usage(self) -> Usage:
        """The tokens this result used (`Usage`): counts the backend did not report are 0."""
        return Usage(
            prompt_tokens=self.prompt_tokens or 0,
            cached_prompt_tokens=self.cached_prompt_tokens or 0,
            completion_tokens=self.completion_tokens,
            reasoning_tokens=sum(c.reasoning_tokens for c in self.completions),
        )


@dataclass(frozen=True, slots=True)
class LoglikelihoodResult:
    """The result of a loglikelihood request.

    Args:
        request_id: The request's id.
        logprob: The summed log probability (never positive).
        is_greedy: Whether greedy decoding would produce the continuation; ``None`` where unknowable.
        num_tokens: Tokens scored.
        token_logprobs: Each scored token's logprob, where the backend reports them.
    """

    request_id: str | None
    logprob: float
    is_greedy: bool | None = None
    num_tokens: int = 0
    token_logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.request_id is not None and type(self.request_id) is not str:
            check_request_id(self.request_id)
        if (
            not isinstance(self.logprob, (int, float))
            or isinstance(self.logprob, bool)
            or self.logprob != self.logprob
        ):
            raise InvalidRequestError(f"logprob must be a number (not NaN), got {self.logprob!r}")
        if type(self.logprob) is not float:
            set_field(self, "logprob", float(self.logprob))
        if self.is_greedy is not None and not isinstance(self.is_greedy, bool):
            raise InvalidRequestError(f"is_greedy must be a bool or None, got {self.is_greedy!r}")
        if not is_int(self.num_tokens):
            raise InvalidRequestError(f"num_tokens must be an int, got {self.num_tokens!r}")
        if self.token_logprobs is not None and type(self.token_logprobs) is not tuple:
            set_field(self, "token_logprobs", as_floats("token_logprobs", self.token_logprobs))


Result: TypeAlias = GenerationResult | LoglikelihoodResult
