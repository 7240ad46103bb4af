"""`VLLMBackend` (name ``vllm``): an in-process vLLM ``AsyncLLM`` engine.

The engine lives on the shared loop: `create` (through `create_backend`) builds it in a thread of its own and
starts its loop-bound tasks on the shared loop (`_engine_lifecycle`), and every request runs there, because
``AsyncLLM`` binds its output handler to the loop that first used it. Each call sends exactly one engine
request (a rolling loglikelihood sends one per window) with ``RequestOutputKind.FINAL_ONLY`` and waits for its
final output; a cancelled or failed call aborts its engine request instead of leaving it running. Requests
and results are translated in `_requests`; this module holds the engine's lifetime and the request path.
Loglikelihoods ask the engine for the scored tokens only, the one-token choices of a question that arrive
together in one engine request (`_scoring_path`). An engine core that dies is started again and its requests
sent again, up to ``max_restarts`` (`_restart`).

Throughput: ``AsyncLLM.from_engine_args`` picks the scheduler limits of ``UsageContext.ENGINE_CONTEXT``,
several times smaller than the offline ``LLM`` class's on a large GPU (max_num_seqs 128 vs 1024), which made
plain async evaluation run at a quarter of offline speed. This adapter builds the engine with
``UsageContext.LLM_CLASS`` and, like ``LLM``, with stats logging off, unless the options say otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..._loop import get_loop_manager
from ..._protocol import BaseBackend
from ..._refusals import refuse_unclaimed_chat, refuse_unsupported
from ..._registry import check_options
from ..._tasks import all_or_nothing
from ..._text import split_of
from ..._types import (
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ...errors import (
    BackendBrokenError,
    BackendClosedError,
    BackendError,
    ContextLengthError,
    InvalidRequestError,
    RateLimitedError,
    RequestRejectedError,
)
from .._checkpoint import checkpoint_fields
from .._lengths import says_context_length
from .._scoring import aplan_loglikelihood, plan_rolling, scored_result
from . import _checks
from ._checks import FINGERPRINT_OPTIONS as _FINGERPRINT_OPTIONS
from ._checks import check_before_import, engine_defaults, import_vllm
from ._engine_plan import (
    EnginePlan,
    auto_engines,
    check_engines,
    plan_engines,
    read_config,
    start_waves,
    visible_devices,
)
from ._engine_pool import VLLMEnginesBackend
from ._lora import AdapterPaths, LoraModules, lora_engine_options, prompt_logprobs_work, read_lora_modules
from ._restart import DEFAULT_MAX_RESTARTS, EngineDied, EngineRestarts, check_max_restarts
from ._text_encoder import TextEncoder

if TYPE_CHECKING:
    # Bound at run time by `import_vllm` on the first `create`: importing vLLM takes 10 s or more, and what
    # can be checked without it (option names, a model path) is checked first.
    import vllm
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.engine.output_processor import RequestOutputCollector

    from ._chat import ChatPath, check_tool_parser
    from ._compat import GracefulHTTPError, VLLMClientError, VLLMError
    from ._engine_lifecycle import start_engine, stop_engine
    from ._reasoning import REFUSALS, ReasoningPath, check_reasoning_parser
    from ._requests import completions, engine_capabilities, engine_input, vllm_sampling
    from ._requests import prompt_ids as translate_prompt
    from ._scoring_path import EngineScoring, scoring_mode

__all__ = ["VLLMBackend"]


class VLLMBackend(BaseBackend):
    """An in-process vLLM engine. Build it with ``create_backend("vllm", model=..., **engine_args)``.

    Args:
        engine: A running ``AsyncLLM``, built on the shared loop.
        model: The model path or hub id it serves.
        engine_args: The options it was built with (for the fingerprint).
        max_concurrency: The concurrency hint for `gather`; ``None`` picks one from the scheduler limits.
        tool_parser: vLLM's name of the tool parser that reads ``tool_choice="auto"`` output (``hermes``,
            ``llama3_json``, ...); without one, ``"auto"`` with tools is refused.
        allow_remote_images: Let the engine fetch http(s) image URLs; off by default (data URLs only).
        reasoning_parser: vLLM's name of the reasoning parser (``deepseek_r1``, ``qwen3``, ...; the engine was
            built with it): a chat's completions come back split into ``reasoning`` and the answer, as ``vllm
            serve --reasoning-parser`` splits them, and stop strings end only the answer (`_reasoning`); a
            text or token prompt's come back whole, as the server's ``/v1/completions`` returns them.
        restarts: Starts the engine again when it dies (`_restart`); ``None``: never.
        lora_modules: The LoRA adapters requests may name (`_lora`); ``None``: the base only.
    """

    name = "vllm"

    def __init__(
        self,
        engine: AsyncLLM,
        *,
        model: str,
        engine_args: Mapping[str, Any] | None = None,
        max_concurrency: int | None = None,
        tool_parser: str | None = None,
        allow_remote_images: bool = False,
        reasoning_parser: str | None = None,
        restarts: EngineRestarts | None = None,
        lora_modules: LoraModules | None = None,
    ) -> None:
        self._engine: AsyncLLM | None = engine
        self._restarts = restarts or EngineRestarts(engine, start=None, stop=stop_engine, max_restarts=0)
        self._restarts.on_restart = self._restarted
        self._chat = ChatPath(engine, self.name, tool_parser, allow_remote_images)
        self._reasoning = ReasoningPath(engine, reasoning_parser) if reasoning_parser else None
        multimodal = bool(engine.model_config.is_multimodal_model)
        self._not_multimodal = {} if multimodal else {"images": f"{model!r} is not a multimodal model"}
        self._closing: asyncio.Future[None] | None = None
        self.model = model
        self._dtype = str(engine.model_config.dtype).removeprefix("torch.")
        # Only what changes outputs is kept (for the fingerprint): never hf_token or other credentials.
        self._engine_args = {k: v for k, v in (engine_args or {}).items() if k in _FINGERPRINT_OPTIONS}
        if reasoning_parser:  # it changes what text holds
            self._engine_args["reasoning_parser"] = reasoning_parser
        self._checkpoint = checkpoint_fields(model, engine_args or {})  # retrained in place: other keys
        self.max_model_len: int = engine.model_config.max_model_len
        self.max_num_seqs: int = engine.vllm_config.scheduler_config.max_num_seqs
        tokenizer = engine.get_tokenizer()
        self.tokenizer: Any = tokenizer
        bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
        probe = tokenizer.encode("a", add_special_tokens=True)
        # Scoring mirrors generation: the special tokens the tokenizer puts in front of a text (Llama's BOS)
        # are in front of a scored context too. Detected once, instead of trusting add_special_tokens to
        # add nothing at the end (some tokenizers append EOS, which would break the tail split).
        self._prefix: tuple[int, ...] = (bos,) if bos is not None and probe[:1] == [bos] else ()
        stand_in = bos if bos is not None else eos
        if stand_in is None:
            raise InvalidRequestError(f"model {model!r}: its tokenizer has neither a BOS nor an EOS token")
        self._stand_in: int = stand_in
        # Scoring's texts are encoded in a worker thread, many requests' at once: on the loop thread that
        # encoding bounded scoring however many engines there were (docs/benchmarks.md). It makes its
        # futures and worker on the loop that runs the requests (the shared loop).
        self._encoder = TextEncoder(self._encode_texts)
        # How loglikelihoods are asked of the engine, chosen once from what this vLLM offers (_scoring_path).
        mode = scoring_mode(prompt_logprobs=prompt_logprobs_work(engine))
        self._scoring = EngineScoring(self._run, mode, backend=self.name)
        self._adapters = AdapterPaths(lora_modules, self._scoring)  # requests' LoRA adapters (_lora)
        # The engine refuses a prompt that leaves no room for one generated token.
        self._max_prompt_tokens = self.max_model_len - 1
        # The scheduler, not gather, should be the bottleneck: keep enough requests waiting in the engine
        # that each step finds a full batch (see docs/benchmarks.md for the measurement).
        hint = max_concurrency if max_concurrency is not None else max(1024, 4 * self.max_num_seqs)
        self.capabilities = engine_capabilities(
            images=multimodal,
            max_concurrency=hint,
            reasoning=bool(reasoning_parser),
            engine=engine,
            adapters=lora_modules is not None,
        )

    @classmethod
    async def create(
        cls,
        model: str,
        *,
        engines: int | str = 1,
        routing: str | None = None,
        tool_parser: str | None = None,
        allow_remote_images: bool = False,
        reasoning_parser: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        lora_modules: Mapping[str, str | os.PathLike[str]] | None = None,
        **engine_args: Any,
    ) -> VLLMBackend | VLLMEnginesBackend:
        """Build an ``AsyncLLM`` for the shared loop and wrap it (several, with ``engines``).

        The engine starts in a thread of its own, so other backends' requests on the shared loop go on while
        it loads; cancelling the call shuts the engine down as soon as it has started.

        Args:
            model: A model directory or hub id.
            tool_parser: vLLM's tool parser for ``tool_choice="auto"`` (see `VLLMBackend`).
            allow_remote_images: Let the engine fetch http(s) image URLs (see `VLLMBackend`).
            reasoning_parser: vLLM's reasoning parser: split thinking from the answer (see `VLLMBackend`).
            max_restarts: How many times an engine core that died is started again (same options) over the
                backend's life, the requests it held sent again; past that its requests fail with
                `BackendBrokenError`. Each engine of ``engines=N`` has its own count.
            lora_modules: LoRA adapters by name (``{"name": "/adapter/dir"}``, as ``vllm serve
                --lora-modules``) that requests name in ``adapter``; implies ``enable_lora``, and sets
                ``max_lora_rank`` (the adapters' largest rank, rounded up to one vLLM accepts) and
                ``max_loras`` (their number, one more on a CPU) unless given. See `_lora` and
                docs/adapters/vllm.md.
            **engine_args: ``AsyncEngineArgs`` fields, passed through unchanged (``tensor_parallel_size``,
                ``data_parallel_size``, ``max_model_len``, ``dtype``, ``gpu_memory_utilization``,
                ``max_num_seqs``...). Unset scheduler limits take the offline ``LLM`` class's defaults and
                ``disable_log_stats`` defaults to true, as with ``LLM``; on a CPU the KV cache gets 1 GiB
                unless ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE``
                say otherwise.
            engines: ``N`` engines of the model behind one backend (`VLLMEnginesBackend`: replicas
                ``engine-0``...), the memory settings being their total; ``"auto"`` picks the count
                (see docs/adapters/vllm.md); 1 (the default) builds this plain backend.
            routing: With several engines, the pool's routing: ``"least_loaded"`` (default) or ``"affinity"``.

        Raises:
            BackendNotFoundError: vLLM is not installed (with the pip command).
            InvalidRequestError: An option that is not an ``AsyncEngineArgs`` field (close matches named), a
                local model path that does not exist, a LoRA module that is not an adapter directory (found
                before vLLM is imported), an option the engine refuses, or an adapter it cannot load.
            BackendBrokenError: The engine failed to start.
        """
        chat: dict[str, Any] = dict(tool_parser=tool_parser, allow_remote_images=allow_remote_images)
        chat["reasoning_parser"] = reasoning_parser
        chat["max_restarts"] = check_max_restarts(max_restarts)
        count = check_engines(engines, routing, engine_args)
        # Read once for every engine: the same adapters, ids and digests in each (files read in a thread).
        chat["lora_modules"] = modules = await asyncio.to_thread(read_lora_modules, lora_modules)
        if count != 1 or modules is not None:  # LoRA's defaults depend on the platform, which vLLM knows
            check_before_import(cls.name, model, engine_args)
            await asyncio.to_thread(import_vllm, globals())
        engine_args = lora_engine_options(
            modules, engine_args, on_cpu=modules is not None and _checks._on_cpu()
        )
        if count != 1:
            return await cls._start_engines(model, count, routing, engine_args, chat)
        return await cls._build(model, engine_args, env=None, **chat)

    @classmethod
    async def _start_engines(
        cls,
        model: str,
        engines: int | str,
        routing: str | None,
        engine_args: dict[str, Any],
        chat: Mapping[str, Any],
    ) -> VLLMBackend | VLLMEnginesBackend:
        """Several engines, started wave by wave as `_engine_plan` plans them, then the pool over them.

        ``"auto"`` picking one engine builds the plain backend. If an engine fails to start, the others of its
        wave finish starting; then every started engine is closed and the first failure raised (the others
        noted on it). If the caller gives up (cancellation), the starts under way are cancelled (each shuts
        its engine down once built) and awaited, and the engines already started are closed. The closes run
        together: a close that fails, or a caller giving up meanwhile, leaves none of the others unclosed.
        """
        cpu = _checks._on_cpu()
        devices = [] if cpu else visible_devices(os.environ, _checks._device_count())
        if engines == "auto":
            count = auto_engines(read_config(model), on_cpu=cpu, gpus=len(devices))
            if count == 1:
                return await cls._build(model, engine_args, env=None, **chat)
        else:
            count = int(engines)
        options = {**engine_defaults(engine_args), **engine_args}
        plans = plan_engines(count, options, environ=os.environ, on_cpu=cpu, devices=devices)
        built: dict[str, VLLMBackend] = {}
        try:
            for wave in start_waves(plans, on_cpu=cpu):
                await cls._start_wave(model, wave, chat, built)
            backend = VLLMEnginesBackend(
                [built[p.label] for p in plans],
                routing=routing or "least_loaded",
                labels=[p.label for p in plans],
            )
        except BaseException as exc:
            for failure in await _close_all(built.values()):
                exc.add_note(f"an engine started meanwhile failed to close: {failure!r}")
            raise
        try:
            await backend.ready()
        except BaseException:
            await backend.aclose()
            raise
        return backend

    @classmethod
    async def _start_wave(
        cls, model: str, wave: list[EnginePlan], chat: Mapping[str, Any], built: dict[str, VLLMBackend]
    ) -> None:
        """Start a wave's engines at once (one start-gate group), adding each started one to ``built``."""
        group = object() if len(wave) > 1 else None  # the token the wave's starts share (`start_engine`)
        tasks = [
            asyncio.ensure_future(
                cls._build(model, p.options, env=p.env, start_group=group, label=f"vllm {p.label}", **chat)
            )
            for p in wave
        ]
        try:
            await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()  # those still starting: the caller gave up (each stops its engine once built)
            try:
                await asyncio.wait(tasks)  # none runs on behind the caller's error (cancelled: ends soon)
            finally:
                for plan, task in zip(wave, tasks, strict=True):
                    if task.done() and not task.cancelled() and task.exception() is None:
                        built[plan.label] = task.result()
        failed = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]
        if failed:
            for other in failed[1:]:
                failed[0].add_note(f"another engine failed to start too: {other!r}")
            raise failed[0]

    @classmethod
    async def _build(
        cls,
        model: str,
        engine_args: dict[str, Any],
        *,
        env: Mapping[str, str | None] | None,
        start_group: object | None = None,
        tool_parser: str | None = None,
        allow_remote_images: bool = False,
        reasoning_parser: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        lora_modules: LoraModules | None = None,
        label: str = "vllm engine",
    ) -> VLLMBackend:
        """One engine; ``env`` overrides the environment its processes start with.

        The starts given one ``start_group`` overlap (`start_engine`); others take their turn.
        """
        check_before_import(cls.name, model, engine_args)  # fast: names and paths, before vLLM loads
        await asyncio.to_thread(import_vllm, globals())  # not on the shared loop: it serves on meanwhile
        engine_fields = frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
        check_options(cls.name, engine_args, engine_fields - {"model"})
        check_tool_parser(tool_parser, backend=cls.name)
        check_reasoning_parser(reasoning_parser, backend=cls.name)
        options = {**engine_defaults(engine_args), **engine_args}
        if reasoning_parser:  # the engine's too, as `vllm serve`'s: its thinking budget reads it
            options["reasoning_parser"] = reasoning_parser
        try:
            args = AsyncEngineArgs(model=model, **options)
        except (TypeError, ValueError, VLLMError) as exc:
            raise InvalidRequestError(f"vllm engine options refused: {exc}") from exc
        try:
            engine = await start_engine(args, env, start_group)  # in a thread: the shared loop serves on
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"vllm engine options refused: {exc}") from exc
        except Exception as exc:
            raise BackendBrokenError(f"vllm engine failed to start: {exc}", backend=cls.name) from exc
        # A fresh AsyncEngineArgs a start: vLLM may fill in fields of the one it is given.
        again = lambda: start_engine(AsyncEngineArgs(model=model, **options), env)  # noqa: E731
        restarts = EngineRestarts(engine, start=again, stop=stop_engine, max_restarts=max_restarts)
        restarts.label = label
        try:
            backend = cls(
                engine,
                model=model,
                engine_args=engine_args,
                tool_parser=tool_parser,
                allow_remote_images=allow_remote_images,
                reasoning_parser=reasoning_parser,
                restarts=restarts,
                lora_modules=lora_modules,
            )
            await backend._warm_up()
            await backend._adapters.load_all(engine.add_lora, model=model)
        except BaseException:
            await stop_engine(engine)  # a started engine owns processes: never leak them
            raise
        return backend

    async def _warm_up(self) -> None:
        """Pay at the start what an engine's first request asking for logprobs pays (docs/adapters/vllm.md).

        That request compiles vLLM's ``batched_count_greater_than`` (``torch.compile``, the sampled token's
        rank), once per engine process: about 2.4 s on a quiet CPU, 5-12 s on a loaded one, while later
        logprobs requests take 0.01 s. Every loglikelihood asks for logprobs, so without this the first one
        of a run paid it; a plain generation does not. One token after the one-token prompt the scorer uses
        for an empty context.
        """
        await self._run(
            [self._stand_in], VLLMSamplingParams(max_tokens=1, logprobs=0, detokenize=False), None
        )

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The model (a local checkpoint by its files too), and the engine options that change outputs."""
        fingerprint: dict[str, Any] = {
            "name": self.name,
            "model": self.model,
            "dtype": self._dtype,
            "max_model_len": self.max_model_len,
            "vllm": vllm.__version__,
        }
        for option in _FINGERPRINT_OPTIONS:
            if option in self._engine_args:
                fingerprint[option] = self._engine_args[option]
        return {**fingerprint, **self._checkpoint, **self._adapters.fingerprint}

    @property
    def engine(self) -> AsyncLLM:
        """The ``AsyncLLM`` itself, for what this adapter does not cover; use it on the shared loop only.

        Raises:
            BackendClosedError: After `aclose`.
        """
        self._check_open()
        assert self._engine is not None
        return self._engine

    async def check_ready(self) -> None:
        """The engine's liveness (``AsyncLLM.check_health``), for a pool's readiness probe.

        Raises:
            BackendClosedError: After `aclose`.
            BackendBrokenError: The engine died and was not started again (see ``max_restarts``).
        """
        self._check_open()
        await self._restarts.check_ready(lambda engine: engine.check_health())

    # -- the engine boundary ---------------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        """How many times the engine was started again after its engine core died (see ``max_restarts``)."""
        return self._restarts.count

    def _restarted(self, engine: AsyncLLM) -> None:
        self._engine = self._chat.engine = engine
        if self._reasoning is not None:
            self._reasoning.engine = engine

    async def _run(
        self,
        prompt: list[int] | Any,
        params: VLLMSamplingParams,
        request_id: str | None,
        render: Callable[[], Awaitable[Any]] | None = None,
        watch: Callable[[RequestOutput], bool] | None = None,
        lora: LoRARequest | None = None,
    ) -> RequestOutput:
        """Send one engine request and wait for its final output; again after an engine restart.

        A rendered prompt is rendered again by ``render`` then, for the new engine's renderer. ``watch`` sees
        each output (of a streaming output kind); once it says True, the request is aborted. ``lora``: the
        adapter it is sent with (``None``: the base).
        """
        self._check_open(request_id)

        async def send(engine: AsyncLLM, again: bool) -> RequestOutput:
            fresh = await render() if again and render is not None else prompt
            return await self._send(engine, fresh, params, request_id, watch, lora)

        return await self._restarts.run(send, request_id)

    async def _send(
        self,
        engine: AsyncLLM,
        prompt: list[int] | Any,
        params: VLLMSamplingParams,
        request_id: str | None,
        watch: Callable[[RequestOutput], bool] | None = None,
        lora: LoRARequest | None = None,
    ) -> RequestOutput:
        """Send one engine request, wait for its final output, and translate engine errors to ours."""
        output: Any = None
        collector: RequestOutputCollector | None = None
        try:
            prompt = engine_input(engine, prompt) if isinstance(prompt, list) else prompt  # else rendered
            # What AsyncLLM.generate does, without its async generator: that generator, its aclosing
            # wrapper, its awaitable and the loop's weak reference to it were six more objects per request
            # in flight, all promoted to the collector's oldest generation (docs/benchmarks.md).
            collector = await engine.add_request(f"ab-{uuid.uuid4().hex}", prompt, params, lora_request=lora)
            while output is None or not output.finished:  # FINAL_ONLY: one output, all its completions
                output = collector.get_nowait() or await collector.get()
                if watch is not None and watch(output):
                    await self._abort(engine, collector.request_id)
                    break
        except EngineDeadError as exc:
            raise self._dead(exc, request_id) if self._closed else EngineDied() from exc
        except BaseException as exc:
            if collector is not None:
                # Cancelled or failed mid-way: the engine must not go on serving the request.
                await self._abort(engine, collector.request_id)
            if isinstance(exc, Exception) and engine.errored and not self._closed:
                raise EngineDied() from exc
            if isinstance(exc, Exception):
                raise self._translate(exc, request_id) from exc
            raise
        finally:
            if collector is not None:
                collector.close()  # type: ignore[no-untyped-call]
        if self._closed:
            # aclose() aborted the engine's requests: what the engine hands back is an aborted fragment, not
            # a result (closed is closed).
            raise self._dead(RuntimeError("closed"), request_id)
        final: RequestOutput = output
        return final

    def _translate(self, exc: Exception, request_id: str | None) -> BackendError:
        if isinstance(exc, GracefulHTTPError):  # the engine's queue limits (max_num_queued_reqs): slow down
            return RateLimitedError(f"vllm: {exc}", backend=self.name, request_id=request_id)
        if isinstance(exc, VLLMClientError):  # validation: prompt too long, token id out of vocabulary...
            # vLLM's input processor: a prompt that leaves no room for one generated token (a prompt
            # that fits is generated up to max_model_len, finish reason "length", as vLLM does).
            kind = ContextLengthError if says_context_length(str(exc)) else RequestRejectedError
            return kind(f"vllm: {exc}", backend=self.name, request_id=request_id)
        if self._closed or (self._engine is not None and self._engine.errored):
            return self._dead(exc, request_id)
        return BackendError(
            f"vllm: {type(exc).__name__}: {exc}", backend=self.name, request_id=request_id, retryable=False
        )

    @staticmethod
    async def _abort(engine: AsyncLLM, internal_id: str) -> None:
        with contextlib.suppress(Exception):  # a failed abort (engine died) must not hide why we ended
            await engine.abort(internal_id, internal=True)

    def _dead(self, exc: BaseException, request_id: str | None) -> BackendError:
        if self._closed:
            return BackendClosedError("vllm backend was closed", backend=self.name, request_id=request_id)
        return BackendBrokenError(
            f"the vllm engine died ({type(exc).__name__}); build a new backend",
            backend=self.name,
            request_id=request_id,
        )

    # -- generation --------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate ``params.n`` completions with one engine request (see `AsyncBackend.generate`)."""
        self._check_open(request.request_id)
        params = request.params
        refuse_unsupported(
            params, self.capabilities, backend=self.name, request_id=request.request_id, reasons=REFUSALS
        )
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name, reasons=self._not_multimodal)
        lora = self._lora(request)
        if params.max_tokens > self.max_model_len:
            # `vllm serve` refuses it before anything else (its tokenization parameters); the engine alone
            # would generate up to max_model_len. A smaller max_tokens than the prompt leaves room for is
            # clamped to that room, as there (the engine stops at max_model_len: "length").
            raise ContextLengthError(
                f"vllm: max_tokens={params.max_tokens} cannot be greater than "
                f"max_model_len={self.max_model_len}; ask for fewer output tokens",
                backend=self.name,
                request_id=request.request_id,
            )
        # A chat is rendered by the engine as `vllm serve` renders the same chat completions body (ChatPath).
        chat = request.prompt_kind == "chat"
        prompt: Any = await self._chat.render(request) if chat else translate_prompt(self.tokenizer, request)
        if params.max_tokens == 0:
            # vLLM refuses max_tokens=0; the answer is known without asking it.
            empty = Completion("", (), () if params.logprobs else None, "length")
            length = len(prompt["prompt_token_ids"] if chat else prompt)
            return GenerationResult(request.request_id, (empty,) * params.n, length, self.model)
        sampling = self._chat.sampling(request, vllm_sampling(params)) if chat else vllm_sampling(params)
        render = (lambda: self._chat.render(request)) if chat else None
        # Only a chat is split, as only `vllm serve`'s /v1/chat/completions applies the reasoning parser: its
        # /v1/completions returns a text (or token) prompt's output whole, stop strings ending it anywhere.
        if self._reasoning is None or not chat:
            output = await self._run(prompt, sampling, request.request_id, render, lora=lora)
            got = completions(output, logprobs=params.logprobs)
        else:  # the thinking apart from the answer, stop strings ending the answer only
            run = functools.partial(self._run, request_id=request.request_id, render=render, lora=lora)
            got, output = await self._reasoning.generate(run, prompt, sampling, logprobs=params.logprobs)
        got = self._chat.tool_calls(request, got)  # from the answer alone, as the server reads them
        if len(got) != params.n:
            raise BackendError(
                f"vllm returned {len(got)} completions for n={params.n}",
                backend=self.name,
                request_id=request.request_id,
                retryable=False,
            )
        cached = getattr(output, "num_cached_tokens", None)  # the prefix cache's share of the prompt
        return GenerationResult(
            request.request_id,
            got,
            prompt_tokens=len(output.prompt_token_ids or ()),
            model=self.model,
            cached_prompt_tokens=cached if isinstance(cached, int) else None,
        )

    # -- scoring -------------------------------------------------------------------------------------

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        # The tokenizer's batch call, not encode() text by text: a fast tokenizer encodes the batch in Rust
        # across the cores with the GIL released, and its ids are encode()'s (tested).
        ids: list[list[int]] = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return ids

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score the continuation's tokens given the context's (see `AsyncBackend.loglikelihood`).

        A context too long for the model is truncated from the left; a continuation that alone does not
        fit is refused with `RequestRejectedError`.
        """
        self._check_open(request.request_id)
        scoring = self._adapters.scoring(self._lora(request))
        plan = await aplan_loglikelihood(
            request.context,
            request.continuation,
            encode=self._encoder.encode,
            prefix=self._prefix,
            empty_context_token=self._stand_in,
            max_prompt_tokens=self._max_prompt_tokens,
            split=split_of(request),
        )
        if plan is None:
            raise ContextLengthError(
                f"continuation does not fit in max_model_len={self.max_model_len}",
                backend=self.name,
                request_id=request.request_id,
            )
        return scored_result(request.request_id, await scoring.score(plan, request.request_id))

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text in windows of the model's length, every token once (perplexity tasks)."""
        self._check_open(request.request_id)
        score = self._adapters.scoring(self._lora(request)).score_prompt
        [ids] = await self._encoder.encode([request.text], keep=False)  # a whole document: not worth keeping
        plans = plan_rolling(ids, prefix_token=self._stand_in, max_prompt_tokens=self._max_prompt_tokens)
        windows = await all_or_nothing([score(plan, request.request_id) for plan in plans])
        return scored_result(request.request_id, [item for window in windows for item in window])

    def _lora(
        self, request: GenerationRequest | LoglikelihoodRequest | RollingLoglikelihoodRequest
    ) -> LoRARequest | None:
        """The request's adapter as a ``LoRARequest`` (``None``: the base); an unknown one refused."""
        return self._adapters.lora_request(request, backend=self.name)

    # -- lifetime ------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the engine and its processes; other calls, concurrent or later, wait until that has ended.

        Runs on the shared loop whichever loop awaits it (the engine's sockets and tasks live there), and the
        blocking part (joining processes) runs in a thread, so other backends on that loop go on meanwhile.
        """
        await get_loop_manager().arun(self._close_once())

    async def _close_once(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(super().aclose())
        elif self._closing.get_loop() is not asyncio.get_running_loop():
            # Closed on a manager's loop that stopped since (its shutdown closes every backend): that close
            # had its turn there and cannot be awaited from this loop; there is nothing left to do here.
            return
        # Shielded: a caller that gives up waiting does not cut the clean-up short for the others.
        await asyncio.shield(self._closing)

    async def _aclose(self) -> None:
        # Requests still in flight fail with EngineDeadError, which _run reports as BackendClosedError.
        self._engine = self._chat.engine = None
        if self._reasoning is not None:
            self._reasoning.engine = None
        # Dropping the last references now lets AsyncLLM.__del__ run while the interpreter is intact; at exit
        # it would call shutdown() again on half-torn-down modules and print a TypeError.
        await self._restarts.aclose()


async def _close_all(engines: Iterable[VLLMBackend]) -> list[BaseException]:
    """Close started engines together, each to its end; return the closes' failures.

    Shielded: a caller giving up meanwhile stops its waiting, not the closes, nor one not yet begun. Together:
    one failing (or slow) close holds up none of the others.
    """
    closes = asyncio.gather(*(engine.aclose() for engine in engines), return_exceptions=True)
    return [result for result in await asyncio.shield(closes) if isinstance(result, BaseException)]
