"""The per-attempt clock: waiting for an adapter's own slots is not timed; holding one is."""

from __future__ import annotations

import asyncio

import asyncbackends as ab
from asyncbackends._clock import held_slot, waiting_for_slot


def requests(n: int) -> list[ab.GenerationRequest]:
    return [ab.GenerationRequest(f"p{i}", request_id=f"p{i}") for i in range(n)]


class PooledBackend(ab.BaseBackend):
    """An adapter with its own pool of ``slots`` connections (made on first use, on the shared loop)."""

    name = "pooled"

    def __init__(
        self, slots: int, service: float, parts: int = 1, hang_part: int | None = None, hang_request: str = ""
    ) -> None:
        self.slots, self.service, self.parts, self.hang_part = slots, service, parts, hang_part
        self.hang_request = hang_request  # "" hangs that part of every request
        self._pool: asyncio.Semaphore | None = None
        self.holding = self.max_holding = 0
        self.waiting_parts = 0

    async def _part(self, index: int, request_id: str | None) -> str:
        if self._pool is None:
            self._pool = asyncio.Semaphore(self.slots)
        self.waiting_parts += 1
        waiting = True
        try:
            async with held_slot(self._pool):
                self.waiting_parts -= 1
                waiting = False
                self.holding += 1
                self.max_holding = max(self.max_holding, self.holding)
                try:
                    hangs = index == self.hang_part and self.hang_request in ((request_id or ""), "")
                    await asyncio.sleep(3600 if hangs else self.service)
                finally:
                    self.holding -= 1
        finally:
            if waiting:
                self.waiting_parts -= 1
        return str(index)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        texts = await asyncio.gather(*(self._part(i, request.request_id) for i in range(self.parts)))
        return ab.GenerationResult(request.request_id, tuple(ab.Completion(t) for t in texts))


def test_waiting_for_an_adapters_slot_is_not_timed() -> None:
    # 16 requests in flight share 2 slots of 0.3 s: the last pair waits 2.1 s for a slot, longer than the
    # 1.2 s timeout, yet only the 0.3 s holding a slot is timed, so nothing times out (the 0.9 s between
    # is room for a loaded machine's stalls).
    backend = PooledBackend(slots=2, service=0.3)
    outcomes = ab.run_batch(
        backend,
        requests(16),
        concurrency=16,
        timeout=1.2,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert [type(o).__name__ for o in outcomes] == ["GenerationResult"] * 16
    assert backend.max_holding == 2


def test_a_part_hanging_on_a_slot_times_out_while_another_part_waits() -> None:
    # One request fans out into two parts over one slot: part 0 takes the slot and hangs, part 1 waits
    # behind it. A part holds a slot, so the clock runs and the attempt times out.
    backend = PooledBackend(slots=1, service=0.01, parts=2, hang_part=0)
    outcomes = ab.run_batch(
        backend, requests(1), timeout=0.3, retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError)
    assert backend.holding == 0 and backend.waiting_parts == 0  # both parts cancelled and gone


def test_a_request_waiting_behind_a_hung_holder_is_served_after_the_holder_times_out() -> None:
    # p0 holds the only slot and hangs; p1 waits (untimed) until p0 times out, then gets the slot. Its own
    # 0.05 s leave a loaded machine most of the 1 s timeout.
    backend = PooledBackend(slots=1, service=0.05, hang_part=0, hang_request="p0")
    outcomes = ab.run_batch(
        backend,
        requests(2),
        concurrency=2,
        timeout=1.0,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError)
    assert isinstance(outcomes[1], ab.GenerationResult)


def test_waiting_for_slot_pauses_only_a_timed_attempt() -> None:
    class RateWaits(ab.BaseBackend):
        name = "rate-waits"

        async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
            async with waiting_for_slot():
                await asyncio.sleep(2.0)  # stands in for a shared rate limit's wait
            return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))

    # Twice the timeout waiting, untimed; next to nothing timed, with a loaded machine's room in the 1 s.
    outcomes = ab.run_batch(
        RateWaits(), requests(2), timeout=1.0, retry=ab.RetryPolicy(max_attempts=1), return_exceptions=True
    )
    assert all(isinstance(o, ab.GenerationResult) for o in outcomes)

    async def outside_a_run() -> None:
        async with waiting_for_slot():
            pass
        async with held_slot(asyncio.Semaphore(1)):
            pass
        async with held_slot(None):
            pass

    asyncio.run(outside_a_run())


class WaitsThenHolds(ab.BaseBackend):
    """Part 0 waits for a slot that never frees; once it waits, part 1 takes another slot and stalls."""

    name = "waits-then-holds"

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        never, free = asyncio.Semaphore(0), asyncio.Semaphore(1)
        first_waiting = asyncio.Event()

        async def waiter() -> None:
            async with waiting_for_slot():
                first_waiting.set()
                await never.acquire()

        async def holder() -> None:
            await first_waiting.wait()
            async with held_slot(free):
                await asyncio.sleep(5)  # stalls while holding: its time is timed

        await asyncio.gather(waiter(), holder())
        raise AssertionError("unreachable")


def test_a_part_taking_a_slot_while_another_waits_restarts_the_clock() -> None:
    outcomes = ab.run_batch(
        WaitsThenHolds(),
        requests(1),
        timeout=0.2,
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError)


class OneHangs(ab.BaseBackend):
    name = "one-hangs"

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        if request.request_id == "p0":
            await asyncio.sleep(5)
        return ab.GenerationResult(request.request_id, (ab.Completion("ok"),))


def test_a_worker_still_waiting_for_the_rate_limit_does_not_stop_the_deadlines() -> None:
    # One request a second: p1's worker waits a second for its turn, untimed, while p0 must time out.
    outcomes = ab.run_batch(
        OneHangs(),
        requests(2),
        concurrency=2,
        timeout=0.2,
        rate_limit=ab.RateLimit(requests_per_second=1),
        retry=ab.RetryPolicy(max_attempts=1),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], ab.BackendTimeoutError)
    assert isinstance(outcomes[1], ab.GenerationResult)


def test_a_free_slot_is_taken_without_pausing_the_clock() -> None:
    # held_slot is entered once per HTTP exchange: a free slot costs no pause and resume, so the attempt's
    # deadline stays exactly where it was; only a real wait stands the clock still.
    from asyncbackends._clock import AttemptClock

    async def main() -> None:
        clock = AttemptClock()
        clock.start(10.0)
        deadline = clock.deadline
        slots = asyncio.Semaphore(1)
        async with held_slot(slots):
            assert clock.deadline == deadline and clock.held == 1
            waiting = asyncio.get_running_loop().create_task(held_slot(slots).__aenter__())
            await asyncio.sleep(0)  # one turn of the loop: the task runs up to its wait for the slot
            assert clock.waiting == 1  # the second taker queues behind the first
            assert clock.deadline == deadline  # a part holds a slot: the clock runs on
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert clock.waiting == 0 and clock.held == 1
        assert clock.held == 0 and not slots.locked()

        only = asyncio.Semaphore(0)
        task = asyncio.get_running_loop().create_task(held_slot(only).__aenter__())
        await asyncio.sleep(0)
        assert clock.waiting == 1
        assert clock.deadline == float("inf")  # waiting and holding nothing: paused
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert clock.waiting == 0 and clock.held == 0
        assert deadline - 0.5 < clock.deadline < float("inf")  # running again after the abandoned wait
        clock.stop()

    asyncio.run(main())
