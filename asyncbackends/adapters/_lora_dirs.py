"""LoRA adapter directories as adapters that load them name them: ``lora_modules={"name": "/adapter/dir"}``.

Shared by the ``vllm`` adapter (which loads them into its engine) and the ``openai`` adapter (which has a
server load them): each directory is checked when the backend is built (it exists and holds a peft
``adapter_config.json`` with a rank), and its files are digested for the backend's fingerprint, so a response
cache never serves one checkpoint's answers for another saved under the same name. Importing this module
imports no engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

__all__ = ["LoraModule", "LoraModules", "read_lora_modules"]

_CONFIG = "adapter_config.json"
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class LoraModule:
    """One adapter the backend serves.

    Attributes:
        name: The name requests give (``request.adapter``).
        path: Its directory, absolute.
        rank: Its ``r`` (the largest of its ``rank_pattern``, where it has one).
        lora_id: Its ``LoRARequest`` id (>= 1), the same in every engine of the backend.
        digest: The SHA-256 of its files (hex), for the fingerprint.
        target_modules: Its config's ``target_modules`` where that is a list of names (peft's regex string
            or anything else: ``None``).
        saves_modules: Whether its config has ``modules_to_save`` (whole modules trained, not LoRA).
    """

    name: str
    path: str
    rank: int
    lora_id: int
    digest: str
    target_modules: tuple[str, ...] | None = None
    saves_modules: bool = False


class LoraModules:
    """The backend's adapters by name, read and checked once at create time (`read_lora_modules`)."""

    def __init__(self, modules: list[LoraModule]) -> None:
        self.by_name = {module.name: module for module in modules}

    @property
    def names(self) -> list[str]:
        """The adapters' names, sorted."""
        return sorted(self.by_name)

    @property
    def max_rank(self) -> int:
        """The largest rank among the adapters."""
        return max(module.rank for module in self.by_name.values())

    @property
    def fingerprint(self) -> dict[str, dict[str, str]]:
        """``{"lora_modules": {name: "sha256:<hex>"}}``: what the response cache keys on."""
        return {"lora_modules": {m.name: f"sha256:{m.digest}" for m in self.by_name.values()}}

    def lora_requests(self) -> dict[str, LoRARequest]:
        """The ``LoRARequest`` of each adapter by name (imports vLLM: call after `import_vllm`)."""
        from vllm.lora.request import LoRARequest

        return {m.name: LoRARequest(m.name, m.lora_id, m.path) for m in self.by_name.values()}


def read_lora_modules(lora_modules: Any) -> LoraModules | None:
    """Check the ``lora_modules`` option and read each adapter's rank and digest; ``None`` where not given.

    Reads every file of every adapter (for the digest): call it in a thread, not on the shared loop.

    Raises:
        InvalidRequestError: Not a mapping of names to paths, an empty one, or a path that is not a
            directory holding a readable ``adapter_config.json`` with a positive int ``r``.
    """
    if lora_modules is None:
        return None
    if not isinstance(lora_modules, Mapping) or not lora_modules:
        raise InvalidRequestError(
            f"lora_modules must be a non-empty mapping of adapter names to directories, got {lora_modules!r}"
        )
    checked: list[tuple[str, str, dict[str, Any]]] = []
    for name, path in lora_modules.items():
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequestError(f"lora_modules: an adapter name must be a non-empty str, got {name!r}")
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidRequestError(f"lora_modules[{name!r}] must be a directory path, got {path!r}")
        directory = Path(path).expanduser().resolve()
        checked.append((name, str(directory), _config(name, directory)))
    ids = {name: i for i, name in enumerate(sorted(lora_modules), start=1)}
    return LoraModules([_module(name, path, config, ids[name]) for name, path, config in checked])


def _module(name: str, path: str, config: dict[str, Any], lora_id: int) -> LoraModule:
    targets = config.get("target_modules")
    listed = isinstance(targets, list) and all(isinstance(t, str) for t in targets)
    return LoraModule(
        name,
        path,
        _rank(name, path, config),
        lora_id,
        _digest(Path(path)),
        tuple(targets) if listed else None,  # type: ignore[arg-type]  # a list of strs, checked
        bool(config.get("modules_to_save")),
    )


def _config(name: str, directory: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``, read once (its rank, its target modules)."""
    where = f"lora_modules[{name!r}] ({str(directory)!r})"
    if not directory.is_dir():
        raise InvalidRequestError(f"{where}: no such adapter directory")
    try:
        config = json.loads((directory / _CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidRequestError(f"{where}: not a LoRA adapter directory (no {_CONFIG})") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"{where}: its {_CONFIG} cannot be read: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidRequestError(f"{where}: its {_CONFIG} gives no positive int rank 'r'")
    return config


def _rank(name: str, path: str, config: dict[str, Any]) -> int:
    """The adapter's rank (peft's ``r``, and ``rank_pattern`` overrides)."""
    where = f"lora_modules[{name!r}] ({path!r})"
    ranks: list[Any] = [config.get("r")]
    if isinstance(config.get("rank_pattern"), dict):
        ranks += list(config["rank_pattern"].values())
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise InvalidRequestError(f"{where}: its {_CONFIG} gives no positive int rank 'r'")
    return int(max(ranks))


def _digest(directory: Path) -> str:
    """SHA-256 over the adapter's top-level files (not dot-files), each by its name, size and bytes.

    Not the stat-based identity of a base checkpoint (`_checkpoint`): an adapter is small next to a base,
    so its bytes are read, and a copy of the same adapter elsewhere keeps its cache.
    """
    digest = hashlib.sha256(b"asyncbackends-lora/1\0")
    for path in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")):
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode("utf-8", "surrogateescape"))
        with path.open("rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()
