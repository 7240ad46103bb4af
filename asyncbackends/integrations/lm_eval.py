"""lm-evaluation-harness on any asyncbackends backend: an ``LM`` registered as ``asyncbackends``.

lm-eval calls ``loglikelihood``, ``loglikelihood_rolling`` and ``generate_until`` once per request type with
every request of the run, synchronously. Each call here becomes one `run_batch` on the shared loop: bounded
concurrency, retries, order kept, one progress bar, and the same engine for every call (calling
``asyncio.run`` per batch would break vLLM's ``AsyncLLM`` on the second one).

lm-eval has no plugin entry points for models: importing this module registers the name. From the shell,
``python -m asyncbackends.integrations.lm_eval`` is lm-eval's own command line with the model registered::

    python -m asyncbackends.integrations.lm_eval run --model asyncbackends --tasks hellaswag
        --model_args backend=vllm,model=/models/llama,dtype=float32,concurrency=64

A LoRA adapter, as lm-eval's own ``vllm`` model takes it (``lora_local_path``), or one of several served by
the engine (``lora_modules`` and ``adapter``)::

    --model_args backend=vllm,model=/models/llama,lora_local_path=/ckpt/math-v3
    --model_args backend=vllm,model=/models/llama,lora_modules=math=/ckpt/math|code=/ckpt/code,adapter=math
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._install import missing_extra

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import model_registry
    from lm_eval.models.utils import normalize_gen_kwargs
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(exc, __name__, "lm-eval", "lm-eval") from exc

from .._budget import Budget
from .._gather import RetryPolicy, run_batch
from .._protocol import AsyncBackend
from .._registry import create_backend
from .._sampling_table import OPTIONAL_SPECS, SAMPLING_TABLE
from .._text import EncodePairRequest
from .._text import split_trailing_space as split_trailing_space
from .._types import (
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from .._wrappers.limited import limited
from ..errors import ContextLengthError, InvalidRequestError
from ._adapters import adapter_named, merge_module, module_from_path, parse_lora_modules
from ._closing import close_when_dropped
from ._failed_samples import FAILED_LOGPROB, eval_timeouts, length_failures
from ._lm_eval_chat import chat_prompt, encode_history, refuse_chat_scoring
from ._thinking import answer_after

__all__ = ["MODEL_NAME", "AsyncBackendsLM", "main"]

MODEL_NAME = "asyncbackends"
"""The name lm-eval's ``--model`` takes once this module is imported."""

log = logging.getLogger(__name__)

# lm-eval passes these to every model's constructor whether or not it asked for them.
_LM_EVAL_EXTRAS = ("batch_size", "max_batch_size", "device")
# Generation kwargs mapped to SamplingParams (after lm-eval's normalisation), by lm-eval's name (the table's):
# the core ones in `sampling_params`' own code (greedy unless do_sample...), the optional ones as they are.
_GEN_KEYS = frozenset(
    {"do_sample", *(key for spec in SAMPLING_TABLE if not spec.optional for key in spec.lm_eval)}
)
_OPTIONAL_KEYS = {key: spec.name for spec in OPTIONAL_SPECS for key in spec.lm_eval}
# Keys whose value here asks for nothing beyond the default (one beam, one sequence, special tokens left out
# of the text, as every backend here decodes): nothing to map.
_DEFAULT_VALUES: dict[str, Any] = {"num_beams": 1, "num_return_sequences": 1, "skip_special_tokens": True}


def _concurrency(concurrency: int | None, batch_size: Any) -> int | None:
    if concurrency is not None:
        return int(concurrency)
    # lm-eval's command line defaults batch_size to 1, which as a concurrency would serialise the whole run:
    # only a larger integer is taken as a request for that many requests in flight.
    if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size > 1:
        return batch_size
    if isinstance(batch_size, str) and batch_size.isdigit() and int(batch_size) > 1:
        return int(batch_size)
    return None


def _lora_options(
    backend_options: dict[str, Any], lora_local_path: Any, lora_modules: Any, adapter: Any
) -> str | None:
    """Put the adapters' directories in ``backend_options`` (``lora_modules``); return the adapter to name.

    Raises:
        InvalidRequestError: ``lora_local_path`` and an ``adapter`` naming another, or ``lora_modules``
            with no ``adapter`` to say which of them this model evaluates.
    """
    modules = parse_lora_modules(lora_modules)
    # lm-eval reads a name such as "3" as a number.
    named = None if adapter is None else str(adapter)
    if lora_local_path is not None:
        name, path = module_from_path(str(lora_local_path), where="lora_local_path")
        if named is not None and named != name:
            raise InvalidRequestError(
                f"lora_local_path is adapter {name!r} (its directory's name) and adapter={named!r} names "
                "another: give one of them"
            )
        modules = merge_module(modules, name, path, where="lora_local_path")
        named = name
    elif modules is not None and named is None:
        # Evaluating the base on an engine loaded with adapters is never what lora_modules was given for.
        raise InvalidRequestError(
            f"lora_modules gives adapters {sorted(modules)}: name the one this model evaluates with "
            "adapter=NAME (one model per adapter; leave lora_modules out to evaluate the base)"
        )
    if modules is not None:
        backend_options["lora_modules"] = modules
    return named


class AsyncBackendsLM(LM):  # type: ignore[misc]  # lm-eval ships no type information
    """An lm-eval model that sends every request through an asyncbackends backend.

    Args:
        backend: A registered backend name (``"vllm"``, ``"tgi"``, ``"mock"``...) or a backend object.
        concurrency: Requests in flight; ``None`` takes lm-eval's ``batch_size`` when it is above 1, else the
            backend's own hint.
        timeout: Seconds allowed per attempt in all; ``None`` (the default) or ``0`` for no limit.
        idle_timeout: Seconds an attempt may wait for the next byte or token (streaming backends); ``None``
            takes the default, 120 s; ``0`` for no limit. A long generation that keeps producing is never cut.
            Either option means the same whether given in Python or as text (``--model_args``:
            ``idle_timeout=None`` is the default, ``idle_timeout=0`` no limit); a negative is refused.
        max_attempts: Attempts per request for retryable errors, the first included.
        progress: Show a progress bar per batch.
        cache: Path of a response cache (`ResponseCache`): a killed run resumes where it stopped.
        max_gen_toks: Tokens generated when a task does not say (lm-eval's default is 256).
        ignore_gen_kwargs: Generation kwargs to drop on purpose (a list, or names joined by ``|`` in
            ``--model_args``), each logged once; any other key with no equivalent is an error.
        think_end_token: lm-eval's option for reasoning models: what ends the thinking (``"</think>"``). The
            scored text is what follows it; a generation without it never finished thinking and scores as an
            empty answer. A backend that splits the thinking itself (`Completion.reasoning`) needs none.
        budget_tokens: The most tokens the whole evaluation may spend (every request type's run together);
            a request it cannot cover is not sent and the evaluation ends with `BudgetExceededError` (a rerun
            on the same ``cache`` with a larger budget sends only what was not sent).
        lora_local_path: A LoRA adapter's directory, as lm-eval's ``vllm`` model takes it: the backend built
            by name serves it (``lora_modules={<its directory's name>: path}``) and every request of this
            model names it.
        lora_modules: The adapters the backend built by name serves (its ``lora_modules`` option): a mapping,
            or ``name=path`` pairs joined by ``|`` (a comma would split lm-eval's ``--model_args``), or a
            JSON object. ``adapter`` says which one this model evaluates.
        adapter: The adapter every request of this model names (`ab.with_adapter`), among ``lora_modules``
            or the ones a backend object serves; ``None``: the base model.
        budget_cost: The most the whole evaluation may cost at the backend's prices (``price_input=``,
            ``price_output=``, ``price_cached_input=``, ``price_reasoning=`` per 1M tokens, given as options
            of a backend built by name).
        batch_size: Given by lm-eval; an integer above 1 is the concurrency unless ``concurrency`` is set.
        max_batch_size: Given by lm-eval; ignored.
        device: Given by lm-eval; ignored (the backend decides where it runs).
        **backend_options: Passed to `create_backend` unchanged (``model=``, ``dtype=``, ``url=``...).
    """

    def __init__(
        self,
        backend: str | AsyncBackend = "mock",
        *,
        concurrency: int | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        max_attempts: int = 3,
        progress: bool = True,
        cache: str | None = None,
        max_gen_toks: int = 256,
        ignore_gen_kwargs: str | Sequence[str] = (),
        think_end_token: str | None = None,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        lora_local_path: str | None = None,
        lora_modules: Any = None,
        adapter: str | None = None,
        batch_size: Any = None,
        max_batch_size: Any = None,
        device: Any = None,
        **backend_options: Any,
    ) -> None:
        super().__init__()
        # Prices as flat model args (a model_args string holds no mapping): `pricing`'s fields, checked there.
        prices = {
            k.removeprefix("price_"): backend_options.pop(k)
            for k in list(backend_options)
            if k[:6] == "price_"
        }
        if prices:
            backend_options["pricing"] = prices
        adapter = _lora_options(backend_options, lora_local_path, lora_modules, adapter)
        if isinstance(backend, str):
            self.backend: AsyncBackend = create_backend(backend, **backend_options)
            close_when_dropped(self, self.backend)  # lm-eval never calls close()
        elif backend_options:
            raise TypeError(
                f"backend options {sorted(backend_options)} given with a backend object; "
                "pass the backend's name instead, or build it with those options yourself"
            )
        else:
            self.backend = backend
        # Read before any wrapper hides it (wrappers forward side doors, not the model's name).
        self._model_name = str(getattr(self.backend, "model", ""))
        self.adapter = adapter
        self.backend = adapter_named(self.backend, adapter)
        if budget_tokens is not None or budget_cost is not None:
            # One budget for the evaluation's several runs: a wrapper holds it, as any limit outliving a run.
            self.backend = limited(self.backend, budget=Budget(tokens=budget_tokens, cost=budget_cost))
        self.concurrency = _concurrency(concurrency, batch_size)
        self.timeout = eval_timeouts(timeout, idle_timeout)
        self.retry = RetryPolicy(max_attempts=int(max_attempts))
        self.progress = bool(progress)
        self.cache = cache
        self.max_gen_toks = int(max_gen_toks)
        names = ignore_gen_kwargs.split("|") if isinstance(ignore_gen_kwargs, str) else ignore_gen_kwargs
        self.ignore_gen_kwargs = frozenset(n.strip() for n in names if n.strip())
        self._ignored_gen_keys: set[str] = set()
        if think_end_token is not None and (not isinstance(think_end_token, str) or not think_end_token):
            # lm-eval's hf model also takes a token id; our backends return text, so the token's text it is.
            raise InvalidRequestError(f"think_end_token must be the token's text, got {think_end_token!r}")
        self.think_end_token = think_end_token
        self._warned_is_greedy = False
        # lm-eval runs multimodal tasks only on a model that says it takes images.
        self.MULTIMODAL = bool(getattr(self.backend.capabilities, "images", False))

    @property
    def tokenizer_name(self) -> str:
        """What renders chat prompts (the backend), for lm-eval's request-cache fingerprint."""
        return f"asyncbackends/{self.backend_name}/{self._model_name}"

    def chat_template(self, chat_template: bool | str = False) -> str:
        """The backend applies its model's own template: nothing to choose here (lm-eval's fingerprint)."""
        return f"backend:{self.backend_name}"

    def apply_chat_template(
        self, chat_history: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Keep the messages: the backend renders them (``<image>`` placeholders become its image parts)."""
        return encode_history(chat_history, add_generation_prompt)

    @property
    def backend_name(self) -> str:
        """The backend's registry name, for logs and results."""
        return str(getattr(self.backend, "name", type(self.backend).__name__))

    def _run(self, requests: Sequence[Any], label: str, order: Sequence[int] | None = None) -> list[Any]:
        """One `run_batch` over ``requests`` sent in ``order`` (indices); results come back in input order."""
        sent = requests if order is None else [requests[i] for i in order]
        results = run_batch(
            self.backend,
            sent,
            concurrency=self.concurrency,
            timeout=self.timeout,
            retry=self.retry,
            progress=f"{self.backend_name}: {label}" if self.progress and self.rank == 0 else False,
            cache=self.cache,
            return_exceptions=True,
        )
        length_failures(results, label, log)  # raises any other error; those stay in place as failed samples
        if order is None:
            return results
        ordered: list[Any] = [None] * len(results)
        for position, index in enumerate(order):
            ordered[index] = results[position]
        return ordered

    # -- scoring -------------------------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Score each ``(context, continuation)``: returns ``(logprob, is_greedy)`` per request, in order."""
        args = [tuple(request.args) for request in requests]
        refuse_chat_scoring([arg[0] for arg in args])
        # Split into tokens as lm-eval's own models split them (_encode_pair), merges across the boundary
        # included, so every score is theirs (asyncbackends._text.Split).
        batch: list[LoglikelihoodRequest] = []
        for index, (context, continuation) in enumerate(args):
            context, continuation = split_trailing_space(context, continuation)
            batch.append(EncodePairRequest(context, continuation, request_id=f"loglikelihood-{index}"))
        # Longest contexts first, so the engine's batches stay full to the end; a context's continuations
        # next to each other, so an engine with a prefix cache finds the context it has just computed.
        order = sorted(range(len(args)), key=lambda i: (-len(args[i][0]), args[i][0], -len(args[i][1])))
        results: list[LoglikelihoodResult] = self._run(batch, "loglikelihood", order)
        answers = []
        for arg, result in zip(args, results, strict=True):
            if isinstance(result, ContextLengthError):
                answers.append((FAILED_LOGPROB, False))  # a failed sample: never cached
                continue
            if result.is_greedy is None and not self._warned_is_greedy:
                self._warned_is_greedy = True
                log.warning(
                    "backend %r cannot tell whether a continuation is greedy: reported as False",
                    self.backend_name,
                )
            answer = (float(result.logprob), bool(result.is_greedy))
            self.cache_hook.add_partial("loglikelihood", arg, answer)
            answers.append(answer)
        return answers

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Score each whole text (perplexity tasks): the summed logprob of every token, in order."""
        args = [tuple(request.args) for request in requests]
        refuse_chat_scoring([arg[0] for arg in args])
        batch = [RollingLoglikelihoodRequest(arg[0], request_id=f"rolling-{i}") for i, arg in enumerate(args)]
        results: list[LoglikelihoodResult] = self._run(batch, "loglikelihood_rolling")
        answers = []
        for arg, result in zip(args, results, strict=True):
            if isinstance(result, ContextLengthError):
                answers.append(FAILED_LOGPROB)
                continue
            self.cache_hook.add_partial("loglikelihood_rolling", arg, float(result.logprob))
            answers.append(float(result.logprob))
        return answers

    # -- generation ----------------------------------------------------------------------------------

    def sampling_params(self, gen_kwargs: Mapping[str, Any]) -> SamplingParams:
        """Map lm-eval generation kwargs to `SamplingParams` with lm-eval's own normalisation.

        ``until`` becomes ``stop``, ``max_gen_toks`` (or an alias) ``max_tokens``; ``do_sample=False`` means
        greedy whatever the temperature; ``top_p``, ``top_k`` and ``seed`` pass through, and so do the
        penalties, ``min_tokens`` (or transformers' ``min_new_tokens``), ``json_schema``, ``regex`` and the
        rest of `asyncbackends._sampling_table`'s ``lm_eval`` names (the backend refuses those it cannot
        honour).

        Raises:
            InvalidRequestError: A key with no equivalent (``num_beams=4``...), unless named in
                ``ignore_gen_kwargs``: it is never dropped in silence.
        """
        kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks))
        optional: dict[str, Any] = {}
        for key in sorted(set(kwargs) - _GEN_KEYS):
            value = kwargs[key]
            if key in _OPTIONAL_KEYS:
                if value is not None:
                    optional[_OPTIONAL_KEYS[key]] = value
            elif key in _DEFAULT_VALUES and value == _DEFAULT_VALUES[key]:
                continue
            elif key in self.ignore_gen_kwargs:
                if key not in self._ignored_gen_keys:
                    self._ignored_gen_keys.add(key)
                    log.warning("generation kwarg %r=%r ignored, as ignore_gen_kwargs asks", key, value)
            else:
                raise InvalidRequestError(
                    f"generation kwarg {key}={value!r} has no asyncbackends equivalent; to run without it, "
                    f"pass ignore_gen_kwargs={key} in --model_args (names joined by '|')"
                )
        until = kwargs.get("until") or []
        stop = tuple(s for s in ([until] if isinstance(until, str) else until) if s)
        temperature = float(kwargs.get("temperature") or 0.0) if kwargs.get("do_sample") else 0.0
        top_k = kwargs.get("top_k")
        return SamplingParams(
            max_tokens=int(kwargs["max_gen_toks"]),
            temperature=temperature,
            top_p=float(kwargs.get("top_p") or 1.0) if temperature > 0 else 1.0,
            top_k=int(top_k) if top_k and temperature > 0 else None,
            stop=stop,
            seed=None if kwargs.get("seed") is None else int(kwargs["seed"]),
            **optional,
        )

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Generate for each ``(context, gen_kwargs)`` until a stop string or the token limit, in order.

        A multimodal request (``(context, gen_kwargs, {"visual": images})``) becomes a chat prompt with image
        parts where the context's ``<image>`` placeholders are; it needs ``--apply_chat_template`` and a
        backend whose capabilities include images.

        Raises:
            InvalidRequestError: Images for a backend without them, or without ``--apply_chat_template``.
        """
        args = [tuple(request.args) for request in requests]
        visuals = [arg[2].get("visual") if len(arg) > 2 and arg[2] else None for arg in args]
        if any(visuals) and not self.MULTIMODAL:
            raise InvalidRequestError(
                f"lm-eval sent images, and backend {self.backend_name!r} does not accept them (its "
                "capabilities.images is false): use an image-capable backend, e.g. vllm with a "
                "vision-language model"
            )
        # A backend that splits the thinking ends generation at a stop only once thinking has ended; one that
        # does not would end a thought at an answer-level stop ("\n\n" inside it): as lm-eval's vllm model
        # does, the stops then apply after the thinking is split off here. A backend splits chats only (as
        # vllm serve's chat route does; its text route returns the output whole), so text prompts are split
        # here too.
        reasoning_backend = self.backend.capabilities.reasoning
        batch = []
        for index, (arg, visual) in enumerate(zip(args, visuals, strict=True)):
            params = self.sampling_params(arg[1])
            prompt = chat_prompt(arg[0], visual)
            split_here = self.think_end_token is not None and (
                not reasoning_backend or isinstance(prompt, str)
            )
            batch.append(
                GenerationRequest(
                    prompt,  # type: ignore[arg-type]  # a list of messages is a chat prompt
                    replace(params, stop=()) if split_here else params,
                    request_id=f"generate-{index}",
                )
            )
        # Longest prompts first: the last requests to start are the short ones, so the run's tail is short.
        order = sorted(range(len(args)), key=lambda i: (-len(args[i][0]), args[i][0]))
        results: list[GenerationResult] = self._run(batch, "generate_until", order)
        answers = []
        unclosed = 0
        for arg, result in zip([a[:2] for a in args], results, strict=True):
            if isinstance(result, ContextLengthError):
                answers.append("")  # a failed sample, scored as such: never the error's text
                continue
            answer = answer_after(result.completions[0], self.think_end_token)
            unclosed += answer.unclosed
            text = answer.text
            # A backend that ignores stop strings would leak the text after them: cut as lm-eval's models do.
            for stop in self.sampling_params(arg[1]).stop:
                text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", arg, text)
            answers.append(text)
        if unclosed:
            log.warning(
                "%d of %d generations were cut off while thinking (max_gen_toks reached first): scored as "
                "empty answers",
                unclosed,
                len(answers),
            )
        return answers

    def close(self) -> None:
        """Release the backend (its engine or HTTP session); idempotent."""
        from .._loop import get_loop_manager

        get_loop_manager().run(self.backend.aclose())


def _register() -> None:
    # Idempotent: importing this module twice must not trip lm-eval's duplicate-name check.
    if model_registry.get(MODEL_NAME, None) is not AsyncBackendsLM:
        model_registry.register(MODEL_NAME)(AsyncBackendsLM)


def main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's command line with the ``asyncbackends`` model registered (``python -m`` this module)."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    # Run as a script, this file is the module ``__main__``: import it under its real name so the class
    # lm-eval finds is the importable one, then hand over to lm-eval's command line.
    from asyncbackends.integrations.lm_eval import main as _main

    _main()
else:
    _register()
