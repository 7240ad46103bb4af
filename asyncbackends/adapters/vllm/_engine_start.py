"""Starting the ``vllm`` adapter's engines: one engine with its restarts, or ``engines=N`` wave by wave.

`start_engine_restarts` starts one ``AsyncLLM`` (checked options, in a thread: `_engine_lifecycle`) and
returns it inside the holder that starts it again when its engine core dies (`_restart`), which every part
of a backend reads the engine from. `start_engines` starts several engines of one model as `_engine_plan`
plans them, through the backend's one-engine build, and puts the pool (`VLLMEnginesBackend`) over them.
`VLLMBackend.create` (`_backend`) calls both; neither imports vLLM before it is needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..._protocol import BaseBackend
from ..._registry import check_options
from ...errors import BackendBrokenError, InvalidRequestError
from . import _checks
from ._checks import check_before_import, engine_defaults, import_vllm
from ._engine_plan import EnginePlan, auto_engines, plan_engines, read_config, start_waves, visible_devices
from ._engine_pool import VLLMEnginesBackend
from ._options import AdapterOptions
from ._restart import EngineRestarts

if TYPE_CHECKING:
    # Bound at run time by `import_vllm`: importing vLLM takes 10 s or more.
    from vllm.engine.arg_utils import AsyncEngineArgs

    from ._chat import check_tool_parser
    from ._compat import VLLMError
    from ._engine_lifecycle import start_engine, stop_engine
    from ._reasoning import check_reasoning_parser

__all__ = ["BuildOne", "close_all", "start_engine_restarts", "start_engines"]


BuildOne = Callable[..., Awaitable[BaseBackend]]
"""Builds one engine's backend (`VLLMBackend._build`): ``build(model, engine_args, *, env, start_group,
options, label)``, ``env`` overriding the environment its processes start with."""


async def start_engine_restarts(
    backend: str,
    model: str,
    engine_args: dict[str, Any],
    *,
    env: Mapping[str, str | None] | None,
    start_group: object | None,
    options: AdapterOptions,
    label: str,
) -> EngineRestarts:
    """Start one engine and return it in its restarts holder; a restart starts it with the same options.

    The starts given one ``start_group`` overlap (`start_engine`); others take their turn.

    Raises:
        InvalidRequestError: An option that is not an ``AsyncEngineArgs`` field, an unknown parser, or an
            option the engine refuses.
        BackendBrokenError: The engine failed to start.
    """
    check_before_import(backend, model, engine_args)  # fast: names and paths, before vLLM loads
    await asyncio.to_thread(import_vllm, globals())  # not on the shared loop: it serves on meanwhile
    engine_fields = frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
    check_options(backend, engine_args, engine_fields - {"model"})
    check_tool_parser(options.tool_parser, backend=backend)
    check_reasoning_parser(options.reasoning_parser, backend=backend)
    engine_options = {**engine_defaults(engine_args), **engine_args}
    if options.reasoning_parser:  # the engine's too, as `vllm serve`'s: its thinking budget reads it
        engine_options["reasoning_parser"] = options.reasoning_parser
    try:
        args = AsyncEngineArgs(model=model, **engine_options)
    except (TypeError, ValueError, VLLMError) as exc:
        raise InvalidRequestError(f"vllm engine options refused: {exc}") from exc
    try:
        engine = await start_engine(args, env, start_group)  # in a thread: the shared loop serves on
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"vllm engine options refused: {exc}") from exc
    except Exception as exc:
        raise BackendBrokenError(f"vllm engine failed to start: {exc}", backend=backend) from exc
    # A fresh AsyncEngineArgs a start: vLLM may fill in fields of the one it is given.
    again = lambda: start_engine(AsyncEngineArgs(model=model, **engine_options), env)  # noqa: E731
    restarts = EngineRestarts(engine, start=again, stop=stop_engine, max_restarts=options.max_restarts)
    restarts.label = label
    return restarts


async def start_engines(
    build: BuildOne,
    model: str,
    engines: int | str,
    routing: str | None,
    engine_args: dict[str, Any],
    options: AdapterOptions,
) -> BaseBackend:
    """Several engines, started wave by wave as `_engine_plan` plans them, then the pool over them.

    ``"auto"`` picking one engine returns ``build``'s plain backend. If an engine fails to start, the others
    of its wave finish starting; then every started engine is closed and the first failure raised (the
    others noted on it). If the caller gives up (cancellation), the starts under way are cancelled (each
    shuts its engine down once built) and awaited, and the engines already started are closed. The closes
    run together: a close that fails, or a caller giving up meanwhile, leaves none of the others unclosed.
    """
    cpu = _checks._on_cpu()
    devices = [] if cpu else visible_devices(os.environ, _checks._device_count())
    if engines == "auto":
        count = auto_engines(read_config(model), on_cpu=cpu, gpus=len(devices))
        if count == 1:
            return await build(model, engine_args, env=None, options=options)
    else:
        count = int(engines)
    all_options = {**engine_defaults(engine_args), **engine_args}
    plans = plan_engines(count, all_options, environ=os.environ, on_cpu=cpu, devices=devices)
    built: dict[str, BaseBackend] = {}
    try:
        for wave in start_waves(plans, on_cpu=cpu):
            await _start_wave(build, model, wave, options, built)
        backend = VLLMEnginesBackend(
            [built[p.label] for p in plans],
            routing=routing or "least_loaded",
            labels=[p.label for p in plans],
        )
    except BaseException as exc:
        for failure in await close_all(built.values()):
            exc.add_note(f"an engine started meanwhile failed to close: {failure!r}")
        raise
    try:
        await backend.ready()
    except BaseException:
        await backend.aclose()
        raise
    return backend


async def _start_wave(
    build: BuildOne,
    model: str,
    wave: list[EnginePlan],
    options: AdapterOptions,
    built: dict[str, BaseBackend],
) -> None:
    """Start a wave's engines at once (one start-gate group), adding each started one to ``built``."""
    group = object() if len(wave) > 1 else None  # the token the wave's starts share (`start_engine`)
    tasks = [
        asyncio.ensure_future(
            build(model, p.options, env=p.env, start_group=group, options=options, label=f"vllm {p.label}")
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


async def close_all(engines: Iterable[BaseBackend]) -> list[BaseException]:
    """Close started engines together, each to its end; return the closes' failures.

    Shielded: a caller giving up meanwhile stops its waiting, not the closes, nor one not yet begun. Together:
    one failing (or slow) close holds up none of the others.
    """
    closes = asyncio.gather(*(engine.aclose() for engine in engines), return_exceptions=True)
    return [result for result in await asyncio.shield(closes) if isinstance(result, BaseException)]
