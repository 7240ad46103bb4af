"""The engine-start thread on its own, with a stand-in for ``AsyncLLM.from_engine_args`` (no engine runs).

The real start is covered by test_engine_start.py; here the timing is ours to choose: starts that overlap,
a caller that gives up, and a process that exits while an engine is still starting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.vllm import _engine_lifecycle as _vllm_engine

NO_ARGS: Any = None  # the stand-in builder ignores the engine arguments


class _FakeEngine:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def shutdown(self) -> None:
        self.stopped.set()


class _SlowBuilder:
    """Takes ``seconds`` to build, or until `release` is set; counts how many builds ran at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = self.most_at_once = 0
        self.lock = threading.Lock()
        self.engines: list[_FakeEngine] = []
        self.building = threading.Event()
        self.release = threading.Event()

    def __call__(self, args: Any, usage_context: Any = None) -> _FakeEngine:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.building.set()
        self.release.wait(self.seconds)
        with self.lock:
            self.running -= 1
        engine = _FakeEngine()
        self.engines.append(engine)
        return engine


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch) -> _SlowBuilder:
    slow = _SlowBuilder(0.5)
    monkeypatch.setattr(_vllm_engine.AsyncLLM, "from_engine_args", slow)
    return slow


def test_engines_start_one_at_a_time(builder: _SlowBuilder) -> None:
    async def two() -> list[Any]:
        return list(
            await asyncio.gather(_vllm_engine.start_engine(NO_ARGS), _vllm_engine.start_engine(NO_ARGS))
        )

    engines = ab.get_loop_manager().run(two())
    assert len({id(e) for e in engines}) == 2
    assert builder.most_at_once == 1


def test_a_cancelled_start_returns_at_once_and_the_engine_is_stopped_when_built(
    builder: _SlowBuilder,
) -> None:
    builder.seconds = 60.0  # held until released below
    starting = ab.get_loop_manager().submit(_vllm_engine.start_engine(NO_ARGS))
    assert builder.building.wait(timeout=30)
    starting.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        starting.result(timeout=30)
    assert not builder.engines  # the cancel returned while the build was still held: it did not wait
    builder.release.set()
    deadline = time.monotonic() + 30
    while not builder.engines:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert builder.engines[0].stopped.wait(timeout=30)  # built after the cancel, then stopped


def test_a_process_exits_without_waiting_for_a_start(tmp_path: Any) -> None:
    script = tmp_path / "exit_while_starting.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            import asyncbackends as ab
            from asyncbackends.adapters.vllm import _engine_lifecycle as _vllm_engine

            _vllm_engine.AsyncLLM.from_engine_args = lambda *a, **k: time.sleep(3600)
            ab.get_loop_manager().submit(_vllm_engine.start_engine(None))
            time.sleep(0.5)
            print("leaving", flush=True)
            """
        )
    )
    # The start never ends (an hour): a process that waited for it would run into the timeout, so
    # exiting at all is the proof, with no guess at how long imports take on a loaded machine.
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout


class _HeldBuilder:
    """Each build waits until `release` is set; records what each saw; `wait_running(n)` waits for n at once."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.running = self.most_at_once = 0
        self.release = threading.Event()
        self.seen: list[tuple[str | None, str | None]] = []

    def __call__(self, args: Any, usage_context: Any = None) -> _FakeEngine:
        import torch

        with self.changed:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.seen.append((os.environ.get("ASYNCBACKENDS_TEST_START"), os.environ.get(_WORKER_GRACE)))
            self.changed.notify_all()
        torch.set_num_threads(1)  # as vLLM's start-up does, restoring it later in a way starts can race
        assert self.release.wait(timeout=300)
        with self.changed:
            self.running -= 1
        return _FakeEngine()

    def wait_running(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.running == count, timeout=300)


_WORKER_GRACE = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"


def test_the_starts_of_one_group_overlap_and_a_start_of_another_waits_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    held = _HeldBuilder()
    monkeypatch.setattr(_vllm_engine.AsyncLLM, "from_engine_args", held)
    monkeypatch.delenv("ASYNCBACKENDS_TEST_START", raising=False)
    monkeypatch.delenv(_WORKER_GRACE, raising=False)
    threads = torch.get_num_threads()
    group, env = object(), {"ASYNCBACKENDS_TEST_START": "set"}
    manager = ab.get_loop_manager()
    waiting = _vllm_engine._GATE.waiting  # another test's start may still be queued: count from here
    try:
        together = [manager.submit(_vllm_engine.start_engine(NO_ARGS, env, group)) for _ in range(2)]
        held.wait_running(2)  # both inside the build at once
        alone = manager.submit(_vllm_engine.start_engine(NO_ARGS))
        deadline = time.monotonic() + 300
        while _vllm_engine._GATE.waiting != waiting + 1:  # the lone start is queued at the gate, not building
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert held.running == 2
    finally:
        held.release.set()  # never leave a build holding the gate for later tests
    for start in [*together, alone]:
        start.result(timeout=300)
    assert held.most_at_once == 2
    # The group's environment (and the workers' grace) applied for its starts, then put back; the lone
    # start saw neither the group's variable nor a grace left behind; torch's thread count restored.
    assert held.seen == [("set", "30"), ("set", "30"), (None, "30")]
    assert "ASYNCBACKENDS_TEST_START" not in os.environ
    assert _WORKER_GRACE not in os.environ
    assert torch.get_num_threads() == threads


class _NoOutputHandler(_FakeEngine):
    def _run_output_handler(self) -> None:
        raise RuntimeError("the output handler did not start")


def test_an_engine_whose_output_handler_fails_to_start_is_stopped_before_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engines: list[_NoOutputHandler] = []

    def build(args: Any, usage_context: Any = None) -> _NoOutputHandler:
        engines.append(_NoOutputHandler())
        return engines[-1]

    monkeypatch.setattr(_vllm_engine.AsyncLLM, "from_engine_args", build)
    with pytest.raises(RuntimeError, match="output handler did not start"):
        ab.get_loop_manager().run(_vllm_engine.start_engine(NO_ARGS))
    (engine,) = engines
    assert engine.stopped.is_set()  # already when the error arrived: nothing holds the engine after it


def test_a_start_cancelled_just_after_its_engine_was_handed_over_stops_the_engine(
    builder: _SlowBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine is handed to the waiting task (the future's result set), and the cancel lands before the
    # task resumes: the result is never read by it. Ordered on the loop by wrapping the hand-over.
    settle = _vllm_engine._settle
    starting: list[asyncio.Task[Any]] = []

    def settle_then_cancel(built: Any, engine: Any, error: BaseException | None) -> None:
        settle(built, engine, error)
        starting[0].cancel()

    monkeypatch.setattr(_vllm_engine, "_settle", settle_then_cancel)

    async def start() -> None:
        starting.append(asyncio.ensure_future(_vllm_engine.start_engine(NO_ARGS)))
        with pytest.raises(asyncio.CancelledError):
            await starting[0]

    ab.get_loop_manager().run(start())
    (engine,) = builder.engines
    assert engine.stopped.wait(timeout=30)
