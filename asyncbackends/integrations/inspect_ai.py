"""asyncbackends as an inspect_ai model provider: ``--model asyncbackends/<backend>[/<model>]``.

inspect finds this module through the ``inspect_ai`` entry-point group (the extra ``inspect``, installed
from the checkout); it registers the ``asyncbackends`` model API::

    inspect eval task.py --model asyncbackends/vllm//path/to/model -M enforce_eager=true
    inspect_ai.eval(task, model="asyncbackends/mock")
    inspect_ai.eval(task, model="asyncbackends/vllm/" + path)   # the rest of the name is the `model` option
    inspect eval task.py --model asyncbackends/vllm/BASE:/ckpt/math-v3      # a LoRA adapter (inspect's form)
    inspect eval task.py --model asyncbackends/vllm/BASE:math,asyncbackends/vllm/BASE:code \
        -M lora_modules='math=/ckpt/math|code=/ckpt/code'                   # one engine, both adapters

The model args (``-M``) are the backend's options, read as the ``asyncbackends`` command reads ``--option``;
inspect's own ``base_url`` and ``api_key`` become the backend's URL and key options. Each request is one
call to the backend on the shared loop: inspect keeps its own retries (our errors mapped to its retry
decisions) and connection limit (the backend's concurrency hint). One backend per model and options per
process, shared by every task of an eval set and closed when the last provider using it is closed.
See docs/integrations/inspect.md.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncbackends._install import missing_extra

try:
    from inspect_ai.model import (
        ChatMessage,
        GenerateConfig,
        Model,
        ModelAPI,
        ModelOutput,
        get_model,
        modelapi,
    )
    from inspect_ai.model._model import RetryDecision
    from inspect_ai.model._model_call import ModelCall
    from inspect_ai.tool import ToolChoice, ToolInfo
    from tenacity import RetryCallState
    from tenacity.wait import wait_base, wait_exponential_jitter
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(exc, __name__, "inspect_ai", "inspect") from exc

from asyncbackends._loop import get_loop_manager
from asyncbackends._options import DEFAULT_CONCURRENCY
from asyncbackends._parse import parse_option_value
from asyncbackends._protocol import AsyncBackend
from asyncbackends._registry import _factory, _load, _parameters, create_backend, required_options
from asyncbackends._results import Completion
from asyncbackends._timeouts import DEFAULT_IDLE, set_idle_timeout
from asyncbackends._types import GenerationRequest, GenerationResult
from asyncbackends._usage import pricing_of
from asyncbackends.errors import BackendError, ContextLengthError, InvalidRequestError, RateLimitedError
from asyncbackends.integrations._adapters import (
    adapter_named,
    merge_module,
    module_from_path,
    parse_lora_modules,
)
from asyncbackends.integrations._inspect_convert import (
    messages_of,
    model_output,
    sampling_params,
    tool_choice_of,
    tools_of,
)

__all__ = ["AsyncBackendsAPI", "backend_options", "inspect_model", "split_adapter"]

_URL_OPTIONS = ("base_url", "url")
_INSTANCE = "_asyncbackends_instance"  # the model arg `inspect_model` hands a built backend over in
_KEY_OPTIONS = ("api_key", "token")
# inspect's eval and get_model take `model` themselves (`get_model(model=m, **model_args)`): a `model` model
# arg stops inside inspect with a TypeError before any provider is called, so the name is the only way in.
_NO_MODEL = (
    "backend {backend!r} needs a model: give it in the model name, asyncbackends/{backend}/<model> "
    "(-M model=... and model_args={{'model': ...}} cannot reach the provider: inspect's get_model takes "
    "`model` for itself and stops with a TypeError)"
)


def _accepted(backend: str) -> set[str] | None:
    """The option names ``backend``'s factory takes, or ``None`` where it takes any (``**options``)."""
    cls = _load(backend)
    factory, _ = _factory(cls)
    params = _parameters(cls, factory) or []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _pick(backend: str, accepted: set[str] | None, candidates: tuple[str, ...], what: str) -> str:
    if accepted is None:
        return candidates[0]
    for name in candidates:
        if name in accepted:
            return name
    raise InvalidRequestError(f"backend {backend!r} takes no {what} option ({' or '.join(candidates)})")


def backend_options(
    model_name: str, model_args: Mapping[str, Any], base_url: str | None = None, api_key: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The backend name and its options from inspect's model name, model args, base URL and API key.

    ``vllm/some/model`` gives backend ``vllm`` with ``model="some/model"``; string model args are read as
    the CLI reads ``--option`` values (``"8"`` -> 8, ``"true"`` -> True, ``"[1, 2]"`` -> [1, 2]).

    Raises:
        InvalidRequestError: The name has no backend, or no model for a backend that needs one (the
            message names the ``asyncbackends/<backend>/<model>`` form), ``model`` is given twice with
            different values, or a URL or key is given to a backend that takes none.
        BackendNotFoundError: Unknown backend, or its extra is not installed.
    """
    backend, _, rest = model_name.partition("/")
    if not backend:
        raise InvalidRequestError(f"model {model_name!r}: expected asyncbackends/<backend>[/<model>]")
    options = {k: parse_option_value(v) if isinstance(v, str) else v for k, v in model_args.items()}
    if rest:
        if "model" in options and options["model"] != rest:
            raise InvalidRequestError(
                f"model given twice: {rest!r} in the model name and {options['model']!r} in the model args"
            )
        options["model"] = rest
    elif "model" not in options and "model" in required_options(backend):
        raise InvalidRequestError(_NO_MODEL.format(backend=backend))
    if base_url is not None or api_key is not None:
        accepted = _accepted(backend)
        if base_url is not None:
            options[_pick(backend, accepted, _URL_OPTIONS, "URL")] = base_url
        if api_key is not None:
            options[_pick(backend, accepted, _KEY_OPTIONS, "API key")] = api_key
    return backend, options


def split_adapter(model_name: str, model_args: Mapping[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    """The model name without its LoRA adapter, the model args with the adapters' directories, the adapter.

    inspect names an adapter ``<base>:<adapter>`` (its ``vllm`` provider's form). For a backend that loads
    adapters itself into an engine of its own (it takes a ``lora_modules`` option and no server URL:
    ``vllm``), the model part after ``<backend>/`` is split at its last ``:``, and the adapter part is:

    - a name among ``lora_modules`` (``-M lora_modules=name=path|name=path``, or a JSON object);
    - else a local directory: served as the adapter named by the directory's name (added to
      ``lora_modules``); only local directories, as the backend loads them (no hub download).

    Other backends' model names are taken whole, since server model names hold ``:`` (OpenAI's ``ft:...``,
    Ollama's ``llama3:8b``): ``-M adapter=NAME`` names an adapter their server serves. ``-M adapter`` works
    for every backend. A model path holding ``:`` is the model, whole, when it exists on disk; a base still
    holding ``:`` after the split and not on disk is refused as ambiguous.

    Raises:
        InvalidRequestError: An empty base or adapter around the ``:``, a base still holding ``:`` that is
            not a local path, two different adapters named (``:`` and ``-M adapter``), a path that is not a
            directory, a name not among ``lora_modules``, one name for two directories, or an adapter
            directory for a backend that loads none.
        BackendNotFoundError: Unknown backend, or its extra is not installed.
    """
    options = dict(model_args)
    modules = parse_lora_modules(options.pop("lora_modules", None), where="-M lora_modules")
    given = options.pop("adapter", None)
    adapter = None if given is None else str(given)
    backend, slash, rest = model_name.partition("/")
    accepted = _accepted(backend) if backend else set()
    loads_adapters = accepted is None or "lora_modules" in accepted
    # Only an in-process engine's model (a path or a hub id) is split: a server's model names hold ':'
    # (OpenAI's ft:..., Ollama's llama3:8b), and the openai adapter's lora_modules load onto the server.
    splits = loads_adapters and (accepted is None or not {"base_url", "url"} & accepted)
    named: str | None = None
    if splits and ":" in rest and not Path(rest).expanduser().exists():
        base, _, named = rest.rpartition(":")
        if not base or not named:
            raise InvalidRequestError(
                f"model {model_name!r}: expected asyncbackends/{backend}/<model>:<adapter>, with both parts"
            )
        if ":" in base and not Path(base).expanduser().exists():
            raise InvalidRequestError(
                f"model {model_name!r} holds more than one ':', and neither {rest!r} nor {base!r} is a local "
                "path: which ':' starts the adapter is ambiguous; name the model alone and the adapter with "
                "-M adapter=NAME (a directory's with -M lora_modules=NAME=PATH)"
            )
        model_name = f"{backend}{slash}{base}"
    if named is not None and adapter is not None and named != adapter:
        raise InvalidRequestError(
            f"model {model_name!r} names adapter {named!r} and -M adapter names {adapter!r}: give one"
        )
    adapter = named if named is not None else adapter
    if splits and adapter is not None and (modules is None or adapter not in modules):
        if not Path(adapter).expanduser().is_dir():
            known = f"not among lora_modules {sorted(modules)}" if modules else "given no lora_modules"
            raise InvalidRequestError(
                f"adapter {adapter!r}: {known}, and not a local directory (adapters are loaded from local "
                "directories only: download one first, e.g. `hf download`, and give its path)"
            )
        name, path = module_from_path(adapter, where="the model name's adapter")
        modules = merge_module(modules, name, path, where=f"the adapter directory {adapter!r}")
        adapter = name
    if modules is not None:
        if not loads_adapters:
            raise InvalidRequestError(
                f"backend {backend!r} loads no adapter directories (it takes no lora_modules option): "
                "name an adapter its server serves with -M adapter=NAME"
            )
        options["lora_modules"] = modules
    return model_name, options, adapter


@dataclass
class _Shared:
    backend: AsyncBackend
    users: int


# One backend per (name, options) per process: two tasks, or two GenerateConfigs, on one model share it.
_shared: dict[str, _Shared] = {}
_shared_lock = threading.Lock()


def _acquire(backend: str, options: dict[str, Any]) -> tuple[str, AsyncBackend]:
    key = json.dumps({"backend": backend, "options": options}, sort_keys=True, default=repr)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            # Built under the lock: a second provider for the same model waits for this engine, not a twin.
            entry = _shared[key] = _Shared(create_backend(backend, **options), 0)
        entry.users += 1
        return key, entry.backend


async def _release(key: str) -> None:
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            return
        entry.users -= 1
        if entry.users > 0:
            return
        del _shared[key]
    await get_loop_manager().arun(entry.backend.aclose())


async def _generate(backend: AsyncBackend, request: GenerationRequest, idle: float) -> GenerationResult:
    set_idle_timeout(idle)  # in this task, on the shared loop: what the adapter's stream reads
    return await backend.generate(request)


class _RetryAfterWait(wait_base):
    """inspect's default backoff, but a rate limit's Retry-After when the error carries one."""

    def __init__(self) -> None:
        self._default = wait_exponential_jitter(multiplier=3, max=30 * 60, jitter=3)

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            return float(error.retry_after)
        return float(self._default(retry_state))


class AsyncBackendsAPI(ModelAPI):
    """inspect's ``asyncbackends`` model API: any registered backend, built once per process.

    Args:
        model_name: ``<backend>``, ``<backend>/<model>``, or ``vllm/<model>:<adapter>`` (the part after
            ``asyncbackends/``; `split_adapter`).
        base_url: inspect's ``--model-base-url``: the backend's ``base_url`` or ``url`` option.
        api_key: The backend's ``api_key`` or ``token`` option.
        config: inspect's model config (the per-sample config arrives with each `generate`).
        **model_args: The backend's options (``-M key=value``); never ``model``, a name inspect keeps for
            itself (the model goes in ``model_name``). ``adapter`` and ``lora_modules`` name a LoRA adapter
            (`split_adapter`).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008 - inspect's own signature
        **model_args: Any,
    ) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        instance = model_args.pop(_INSTANCE, None)
        self.adapter: str | None = None
        if instance is not None:  # `inspect_model`: the caller's backend, left open at close
            self.backend_name = instance.name
            model = getattr(instance, "model", None)
            self._setup(instance, None, model if isinstance(model, str) else "")
            return
        name, model_args, self.adapter = split_adapter(model_name, model_args)
        self.backend_name, options = backend_options(name, model_args, base_url, api_key)
        # Shared by every model with the same options: models naming different adapters of one
        # lora_modules share one engine.
        key, backend = _acquire(self.backend_name, options)
        try:
            self._setup(adapter_named(backend, self.adapter), key, str(options.get("model", "")))
        except BaseException:
            get_loop_manager().run(_release(key))
            raise

    def _setup(self, backend: AsyncBackend, key: str | None, model: str) -> None:
        self.backend = backend
        self._key = key  # None: a backend the caller built and closes (`inspect_model`)
        self._closed = False
        # The identity without the options' values (a key may be among them): a digest tells models apart.
        digest = hashlib.sha256((key or f"id:{id(backend)}").encode()).hexdigest()[:12]
        self._connection_key = f"{backend.name}:{model}:{digest}"

    # -- what inspect asks of a provider -----------------------------------------------------------

    def connection_key(self) -> str:
        """The backend's identity: two tasks on one model share inspect's connection pool and our engine."""
        return self._connection_key

    def max_connections(self) -> int:
        """The backend's concurrency hint, else the library's default."""
        return self.backend.capabilities.max_concurrency or DEFAULT_CONCURRENCY

    def should_retry(self, ex: Exception) -> RetryDecision:
        """Rate limited (with its Retry-After), transient (``retryable`` errors), or final."""
        if isinstance(ex, RateLimitedError):
            return RetryDecision.rate_limit(ex.retry_after)
        if isinstance(ex, BackendError) and ex.retryable:
            return RetryDecision.transient()
        return RetryDecision.no()

    def retry_wait(self) -> wait_base:
        """Wait a rate limit's Retry-After where it gives one, else inspect's default backoff."""
        return _RetryAfterWait()

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> tuple[ModelOutput | Exception, ModelCall]:
        """Send one request to the backend on the shared loop; return inspect's output and the call."""
        params = sampling_params(config, self.backend.capabilities, self.backend_name)
        request = GenerationRequest(
            tuple(messages_of(input)),
            params=params,
            tools=tools_of(tools),
            tool_choice=tool_choice_of(tool_choice) if tools else "auto",
        )
        call = {
            "backend": self.backend_name,
            **({"adapter": self.adapter} if self.adapter is not None else {}),
            "prompt": request.prompt,
            "params": _params_dict(params),
            "tools": [t.to_openai() for t in request.tools],
            "tool_choice": request.tool_choice,
        }
        # inspect's stream_idle_timeout is our idle limit (inspect times attempts itself, attempt_timeout).
        idle = config.stream_idle_timeout or DEFAULT_IDLE
        try:
            result = await get_loop_manager().arun(_generate(self.backend, request, idle))
        except ContextLengthError as exc:
            # inspect's own stop reason for a prompt the model cannot hold: the sample ends there, with no
            # answer to grade (never the error's text as one).
            output = ModelOutput.from_content(self.model_name, "", stop_reason="model_length", error=str(exc))
            return output, ModelCall.create(call, {"error": str(exc)})
        input_tokens = result.prompt_tokens
        if input_tokens is None:
            input_tokens = await self.count_tokens(input, config)
        output = model_output(
            result,
            model=self.model_name,
            tools=tools,
            input_tokens=input_tokens,
            output_tokens=self._completion_tokens,
            token_text=self._token_text,
            pricing=pricing_of(self.backend),
        )
        response = {
            "completions": [
                {
                    "text": c.text,
                    "reasoning": c.reasoning,
                    "reasoning_truncated": c.reasoning_truncated,
                    "tool_calls": [t.to_openai() for t in c.tool_calls],
                }
                for c in result.completions
            ],
            "usage": output.usage,
        }
        return output, ModelCall.create(call, response)

    async def count_text_tokens(self, text: str) -> int:
        """Tokens in ``text`` by the backend's own tokenizer where it has one; else 4 characters a token.

        inspect's default counts with a tokenizer it downloads at first use, which fails offline.
        """
        tokenizer = getattr(self.backend, "tokenizer", None)
        if tokenizer is not None:
            return len(tokenizer.encode(text, add_special_tokens=False))
        if self.backend_name == "mock":
            return len(text)  # the mock's model reads one character as one token
        return max(1, (len(text) + 3) // 4) if text else 0

    def _completion_tokens(self, completion: Completion) -> int:
        if completion.token_ids:
            return len(completion.token_ids)
        # No ids reported (HTTP backends without return_token_ids): counted, as inspect's own estimate is.
        tokenizer = getattr(self.backend, "tokenizer", None)
        if tokenizer is not None:
            return len(tokenizer.encode(completion.text, add_special_tokens=False))
        return len(completion.text) if self.backend_name == "mock" else (len(completion.text) + 3) // 4

    def _token_text(self, token_id: int) -> str:
        tokenizer = getattr(self.backend, "tokenizer", None)
        if tokenizer is not None:
            return str(tokenizer.decode([token_id]))
        if self.backend_name == "mock":
            return chr(token_id)
        return f"token_id:{token_id}"  # vLLM's spelling for a token it cannot show as text

    async def aclose(self) -> None:
        """Release this provider's share of the backend; the last one out closes it (engine memory freed)."""
        if self._closed:
            return
        self._closed = True
        if self._key is not None:
            await _release(self._key)


def inspect_model(backend: AsyncBackend, *, config: GenerateConfig | None = None) -> Model:
    """An inspect `Model` on a backend you built (and close yourself): ``inspect_ai.eval(task, model=...)``.

    Args:
        backend: Any backend (``ab.create_backend(...)``, a pool, a wrapper).
        config: inspect's model config.
    """
    instance: dict[str, Any] = {_INSTANCE: backend}
    return get_model(
        f"asyncbackends/{backend.name}", config=config or GenerateConfig(), memoize=False, **instance
    )


def _params_dict(params: Any) -> dict[str, Any]:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}


@modelapi(name="asyncbackends")
def asyncbackends() -> type[ModelAPI]:
    """The ``asyncbackends`` model API (inspect calls this when a model name starts with it)."""
    return AsyncBackendsAPI
