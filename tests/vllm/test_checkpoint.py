"""A local checkpoint's identity in vLLM's cache fingerprint: its files, not only its path (no engine here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncbackends.adapters._checkpoint import checkpoint_fields, checkpoint_identity


@pytest.fixture
def checkpoint(tiny_model: str, tmp_path: Path) -> Path:
    """A copy of the tiny model (copy2: the files keep their sizes and times), free to be rewritten."""
    return Path(shutil.copytree(tiny_model, tmp_path / "ckpt"))


def _identity_in_another_process(path: Path) -> str:
    code = "import sys; from asyncbackends.adapters._checkpoint import checkpoint_identity as c; print(c(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True, timeout=60
    )
    return proc.stdout.strip()


def test_retrained_weights_in_the_same_directory_change_the_identity(checkpoint: Path) -> None:
    before = checkpoint_identity(checkpoint)
    assert before is not None and len(before) == 32
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(255 - b for b in data[-64:])  # other weights, same size: as a retrain writes them
    old_mtime = weights.stat().st_mtime_ns
    weights.write_bytes(bytes(data))
    assert weights.stat().st_mtime_ns != old_mtime
    after = checkpoint_identity(checkpoint)
    assert after is not None and after != before
    assert checkpoint_fields(str(checkpoint), {})["checkpoint"] == after


def test_unchanged_files_give_the_same_identity_in_every_process(tiny_model: str, checkpoint: Path) -> None:
    here = checkpoint_identity(checkpoint)
    assert here == checkpoint_identity(str(checkpoint))
    assert _identity_in_another_process(checkpoint) == here
    assert _identity_in_another_process(Path(tiny_model)) == checkpoint_identity(tiny_model)
    # Nothing was loaded or written: reading the identity leaves the files as they were.
    assert checkpoint_identity(checkpoint) == here


def test_config_tokenizer_and_new_files_count_hidden_files_do_not(checkpoint: Path) -> None:
    seen = {checkpoint_identity(checkpoint)}
    (checkpoint / ".cache").mkdir()
    (checkpoint / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert checkpoint_identity(checkpoint) in seen  # download metadata is not the model
    config = checkpoint / "config.json"
    config.write_text(config.read_text() + "\n")  # an edited config: another model
    seen.add(checkpoint_identity(checkpoint))
    tokenizer = checkpoint / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text() + " ")
    seen.add(checkpoint_identity(checkpoint))
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    seen.add(checkpoint_identity(checkpoint))
    assert len(seen) == 4


def test_a_hub_id_keeps_its_fingerprint_and_a_local_tokenizer_is_identified(
    tiny_model: str, tmp_path: Path
) -> None:
    hub_id = "meta-llama/Llama-3.2-1B-Instruct"
    assert not os.path.exists(hub_id)
    assert checkpoint_identity(hub_id) is None
    assert checkpoint_fields(hub_id, {"revision": "main", "tokenizer": "other/tokenizer"}) == {}
    fields = checkpoint_fields(hub_id, {"tokenizer": tiny_model})
    assert fields == {"tokenizer_checkpoint": checkpoint_identity(tiny_model)}
    single = tmp_path / "model.gguf"
    single.write_bytes(b"GGUF" + bytes(60))
    assert checkpoint_identity(single) is not None
