"""`run_contract`, the pytest plugin, option parsing and the third-party path through the entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.contract import (
    CONTRACT_VERSION,
    BackendContract,
    added_in,
    contract_tests,
    parse_option_value,
)
from asyncbackends.testing.contract._base import version_of_test

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _python(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, *args, "-c", code] if code else [sys.executable, *args],
        cwd=tmp_path,  # away from the project's pytest settings: run_contract must bring its own
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


def _run_contract(name: str, options: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "from asyncbackends.testing.contract import run_contract\n"
        f"raise SystemExit(run_contract({name!r}, {options!r}, ['-q']))\n"
    )
    return _python(code, tmp_path)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("0.5", 0.5),
        ("true", True),
        ("True", True),
        ("FALSE", False),
        ("none", None),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ('{"a": 1}', {"a": 1}),
        ('"8"', "8"),
        ("float32", "float32"),
        ("/models/tiny", "/models/tiny"),
        ("", ""),
    ],
)
def test_parse_option_value(text: str, value: Any) -> None:
    parsed = parse_option_value(text)
    assert parsed == value
    assert type(parsed) is type(value)


def test_third_party_adapter_is_discovered_through_its_entry_point() -> None:
    backends = ab.available_backends()
    assert backends.get("reverse-echo") == "reverse_echo:ReverseEchoBackend", (
        "install the example first: .venv/bin/pip install -e examples/third_party_adapter"
    )


@pytest.mark.slow
def test_run_contract_passes_the_third_party_adapter_by_name(tmp_path: Path) -> None:
    proc = _run_contract("reverse-echo", {"api_key": "sk-third-party-77"}, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "asyncbackends contract 'reverse-echo': no contract broken (25 passed, 15 skipped)" in proc.stdout
    assert "sk-third-party-77" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_run_contract_names_the_broken_contract(tmp_path: Path) -> None:
    proc = _run_contract("broken_adapters:NIgnoredBackend", {}, tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 contract(s) broken" in proc.stdout
    assert "BROKEN test_n_completions_exactly: asked for n=2, got 1 completion(s)" in proc.stdout


@pytest.mark.slow
def test_run_contract_reports_a_backend_that_cannot_be_built(tmp_path: Path) -> None:
    proc = _run_contract("mock", {"latency": -1}, tmp_path)
    assert proc.returncode == 1
    assert (
        "(error in setup): asyncbackends.InvalidRequestError: latency and jitter must be >= 0" in proc.stdout
    )


@pytest.mark.slow
def test_plugin_builds_the_backend_from_command_line_options(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    from asyncbackends.testing.contract import _registered

    proc = _python(
        "",
        tmp_path,
        "-m",
        "pytest",
        str(Path(_registered.__file__)),
        "-c",
        str(tmp_path / "pytest.ini"),
        "-p",
        "asyncbackends.testing.plugin",
        "-p",
        "no:cacheprovider",
        "--backend-name",
        "mock",
        "--backend-option",
        "latency=0.02",
        "--backend-option",
        "model=contract-model",
        "--no-fresh-backends",
        "-k",
        "shape or aclose",
        "-rs",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed, 2 skipped" in proc.stdout  # both aclose checks need fresh backends
    assert "no make_backend fixture" in proc.stdout  # --no-fresh-backends reached the fixture


def test_plugin_imports_no_engine(tmp_path: Path) -> None:
    code = (
        "import sys, asyncbackends.testing.plugin, asyncbackends.testing.contract\n"
        "print(sorted(m for m in ('vllm', 'aiohttp', 'torch', 'transformers', 'huggingface_hub') if m in sys.modules))"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_contract_version_is_exposed_and_names_the_newest_tests() -> None:
    import asyncbackends.testing.contract as contract

    assert "CONTRACT_VERSION" in contract.__all__
    versions = {name: version_of_test(BackendContract, name) for name in contract_tests(BackendContract)}
    assert max(versions.values()) == CONTRACT_VERSION == 3
    assert versions["test_named_tool_choice_obeyed"] == 3
    assert versions["test_n_samples_vary"] == 2
    assert versions["test_seeded_n_samples_vary"] == 3
    assert versions["test_greedy_deterministic"] == 1
    assert added_in(4)(lambda: None).__contract_version__ == 4  # type: ignore[attr-defined]


@pytest.mark.slow
def test_run_contract_lists_skips_with_what_to_give_and_runs_them_when_given(tmp_path: Path) -> None:
    code = (
        "from asyncbackends.testing.contract import run_contract\n"
        "raise SystemExit(run_contract('broken_adapters:QueuedBackend', {'latency': 0.05}, ['-q'], "
        "fresh_backends=False))\n"
    )
    plain = _python(code, tmp_path)
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-2000:]
    assert "  skipped test_timeout_excludes_waiting_for_a_slot: no make_slot_limited_backend fixture" in (
        plain.stdout
    )
    assert "      to run it, give: --slot-limit-option NAME" in plain.stdout
    assert "      to run it, give: --failing-option KEY=VALUE" in plain.stdout
    assert "      to run it, give: drop --no-fresh-backends" in plain.stdout
    code = (
        "from asyncbackends.testing.contract import run_contract\n"
        "raise SystemExit(run_contract('broken_adapters:QueuedBackend', {'latency': 0.05}, ['-q'], "
        "fresh_backends=False, failing_options={'failure_rate': 1.0}, slot_limit_option='max_slots'))\n"
    )
    given = _python(code, tmp_path)
    assert given.returncode == 1, given.stdout[-4000:] + given.stderr[-2000:]
    assert "BROKEN test_timeout_excludes_waiting_for_a_slot: with the adapter's own limit of 2 slots" in (
        given.stdout
    )
    assert "skipped test_transport_failures_are_library_errors" not in given.stdout  # it ran, and passed
    assert "skipped test_timeout_excludes_waiting_for_a_slot" not in given.stdout


@pytest.mark.slow
def test_run_contract_reports_an_unreachable_server_once(tmp_path: Path) -> None:
    proc = _run_contract("tgi", {"url": "http://127.0.0.1:9", "token": False}, tmp_path)
    assert proc.returncode == 3, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "asyncbackends contract 'tgi': cannot reach the server of backend 'tgi'" in proc.stdout
    assert "no contract was checked" in proc.stdout
    assert "BROKEN" not in proc.stdout
