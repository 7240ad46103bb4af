from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import types
from typing import Any

import pytest

import asyncbackends as ab
import asyncbackends._loop as loop_module


async def _loop_and_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    return asyncio.get_running_loop(), threading.current_thread()


def test_one_manager_one_loop_reused() -> None:
    manager = ab.get_loop_manager()
    assert ab.get_loop_manager() is manager
    loop1, thread1 = manager.run(_loop_and_thread())
    loop2, thread2 = manager.run(_loop_and_thread())
    assert loop1 is loop2 is manager.loop
    assert thread1 is thread2 and thread1 is not threading.current_thread() and thread1.daemon


def test_submit_returns_a_concurrent_future() -> None:
    future = ab.get_loop_manager().submit(_loop_and_thread())
    loop, _ = future.result(timeout=5)
    assert loop is ab.get_loop_manager().loop


def test_arun_from_a_foreign_loop_runs_on_the_shared_loop() -> None:
    async def main() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        here = asyncio.get_running_loop()
        there, _ = await ab.get_loop_manager().arun(_loop_and_thread())
        return here, there

    here, there = asyncio.run(main())
    assert there is ab.get_loop_manager().loop and here is not there


def test_blocking_call_from_the_loop_thread_raises_loop_error() -> None:
    manager = ab.get_loop_manager()

    async def nested() -> str:
        async def inner() -> int:
            return 1

        try:
            manager.run(inner())
        except ab.LoopError as exc:
            return str(exc)
        return "no error"

    message = manager.run(nested())
    assert "deadlock" in message


def test_blocking_create_backend_from_the_loop_thread_raises() -> None:
    async def nested() -> type[BaseException] | None:
        try:
            ab.create_backend("mock")
        except ab.LoopError as exc:
            return type(exc)
        return None

    assert ab.get_loop_manager().run(nested()) is ab.LoopError


def test_shutdown_is_idempotent_and_a_fresh_manager_follows() -> None:
    manager = ab.get_loop_manager()
    loop, thread = manager.run(_loop_and_thread())
    manager.shutdown()
    manager.shutdown()
    thread.join(5)
    assert not thread.is_alive() and loop.is_closed()

    async def noop() -> None:
        return None

    with pytest.raises(ab.LoopError, match="shut down"):
        manager.run(noop())
    fresh = ab.get_loop_manager()
    assert fresh is not manager and ab.get_loop_manager() is fresh
    fresh_loop, fresh_thread = fresh.run(_loop_and_thread())
    assert fresh_loop is not loop and fresh_thread.is_alive() and not fresh_loop.is_closed()
    assert ab.run_batch(ab.create_backend("mock"), [ab.GenerationRequest("again")])[0].text == "again"


class _Hanging(ab.BaseBackend):
    name = "hanging"

    def __init__(self) -> None:
        self.started = threading.Event()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_shutdown_while_another_thread_is_in_run_batch_gives_it_loop_error() -> None:
    manager = ab.get_loop_manager()
    backend = _Hanging()
    caught: list[BaseException] = []

    def worker() -> None:
        try:
            ab.run_batch(backend, [ab.GenerationRequest("x")])
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert backend.started.wait(30)
    manager.shutdown()
    thread.join(30)
    assert len(caught) == 1 and isinstance(caught[0], ab.LoopError), caught
    assert "shut down" in str(caught[0])


def test_shutdown_while_a_foreign_loop_awaits_arun_gives_it_loop_error() -> None:
    manager = ab.get_loop_manager()
    backend = _Hanging()

    async def main() -> None:
        with pytest.raises(ab.LoopError, match="shut down"):
            await ab.gather(backend, [ab.GenerationRequest("x")])

    caught: list[BaseException] = []

    def in_thread() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # pragma: no cover - reported below
            caught.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    assert backend.started.wait(30)
    manager.shutdown()
    thread.join(30)
    assert not thread.is_alive() and caught == []


def test_shutdown_closes_tracked_backends() -> None:
    manager = ab.LoopManager()
    backend = ab.create_backend("mock")
    manager.track(backend)
    manager.run(backend.generate(ab.GenerationRequest("x")))
    manager.shutdown()
    assert backend.closed  # type: ignore[attr-defined]


class _ClosesOnTheSharedLoop:
    """Closes as the vllm adapter does: on `get_loop_manager()`'s loop, awaiting a close already begun."""

    name = "closes-on-the-shared-loop"

    def __init__(self) -> None:
        self.closing: asyncio.Future[None] | None = None
        self.managers: list[ab.LoopManager] = []

    async def aclose(self) -> None:
        self.managers.append(ab.get_loop_manager())
        await ab.get_loop_manager().arun(self._close_once())

    async def _close_once(self) -> None:
        if self.closing is None:
            self.closing = asyncio.ensure_future(asyncio.sleep(0.05))
        await asyncio.shield(self.closing)


def test_a_backend_closed_by_shutdown_finds_the_closing_manager_and_its_close_in_progress() -> None:
    # lm-eval drops its LM: the backend's close begins on the shared loop; the exit hook's shutdown then
    # closes it again. Seen from the loop, the manager is the one shutting down, not a fresh one (whose
    # loop would wait on the first close's future: "attached to a different loop").
    manager = ab.get_loop_manager()
    backend = _ClosesOnTheSharedLoop()
    manager.track(backend)
    first = manager.submit(backend.aclose())
    manager.shutdown()
    assert first.result(5) is None
    assert backend.managers == [manager, manager]
    assert backend.closing is not None and backend.closing.done() and backend.closing.exception() is None


def _child_uses_fresh_manager(
    parent_manager_id: int, parent_loop_id: int, queue: multiprocessing.Queue[object]
) -> None:
    # The parent's manager and loop objects still exist in the child's copy of memory, so a fresh manager
    # and loop have other ids.
    manager = ab.get_loop_manager()
    loop, thread = manager.run(_loop_and_thread())
    backend = ab.create_backend("mock")
    result = ab.run_batch(backend, [ab.GenerationRequest("fork")])
    fresh = id(manager) != parent_manager_id and id(loop) != parent_loop_id and thread.is_alive()
    queue.put((fresh, result[0].text))


def test_child_after_fork_gets_a_fresh_working_manager() -> None:
    manager = ab.get_loop_manager()
    parent_loop, _ = manager.run(_loop_and_thread())
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = ctx.Queue()
    process = ctx.Process(target=_child_uses_fresh_manager, args=(id(manager), id(parent_loop), queue))
    process.start()
    fresh, text = queue.get(timeout=30)  # type: ignore[misc]
    process.join(30)
    assert process.exitcode == 0 and fresh is True and text == "fork"


def test_parent_manager_object_refuses_use_in_a_forked_child() -> None:
    manager = ab.get_loop_manager()
    manager.run(_loop_and_thread())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's manager object must refuse, not hang
        try:
            manager.run(_loop_and_thread())
            code = 1
        except ab.LoopError:
            code = 0
        except BaseException:
            code = 2
        os.write(write, bytes([code]))
        os._exit(0)
    os.close(write)
    code = os.read(read, 1)
    os.waitpid(pid, 0)
    assert code == bytes([0])


def test_ctrl_c_during_run_batch_cancels_in_flight_requests() -> None:
    # A real SIGINT in a real process: in-flight requests are cancelled, KeyboardInterrupt reaches the
    # caller, and a second run_batch afterwards works (the notebook case).
    script = textwrap.dedent(
        """
        import os, signal, threading, time
        import asyncbackends as ab

        backend = ab.create_backend("mock", latency=30)

        def interrupt_once_all_are_in_flight():
            # The state, not a delay: a loaded machine may take longer than any guess to start the run.
            while backend.in_flight < 8:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_all_are_in_flight, daemon=True).start()
        try:
            ab.run_batch(backend, [ab.GenerationRequest(str(i)) for i in range(20)], concurrency=8)
        except KeyboardInterrupt:
            print("interrupted", backend.cancelled, backend.in_flight)
        quick = ab.create_backend("mock")
        print("again", ab.run_batch(quick, [ab.GenerationRequest("ok")])[0].text)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "interrupted 8 0"
    assert lines[1] == "again ok"


def test_process_exits_cleanly_with_a_live_loop() -> None:
    script = "import asyncbackends as ab; b = ab.create_backend('mock'); print(ab.run_batch(b, [ab.GenerationRequest('x')])[0].text)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "x" and done.stderr == ""


# Edges of the manager's lifetime (found by mutation testing): each test builds its own LoopManager.


def test_the_loop_runs_in_a_named_daemon_thread() -> None:
    manager = ab.LoopManager()
    try:
        _, thread = manager.run(_loop_and_thread())
        assert thread.name == "asyncbackends-loop" and thread.daemon
    finally:
        manager.shutdown()


def test_uvloop_is_used_when_installed_unless_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[asyncio.AbstractEventLoop] = []

    def new_event_loop() -> asyncio.AbstractEventLoop:
        made.append(asyncio.new_event_loop())
        return made[-1]

    fake = types.ModuleType("uvloop")
    fake.new_event_loop = new_event_loop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", fake)
    monkeypatch.delenv("ASYNCBACKENDS_UVLOOP", raising=False)
    default = loop_module._new_event_loop()
    monkeypatch.setenv("ASYNCBACKENDS_UVLOOP", "1")
    opted_in = loop_module._new_event_loop()
    monkeypatch.setenv("ASYNCBACKENDS_UVLOOP", "0")
    opted_out = loop_module._new_event_loop()
    try:
        assert made == [default, opted_in]
        assert opted_out not in made
    finally:
        for loop in (default, opted_in, opted_out):
            loop.close()


def test_shutdown_from_the_loops_own_thread_stops_the_loop() -> None:
    manager = ab.LoopManager()
    _, thread = manager.run(_loop_and_thread())

    async def shut_down_here() -> None:
        manager.shutdown()

    manager.submit(shut_down_here())
    thread.join(30)
    assert not thread.is_alive()


def test_shutdown_waits_for_cancelled_work_to_clean_up_and_closes_async_generators() -> None:
    manager = ab.LoopManager()
    started = threading.Event()
    cleaned: list[str] = []

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.2)  # a clean-up that takes a while (aborting an engine request)
            cleaned.append("task")

    async def generator() -> Any:
        try:
            yield 1
            yield 2
        finally:
            cleaned.append("generator")

    suspended = generator()

    async def first() -> Any:
        return await suspended.__anext__()  # first iterated on the loop's thread: the loop tracks it

    assert manager.run(first()) == 1  # and leaves it suspended
    manager.submit(work())
    started.wait(30)
    manager.shutdown()
    assert sorted(cleaned) == ["generator", "task"]


def test_an_unusable_manager_says_why() -> None:
    async def noop() -> None:
        return None

    stopped = ab.LoopManager()
    stopped.shutdown()
    with pytest.raises(ab.LoopError) as info:
        stopped.run(noop())
    assert str(info.value) == "the loop manager was shut down; get_loop_manager() returns a fresh one"

    inherited = ab.LoopManager()
    inherited._pid = -1  # what a forked child sees: the manager of another process
    with pytest.raises(ab.LoopError) as info:
        inherited.run(noop())
    assert str(info.value) == (
        "this LoopManager belongs to the parent process; after fork call get_loop_manager() again"
    )


class SlowToCancel(ab.BaseBackend):
    """Hangs; once cancelled, takes two seconds to clean up (an engine abort that is slow to answer)."""

    name = "slow-to-cancel"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.cleaning = threading.Event()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cleaning.set()
            await asyncio.sleep(2)
            raise
        raise AssertionError("unreachable")


def test_a_caller_cancelled_again_while_waiting_for_clean_up_is_cancelled() -> None:
    backend = SlowToCancel()

    async def main() -> None:
        task = asyncio.ensure_future(ab.gather(backend, [ab.GenerationRequest("x")]))
        await asyncio.to_thread(backend.entered.wait, 30)
        task.cancel()  # arun now waits (bounded) for the clean-up on the shared loop ...
        await asyncio.to_thread(backend.cleaning.wait, 30)
        task.cancel()  # ... and the caller gives up on that wait too
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
