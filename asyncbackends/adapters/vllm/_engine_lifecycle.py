"""Starting and stopping the ``vllm`` adapter's ``AsyncLLM`` without stalling the shared loop.

An engine takes 20-70 s to start (loading weights, profiling memory, compiling, capturing CUDA graphs).
Built on the shared loop, it would freeze every other backend's requests on that loop for as long; so it is
built in a thread of its own. ``AsyncLLM`` supports that: built with no running loop it defers its loop-bound
tasks (the output handler, the ZeroMQ output reader) to first use, and its asyncio sockets bind to the loop
that first awaits them. `start_engine` then starts those tasks on the shared loop at once, as ``AsyncLLM``
does when built on a loop, so an engine that fails before the first request is noticed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM and torch, as in vllm.py
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

from ._shm import note_segments, release_segments

__all__ = ["shutdown_engine", "start_engine", "stop_engine"]

# How long the engine core gets to exit after SIGTERM before vLLM kills it. A healthy engine takes seconds
# (measured 7-20 s on a loaded 2-core machine), nearly all of it spent in vLLM's own processes, which run
# full-heap garbage collections of their start-up objects on the way out (vLLM issue #48620): first the
# worker, then the engine core, one after the other. vLLM's default of 5 s is shorter than that on a busy
# machine, and a kill that lands before the engine core has freed its shared memory leaves a segment behind
# (Python's "resource_tracker: There appear to be 1 leaked shared_memory objects" at exit) and logs
# "force killing remaining process". The timeout only bounds a hung engine: a healthy one exits sooner.
_PROCESS_STOP_TIMEOUT = 60.0
# The same for the engine core's wait on its workers (vLLM's VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, 5 by
# default): past it the engine core logs "workers still running after grace period" from its own process,
# where no filter of ours can reach, and signals them. Read by the engine core from the environment it
# inherits, so it is set while the engine starts, unless the user set it.
_WORKER_STOP_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
_WORKER_STOP_TIMEOUT = "30"
# How long the engine's loop-bound tasks get to finish once cancelled.
_TASK_STOP_TIMEOUT = 5.0


class _StartGate:
    """The process-wide lock on engine starts, which the starts of one group hold together.

    vLLM's start-up changes process-wide state (``os.environ``, torch's thread count, saved and restored
    without a lock), and an engine's processes inherit the environment it starts with. So starts take the
    gate in turn; only the members of one group, which start with the same environment, hold it at once. The
    first holder applies the group's environment (with the workers' grace) and notes torch's thread count;
    the last one restores both (starts overlapping inside vLLM could leave each other's thread count behind).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._group: object | None = None
        self._holders = 0
        self._saved: dict[str, str | None] = {}
        self._threads: int | None = None
        self.waiting = 0  # threads waiting for the gate (tests wait on it, not on the clock)

    @contextlib.contextmanager
    def hold(self, group: object, env: Mapping[str, str | None]) -> Iterator[None]:
        """Hold the gate for ``group`` (an object of its own for a start alone), its ``env`` applied."""
        with self._changed:
            self.waiting += 1
            try:
                self._changed.wait_for(lambda: self._holders == 0 or self._group is group)
            finally:
                self.waiting -= 1
            if self._holders == 0:
                # Read here, with no start's changes in place: a grace already set is the user's own.
                self._saved = _apply({**_worker_stop_env(), **env})
                self._threads = _torch_threads()
                self._group = group
            self._holders += 1
        try:
            yield
        finally:
            with self._changed:
                self._holders -= 1
                if self._holders == 0:
                    try:
                        _apply(self._saved)  # puts back what it replaced
                        if self._threads is not None:
                            _set_torch_threads(self._threads)
                    finally:
                        self._group = None
                        self._changed.notify_all()


_GATE = _StartGate()


async def start_engine(
    args: AsyncEngineArgs, env: Mapping[str, str | None] | None = None, group: object | None = None
) -> AsyncLLM:
    """Build the engine in a thread of its own with the offline ``LLM`` class's scheduler defaults.

    ``env`` overrides environment variables (``None`` removes one) while the engine starts, under the start
    gate: its processes inherit them (one of several engines gets its device or memory share this way).
    Starts take the gate one at a time, except those given one ``group`` (any object they share), which
    overlap: the caller vouches that vLLM allows it for them and that they start with the same ``env``
    (``_engine_plan.start_waves`` decides which: on a CPU only).

    The thread is a daemon, so a process that gives up on a start (Ctrl-C, a cancelled caller) can exit
    without waiting for it. Cancelling the caller cannot stop the build itself: the engine is shut down as
    soon as it exists, so a cancelled start leaves no engine process behind.

    Raises:
        Exception: Whatever ``AsyncLLM.from_engine_args`` or the start of the engine's output handler
            raised (the engine stopped first); the adapter maps it.
    """
    loop = asyncio.get_running_loop()
    built: asyncio.Future[AsyncLLM] = loop.create_future()

    def build() -> None:
        engine: AsyncLLM | None = None
        error: BaseException | None = None
        try:
            with _GATE.hold(group or object(), env or {}):
                engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)
        except BaseException as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(_settle, built, engine, error)
        except RuntimeError:  # the loop is gone (the process is exiting): nobody will use the engine
            if engine is not None:
                shutdown_engine(engine)

    threading.Thread(target=build, name="asyncbackends-vllm-start", daemon=True).start()
    try:
        engine = await built  # cancelling this cancels `built`; _settle then shuts the engine down
    except asyncio.CancelledError:
        if built.done() and not built.cancelled() and built.exception() is None:
            # Cancelled after `_settle` handed the engine over but before this task resumed: the engine is
            # this task's alone, and nobody else would stop it.
            _stop_in_thread(built.result())
        raise
    try:
        note_segments(engine)
        start_output_handler = getattr(engine, "_run_output_handler", None)
        if start_output_handler is not None:  # else (another vLLM) it starts with the first request
            start_output_handler()
    except BaseException:
        # Nobody else holds the engine: left running, its engine-core process would outlive the error.
        await stop_engine(engine)
        raise
    return engine


def _worker_stop_env() -> dict[str, str]:
    """The workers' grace for the engine's processes, spawned meanwhile, unless the user chose one."""
    return {} if _WORKER_STOP_ENV in os.environ else {_WORKER_STOP_ENV: _WORKER_STOP_TIMEOUT}


def _apply(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """Apply ``env`` to ``os.environ`` (``None`` removes a variable); return what to restore.

    All or nothing: a value the environment refuses (a NUL byte) puts back what was already set.
    """
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    except BaseException:
        _apply(saved)
        raise
    return saved


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")  # vLLM imports it before any engine starts
    return None if torch is None else int(torch.get_num_threads())


def _set_torch_threads(count: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)


def _settle(built: asyncio.Future[AsyncLLM], engine: AsyncLLM | None, error: BaseException | None) -> None:
    if not built.cancelled():
        if error is not None:
            built.set_exception(error)
        else:
            built.set_result(engine)  # type: ignore[arg-type]  # no error: an engine
    elif engine is not None:
        _stop_in_thread(engine)


def _stop_in_thread(engine: AsyncLLM) -> None:
    # Nobody waits for this engine: stop it in a thread, not on the loop other backends use (it joins the
    # engine's processes), and not in a daemon, so that the processes are reaped before exit.
    threading.Thread(target=shutdown_engine, args=(engine,), name="asyncbackends-vllm-stop").start()


async def stop_engine(engine: AsyncLLM) -> None:
    """Stop a started engine from its own (the shared) loop without blocking that loop.

    ``AsyncLLM.shutdown`` joins the engine's processes (seconds): it runs in a thread, from which vLLM hands
    the closing of its loop-bound sockets and tasks back to this loop. Those tasks are awaited here, and the
    ZeroMQ context is destroyed only then: destroyed under a task still reading a socket, it makes that task
    fail with ``zmq.error.ContextTerminated``, printed as a traceback.
    """
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    here = asyncio.get_running_loop()
    # Only tasks on this loop can be awaited: an engine built on a loop manager that was shut down since
    # (a fresh one follows) has its tasks on a closed loop, where they will never run again.
    tasks = [
        task
        for task in (
            getattr(engine, "output_handler", None),
            getattr(resources, "output_queue_task", None),
            getattr(resources, "stats_update_task", None),
        )
        if isinstance(task, asyncio.Task) and not task.done() and task.get_loop() is here
    ]
    await asyncio.to_thread(_stop_quietly, engine)
    for task in tasks:  # vLLM cancels them from its thread; make sure, then let them finish
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_TASK_STOP_TIMEOUT)
    _destroy_context(engine)
    await asyncio.to_thread(release_segments, engine)  # waits for a dead core's workers to exit


def shutdown_engine(engine: AsyncLLM) -> None:
    """Stop an engine whose loop-bound tasks never started (a start nobody waits for), from any thread."""
    _stop_quietly(engine)
    _destroy_context(engine)


def _stop_quietly(engine: AsyncLLM) -> None:
    # vLLM logs each step of a shutdown at INFO ("[shutdown] MPClient: start", "... send sigterm to process
    # EngineCore", ...): routine for a stop that was asked for, so those records of this thread are dropped.
    # Warnings pass: with the grace above, "force killing remaining process" means the engine hung.
    # A filter on the handlers, not the logger: a logger's filters do not apply to its children's records.
    quiet = _RoutineShutdownSteps()
    handlers = [*logging.getLogger("vllm").handlers, *logging.getLogger().handlers]
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        # ``timeout`` is newer than some vLLM releases this adapter runs on (0.26 lacks it).
        if "timeout" in inspect.signature(engine.shutdown).parameters:
            engine.shutdown(timeout=_PROCESS_STOP_TIMEOUT)
        else:
            engine.shutdown()
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


class _RoutineShutdownSteps(logging.Filter):
    """Drops vLLM's INFO/DEBUG "[shutdown] ..." records logged by the thread that created the filter."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        routine = record.levelno < logging.WARNING and str(record.msg).startswith("[shutdown]")
        return not (routine and record.thread == self._thread)


def _destroy_context(engine: AsyncLLM) -> None:
    # vLLM's async client closes its ZeroMQ sockets but never terminates their context, whose finaliser then
    # warns "Unclosed context" (an error under -W error).
    ctx = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "ctx", None)
    if ctx is not None:
        with contextlib.suppress(Exception):
            ctx.destroy(linger=0)
