"""One engine request of the ``vllm`` adapter: sent, waited for, aborted when given up, errors translated.

`EngineCalls.run` sends one request to the engine the restarts holder (`_restart`) says serves now, with
``RequestOutputKind.FINAL_ONLY``, and waits for its final output; a cancelled or failed call aborts its engine
request instead of leaving it running. A request whose engine died under it is sent again to the next engine
(a rendered chat rendered again for it first). vLLM's errors become the library's at this boundary. Imported
by the adapter once vLLM is (`import_vllm`), like `_requests`.
"""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import (
    BackendBrokenError,
    BackendClosedError,
    BackendError,
    ContextLengthError,
    RateLimitedError,
    RequestRejectedError,
)
from .._lengths import says_context_length
from ._compat import GracefulHTTPError, VLLMClientError
from ._requests import engine_input
from ._restart import EngineDied, EngineRestarts

with warnings.catch_warnings():  # import-time DeprecationWarnings from vLLM, as in _requests
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.engine.output_processor import RequestOutputCollector

__all__ = ["EngineCalls"]


class EngineCalls:
    """Sends a backend's engine requests (see the module docstring).

    Args:
        restarts: The backend's engine, started again when it dies.
        backend: The backend's name, for errors.
        check_open: The backend's refusal of a request once it is closed (`BaseBackend._check_open`).
        closed: Whether the backend was closed (requests under way then end with `BackendClosedError`).
    """

    def __init__(
        self,
        restarts: EngineRestarts,
        *,
        backend: str,
        check_open: Callable[[str | None], None],
        closed: Callable[[], bool],
    ) -> None:
        self._restarts = restarts
        self._backend = backend
        self._check_open = check_open
        self._closed = closed

    async def run(
        self,
        prompt: list[int] | Any,
        params: VLLMSamplingParams,
        request_id: str | None,
        render: Callable[[], Awaitable[Any]] | None = None,
        watch: Callable[[RequestOutput], bool] | None = None,
        lora: LoRARequest | None = None,
    ) -> RequestOutput:
        """Send one engine request and wait for its final output; again after an engine restart.

        A rendered prompt is rendered again by ``render`` then, for the new engine's renderer. ``watch`` sees
        each output (of a streaming output kind); once it says True, the request is aborted. ``lora``: the
        adapter it is sent with (``None``: the base).

        Raises:
            BackendClosedError: The backend was closed (before or while the request ran).
        """
        self._check_open(request_id)

        async def send(engine: AsyncLLM, again: bool) -> RequestOutput:
            fresh = await render() if again and render is not None else prompt
            return await self._send(engine, fresh, params, request_id, watch, lora)

        return await self._restarts.run(send, request_id)

    async def _send(
        self,
        engine: AsyncLLM,
        prompt: list[int] | Any,
        params: VLLMSamplingParams,
        request_id: str | None,
        watch: Callable[[RequestOutput], bool] | None = None,
        lora: LoRARequest | None = None,
    ) -> RequestOutput:
        """Send one engine request, wait for its final output, and translate engine errors to ours."""
        output: Any = None
        collector: RequestOutputCollector | None = None
        try:
            prompt = engine_input(engine, prompt) if isinstance(prompt, list) else prompt  # else rendered
            # What AsyncLLM.generate does, without its async generator: that generator, its aclosing
            # wrapper, its awaitable and the loop's weak reference to it were six more objects per request
            # in flight, all promoted to the collector's oldest generation (docs/benchmarks.md).
            collector = await engine.add_request(f"ab-{uuid.uuid4().hex}", prompt, params, lora_request=lora)
            while output is None or not output.finished:  # FINAL_ONLY: one output, all its completions
                output = collector.get_nowait() or await collector.get()
                if watch is not None and watch(output):
                    await _abort(engine, collector.request_id)
                    break
        except EngineDeadError as exc:
            raise self._dead(exc, request_id) if self._closed() else EngineDied() from exc
        except BaseException as exc:
            if collector is not None:
                # Cancelled or failed mid-way: the engine must not go on serving the request.
                await _abort(engine, collector.request_id)
            if isinstance(exc, Exception) and engine.errored and not self._closed():
                raise EngineDied() from exc
            if isinstance(exc, Exception):
                raise self._translate(exc, request_id) from exc
            raise
        finally:
            if collector is not None:
                collector.close()  # type: ignore[no-untyped-call]
        if self._closed():
            # aclose() aborted the engine's requests: what the engine hands back is an aborted fragment, not
            # a result (closed is closed).
            raise self._dead(RuntimeError("closed"), request_id)
        final: RequestOutput = output
        return final

    def _translate(self, exc: Exception, request_id: str | None) -> BackendError:
        name = self._backend
        if isinstance(exc, GracefulHTTPError):  # the engine's queue limits (max_num_queued_reqs): slow down
            return RateLimitedError(f"vllm: {exc}", backend=name, request_id=request_id)
        if isinstance(exc, VLLMClientError):  # validation: prompt too long, token id out of vocabulary...
            # vLLM's input processor: a prompt that leaves no room for one generated token (a prompt
            # that fits is generated up to max_model_len, finish reason "length", as vLLM does).
            kind = ContextLengthError if says_context_length(str(exc)) else RequestRejectedError
            return kind(f"vllm: {exc}", backend=name, request_id=request_id)
        engine = self._restarts.latest  # the dead one, after a death that started a restart
        if self._closed() or (engine is not None and engine.errored):
            return self._dead(exc, request_id)
        return BackendError(
            f"vllm: {type(exc).__name__}: {exc}", backend=name, request_id=request_id, retryable=False
        )

    def _dead(self, exc: BaseException, request_id: str | None) -> BackendError:
        if self._closed():
            return BackendClosedError("vllm backend was closed", backend=self._backend, request_id=request_id)
        return BackendBrokenError(
            f"the vllm engine died ({type(exc).__name__}); build a new backend",
            backend=self._backend,
            request_id=request_id,
        )


async def _abort(engine: AsyncLLM, internal_id: str) -> None:
    with contextlib.suppress(Exception):  # a failed abort (engine died) must not hide why we ended
        await engine.abort(internal_id, internal=True)
