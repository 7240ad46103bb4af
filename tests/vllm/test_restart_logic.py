"""`EngineRestarts` (the ``vllm`` adapter's engine across engine-core deaths) with stand-in engines.

No engine starts here: an engine is an object with a name, a "send" completes or raises `EngineDied` as the
test says, and starts and stops are recorded. The real engine's death is tests/vllm/test_zz_engine_restart.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.vllm._restart import EngineDied, EngineRestarts, check_max_restarts


class _Engine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dead = asyncio.Event()  # set: every send on it fails with EngineDied

    def __repr__(self) -> str:
        return self.name


class _Engines:
    """Starts and stops stand-in engines; a start waits for ``release`` when one is given."""

    def __init__(self, fail_start: bool = False) -> None:
        self.started: list[_Engine] = []
        self.stopped: list[_Engine] = []
        self.release: asyncio.Event | None = None
        self.fail_start = fail_start
        self.starting = asyncio.Event()

    async def start(self) -> _Engine:
        self.starting.set()
        if self.release is not None:
            await self.release.wait()
        if self.fail_start:
            raise RuntimeError("no memory left")
        engine = _Engine(f"engine-{len(self.started) + 1}")
        self.started.append(engine)
        return engine

    async def stop(self, engine: _Engine) -> None:
        await asyncio.sleep(0)
        self.stopped.append(engine)


def _restarts(engines: _Engines, max_restarts: int = 2) -> tuple[EngineRestarts, _Engine]:
    first = _Engine("engine-0")
    return EngineRestarts(first, start=engines.start, stop=engines.stop, max_restarts=max_restarts), first


class _Sent(list[tuple[str, bool]]):
    """What was sent: (engine, sent again); `reach` waits for a count."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def add(self, item: tuple[str, bool]) -> None:
        self.append(item)
        self.changed.set()

    async def reach(self, count: int) -> None:
        while len(self) < count:
            self.changed.clear()
            await self.changed.wait()


async def _send(engine: _Engine, again: bool, sent: _Sent, done: asyncio.Event) -> str:
    """A request that runs until ``done`` unless its engine dies first."""
    sent.add((engine.name, again))
    dies = asyncio.ensure_future(engine.dead.wait())
    ends = asyncio.ensure_future(done.wait())
    await asyncio.wait([dies, ends], return_when=asyncio.FIRST_COMPLETED)
    dies.cancel()
    ends.cancel()
    if engine.dead.is_set():
        raise EngineDied() from RuntimeError(f"{engine.name} died")
    return engine.name


@pytest.mark.parametrize("value", [0, 1, 5])
def test_max_restarts_accepts_ints_from_zero(value: int) -> None:
    assert check_max_restarts(value) == value


@pytest.mark.parametrize("value", [-1, 1.5, "2", None, True])
def test_max_restarts_refuses_anything_else(value: Any) -> None:
    with pytest.raises(ab.InvalidRequestError, match="max_restarts must be an int >= 0"):
        check_max_restarts(value)


@pytest.mark.asyncio
async def test_one_restart_for_many_requests_and_each_sent_again_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engines = _Engines()
    engines.release = asyncio.Event()
    restarts, first = _restarts(engines)
    sent = _Sent()
    done = asyncio.Event()
    tasks = [asyncio.ensure_future(restarts.run(lambda e, a: _send(e, a, sent, done))) for _ in range(5)]
    await sent.reach(5)
    with caplog.at_level(logging.WARNING, logger="asyncbackends.adapters.vllm"):
        first.dead.set()
        await engines.starting.wait()
        # A request arriving during the restart waits for it instead of going to the dead engine.
        late = asyncio.ensure_future(restarts.run(lambda e, a: _send(e, a, sent, done)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(sent) == 5 and not late.done()
        engines.release.set()
        await sent.reach(11)
        done.set()
        results = await asyncio.gather(*tasks, late)
    assert results == ["engine-1"] * 6
    assert restarts.count == 1 and engines.started == [restarts.engine]
    assert engines.stopped == [first]  # the dead engine was shut down before the new one started
    assert sorted(sent) == sorted(
        [("engine-0", False)] * 5 + [("engine-1", True)] * 5 + [("engine-1", False)]
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("died (RuntimeError: engine-0 died)" in m and "restart 1 of at most 2" in m for m in warnings)


@pytest.mark.asyncio
async def test_a_death_past_max_restarts_fails_what_is_left_and_later_requests() -> None:
    engines = _Engines()
    restarts, first = _restarts(engines, max_restarts=2)
    sent = _Sent()
    done = asyncio.Event()
    tasks = [asyncio.ensure_future(restarts.run(lambda e, a: _send(e, a, sent, done))) for _ in range(3)]
    for deaths in range(3):  # the same three requests die with each engine: three deaths in a row
        await sent.reach(3 * (deaths + 1))
        (restarts.engine or first).dead.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert all(isinstance(r, ab.BackendBrokenError) for r in results), results
    assert "after 2 restart(s) (max_restarts=2)" in str(results[0])
    assert restarts.count == 2 and len(engines.started) == 2
    with pytest.raises(ab.BackendBrokenError):
        await restarts.run(lambda e, a: _send(e, a, sent, done))
    await restarts.aclose()
    assert engines.stopped == [first, *engines.started]  # the last, dead one at close


@pytest.mark.asyncio
async def test_max_restarts_zero_and_a_failed_start_give_up() -> None:
    restarts, first = _restarts(_Engines(), max_restarts=0)
    first.dead.set()
    with pytest.raises(ab.BackendBrokenError, match="after 0 restart"):
        await restarts.run(lambda e, a: _send(e, a, _Sent(), asyncio.Event()))
    failing = _Engines(fail_start=True)
    restarts, first = _restarts(failing)
    first.dead.set()
    with pytest.raises(ab.BackendBrokenError, match=r"failed to start again \(RuntimeError: no memory left"):
        await restarts.run(lambda e, a: _send(e, a, _Sent(), asyncio.Event()))
    assert restarts.count == 1 and failing.stopped == [first]


@pytest.mark.asyncio
async def test_close_during_a_restart_cancels_the_start_and_fails_the_waiting_requests() -> None:
    engines = _Engines()
    engines.release = asyncio.Event()  # never set: the start hangs until cancelled
    restarts, first = _restarts(engines)
    sent = _Sent()
    task = asyncio.ensure_future(restarts.run(lambda e, a: _send(e, a, sent, asyncio.Event())))
    await sent.reach(1)
    first.dead.set()
    await engines.starting.wait()
    await asyncio.wait_for(restarts.aclose(), 10)
    with pytest.raises(ab.BackendClosedError):
        await task
    assert engines.stopped == [first] and engines.started == []


@pytest.mark.asyncio
async def test_a_report_about_a_replaced_engine_restarts_nothing() -> None:
    engines = _Engines()
    restarts, first = _restarts(engines)
    await restarts.died(first, RuntimeError("gone"))
    second = restarts.engine
    await restarts.died(first, RuntimeError("gone, reported late"))  # the same death: nothing more
    assert restarts.engine is second and restarts.count == 1
    await restarts.check_ready(lambda engine: asyncio.sleep(0))
    assert restarts.count == 1


@pytest.mark.parametrize("engines", [1, 2])
def test_create_backend_refuses_a_bad_max_restarts_before_starting_anything(engines: int) -> None:
    with pytest.raises(ab.InvalidRequestError, match="max_restarts must be an int >= 0, got -1"):
        ab.create_backend("vllm", model="/no/such/model", engines=engines, max_restarts=-1)


def test_latest_is_the_dead_engine_until_the_new_one_serves_then_none_once_closed() -> None:
    # What the backend shows as its engine (`VLLMBackend.engine`): never None while a restart is between
    # stopping the dead engine and starting the new one.
    async def run() -> None:
        engines = _Engines()
        engines.release = asyncio.Event()
        restarts, first = _restarts(engines)
        died = asyncio.ensure_future(restarts.died(first, RuntimeError("killed")))
        await engines.starting.wait()  # the dead engine is stopped, the new one not yet started
        assert restarts.engine is None and restarts.latest is first
        engines.release.set()
        await died
        assert restarts.engine is restarts.latest is engines.started[0]
        await restarts.aclose()
        assert restarts.engine is None and restarts.latest is None

    asyncio.run(run())
