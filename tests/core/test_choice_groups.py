"""`ChoiceGroups` without an engine: who joins a group, cancellation of members, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

import asyncbackends as ab
from asyncbackends.adapters.vllm._choice_groups import ChoiceGroups, TokenScores

pytestmark = pytest.mark.asyncio


class _Engine:
    """Records each group it is sent and answers when told to."""

    def __init__(self) -> None:
        self.sent: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.release = asyncio.Event()
        self.cancelled = 0
        self.fail: Exception | None = None
        self.was_sent = asyncio.Event()
        self.was_cancelled = asyncio.Event()

    async def send(self, prompt: Sequence[int], tokens: Sequence[int]) -> TokenScores:
        self.sent.append((tuple(prompt), tuple(tokens)))
        self.was_sent.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.was_cancelled.set()
            raise
        if self.fail is not None:
            raise self.fail
        return {t: (-float(t), t == 1) for t in tokens}


async def test_choices_arriving_together_share_one_request() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send)
    engine.release.set()
    got = await asyncio.gather(*(groups.score((5, 6), t, None) for t in (1, 2, 3, 2)))
    assert got == [(-1.0, True), (-2.0, False), (-3.0, False), (-2.0, False)]
    assert engine.sent == [((5, 6), (1, 2, 3))]  # a token asked twice is asked once
    assert groups.sent == 1


async def test_other_contexts_and_late_arrivals_go_apart() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send)
    engine.release.set()
    first = await asyncio.gather(groups.score((5,), 1, None), groups.score((7,), 2, None))
    assert first == [(-1.0, True), (-2.0, False)]
    assert await groups.score((5,), 3, None) == (-3.0, False)  # the first group was sent: a new one
    assert sorted(engine.sent) == [((5,), (1,)), ((5,), (3,)), ((7,), (2,))]


async def test_a_full_group_starts_another() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send, max_tokens=2)
    engine.release.set()
    await asyncio.gather(*(groups.score((5,), t, None) for t in (1, 2, 3, 1)))
    assert engine.sent == [((5,), (1, 2)), ((5,), (3, 1))]


async def test_a_cancelled_member_leaves_the_others_served() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send)
    tasks = [asyncio.ensure_future(groups.score((5,), t, None)) for t in (1, 2, 3)]
    await engine.was_sent.wait()
    tasks[1].cancel()
    engine.release.set()
    assert await tasks[0] == (-1.0, True)
    assert await tasks[2] == (-3.0, False)
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert engine.cancelled == 0


async def test_the_last_member_cancelled_cancels_the_engine_request() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send)
    tasks = [asyncio.ensure_future(groups.score((5,), t, None)) for t in (1, 2)]
    await engine.was_sent.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await engine.was_cancelled.wait()
    # A request arriving now starts a new group instead of joining the cancelled one.
    engine.release.set()
    assert await groups.score((5,), 2, "late") == (-2.0, False)
    assert engine.sent[-1] == ((5,), (2,))


async def test_members_cancelled_before_sending_send_nothing_that_lives_on() -> None:
    engine = _Engine()
    groups = ChoiceGroups(engine.send)
    task = asyncio.ensure_future(groups.score((5,), 1, None))
    await asyncio.sleep(0)  # the member has joined; the group is not sent yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    engine.release.set()
    assert await groups.score((5,), 2, None) == (-2.0, False)
    assert engine.sent[-1] == ((5,), (2,))


async def test_every_member_gets_the_error_with_its_own_request_id() -> None:
    engine = _Engine()
    engine.fail = ab.RequestRejectedError("token out of vocabulary", backend="vllm")
    engine.release.set()
    groups = ChoiceGroups(engine.send)
    results = await asyncio.gather(
        groups.score((5,), 1, "a"), groups.score((5,), 2, "b"), return_exceptions=True
    )
    assert [type(r) for r in results] == [ab.RequestRejectedError, ab.RequestRejectedError]
    assert [r.request_id for r in results] == ["a", "b"]  # type: ignore[union-attr]
    assert all(r.__cause__ is engine.fail for r in results)  # type: ignore[union-attr]
    assert len(engine.sent) == 1
