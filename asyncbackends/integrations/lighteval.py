"""lighteval on any asyncbackends backend, through lighteval's custom-model route.

lighteval's pipeline is synchronous and calls the model once per sampling method with every document of
the run. `AsyncBackendsModel` turns each call into one `run_batch` on the shared loop (bounded concurrency,
retries, order kept), so an async engine such as vLLM's ``AsyncLLM`` keeps one event loop for the whole run
instead of one ``asyncio.run`` per batch. ``num_samples`` (pass@k) becomes ``SamplingParams(n=...)``: one
request per document, the backend returning every sample.

Two ways in (see docs/integrations/lighteval.md):

* Python: ``Pipeline(model=AsyncBackendsModel(AsyncBackendsModelConfig(model_name=..., backend="vllm",
  backend_options={...})), ...)``, or ``model_config=AsyncBackendsModelConfig(...)``.
* ``lighteval custom NAME my_model.py TASKS`` where ``my_model.py`` subclasses `AsyncBackendsModel` and sets
  `AsyncBackendsModel.config_defaults`.

This file is also loaded by lighteval as a custom-model definition file (outside its package), so it uses
absolute imports only.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from asyncbackends._install import missing_extra

try:
    from lighteval.models.abstract_model import LightevalModel
    from lighteval.models.custom.custom_model import CustomModelConfig
    from lighteval.models.model_output import ModelResponse
    from lighteval.tasks.prompt_manager import PromptManager
    from lighteval.tasks.requests import Doc, SamplingMethod
    from lighteval.utils.cache_management import SampleCache, cached
    from pydantic import Field, field_validator
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(exc, __name__, "lighteval", "lighteval") from exc

from asyncbackends._field_checks import check_adapter
from asyncbackends._gather import RetryPolicy, run_batch
from asyncbackends._loop import get_loop_manager
from asyncbackends._protocol import AsyncBackend
from asyncbackends._registry import create_backend
from asyncbackends._sampling_table import OPTIONAL_SPECS, SAMPLING_TABLE
from asyncbackends._text import split_trailing_space
from asyncbackends._types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Prompt,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from asyncbackends.errors import ContextLengthError, InvalidRequestError
from asyncbackends.integrations._adapters import adapter_named, parse_lora_modules
from asyncbackends.integrations._failed_samples import FAILED_SCORE, eval_timeouts, length_failures
from asyncbackends.integrations._thinking import answer_without_tags, check_tag_pairs

__all__ = ["AsyncBackendsModel", "AsyncBackendsModelConfig"]

_DEFAULT_MAX_TOKENS = 256
log = logging.getLogger(__name__)

# GenerationParameters fields mapped onto SamplingParams by `sampling_params` (lighteval's name: ours): the
# table's plain renames, and response_format, a JSON Schema in OpenAI's wrapping (unwrapped there).
_MAPPED = {
    **{spec.lighteval: spec.name for spec in SAMPLING_TABLE if spec.lighteval},
    "response_format": "json_schema",
}
# The optional ones passed as they are, by lighteval's name.
_OPTIONAL = {spec.lighteval: spec.name for spec in OPTIONAL_SPECS if spec.lighteval}
# Fields that configure transformers' KV cache, not what is generated: nothing to map, nothing lost.
_MEMORY_ONLY = frozenset({"num_blocks", "block_size", "cache_implementation"})
# Fields whose value here asks for nothing (no beam search, no prompt truncation).
_NO_OP = {"early_stopping": False, "truncate_prompt": False}


class AsyncBackendsModelConfig(CustomModelConfig):
    """Which backend to build and how to gather requests; a lighteval `CustomModelConfig`.

    Attributes:
        model_name: The name lighteval records results and caches under.
        backend: A registered backend name (``"vllm"``, ``"tgi"``, ``"openai"``, ``"mock"``...).
        backend_options: Passed to `create_backend` unchanged (``model``, ``dtype``, ``url``...).
        concurrency: Requests in flight; ``None`` takes the backend's own hint.
        timeout: Seconds allowed per attempt in all; ``None`` (the default) or ``0`` for no limit.
        idle_timeout: Seconds an attempt may wait for the next byte or token (streaming backends); ``None``
            takes the default, 120 s; ``0`` for no limit. A long generation that keeps producing is never cut.
            Either option means the same whether given in Python or as text (``--model_args``:
            ``idle_timeout=None`` is the default, ``idle_timeout=0`` no limit); a negative is refused.
        max_attempts: Attempts per request for retryable errors, the first included.
        use_chat_template: Send chat messages (generation) and chat-rendered prompts (scoring). ``None``
            (the default) decides as lighteval's own vLLM and transformers models do: on when the backend's
            tokenizer has a chat template. A backend without a tokenizer (``tgi``, ``openai``...) gets plain
            prompts, with a warning: lighteval's own endpoint models always send chat messages.
        max_length: The model's context length, reported to lighteval; ``None`` asks the backend.
        progress: Show a progress bar per batch.
        ignore_generation_parameters: ``generation_parameters`` fields to drop on purpose (each logged once);
            any other set field with no equivalent (``length_penalty``, ``early_stopping=True``,
            ``truncate_prompt=True``) is an error when the model is built.
        reasoning_tags: For a backend that returns a thinking model's thought in its text: the ``(start,
            end)`` tag pairs, as lighteval's ``--reasoning-tags`` takes them: ``"[('<think>', '</think>')]"``.
            The thought is removed here (`answer_without_tags`), with the cases lighteval's removal misses:
            an end tag with no start (the template opened the thought) ends it, and no end tag at all (cut
            off by the token limit) is an empty answer. Stops then apply to the answer only. A backend that
            splits the thinking itself (`Completion.reasoning`) needs none.
        adapter: The LoRA adapter every request names (`ab.with_adapter`): one of ``lora_modules``, or one
            the backend serves by itself (an ``openai`` or ``tgi`` server's); ``None``: the base model. Part
            of the config, so lighteval's sample cache keeps each adapter's answers apart.
        lora_modules: The adapters the backend built from the config serves (its ``lora_modules`` option,
            e.g. the ``vllm`` backend's): a mapping of names to directories, or as text ``name=path``
            pairs joined by ``|`` (a bare path named by its directory) or a JSON object.
        model_definition_file_path: Where lighteval's loader finds the model class; this module by default.
    """

    model_definition_file_path: str = __file__
    backend: str = "mock"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    concurrency: int | None = None
    timeout: float | None = None
    idle_timeout: float | None = None
    max_attempts: int = 3
    use_chat_template: bool | None = None
    max_length: int | None = None
    progress: bool = True
    ignore_generation_parameters: list[str] = Field(default_factory=list)
    reasoning_tags: list[tuple[str, str]] | None = None
    adapter: str | None = None
    lora_modules: dict[str, str] | None = None

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _lora_modules(cls, value: Any) -> dict[str, str] | None:
        return parse_lora_modules(value)

    @field_validator("adapter", mode="before")
    @classmethod
    def _adapter(cls, value: Any) -> str | None:
        if value is not None:
            check_adapter(value)
        return value  # type: ignore[no-any-return]

    @field_validator("reasoning_tags", mode="before")
    @classmethod
    def _tag_pairs(cls, value: Any) -> list[tuple[str, str]] | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)  # lighteval's own spelling on its command line
            except (ValueError, SyntaxError) as exc:
                raise InvalidRequestError(f"reasoning_tags is not a list of pairs: {value!r}") from exc
        return check_tag_pairs(value)


def _backend_options(config: AsyncBackendsModelConfig) -> dict[str, Any]:
    """``backend_options`` with the config's ``lora_modules`` (given in one place or both, the same).

    Raises:
        InvalidRequestError: ``lora_modules`` in both places, different.
    """
    options = dict(config.backend_options)
    if config.lora_modules is None:
        return options
    given = options.get("lora_modules")
    if given is not None and parse_lora_modules(given) != config.lora_modules:
        raise InvalidRequestError(
            "lora_modules is given in the config and in backend_options, different: give it once"
        )
    options["lora_modules"] = config.lora_modules
    return options


class AsyncBackendsModel(LightevalModel):
    """A lighteval model that sends every request through an asyncbackends backend.

    Args:
        config: An `AsyncBackendsModelConfig`; a plain ``CustomModelConfig`` (the ``lighteval custom``
            command) is completed from `config_defaults`.
        backend: An already built backend to wrap instead of building one from the config; it is then left
            open by `cleanup`.
    """

    config_defaults: ClassVar[dict[str, Any]] = {}
    """Config fields a subclass fixes for the ``lighteval custom`` command, e.g. ``{"backend": "vllm"}``."""

    def __init__(self, config: CustomModelConfig, backend: AsyncBackend | None = None) -> None:
        # lighteval loads a definition file by executing it outside its package, so this class may come from
        # such a copy of this module: always use the config class of the importable one.
        from asyncbackends.integrations.lighteval import AsyncBackendsModelConfig as config_class

        if not isinstance(config, config_class):
            # A plain CustomModelConfig (the `lighteval custom` command): completed from config_defaults.
            fields = {**type(self).config_defaults, **config.model_dump(exclude_unset=True)}
            config = config_class(**fields)
        self.config = config
        _check_generation_parameters(config)
        self._owns_backend = backend is None
        if backend is None:
            backend = create_backend(config.backend, **_backend_options(config))
        self.backend: AsyncBackend = backend
        try:
            self.backend = adapter_named(backend, config.adapter)
        except BaseException:
            self.cleanup()  # a backend built here and refused must not outlive the error
            raise
        self.retry = RetryPolicy(max_attempts=config.max_attempts)
        self._chat_by_default = _chat_by_default(self.tokenizer, config.use_chat_template, self._name)
        self.prompt_manager = PromptManager(self._chat(), self.tokenizer, config.system_prompt)
        self._cache = SampleCache(config)

    # -- what lighteval asks of every model --------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The backend's tokenizer where it has one (vLLM), for chat templates; else ``None``."""
        return getattr(self.backend, "tokenizer", None)

    @property
    def add_special_tokens(self) -> bool:
        """Special tokens are the backend's business: it adds what its model expects."""
        return True

    @property
    def max_length(self) -> int:
        """The model's context length: from the config, else the backend's, else 4096."""
        configured = self.config.max_length or getattr(self.backend, "max_model_len", None)
        return int(configured or 4096)

    def cleanup(self) -> None:
        """Close the backend if this model built it."""
        if self._owns_backend:
            get_loop_manager().run(self.backend.aclose())

    # -- plumbing ------------------------------------------------------------------------------------

    @property
    def _name(self) -> str:
        return str(getattr(self.backend, "name", type(self.backend).__name__))

    def _run(self, requests: Sequence[Any], label: str) -> list[Any]:
        results = run_batch(
            self.backend,
            requests,
            concurrency=self.config.concurrency,
            timeout=eval_timeouts(self.config.timeout, self.config.idle_timeout),
            retry=self.retry,
            progress=f"{self._name}: {label}" if self.config.progress else False,
            return_exceptions=True,
        )
        length_failures(results, label, log)  # raises any other error; those stay in place as failed samples
        return results

    def _chat(self) -> bool:
        chosen = self.config.use_chat_template
        return self._chat_by_default if chosen is None else bool(chosen)

    def sampling_params(self, doc: Doc) -> SamplingParams:
        """The `SamplingParams` for one document: its size, stops and samples, the config's sampling.

        ``num_samples > 1`` needs a temperature above 0 in the config's ``generation_parameters``, as with
        lighteval's own vLLM model. With a chat template the task's stop sequences are not sent (the model
        ends its turn itself), as lighteval's models do. Penalties and the rest of
        `asyncbackends._sampling_table`'s ``lighteval`` names (``min_new_tokens``...) and ``response_format``
        (a JSON Schema) pass through, and so does the task's ``generation_grammar``
        (``json`` or ``regex``); the backend refuses what it cannot honour.
        """
        generation = self.config.generation_parameters
        ignored = set(self.config.ignore_generation_parameters)
        optional = {
            ours: getattr(generation, theirs)
            for theirs, ours in _OPTIONAL.items()
            if getattr(generation, theirs) is not None and theirs not in ignored
        }
        if generation.response_format is not None and "response_format" not in ignored:
            optional["json_schema"] = _response_format_schema(generation.response_format)
        optional.update(_grammar(doc))
        stop = [] if self._chat() else list(doc.stop_sequences or [])
        stop += [s for s in generation.stop_tokens or [] if s not in stop]
        temperature = float(generation.temperature or 0.0)
        return SamplingParams(
            max_tokens=generation.max_new_tokens or doc.generation_size or _DEFAULT_MAX_TOKENS,
            temperature=temperature,
            top_p=float(generation.top_p) if generation.top_p and temperature > 0 else 1.0,
            top_k=int(generation.top_k) if generation.top_k and temperature > 0 else None,
            stop=tuple(s for s in stop if s),
            n=max(1, int(doc.num_samples or 1)),
            seed=generation.seed,
            logprobs=bool(doc.use_logits),
            **optional,
        )

    def _generation_prompt(self, doc: Doc) -> Prompt:
        capabilities = getattr(self.backend, "capabilities", None)
        if self._chat() and (self.tokenizer is None or getattr(capabilities, "chat", False)):
            # The backend applies its own chat template (vLLM, OpenAI-compatible servers).
            return tuple(self.prompt_manager.prepare_prompt_api(doc))
        return str(self.prompt_manager.prepare_prompt(doc))

    # -- the three request types ----------------------------------------------------------------------

    @cached(SamplingMethod.GENERATIVE)  # type: ignore[untyped-decorator]
    def greedy_until(self, docs: list[Doc]) -> list[ModelResponse]:
        """Generate ``doc.num_samples`` completions per document, one request each, in document order."""
        prompts = [self._generation_prompt(doc) for doc in docs]
        params = [self.sampling_params(doc) for doc in docs]
        tags = self.config.reasoning_tags
        # A backend that cannot tell thinking from answer would end a thought at an answer-level stop: the
        # stops then apply to the answer once the thinking is removed here.
        split_here = bool(tags) and not self.backend.capabilities.reasoning
        requests = [
            GenerationRequest(prompt, replace(p, stop=()) if split_here else p, request_id=f"generate-{i}")
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
        ]
        results: list[GenerationResult] = self._run(requests, "generate")
        responses = []
        unclosed = total = 0
        for prompt, p, doc, result in zip(prompts, params, docs, results, strict=True):
            if isinstance(result, ContextLengthError):  # a failed sample: empty answers, never the error
                text = [""] * doc.num_samples
                responses.append(
                    ModelResponse(input=_listed(prompt), text=text, output_tokens=[[]] * len(text))
                )
                continue
            first = result.completions[0]
            answers = [answer_without_tags(c, tags or ()) for c in result.completions]
            unclosed += sum(a.unclosed for a in answers)
            total += len(answers)
            responses.append(
                ModelResponse(
                    input=_listed(prompt),
                    text=[
                        re.split("|".join(map(re.escape, p.stop)), a.text)[0] if p.stop else a.text
                        for a in answers
                    ],
                    reasonings=[c.reasoning for c in result.completions],
                    output_tokens=[list(c.token_ids) for c in result.completions],
                    logprobs=list(first.logprobs or []),
                )
            )
        if unclosed:
            log.warning(
                "%d of %d generations were cut off while thinking (the token limit came first): scored as "
                "empty answers",
                unclosed,
                total,
            )
        return responses

    @cached(SamplingMethod.LOGPROBS)  # type: ignore[untyped-decorator]
    def loglikelihood(self, docs: list[Doc]) -> list[ModelResponse]:
        """Score every choice of every document (and against ``unconditioned_query`` where set, for PMI)."""
        requests: list[LoglikelihoodRequest] = []
        spans = []
        contexts = []
        for doc in docs:
            context = str(self.prompt_manager.prepare_prompt(doc))
            contexts.append(context)
            start = len(requests)
            for choice in doc.choices:
                requests.append(LoglikelihoodRequest(*split_trailing_space(context, choice)))
            if doc.unconditioned_query is not None:
                for choice in doc.choices:
                    requests.append(
                        LoglikelihoodRequest(*split_trailing_space(doc.unconditioned_query, choice))
                    )
            spans.append((start, len(requests)))
        results: list[LoglikelihoodResult] = self._run(requests, "loglikelihood")
        responses = []
        for doc, context, (start, end) in zip(docs, contexts, spans, strict=True):
            scored = results[start:end]
            choices = scored[: len(doc.choices)]
            responses.append(
                ModelResponse(
                    input=context,
                    # lighteval's PMI normalisation reads the unconditioned scores after the conditioned ones.
                    logprobs=[_logprob(r) for r in scored],
                    argmax_logits_eq_gold=[_greedy(r) for r in choices],
                )
            )
        return responses

    # Not behind lighteval's sample cache: in 0.13 it files any response with logprobs under LOGPROBS, so
    # cached perplexity responses would never be found again (the call would return nothing).
    def loglikelihood_rolling(self, docs: list[Doc]) -> list[ModelResponse]:
        """Score each document's whole text (its prompt followed by its first choice, if any)."""
        texts = [
            str(self.prompt_manager.prepare_prompt(doc)) + (doc.choices[0] if doc.choices else "")
            for doc in docs
        ]
        results: list[LoglikelihoodResult] = self._run(
            [RollingLoglikelihoodRequest(text) for text in texts], "loglikelihood_rolling"
        )
        return [
            ModelResponse(input=text, logprobs=[_logprob(r)], argmax_logits_eq_gold=[_greedy(r)])
            for text, r in zip(texts, results, strict=True)
        ]


def _chat_by_default(tokenizer: Any, chosen: bool | None, backend: str) -> bool:
    """The default lighteval's own models take with ``tokenizer``: a chat template where it has one."""
    default = getattr(tokenizer, "chat_template", None) is not None
    if chosen is None and tokenizer is None:
        log.warning(
            "use_chat_template not set and backend %r has no tokenizer: prompts are sent as plain text, "
            "while lighteval's own endpoint models (tgi, inference endpoints, litellm) send chat messages; "
            "set use_chat_template=True for their prompts",
            backend,
        )
    return default


def _listed(prompt: Any) -> Any:
    return prompt if isinstance(prompt, str) else list(prompt)


def _logprob(result: LoglikelihoodResult | ContextLengthError) -> float:
    # A request that did not fit the model is a failed sample: below every real score.
    return FAILED_SCORE if isinstance(result, ContextLengthError) else float(result.logprob)


def _greedy(result: LoglikelihoodResult | ContextLengthError) -> bool:
    return not isinstance(result, ContextLengthError) and bool(result.is_greedy)


def _check_generation_parameters(config: AsyncBackendsModelConfig) -> None:
    """Refuse, before any request, a generation parameter that would otherwise be dropped in silence."""
    generation = config.generation_parameters
    ignored = set(config.ignore_generation_parameters)
    for name in type(generation).model_fields:
        value = getattr(generation, name)
        if value is None or name in _MAPPED or _NO_OP.get(name, object()) == value:
            continue
        if name in _MEMORY_ONLY:
            continue
        if name in ignored:
            log.warning(
                "generation parameter %s=%r ignored, as ignore_generation_parameters asks", name, value
            )
            continue
        raise InvalidRequestError(
            f"generation parameter {name}={value!r} has no asyncbackends equivalent; to run without it, "
            f"add {name!r} to the model config's ignore_generation_parameters"
        )
    if generation.response_format is not None and "response_format" not in ignored:
        _response_format_schema(generation.response_format)


def _response_format_schema(response_format: str) -> dict[str, Any]:
    """The JSON Schema of an OpenAI ``response_format`` given as JSON text (lighteval's field is a str)."""
    try:
        data = json.loads(response_format)
    except ValueError as exc:
        raise InvalidRequestError(f"response_format is not JSON: {exc}") from exc
    if isinstance(data, dict) and data.get("type") == "json_schema":
        inner = data.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if isinstance(schema, dict):
            return schema
    raise InvalidRequestError(
        'response_format must be {"type": "json_schema", "json_schema": {"schema": {...}}}; '
        f"got {response_format!r}"
    )


def _grammar(doc: Doc) -> dict[str, Any]:
    """The task's ``generation_grammar`` (a TGI grammar type) as ``json_schema`` or ``regex``."""
    grammar = getattr(doc, "generation_grammar", None)
    if grammar is None:
        return {}
    kind = getattr(grammar, "type", None)
    value = getattr(grammar, "value", None)
    if kind == "json":
        return {"json_schema": json.loads(value) if isinstance(value, str) else value}
    if kind == "regex":
        return {"regex": value}
    raise InvalidRequestError(f"generation_grammar of type {kind!r} has no asyncbackends equivalent")
