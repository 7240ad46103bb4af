"""Chat for the ``vllm`` adapter, rendered as ``vllm serve`` renders the same chat completions body.

Every chat prompt is built as vLLM's own ``ChatCompletionRequest`` (the body the ``openai`` adapter would
send: messages, tools, tool choice) and rendered by the engine's renderer with that request's chat and
tokenization parameters, each tool as its pydantic ``model_dump()``, as the server's ``preprocess_chat``
does: the same template call, media loading and multimodal processing, so the prompt token ids equal the
server's (tests/parity/test_vllm_serve_prompts.py). Tool choice follows vLLM's OpenAI server: with the
adapter option ``tool_parser`` the request's sampling is adjusted and its output read by the parser the server
composes from the same names (``ParserManager.get_parser``: its ``adjust_request`` and ``parse``), so a named
or required choice is constrained as the server constrains it (for Hermes, an xgrammar structural tag
around ``<tool_call>`` JSON; for a parser without structural tags, vLLM's JSON schema of the call) and greedy
tool calls equal the server's (tests/parity/test_vllm_serve_tool_calls.py); output the parser cannot read
comes back as text. Without a ``tool_parser``, a named choice is constrained to that tool's parameters
schema and ``"required"`` to a JSON list of calls (vLLM's own schema builder), and ``"auto"`` is refused.
Imported by the adapter once vLLM is, like `_requests`.
"""

from __future__ import annotations

import dataclasses
import functools
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
    from vllm.parser import ParserManager
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
        tool_parser: vLLM's name of the tool parser (``vllm serve --tool-call-parser``), or ``None``.
        allow_remote_images: Whether http(s) image URLs may be fetched by the engine.
        reasoning_parser: vLLM's name of the engine's reasoning parser, or ``None``: the server composes it
            with the tool parser to adjust a request's sampling.
    """

    restarts: Any
    backend: str
    tool_parser: str | None = None
    allow_remote_images: bool = False
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        engine = self.restarts.engine
        # Read once: an engine started again has the same options, so the same tokenizer and configuration.
        self._tokenizer: Any = engine.get_tokenizer() if engine is not None else None
        self._model_config: Any = engine.model_config if engine is not None else None
        self._adjusting = self._reading = None
        if engine is not None and self.tool_parser is not None:
            # The parsers the server composes (`ParserManager.get_parser`, as its chat handler and renderer
            # do, with --enable-auto-tool-choice): the one that adjusts a request holds the reasoning parser
            # too, as the server's; the one that reads tool calls reads them from the answer, which
            # `_reasoning` has already split from the thinking.
            compose = functools.partial(
                ParserManager.get_parser,
                tool_parser_name=self.tool_parser,
                enable_auto_tools=True,
                model_name=engine.model_config.model,
                tokenizer=self._tokenizer,
            )
            self._adjusting = compose(reasoning_parser_name=self.reasoning_parser)
            self._reading = compose()

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
        """``base`` with what vLLM's server changes for the request's tools and tool choice.

        With a ``tool_parser``, as the server's renderer: the composed parser's ``adjust_request`` on the
        request, whose structured output and ``skip_special_tokens`` are then used. For Hermes (vLLM 0.32)
        that is an xgrammar structural tag for a named or required choice, ``<tool_call>`` + the call's JSON
        + ``</tool_call>``, and special tokens kept in the text for any choice but ``"none"``. Without one,
        a named or required choice is constrained to vLLM's JSON schema of the call(s), as the server does
        for a parser that has no structural tag.

        Raises:
            InvalidRequestError: ``json_schema``/``regex`` with a named or required tool choice.
        """
        choice = request.tool_choice
        if not request.tools or choice == "none":
            return base
        forced = choice != "auto"
        if forced and base.structured_outputs is not None:
            # The server drops the caller's constraint with a warning; an eval must not lose it silently.
            raise InvalidRequestError(
                "json_schema/regex cannot be combined with a named or required tool choice"
            )
        params = base.clone()
        openai = self._openai_request(request)
        if self._adjusting is None:  # `check` refused "auto" without a parser
            schema = get_json_schema_from_tools(openai.tool_choice, openai.tools)
            params.structured_outputs = StructuredOutputsParams(json=schema)
            return params
        parser = self._adjusting(
            self._tokenizer,
            openai.tools,
            model_config=self._model_config,
            chat_template_kwargs=self._template_kwargs(openai),
        )
        # The caller's json_schema/regex as the body's own constraint: with "auto" the server lets the
        # output be either a tool call or that (one structural tag holding both, where xgrammar can).
        openai.structured_outputs = base.structured_outputs
        adjusted = parser.adjust_request(openai)
        params.skip_special_tokens = bool(adjusted.skip_special_tokens)
        constraint = adjusted.extract_structured_outputs()
        if constraint is not None:
            params.structured_outputs = constraint
        return params

    @staticmethod
    def _template_kwargs(openai: Any) -> dict[str, Any]:
        return dict(openai.build_chat_params(None, "auto").chat_template_kwargs)

    def tool_calls(
        self, request: GenerationRequest, completions: tuple[Completion, ...]
    ) -> tuple[Completion, ...]:
        """The completions with the tool calls their text holds, read as vLLM's server reads them."""
        choice = request.tool_choice
        if not request.tools or choice == "none":
            return completions
        return tuple(self._read(request, completion) for completion in completions)

    def _read(self, request: GenerationRequest, completion: Completion) -> Completion:
        calls: list[ToolCall] = []
        content: str | None = (
            None  # the text beside the calls: none for a forced choice read without a parser
        )
        try:
            if self._reading is not None:  # the server's own parse of the answer
                openai = self._openai_request(request)
                parser = self._reading(
                    self._tokenizer,
                    openai.tools,
                    model_config=self._model_config,
                    chat_template_kwargs=self._template_kwargs(openai),
                )
                _, content, found = parser.parse(
                    completion.text,
                    openai,
                    enable_auto_tools=True,
                    model_output_token_ids=completion.token_ids,
                )
                calls = [
                    ToolCall(call.id or make_tool_call_id(), call.name, call.arguments)
                    for call in found or ()
                ]
            elif request.tool_choice == "required":  # a JSON list of {"name", "parameters"}, by the schema
                calls = [
                    ToolCall(
                        make_tool_call_id(), item["name"], json.dumps(item["parameters"], ensure_ascii=False)
                    )
                    for item in json.loads(completion.text)
                ]
            else:  # a named tool: the text is its arguments, even cut short by max_tokens (as vLLM's server)
                calls = [ToolCall(make_tool_call_id(), request.tool_choice, completion.text)]
        except Exception as exc:  # cut short by max_tokens, or the parser failed: the text is the answer
            _log.debug("vllm: no tool call read from the output (%s: %s)", type(exc).__name__, exc)
            return completion
        if not calls:
            return completion
        finish = "tool_calls" if completion.finish_reason in (None, "stop") else completion.finish_reason
        text = content or ""
        return dataclasses.replace(completion, text=text, tool_calls=tuple(calls), finish_reason=finish)
