"""LoRA adapters as the integrations and the command line take them: one reading of each spelling.

Frameworks pass options as flat text (lm-eval's ``--model_args`` split on every comma, inspect's ``-M``, the
``asyncbackends run --option``), so ``lora_modules`` (a mapping for the ``vllm`` backend) needs a text form
that survives all of them:

- ``name=/path|other=/path`` (``|`` between adapters, as ``ignore_gen_kwargs`` joins names; a comma would be
  cut by lm-eval before any of this code runs), where a bare ``/path`` is named by its directory's name;
- a JSON object, ``{"name": "/path"}`` (for paths holding ``|`` or ``=``);
- a mapping, from Python or a framework that parsed one already.

An adapter given by its directory alone (lm-eval's ``lora_local_path``, an inspect model name ending in a
path) is named by that directory's name, the same everywhere, so a cache and a log say which one it was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._field_checks import check_adapter
from .._protocol import AsyncBackend
from .._wrappers.with_adapter import with_adapter
from ..errors import InvalidRequestError

__all__ = ["adapter_named", "merge_module", "module_from_path", "parse_lora_modules"]


def parse_lora_modules(value: Any, *, where: str = "lora_modules") -> dict[str, str] | None:
    """Read a ``lora_modules`` value in any of its spellings; ``None`` (or an empty text) stays ``None``.

    Args:
        value: A mapping of names to directories, a JSON object, ``name=path|name=path`` text (a bare
            path is named by its directory's name), or a list of such texts.
        where: What the value was given as, for messages (``--option lora_modules``...).

    Returns:
        The adapters' directories by name, as given (the backend checks the directories).

    Raises:
        InvalidRequestError: An item without a path, a name that is not a valid adapter name, or one name
            given twice.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidRequestError(f"{where}: not a JSON object: {exc}") from exc
    if isinstance(value, Mapping):
        modules: dict[str, str] = {}
        for name, path in value.items():
            if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
                raise InvalidRequestError(f"{where}: adapter {name!r} needs a directory path, got {path!r}")
            modules[_checked_name(name, where)] = os.fspath(path)
        return modules
    # A list: inspect's -M splits a value on its commas (``-M lora_modules=a=/p,b=/q``).
    texts = value if isinstance(value, (list, tuple)) else [value]
    if not texts or not all(isinstance(text, str) for text in texts):
        raise InvalidRequestError(
            f"{where}: expected name=path pairs joined by '|' or a mapping of names to paths, got {value!r}"
        )
    modules = {}
    for item in (part.strip() for text in texts for part in text.split("|")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep:
            name, path = module_from_path(item, where=where)
        elif not path.strip():
            raise InvalidRequestError(f"{where}: adapter {name.strip()!r} has no path (expected name=path)")
        name = _checked_name(name.strip(), where)
        if name in modules:
            raise InvalidRequestError(f"{where}: adapter {name!r} is given twice")
        modules[name] = path.strip()
    return modules or None


def module_from_path(path: str | os.PathLike[str], *, where: str) -> tuple[str, str]:
    """An adapter given by its directory alone: ``(its directory's name, the path)``.

    Raises:
        InvalidRequestError: The directory's name is not a valid adapter name (empty, blanks, control
            characters).
    """
    text = os.fspath(path)
    name = Path(text.rstrip("/\\") or text).expanduser().name
    return _checked_name(name, f"{where} ({text!r}: the adapter is named by its directory)"), text


def merge_module(modules: Mapping[str, str] | None, name: str, path: str, *, where: str) -> dict[str, str]:
    """``modules`` with ``name`` -> ``path`` added; the same name given again must be the same directory.

    Raises:
        InvalidRequestError: ``name`` is already among ``modules`` with another directory.
    """
    merged = dict(modules or {})
    known = merged.get(name)
    if known is not None and _same_directory(known, path):
        return merged
    if known is not None:
        raise InvalidRequestError(
            f"{where}: adapter {name!r} is {path!r} there and {known!r} in lora_modules: one name, two "
            "directories; rename one"
        )
    merged[name] = path
    return merged


def adapter_named(backend: AsyncBackend, adapter: str | None) -> AsyncBackend:
    """``backend`` as it is (``adapter`` None), else `with_adapter` around it: every request names it."""
    return backend if adapter is None else with_adapter(backend, adapter)


def _checked_name(name: object, where: str) -> str:
    try:
        check_adapter(name)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"{where}: {exc}") from None
    if not isinstance(name, str):  # check_adapter lets None through; a mapping's key must be a name
        raise InvalidRequestError(f"{where}: an adapter name must be a str, got {name!r}")
    return name


def _same_directory(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
