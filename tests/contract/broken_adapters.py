"""Deliberately broken adapters, each breaking one contract; the suite must catch each for the right reason.

Imported by name (``broken_adapters:Class``) through the registry, in a subprocess whose path holds this
folder (test_contract_broken.py and test_contract_runner.py set it up).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import aiohttp

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend


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
