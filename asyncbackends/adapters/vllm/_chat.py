"""Chat for the ``vllm`` adapter, rendered as ``vllm serve`` renders the same chat completions body.

Every chat prompt is built as vLLM's own ``ChatCompletionRequest`` (the body the ``openai`` adapter would
send: messages, tools, tool choice) and rendered by the engine's renderer with that request's chat and
tokenization parameters, each tool as its pydantic ``model_dump()``, as the server's ``preprocess_chat``
does: the same template call, media loading and multimodal processing, so the prompt token ids equal the
server's (tests/parity/test_vllm_serve_prompts.py). Tool choice follows vLLM's OpenAI server: a named tool
constrains the output to that tool's parameters schema, ``"required"`` to a JSON list of calls (vLLM's own
schema builder), and ``"auto"`` output is read by the vLLM tool parser named by the adapter option
``tool_parser``; output the parser cannot read comes back as text. Imported by the adapter once vLLM is,
like `_requests`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Iterable
from typing import Any

from ..._chat import ToolCall
from ..._registry import check_options
from ..._types import Completion, GenerationRequest
from ...errors import InvalidRequestError, RequestRejectedError

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM, as in _requests
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers import merge_kwargs

    try:
        from vllm.renderers.chat_utils import make_tool_call_id
    except ImportError:  # vLLM <= 0.26 keeps it with the server's chat helpers (a GPU image's pinned vLLM)
        from vllm.entrypoints.chat_utils import make_tool_call_id  # type: ignore[no-redef]
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.utils import get_json_schema_from_tools

__all__ = ["ChatPath", "check_parser_name", "check_tool_parser"]

# A second turn asking for "auto" most often comes from a framework, not the user: inspect (like OpenAI's own
# agents) switches a forced tool choice to "auto" once the forced call was made, so "name a tool" would be
# advice the user already followed.
_AFTER_FORCED_CALL = (
    ". This conversation already holds a tool call: frameworks switch a forced tool choice (a named tool or "
    "'required') to 'auto' after the forced call, as inspect does, so the later turns need the tool parser "
    "even when you named a tool"
)


def _called_tools(request: GenerationRequest) -> bool:
    """Whether the request's messages already hold an assistant's tool call."""
    messages = request.prompt if request.prompt_kind == "chat" else ()
    return any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") for m in messages)


_log = logging.getLogger(__name__)


def check_tool_parser(name: str | None, *, backend: str) -> None:
    """Refuse a ``tool_parser`` vLLM does not know, naming the close ones.

    Raises:
        InvalidRequestError: ``name`` is not one of vLLM's tool parsers.
    """
    check_parser_name("tool_parser", name, ToolParserManager.list_registered(), backend=backend)


def check_parser_name(option: str, name: str | None, known: Iterable[str], *, backend: str) -> None:
    """Refuse ``name`` (the adapter option ``option``) unless it is in ``known``, naming the close ones.

    Raises:
        InvalidRequestError: ``name`` is not ``None`` and not known.
    """
    if name is None:
        return
    # check_options words the refusal ("unknown option ...; did you mean ...") the way other options get it.
    try:
        check_options(backend, {name: None}, frozenset(known))
    except InvalidRequestError as exc:
        kind = option.removesuffix("_parser").replace("_", " ")
        raise InvalidRequestError(f"{option}={name!r} is not one of vLLM's {kind} parsers ({exc})") from None


@dataclasses.dataclass
class ChatPath:
    """How one backend's engine renders chat with images and tools, and reads tool calls back.

    Args:
        restarts: The backend's `EngineRestarts`: the engine serving now (``AsyncLLM``), the one a restart
            started after a death too.
        backend: The backend's name, for errors.
        tool_parser: vLLM's name of the parser for ``"auto"`` tool choice, or ``None``.
        allow_remote_images: Whether http(s) image URLs may be fetched by the engine.
    """

    restarts: Any
    backend: str
    tool_parser: str | None = None
    allow_remote_images: bool = False

    def __post_init__(self) -> None:
        engine = self.restarts.engine
        # Read once: an engine started again has the same options, so the same tokenizer.
        self._tokenizer: Any = engine.get_tokenizer() if engine is not None else None

    def check(self, request: GenerationRequest) -> None:
        """Refuse, before anything is rendered or sent, what this engine's options do not allow.

        Raises:
            RequestRejectedError: A remote image without ``allow_remote_images=True``, or ``"auto"`` tool
                choice with tools and no ``tool_parser``.
        """
        remote = [url for url in request.images if url.startswith(("http://", "https://"))]
        if remote and not self.allow_remote_images:
            raise RequestRejectedError(
                f"{self.backend}: the prompt has a remote image ({remote[0][:80]!r}); the engine fetches "
                "remote images only with allow_remote_images=True (or send it with ab.image_part(bytes))",
                backend=self.backend,
                request_id=request.request_id,
            )
        if request.tools and request.tool_choice == "auto" and self.tool_parser is None:
            raise RequestRejectedError(
                f"{self.backend}: tool_choice='auto' needs the adapter option tool_parser (vLLM's name of "
                "the parser for this model's tool-call format, e.g. 'hermes' or 'llama3_json'; "
                "`-M tool_parser=hermes` in inspect, `tool_parser=hermes` in lm-eval's model args)"
                + (
                    _AFTER_FORCED_CALL
                    if _called_tools(request)
                    else "; or name a tool, or use 'required' or 'none'"
                ),
                backend=self.backend,
                request_id=request.request_id,
            )

    async def render(self, request: GenerationRequest) -> Any:
        """The engine input ``vllm serve`` makes of this request's body (after `check`).

        The request is built as vLLM's ``ChatCompletionRequest`` and rendered as its chat handler renders it
        (``preprocess_chat``): each tool as its pydantic ``model_dump()`` (``name``, ``description``,
        ``parameters``, unset ones as null), the validated messages, the request's chat and tokenization
        parameters, so a template that writes tools with ``tojson`` sees the server's tokens.

        Raises:
            RequestRejectedError: What `check` refuses, or the engine cannot render the messages.
        """
        self.check(request)
        engine = await self.restarts.current(request.request_id)  # after a restart under way, if any
        body = self._openai_request(request)
        tools = None if body.tools is None else [tool.model_dump() for tool in body.tools]
        config = engine.model_config
        media = config.multimodal_config.media_io_kwargs if config.multimodal_config else None
        params = body.build_chat_params(None, "auto").with_defaults(
            merge_kwargs(None, dict(tools=tools, tokenize=False)), default_media_io_kwargs=media
        )
        with warnings.catch_warnings():  # it reads the request's max_tokens, a field vLLM marks deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            tok_params = body.build_tok_params(config)
        try:
            _, prompts = await engine.renderer.render_chat_async([body.messages], params, tok_params)
        except Exception as exc:  # the template refuses the messages, an image does not decode, too long
            raise RequestRejectedError(
                f"{self.backend}: cannot render the chat: {type(exc).__name__}: {exc}",
                backend=self.backend,
                request_id=request.request_id,
            ) from exc
        return prompts[0]

    def _openai_request(self, request: GenerationRequest) -> Any:
        """The request as vLLM's server holds the body the ``openai`` adapter would send it."""
        choice: Any = request.tool_choice
        if choice not in ("auto", "none", "required"):
            choice = {"type": "function", "function": {"name": choice}}
        body: dict[str, Any] = {"model": "asyncbackends", "messages": [dict(m) for m in request.prompt]}  # type: ignore[arg-type]
        # As a client sends it: no tools, no tool_choice (the server's default is then "none").
        if request.tools:
            body.update(tools=[t.to_openai() for t in request.tools], tool_choice=choice)
        # Validated by vLLM's own model, as its server validates a request body.
        return ChatCompletionRequest.model_validate(body)

    def sampling(self, request: GenerationRequest, base: VLLMSamplingParams) -> VLLMSamplingParams:
        """``base`` with the structured output vLLM's server sets for a named or required tool choice."""
        if not request.tools or request.tool_choice == "none":
            return base
        params = base.clone()
        if request.tool_choice == "auto":  # `check` made sure there is a parser
            # As the server: parsers whose tool-call markers are special tokens need them in the text.
            adjusted = self._parser(request).adjust_request(self._openai_request(request))
            params.skip_special_tokens = bool(adjusted.skip_special_tokens)
            return params
        if params.structured_outputs is not None:
            raise InvalidRequestError(
                "json_schema/regex cannot be combined with a named or required tool choice"
            )
        openai = self._openai_request(request)
        schema = get_json_schema_from_tools(openai.tool_choice, openai.tools)
        params.structured_outputs = StructuredOutputsParams(json=schema)
        return params

    def _parser(self, request: GenerationRequest) -> Any:
        parser_class = ToolParserManager.get_tool_parser(self.tool_parser)  # type: ignore[arg-type]
        tools = self._openai_request(request).tools
        return parser_class(self._tokenizer, tools)

    def tool_calls(
        self, request: GenerationRequest, completions: tuple[Completion, ...]
    ) -> tuple[Completion, ...]:
        """The completions with the tool calls their text holds, read as vLLM's server reads them."""
        choice = request.tool_choice
        if not request.tools or choice == "none":
            return completions
        return tuple(self._read(request, completion) for completion in completions)

    def _read(self, request: GenerationRequest, completion: Completion) -> Completion:
        choice, text = request.tool_choice, completion.text
        calls: list[ToolCall] = []
        content = text
        try:
            if choice == "auto":
                info = self._parser(request).extract_tool_calls(text, self._openai_request(request))
                if info.tools_called:
                    calls = [
                        ToolCall(call.id or make_tool_call_id(), call.function.name, call.function.arguments)
                        for call in info.tool_calls
                    ]
                    content = info.content or ""
            elif choice == "required":
                parsed = json.loads(text)  # a list of {"name", "parameters"}, by the schema
                calls = [
                    ToolCall(
                        make_tool_call_id(), item["name"], json.dumps(item["parameters"], ensure_ascii=False)
                    )
                    for item in parsed
                ]
                content = ""
            else:  # a named tool: the text is its arguments, even cut short by max_tokens (as vLLM's server)
                calls, content = [ToolCall(make_tool_call_id(), choice, text)], ""
        except Exception as exc:  # cut short by max_tokens, or the parser failed: the text is the answer
            _log.debug("vllm: no tool call read from the output (%s: %s)", type(exc).__name__, exc)
            return completion
        if not calls:
            return completion
        finish = "tool_calls" if completion.finish_reason in (None, "stop") else completion.finish_reason
        return dataclasses.replace(completion, text=content, tool_calls=tuple(calls), finish_reason=finish)
