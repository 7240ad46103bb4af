"""`LoopManager`: one daemon thread running one event loop for the whole process.

vLLM's `AsyncLLM`, aiohttp sessions and asyncio locks all bind to the loop that created them, so a sync
pipeline that calls `asyncio.run()` once per batch breaks on its second batch. Everything in this library
runs on the manager's loop instead: sync callers block on `run`, coroutines on other loops await `arun`.

The loop starts lazily on first use, uses uvloop when it is installed (set ``ASYNCBACKENDS_UVLOOP=0`` to
opt out), stops at interpreter exit, and is replaced in a child process after ``fork``: a loop thread does
not survive a fork, so the child builds its own on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread  # its exit hook first, so that ours (registered later) run before it
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import LoopError

__all__ = ["LoopManager", "get_loop_manager", "register_exit_hook"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# How long shutdown and Ctrl-C wait for cancelled work to finish its clean-up (aborting engine requests).
_CLEANUP_TIMEOUT = 10.0


def _new_event_loop() -> asyncio.AbstractEventLoop:
    if os.environ.get("ASYNCBACKENDS_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class LoopManager:
    """Owns the shared event loop and its thread. Get the process-wide one with `get_loop_manager`.

    Example:
        ```python
        manager = ab.get_loop_manager()
        result = manager.run(backend.generate(request))  # blocks this thread, runs on the shared loop
        ```
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stopped = False
        self._backends: weakref.WeakSet[Any] = weakref.WeakSet()
        # Threads blocked in `run`: released with `LoopError` by `shutdown` if their work never started.
        self._waiting: set[concurrent.futures.Future[Any]] = set()

    # -- state ---------------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The shared loop, started on first access.

        Raises:
            LoopError: The manager was shut down, or this is a forked child using its parent's manager.
        """
        loop = self._loop
        if loop is not None and self._pid == os.getpid() and not self._stopped:
            return loop
        with self._lock:
            self._check_usable()
            if self._loop is None:
                self._start()
            assert self._loop is not None
            return self._loop

    @property
    def running(self) -> bool:
        """Whether the loop thread has started and not been shut down."""
        return self._loop is not None and not self._stopped and self._pid == os.getpid()

    def in_loop_thread(self) -> bool:
        """Whether the calling thread is the shared loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _check_usable(self) -> None:
        if self._pid != os.getpid():
            raise LoopError(
                "this LoopManager belongs to the parent process; after fork call get_loop_manager() again"
            )
        if self._stopped:
            raise LoopError("the loop manager was shut down; get_loop_manager() returns a fresh one")

    def _start(self) -> None:
        loop = _new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        thread = threading.Thread(target=serve, name="asyncbackends-loop", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread = loop, thread

    # -- running work ----------------------------------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the shared loop and return a thread-safe future for its result.

        Cancelling the future cancels the task on the loop.
        """
        try:
            loop = self.loop
        except LoopError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the shared loop and block the calling thread until it finishes.

        A ``KeyboardInterrupt`` while waiting cancels the work on the loop, waits for its clean-up (engine
        requests aborted, connections closed) and re-raises, so a later `run` starts from a clean state.

        Raises:
            LoopError: Called from the loop's own thread (it would deadlock), or the manager is unusable.
        """
        if self.in_loop_thread():
            coro.close()
            raise LoopError(
                "a blocking asyncbackends call (run, run_batch, create_backend) was made from the shared "
                "loop's own thread, where it would deadlock; await the async form (gather, acreate_backend)"
            )
        try:
            loop = self.loop
        except LoopError:
            coro.close()
            raise
        finished = threading.Event()
        future = asyncio.run_coroutine_threadsafe(_signal_when_done(coro, finished), loop)
        self._waiting.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # Nobody but `shutdown` cancels this future or the task behind it (Ctrl-C is handled below).
            if self._stopped:
                raise LoopError("the loop manager was shut down while this call was running") from None
            raise
        except KeyboardInterrupt:
            future.cancel()
            if not finished.wait(_CLEANUP_TIMEOUT):
                log.warning("work cancelled by Ctrl-C did not finish its clean-up in %ss", _CLEANUP_TIMEOUT)
            raise
        finally:
            self._waiting.discard(future)

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the shared loop from any loop.

        Cancelling the caller cancels the work and waits (up to a bound) for its clean-up on the shared
        loop, so when the caller sees ``CancelledError`` the engine requests are already aborted.
        """
        here = asyncio.get_running_loop()
        if here is self._loop:
            return await coro
        cleaned_up = asyncio.Event()

        async def tracked() -> T:
            try:
                return await coro
            finally:
                with contextlib.suppress(RuntimeError):  # the caller's loop may be gone already
                    here.call_soon_threadsafe(cleaned_up.set)

        future = asyncio.wrap_future(self.submit(tracked()))
        try:
            return await future
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if self._stopped and caller is not None and not caller.cancelling():
                # Not the caller's cancellation: the work was cancelled by `shutdown`.
                raise LoopError("the loop manager was shut down while this call was running") from None
            future.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(cleaned_up.wait(), _CLEANUP_TIMEOUT)
            raise

    # -- lifetime ------------------------------------------------------------------------------------

    def track(self, backend: Any) -> None:
        """Remember a backend so `shutdown` closes it (held weakly: a dropped backend is not kept alive).

        A backend that cannot be weakly referenced (``__slots__`` without ``__weakref__``) is not tracked:
        closing it stays its owner's job.
        """
        with contextlib.suppress(TypeError):
            self._backends.add(backend)

    def shutdown(self) -> None:
        """Close tracked backends, cancel remaining work, stop the loop and join its thread. Idempotent.

        A thread blocked in `run` (a `run_batch`, say) while this runs gets `LoopError`.
        """
        with self._lock:
            if self._stopped or self._pid != os.getpid():
                self._stopped = True
                return
            self._stopped = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:
            loop.call_soon(loop.stop)
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._drain(), loop).result(_CLEANUP_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLEANUP_TIMEOUT)
        for future in list(self._waiting):
            future.cancel()  # work scheduled but never started: its caller gets LoopError, not a hang

    async def _drain(self) -> None:
        backends = list(self._backends)
        if backends:
            await asyncio.wait(
                [asyncio.ensure_future(b.aclose()) for b in backends], timeout=_CLEANUP_TIMEOUT / 2
            )
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLEANUP_TIMEOUT / 2)


async def _signal_when_done(coro: Coroutine[Any, Any, T], finished: threading.Event) -> T:
    try:
        return await coro
    finally:
        finished.set()


_manager: LoopManager | None = None
_manager_lock = threading.Lock()


def get_loop_manager() -> LoopManager:
    """The process-wide `LoopManager`; a fresh one after a fork or after `LoopManager.shutdown`.

    Code running on a manager's own loop gets that manager, shut down or not: a backend that `shutdown` closes
    closes on the loop its engine lives on, and finds a close already under way there.
    """
    global _manager
    manager = _manager
    if (
        manager is not None
        and manager._pid == os.getpid()
        and (not manager._stopped or manager.in_loop_thread())
    ):
        return manager
    with _manager_lock:
        if _manager is None or _manager._stopped or _manager._pid != os.getpid():
            _manager = LoopManager()
        return _manager


def _shutdown_at_exit() -> None:
    if _manager is not None and _manager._pid == os.getpid():
        _manager.shutdown()


def _reset_after_fork() -> None:
    # The loop thread does not exist in the child; its lock may be held by a thread that no longer exists.
    global _manager, _manager_lock
    _manager_lock = threading.Lock()
    _manager = None


def register_exit_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit while thread pools still take work; hooks run last-in first-out.

    Python stops every `concurrent.futures` thread pool (the loop's default executor: ``to_thread``,
    ``run_in_executor``, which vLLM's and our own clean-up use) in a threading exit hook that runs before any
    `atexit` function. A backend closed from `atexit` then fails with "cannot schedule new futures after
    interpreter shutdown", leaving a traceback after an eval's results and an engine killed half-closed (its
    shared memory leaked). Hooks registered here run before that one: it was registered when
    `concurrent.futures.thread` was imported, which this module does first.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - every CPython this package supports has it
        atexit.register(hook)
    else:
        register(hook)


register_exit_hook(_shutdown_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
