"""What a pool reads from its replicas: the replicas file, their labels, models, identities, capabilities.

`asyncbackends._wrappers.pool` puts the replicas behind one backend with these.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._cache import backend_fingerprint
from .._types import Capabilities
from ..errors import InvalidRequestError

__all__ = ["common_capabilities", "load_replicas_file", "replica_label", "replica_model", "static_identity"]

# Fingerprint keys that say where a replica is, not what it computes: left out of the pool's identity.
_ADDRESS_KEYS = frozenset({"url", "base_url", "endpoint", "address", "host", "port"})
# Every yes/no capability, read from the type itself so a flag added to `Capabilities` is pooled too.
_BOOL_CAPABILITIES = tuple(
    f.name for f in dataclasses.fields(Capabilities) if isinstance(getattr(Capabilities(), f.name), bool)
)


def load_replicas_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a replicas file (``.toml``, or ``.json``): ``{"replicas": [...], **pool options}``.

    Raises:
        InvalidRequestError: The file is missing, unreadable, or has no ``replicas`` list.
    """
    file = Path(path)
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read the replicas file {str(file)!r}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("replicas"), list):
        raise InvalidRequestError(f"the replicas file {str(file)!r} has no list of [[replicas]]")
    return data


def replica_label(backend: Any, index: int) -> str:
    """A replica's name in reports: its URL, else ``name-index``."""
    for attr in ("url", "base_url"):
        value = getattr(backend, attr, None)
        if isinstance(value, str) and value:
            return value
    return f"{getattr(backend, 'name', 'replica')}-{index}"


def static_identity(backend: Any) -> dict[str, Any]:
    """A replica's fingerprint without the keys that say where it is."""
    return {k: v for k, v in backend_fingerprint(backend).items() if k not in _ADDRESS_KEYS}


async def replica_model(backend: Any) -> str:
    """The model a replica serves.

    TGI's ``/info`` ``model_id``, else the adapter's ``model``, else its fingerprint without addresses (JSON).
    """
    info = getattr(backend, "info", None)
    if callable(info) and asyncio.iscoroutinefunction(info):
        model_id = getattr(await info(), "model_id", None)
        if isinstance(model_id, str) and model_id:
            return model_id
    model = getattr(backend, "model", None)
    if isinstance(model, str) and model:
        return model
    return json.dumps(static_identity(backend), sort_keys=True, default=str)


def common_capabilities(backends: Sequence[Any], capacities: Sequence[int | None]) -> Capabilities:
    """The capabilities every replica has; ``max_concurrency`` is the capacities' sum when all are known."""
    caps = [getattr(b, "capabilities", Capabilities()) for b in backends]
    flags = {name: all(getattr(c, name, False) for c in caps) for name in _BOOL_CAPABILITIES}
    total = sum(c for c in capacities if c is not None) if all(c is not None for c in capacities) else None
    return Capabilities(**flags, max_concurrency=total or None)
