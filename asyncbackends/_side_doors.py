"""A backend's optional members beyond the protocol (its side doors), and how wrappers forward them.

Integrations and routers read more of a backend than `AsyncBackend` promises, where it has it: its
``tokenizer`` (inspect counts and names tokens with it, lighteval hands it to its tasks), its
``max_model_len`` (lighteval's ``max_length``), ``check_ready`` (a router's probe), ``info`` (a TGI
server's ``/info``, which a pool reads the model from) and ``_adaptive_limit`` (a backend that limits its
parts adaptively). Each is a `runtime_checkable` protocol below, so ``isinstance(backend,
SupportsTokenizer)`` says whether a backend has it.

Wrappers forward them, so wrapping never loses them: ``limited`` every one its backend has (`FORWARDED`,
copied as instance attributes, so ``isinstance`` with these protocols answers as for the backend); a pool,
``engines=N`` and Ray, through properties, what every replica has and shares (`shared`: one tokenizer, the
smallest context length), not a replica's own ``info`` (a routed backend's ``check_ready`` and
``_adaptive_limit`` are its own). Where not every replica has one the property raises ``AttributeError``:
``hasattr`` (and ``getattr(backend, name, None)``, what the integrations read) tells the truth; so does
``isinstance`` on Python 3.11, while 3.12 reads properties statically and counts them as present.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._adaptive import AdaptiveConcurrency, AdaptiveLimiter, ChangeReason

__all__ = [
    "FORWARDED",
    "SupportsAdaptiveLimit",
    "SupportsCheckReady",
    "SupportsInfo",
    "SupportsMaxModelLen",
    "SupportsTokenizer",
    "shared",
]


@runtime_checkable
class SupportsTokenizer(Protocol):
    """A backend holding its model's tokenizer (Hugging Face's ``encode`` / ``decode`` / ``__call__``)."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the backend encodes prompts with."""
        ...


@runtime_checkable
class SupportsMaxModelLen(Protocol):
    """A backend that knows its model's context length (prompt plus generated tokens)."""

    @property
    def max_model_len(self) -> int | None:
        """The most tokens a sequence may hold; ``None`` where the server did not say."""
        ...


@runtime_checkable
class SupportsCheckReady(Protocol):
    """A backend that can say whether it serves now (what a router's probe awaits)."""

    async def check_ready(self) -> None:
        """Return when it can serve.

        Raises:
            BackendError: It cannot serve now (a `BackendUnavailableError`, say).
        """
        ...


@runtime_checkable
class SupportsInfo(Protocol):
    """A backend with its server's own description (TGI's ``/info``: ``model_id`` and its limits)."""

    async def info(self, request_id: str | None = None) -> Any:
        """The server's description, fetched once and kept."""
        ...


@runtime_checkable
class SupportsAdaptiveLimit(Protocol):
    """A backend limiting its parts adaptively (a pool: one limit a replica): a run's limit is theirs."""

    def _adaptive_limit(
        self, settings: AdaptiveConcurrency, on_change: Callable[[int, ChangeReason], None] | None = None
    ) -> AdaptiveLimiter:
        """The limit a run (or ``ab.limited``) holds its attempts on this backend to."""
        ...


FORWARDED = ("tokenizer", "max_model_len", "info", "check_ready")
"""The side doors a wrapper of one backend forwards (``_adaptive_limit`` it answers itself)."""


def shared(replicas: Sequence[Any], name: str) -> Any:
    """Side door ``name`` (``"tokenizer"`` or ``"max_model_len"``) shared by replicas of one model.

    The tokenizer when every replica has one (the first's: one model, one tokenizer); the context length
    when every replica knows it (the smallest, so a prompt that fits fits wherever it is routed).

    Raises:
        AttributeError: A replica lacks it (or there is none): the routed backend has none.
    """
    values: list[Any] = [getattr(replica, name, None) for replica in replicas]
    if not values or any(value is None for value in values):
        raise AttributeError(f"not every replica has a {name}")
    return values[0] if name == "tokenizer" else min(values)
