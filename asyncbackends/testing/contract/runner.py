"""`run_contract`: the whole suite against any registered adapter, in pytest, with a verdict per contract."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pytest

from .. import plugin
from ..plugin import CONTRACT_TARGET, parse_option_value

__all__ = ["parse_option_value", "run_contract"]

_MAX_LINES = 12


class _Verdicts:
    """A pytest plugin object: hands the target to the plugin and records each test's outcome."""

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.target = (name, dict(options))
        self.outcomes: dict[str, int] = {}
        self.broken: list[tuple[str, str]] = []

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[CONTRACT_TARGET] = self.target

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = report.nodeid.rpartition("::")[2]
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            message = message.removeprefix("Failed: ")
            where = "" if report.when == "call" else f" (error in {report.when})"
            self.broken.append((test + where, message))
            self.outcomes["failed"] = self.outcomes.get("failed", 0) + 1
        elif report.when == "call" or report.skipped:
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def write(self, name: str, stream: TextIO) -> None:
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes.items()))
        if not self.outcomes:
            # A usage error, or a -k that matched nothing: no verdict either way.
            stream.write(
                f"asyncbackends contract {name!r}: no contract test ran; see pytest's output above\n"
            )
            return
        if not self.broken:
            stream.write(f"asyncbackends contract {name!r}: no contract broken ({counts})\n")
            return
        stream.write(f"asyncbackends contract {name!r}: {len(self.broken)} contract(s) broken ({counts})\n")
        for test, message in self.broken:
            lines = message.splitlines() or [""]
            stream.write(f"  BROKEN {test}: {lines[0]}\n")
            for line in lines[1:_MAX_LINES]:
                stream.write(f"      {line}\n")


def run_contract(
    name: str,
    options: Mapping[str, Any] | None = None,
    extra_pytest_args: Sequence[str] = (),
    *,
    fresh_backends: bool = True,
    stream: TextIO | None = None,
) -> int:
    """Run the contract suite against ``create_backend(name, **options)`` and report which contracts broke.

    pytest runs in this process with a configuration of its own (your project's pytest settings do not
    apply), the ``asyncbackends.testing.plugin`` plugin and the `BackendContract` test class.

    Args:
        name: A registered adapter name (built-in, entry point or `register_backend`) or ``"module:Class"``.
        options: The adapter's options, already typed (read command-line text with `parse_option_value`).
        extra_pytest_args: More pytest arguments, for example ``["-x"]`` or ``["-k", "cancel"]``.
        fresh_backends: Build extra backends for the checks that close one (turn off for costly engines).
        stream: Where the verdict goes; standard output by default.

    Returns:
        pytest's exit code: 0 when no contract is broken.
    """
    from . import _registered

    verdicts = _Verdicts(name, options or {})
    ini = ["[pytest]", "addopts =", "python_classes = Test*", "python_functions = test_*"]
    if importlib.util.find_spec("pytest_asyncio") is not None:
        ini.append("asyncio_default_fixture_loop_scope = function")
    with tempfile.TemporaryDirectory(prefix="asyncbackends-contract-") as tmp:
        config_file = Path(tmp, "pytest.ini")
        config_file.write_text("\n".join(ini) + "\n", encoding="utf-8")
        args = [
            str(Path(_registered.__file__)),
            "-c",
            str(config_file),
            "--rootdir",
            tmp,
            "-p",
            "no:cacheprovider",
            "-rs",
            *([] if fresh_backends else ["--no-fresh-backends"]),
            *extra_pytest_args,
        ]
        # The plugin module goes in as an object: naming it with -p would warn that it is already imported.
        code = pytest.main(args, plugins=[plugin, verdicts])
    verdicts.write(name, stream or sys.stdout)
    return int(code)
