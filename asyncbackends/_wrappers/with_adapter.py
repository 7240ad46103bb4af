"""`ab.with_adapter`: a backend that names one LoRA adapter on every request it sends.

Frameworks that know one model per run (lm-eval's ``--model_args``, inspect's model name, lighteval's model
config) have no field for an adapter; wrapping the backend once, ``ab.with_adapter(backend, "math-v3")``,
makes every request through the wrapper ask for it, the way ``ab.limited`` makes every request share its
limits. The wrapper's fingerprint is the wrapped backend's with the adapter's name added, so a run's cache
never serves the base model's answers for the adapter's, or one adapter's for another's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from .._cache_codec import backend_fingerprint
from .._field_checks import check_adapter
from .._protocol import AsyncBackend, SupportsRollingLoglikelihood
from .._types import Request
from ..errors import InvalidRequestError
from .forwarding import ForwardingBackend, ForwardingRolling, Send

__all__ = ["AdapterBackend", "AdapterRollingBackend", "with_adapter"]

T = TypeVar("T")
R = TypeVar("R", bound=Request)


class AdapterBackend(ForwardingBackend):
    """A backend that sends every request through ``backend`` with its ``adapter`` set.

    Build it with `with_adapter`. Its name, capabilities, prices and side doors (tokenizer, context length)
    are the wrapped backend's; `aclose` closes the wrapped backend.

    Attributes:
        backend: The wrapped backend.
        adapter: The adapter every request names.
    """

    def __init__(self, backend: AsyncBackend, adapter: str) -> None:
        check_adapter(adapter)
        if adapter is None or not backend.capabilities.adapters:
            raise InvalidRequestError(
                f"with_adapter({adapter!r}): backend {backend.name!r} serves no LoRA adapters (its "
                "capabilities.adapters is False); give the vllm adapter lora_modules, or use a server that "
                "serves adapters"
            )
        super().__init__(backend)
        self.adapter: str = adapter

    def __repr__(self) -> str:
        return f"with_adapter({self.backend!r}, {self.adapter!r})"

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        """The wrapped backend's fingerprint (its name where it has none) and the adapter's name."""
        return {**backend_fingerprint(self.backend), "with_adapter": self.adapter}

    async def _send(self, request: Any, send: Send[T]) -> T:
        return await send(self._named(request))

    def _named(self, request: R) -> R:
        if request.adapter == self.adapter:
            return request
        if request.adapter is not None:
            # Two names for one request: neither can be chosen silently.
            raise InvalidRequestError(
                f"the request names adapter {request.adapter!r}, but it is sent through "
                f"with_adapter(..., {self.adapter!r}); leave the request's adapter None"
            )
        return dataclasses.replace(request, adapter=self.adapter)


class AdapterRollingBackend(AdapterBackend, ForwardingRolling):
    """An `AdapterBackend` around a backend that has ``loglikelihood_rolling``."""


def with_adapter(backend: AsyncBackend, adapter: str) -> AdapterBackend:
    """Wrap ``backend`` so every request sent through the result names LoRA adapter ``adapter``.

    For frameworks that hold one backend per model: a sweep over adapters is one engine and one wrapper per
    adapter, run one after another or concurrently. A request that already names another adapter is refused
    (`InvalidRequestError`); one that names the same passes as it is.

    Example:
        ```python
        engine = ab.create_backend("vllm", model=BASE, lora_modules={"math-v3": "/ckpt/math-v3"})
        results = ab.run_batch(ab.with_adapter(engine, "math-v3"), requests)
        ```

    Args:
        backend: A backend whose capabilities claim ``adapters``.
        adapter: The adapter's name, as the backend serves it.

    Returns:
        The wrapper: an `AsyncBackend`, with ``loglikelihood_rolling`` when ``backend`` has it.

    Raises:
        InvalidRequestError: ``adapter`` is not a name, or ``backend`` serves no adapters.
    """
    if isinstance(backend, SupportsRollingLoglikelihood):
        return AdapterRollingBackend(backend, adapter)
    return AdapterBackend(backend, adapter)
