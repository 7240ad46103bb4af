"""Starting and stopping the ``vllm`` adapter's ``AsyncLLM`` without stalling the shared loop.

An engine takes 20-70 s to start (loading weights, profiling memory, compiling, capturing CUDA graphs).
Built on the shared loop, it would freeze every other backend's requests on that loop for as long; so it is
built in a worker thread. ``AsyncLLM`` supports that: built with no running loop it defers its loop-bound
tasks (the output handler, the ZeroMQ output reader) to first use, and its asyncio sockets bind to the loop
that first awaits them. `start_engine` then starts those tasks on the shared loop at once, as ``AsyncLLM``
does when built on a loop, so an engine that fails before the first request is noticed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["shutdown_engine", "start_engine"]


async def start_engine(args: AsyncEngineArgs) -> AsyncLLM:
    """Build the engine in a worker thread with the offline ``LLM`` class's scheduler defaults.

    Cancelling the caller does not stop the thread (nothing can): the engine is shut down as soon as it
    exists, so a cancelled start leaves no engine process behind.

    Raises:
        Exception: Whatever ``AsyncLLM.from_engine_args`` raised; the adapter maps it.
    """
    loop = asyncio.get_running_loop()
    build = functools.partial(AsyncLLM.from_engine_args, args, usage_context=UsageContext.LLM_CLASS)
    starting = loop.run_in_executor(None, build)
    try:
        engine = await asyncio.shield(starting)
    except asyncio.CancelledError:
        starting.add_done_callback(_shut_down_when_built)
        raise
    start_output_handler = getattr(engine, "_run_output_handler", None)
    if start_output_handler is not None:  # else (another vLLM) it starts with the first request
        start_output_handler()
    return engine


def _shut_down_when_built(starting: asyncio.Future[Any]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        shutdown_engine(starting.result())


def shutdown_engine(engine: AsyncLLM) -> None:
    """Stop the engine's processes and release its ZeroMQ context; call it on the shared loop."""
    engine.shutdown()
    # vLLM's async client closes its ZeroMQ sockets (here, synchronously: we are on its loop) but never
    # terminates their context, whose finaliser then warns "Unclosed context" (an error under -W error).
    ctx = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "ctx", None)
    if ctx is not None:
        with contextlib.suppress(Exception):
            ctx.destroy(linger=0)
