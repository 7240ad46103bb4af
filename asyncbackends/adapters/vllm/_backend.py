"""`VLLMBackend` (name ``vllm``): an in-process vLLM ``AsyncLLM`` engine.

The engine lives on the shared loop: `create` (through `create_backend`) starts it in a thread of its own
(`_engine_start`, `_engine_lifecycle`), and every request runs there, because ``AsyncLLM`` binds its output
handler to the loop that first used it. Each call sends exactly one engine request (a rolling loglikelihood
sends one per window) and waits for its final output (`_engine_calls`). Requests and results are translated
in `_requests`, chats rendered in `_chat`; this module holds the request path and the backend's lifetime.
Loglikelihoods ask the engine for the scored tokens only, the one-token choices of a question that arrive
together in one engine request (`_scoring_path`). An engine core that dies is started again and its requests
sent again, up to ``max_restarts`` (`_restart`): every part reads the engine from that one holder.

Throughput: ``AsyncLLM.from_engine_args`` picks the scheduler limits of ``UsageContext.ENGINE_CONTEXT``,
several times smaller than the offline ``LLM`` class's on a large GPU (max_num_seqs 128 vs 1024), which made
plain async evaluation run at a quarter of offline speed. This adapter builds the engine with
``UsageContext.LLM_CLASS`` and, like ``LLM``, with stats logging off, unless the options say otherwise.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._loop import get_loop_manager
from ..._protocol import BaseBackend
from ..._refusals import refuse_unclaimed_chat, refuse_unsupported
from ..._types import (
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
)
from ...errors import BackendError, ContextLengthError
from .._checkpoint import checkpoint_fields
from .._lora_dirs import read_lora_modules
from . import _checks
from ._checks import FINGERPRINT_OPTIONS as _FINGERPRINT_OPTIONS
from ._checks import check_before_import, import_vllm
from ._engine_plan import check_engines
from ._engine_pool import VLLMEnginesBackend
from ._engine_start import start_engine_restarts, start_engines
from ._loglikelihoods import Loglikelihoods
from ._lora import AdapterPaths, lora_engine_options, prompt_logprobs_work
from ._options import DEFAULT_OPTIONS, AdapterOptions
from ._restart import DEFAULT_MAX_RESTARTS, EngineRestarts, check_max_restarts

if TYPE_CHECKING:
    # Bound at run time by `import_vllm` on the first `create`: importing vLLM takes 10 s or more, and what
    # can be checked without it (option names, a model path) is checked first.
    import vllm
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from ._chat import ChatPath
    from ._engine_calls import EngineCalls
    from ._reasoning import REFUSALS, ReasoningPath
    from ._requests import completions, engine_capabilities, vllm_sampling
    from ._requests import prompt_ids as translate_prompt
    from ._scoring_path import EngineScoring, scoring_mode

__all__ = ["VLLMBackend"]


class VLLMBackend(BaseBackend):
    """An in-process vLLM engine. Build it with ``create_backend("vllm", model=..., **engine_args)``.

    Args:
        restarts: The running ``AsyncLLM`` (built on the shared loop) in the holder that starts it again when
            its engine core dies (`_restart`); every part of the backend reads the engine from it.
        model: The model path or hub id it serves.
        engine_args: The options it was built with (for the fingerprint).
        options: The adapter's own options (`AdapterOptions`, which says what each does).
        max_concurrency: The concurrency hint for `gather`; ``None`` picks one from the scheduler limits.

    Attributes:
        adapters: The LoRA adapters' names (``lora_modules``), sorted; ``None`` without them.
        max_loras: The adapters the engine holds at once (a router's slots); ``None`` without adapters.
    """

    name = "vllm"

    def __init__(
        self,
        restarts: EngineRestarts,
        *,
        model: str,
        engine_args: Mapping[str, Any] | None = None,
        options: AdapterOptions = DEFAULT_OPTIONS,
        max_concurrency: int | None = None,
    ) -> None:
        engine: AsyncLLM = restarts.engine
        self._restarts = restarts
        calls = EngineCalls(
            restarts, backend=self.name, check_open=self._check_open, closed=lambda: self._closed
        )
        self._run = calls.run  # one engine request, sent again after a restart (`EngineCalls.run`)
        reasoning_parser = options.reasoning_parser
        self._chat = ChatPath(
            restarts, self.name, options.tool_parser, options.allow_remote_images, reasoning_parser
        )
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
        self.tokenizer: Any = engine.get_tokenizer()
        # How loglikelihoods are asked of the engine, chosen once from what this vLLM offers (_scoring_path).
        mode = scoring_mode(prompt_logprobs=prompt_logprobs_work(engine))
        self._scoring = EngineScoring(self._run, mode, backend=self.name)
        self._adapters = AdapterPaths(options.lora_modules, self._scoring)  # requests' LoRA adapters (_lora)
        # What a router reads to keep an adapter's requests where it is loaded (`_routing.replica`).
        modules = options.lora_modules
        self.adapters: tuple[str, ...] | None = tuple(modules.names) if modules is not None else None
        self.max_loras: int | None = (engine_args or {}).get("max_loras") if modules is not None else None
        self._loglikelihoods = Loglikelihoods(
            self.tokenizer,
            model=model,
            max_model_len=self.max_model_len,
            adapters=self._adapters,
            backend=self.name,
        )
        # The scheduler, not gather, should be the bottleneck: keep enough requests waiting in the engine
        # that each step finds a full batch (see docs/benchmarks.md for the measurement).
        hint = max_concurrency if max_concurrency is not None else max(1024, 4 * self.max_num_seqs)
        self.capabilities = engine_capabilities(
            images=multimodal,
            max_concurrency=hint,
            reasoning=bool(reasoning_parser),
            engine=engine,
            adapters=options.lora_modules is not None,
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
        options = AdapterOptions(
            tool_parser=tool_parser,
            allow_remote_images=allow_remote_images,
            reasoning_parser=reasoning_parser,
            max_restarts=check_max_restarts(max_restarts),
            # Read once for every engine: the same adapters, ids and digests in each (files read in a thread).
            lora_modules=await asyncio.to_thread(read_lora_modules, lora_modules),
        )
        count = check_engines(engines, routing, engine_args)
        modules = options.lora_modules
        if count != 1 or modules is not None:  # LoRA's defaults depend on the platform, which vLLM knows
            check_before_import(cls.name, model, engine_args)
            await asyncio.to_thread(import_vllm, globals())
        engine_args = lora_engine_options(
            modules, engine_args, on_cpu=modules is not None and _checks._on_cpu()
        )
        if count != 1:
            return await start_engines(cls._build, model, count, routing, engine_args, options)  # type: ignore[return-value]
        return await cls._build(model, engine_args, env=None, options=options)

    @classmethod
    async def _build(
        cls,
        model: str,
        engine_args: dict[str, Any],
        *,
        env: Mapping[str, str | None] | None,
        start_group: object | None = None,
        options: AdapterOptions = DEFAULT_OPTIONS,
        label: str = "vllm engine",
    ) -> VLLMBackend:
        """One engine's backend (`start_engine_restarts`), warmed up, its LoRA adapters loaded.

        The warm-up pays at the start what an engine's first request asking for logprobs pays
        (docs/adapters/vllm.md): it compiles vLLM's ``batched_count_greater_than`` (``torch.compile``, the
        sampled token's rank), once per engine process, about 2.4 s on a quiet CPU, 5-12 s on a loaded one,
        while later logprobs requests take 0.01 s. Every loglikelihood asks for logprobs, so without it the
        first one of a run paid that; a plain generation does not. One token after the one-token prompt the
        scorer uses for an empty context.
        """
        restarts = await start_engine_restarts(
            cls.name, model, engine_args, env=env, start_group=start_group, options=options, label=label
        )
        import_vllm(globals())  # this module's names (vLLM is imported by now: no wait)
        try:
            backend = cls(restarts, model=model, engine_args=engine_args, options=options)
            warm_up = VLLMSamplingParams(max_tokens=1, logprobs=0, detokenize=False)
            await backend._run([backend._loglikelihoods.stand_in], warm_up, None)
            await backend._adapters.load_all(restarts.engine.add_lora, model=model)
        except BaseException:
            await restarts.aclose()  # a started engine owns processes: never leak them
            raise
        return backend

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

    @property
    def restarts(self) -> int:
        """How many times the engine was started again after its engine core died (see ``max_restarts``)."""
        return self._restarts.count

    @property
    def _engine(self) -> AsyncLLM | None:
        """The engine started last, dead or alive (`EngineRestarts.latest`); ``None`` once closed."""
        engine: AsyncLLM | None = self._restarts.latest
        return engine

    # -- generation --------------------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate ``params.n`` completions with one engine request (see `AsyncBackend.generate`)."""
        self._check_open(request.request_id)
        params = request.params
        refuse_unsupported(
            params, self.capabilities, backend=self.name, request_id=request.request_id, reasons=REFUSALS
        )
        refuse_unclaimed_chat(request, self.capabilities, backend=self.name, reasons=self._not_multimodal)
        lora = self._adapters.lora_request(request, backend=self.name)
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

    async def loglikelihood(self, request: LoglikelihoodRequest) -> LoglikelihoodResult:
        """Score the continuation's tokens given the context (see `AsyncBackend.loglikelihood`).

        A context too long for the model is truncated from the left; a continuation that alone does not
        fit is refused with `RequestRejectedError`.
        """
        self._check_open(request.request_id)
        return await self._loglikelihoods.score(
            request, self._adapters.lora_request(request, backend=self.name)
        )

    async def loglikelihood_rolling(self, request: RollingLoglikelihoodRequest) -> LoglikelihoodResult:
        """Score a whole text in windows of the model's length, every token once (perplexity tasks)."""
        self._check_open(request.request_id)
        return await self._loglikelihoods.score_rolling(
            request, self._adapters.lora_request(request, backend=self.name)
        )

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
        # Stopping the engine drops the last references to it now, so AsyncLLM.__del__ runs while the
        # interpreter is intact; at exit it would call shutdown() again on half-torn-down modules.
        await self._restarts.aclose()
