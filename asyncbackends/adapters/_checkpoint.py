"""A local checkpoint's identity, for the response cache, read from file metadata without loading the model.

A model named by its path alone keeps its cache keys when a checkpoint is retrained or replaced in the same
directory, and the cache then answers with the old model's outputs. A Hugging Face Hub id is identified by
the id and the ``revision`` option; a local checkpoint is identified here by its files instead, as the tgi
adapter uses the server's ``model_sha`` and the openai adapter the served model's root.

The identity hashes the name, size and modification time (nanoseconds) of every file at the top of the
directory (a single-file checkpoint such as a GGUF file: that file): the config, the tokenizer files, the
weight index and the weights themselves. Only ``stat`` is called, so it costs microseconds per file whatever
the checkpoint's size. Names starting with a dot (``.cache/``, ``.gitattributes``) are left out, as are
subdirectories: vLLM reads a checkpoint's files from its top level. Symbolic links are followed, so a Hub
cache snapshot (links into its blob store) is identified by the blobs it points at.

The identity changes whenever a file is rewritten (even with the same bytes), added, removed or renamed; it
is the same in every process that reads the same unchanged files, so a resumed run hits its cache. A copy
of a checkpoint elsewhere gets another identity (its path differs anyway).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from typing import Any

__all__ = ["checkpoint_fields", "checkpoint_identity"]


def checkpoint_identity(model: str | os.PathLike[str]) -> str | None:
    """A short hash identifying the local checkpoint at ``model``; ``None`` where ``model`` is not local.

    Args:
        model: A model directory, a single checkpoint file, or a Hub id (not a local path: ``None``).

    Returns:
        32 hex digits that change when any of the checkpoint's files is rewritten, added or removed.
    """
    path = os.fspath(model)
    try:
        top = os.stat(path)
    except (OSError, ValueError):  # not a local path (a Hub id), or a name the OS cannot take
        return None
    records: list[str] = []
    if stat.S_ISDIR(top.st_mode):
        try:
            with os.scandir(path) as entries:
                names = sorted(entry.name for entry in entries if not entry.name.startswith("."))
        except OSError:  # unreadable: nothing can be loaded from it either
            return None
        for name in names:
            try:
                info = os.stat(os.path.join(path, name))
            except OSError:  # a dangling link or a file removed meanwhile: its absence is the identity
                continue
            if stat.S_ISREG(info.st_mode):
                records.append(_record(name, info))
    elif stat.S_ISREG(top.st_mode):
        records.append(_record(os.path.basename(path), top))
    else:
        return None
    text = "asyncbackends-checkpoint/1\0" + "".join(records)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _record(name: str, info: os.stat_result) -> str:
    # NUL ends each field: the one character no file name can hold, so no two listings hash alike by accident.
    return f"{name}\0{info.st_size}\0{info.st_mtime_ns}\0"


def checkpoint_fields(model: str, engine_args: Mapping[str, Any]) -> dict[str, str]:
    """The fingerprint fields identifying a vLLM backend's local files: the model's, and a local tokenizer's.

    Empty for a Hub id (with no local tokenizer): a Hub model's fingerprint and cache keys stay as they were.
    """
    fields: dict[str, str] = {}
    identity = checkpoint_identity(model)
    if identity is not None:
        fields["checkpoint"] = identity
    tokenizer = engine_args.get("tokenizer")
    if isinstance(tokenizer, (str, os.PathLike)):
        identity = checkpoint_identity(tokenizer)
        if identity is not None:
            fields["tokenizer_checkpoint"] = identity
    return fields
