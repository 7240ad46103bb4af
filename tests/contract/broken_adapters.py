"""Deliberately broken adapters, each breaking one contract; the suite must catch each for the right reason.

Imported by name (``broken_adapters:Class``) through the registry, in a subprocess whose path holds this
folder (test_contract_broken.py and test_contract_runner.py set it up).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp

import asyncbackends as ab
from asyncbackends._clock import held_slot
from asyncbackends.adapters.mock import MockBackend

T = TypeVar("T")
logger = logging.getLogger("broken_adapters")


class SwappedBackend(MockBackend):
    """Keeps the request in flight in one shared slot: concurrent requests get each other's results."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self._current = request
        await asyncio.sleep(0.01)
        return await super().generate(self._current)


class NIgnoredBackend(MockBackend):
    """Claims n_samples but always returns a single completion."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        result = await super().generate(request)
        return dataclasses.replace(result, completions=result.completions[:1])


class SwallowedCancelBackend(MockBackend):
    """Catches the cancellation of a request and answers it anyway."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        if request.params.max_tokens > 64:  # only the long requests take time
            try:  # noqa: SIM105  (the bug on show: a swallowed cancellation)
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                pass
        return await super().generate(request)


class SecretInReprBackend(MockBackend):
    """Keeps its API key in a plain attribute, where repr(vars(backend)) shows it."""

    def __init__(self, *, api_key: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.api_key = api_key


class RawErrorBackend(MockBackend):
    """Lets raw exceptions escape: aiohttp's when "offline", ValueError for prompts it cannot take."""

    def __init__(self, *, offline: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.offline = offline

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        if self.offline:
            raise aiohttp.ServerDisconnectedError()
        if isinstance(request.prompt, str) and len(request.prompt) > 1000:
            raise ValueError("prompt too long")
        return await super().generate(request)

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        if self.offline:
            raise aiohttp.ServerDisconnectedError()
        return await super().loglikelihood(request)


class PrivateLoopBackend(MockBackend):
    """Runs its requests on an event loop of its own, in its own thread, instead of the shared loop."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self._check_open(request.request_id)
        future = asyncio.run_coroutine_threadsafe(super().generate(request), self._loop)
        return await asyncio.wrap_future(future)

    async def _aclose(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


class IgnoresCloseBackend(MockBackend):
    """Keeps answering after aclose()."""

    def _check_open(self, request_id: str | None = None) -> None:
        return None


class StopIgnoredBackend(MockBackend):
    """Claims stop support but ignores stop strings."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        params = dataclasses.replace(request.params, stop=())
        return await super().generate(dataclasses.replace(request, params=params))


class PositiveScoreBackend(MockBackend):
    """Reports loglikelihoods above zero that are not the sum of their parts."""

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        result = await super().loglikelihood(request)
        return dataclasses.replace(result, logprob=result.logprob + 5.0)


class BlockingBackend(MockBackend):
    """Calls a blocking client inside ``async def``: 50 ms of ``time.sleep`` per request, on the shared loop."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        time.sleep(0.05)  # noqa: ASYNC251  (the bug on show: a sync HTTP call blocks the same way)
        return await super().generate(request)


class RepeatedSampleBackend(MockBackend):
    """Answers n samples with n copies of the first one."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        result = await super().generate(request)
        return dataclasses.replace(result, completions=result.completions[:1] * len(result.completions))


class SeededCopiesBackend(MockBackend):
    """Samples independently without a seed, but with one gives every sample that same seed: n copies."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        params = request.params
        if params.seed is None or params.n < 2:
            return await super().generate(request)
        one = dataclasses.replace(request, params=dataclasses.replace(params, n=1))
        result = await super().generate(one)
        return dataclasses.replace(result, completions=result.completions * params.n)


class SecretInErrorBackend(MockBackend):
    """Holds its key in ab.Secret, but chains it into a transport error and logs it on refusals."""

    def __init__(self, *, api_key: str = "", offline: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self._api_key = ab.Secret(api_key)
        self.offline = offline

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        headers = {"Authorization": f"Bearer {self._api_key.get_secret_value()}"}
        if self.offline:
            try:
                raise ConnectionError(f"cannot POST http://127.0.0.1:9/generate with headers {headers}")
            except ConnectionError as exc:
                raise ab.BackendUnavailableError("connection failed", backend=self.name) from exc
        if isinstance(request.prompt, str) and len(request.prompt) > 1000:
            logger.warning("refusing a long prompt; request headers were %s", headers)
            raise ab.RequestRejectedError("prompt too long", backend=self.name)
        return await super().generate(request)

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        if self.offline:
            raise ab.BackendUnavailableError("connection failed", backend=self.name)
        return await super().loglikelihood(request)


class PlainCredentialsBackend(MockBackend):
    """Keeps its API key in a plain header dict and its URL with user:password@ in it."""

    def __init__(self, *, api_key: str = "", url: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.headers = {"Accept": "application/json", "X-API-Key": api_key}
        self.url = url


class _Session:
    """Stands in for an HTTP client session (without an unclosed-session warning at exit)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class ResultsAfterCloseBackend(MockBackend):
    """Lets requests in flight at aclose() finish with results, re-opening its session on the way."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._session: _Session | None = None

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        result = await super().generate(request)
        if request.params.max_tokens > 64:  # only the long requests stay in flight
            await asyncio.sleep(0.3)
        if self._session is None:
            self._session = _Session()
        return result

    async def _aclose(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


class RetryableAtCloseBackend(MockBackend):
    """Cuts requests in flight at aclose() with a retryable BackendUnavailableError (a dropped connection)."""

    _cut: asyncio.Event | None = None

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self._check_open(request.request_id)
        if request.params.max_tokens > 64:
            self._cut = self._cut or asyncio.Event()
            await self._cut.wait()
            raise ab.BackendUnavailableError("connection closed", backend=self.name)
        return await super().generate(request)

    async def _aclose(self) -> None:
        if self._cut is not None:
            self._cut.set()


_CLOSING = "asyncbackends: backend closed"


class ClosingMock(MockBackend):
    """A correct mock at close: aclose() cancels the requests in flight, which end in BackendClosedError."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._calls: set[asyncio.Task[Any]] = set()

    async def _closing(self, request_id: str | None, work: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await work
        except asyncio.CancelledError as exc:
            if not (self._closed and _CLOSING in exc.args):
                raise  # the caller's own cancellation
            task.uncancel()
            raise ab.BackendClosedError(
                "closed while the request was in flight", backend=self.name, request_id=request_id
            ) from None
        finally:
            self._calls.discard(task)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self._check_open(request.request_id)
        if request.params.max_tokens > 64:
            await self._closing(request.request_id, asyncio.sleep(0.3))
        return await super().generate(request)

    async def _aclose(self) -> None:
        for task in list(self._calls):
            task.cancel(_CLOSING)


class QueuedBackend(MockBackend):
    """Queues on slots of its own (like a connection pool), and the wait for one counts toward the timeout."""

    def __init__(self, *, max_slots: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self.max_slots = max_slots
        self._slots: asyncio.Semaphore | None = None

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.max_slots and self._slots is None:
            self._slots = asyncio.Semaphore(self.max_slots)  # created on the loop that serves requests
        return self._slots

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        slots = self._semaphore()
        if slots is None:
            return await super().generate(request)
        async with slots:
            return await super().generate(request)


class HeldSlotBackend(QueuedBackend):
    """The correct way to queue on slots of one's own: `held_slot`, whose wait gather does not time."""

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        async with held_slot(self._semaphore()):
            return await MockBackend.generate(self, request)
