"""`run_contract`: the whole suite against any registered adapter, in pytest, with a verdict per contract.

The verdict names each broken contract with its message, and each skipped one with its reason and what to
give to run it; a server that cannot be reached is reported as such, once, not as broken contracts.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pytest

from .. import plugin
from ..plugin import CONTRACT_EXTRAS, CONTRACT_TARGET, UNREACHABLE
from ..plugin import UNREACHABLE_EXIT as UNREACHABLE_EXIT
from ..plugin import parse_option_value as parse_option_value

__all__ = ["run_contract"]

_MAX_LINES = 12

# What to give `asyncbackends contract` (or `run_contract`) to run a contract that skipped, by its reason.
_HINTS = (
    ("no make_backend fixture", "drop --no-fresh-backends (run_contract(..., fresh_backends=True))"),
    (
        "no failing_backend fixture",
        "--failing-option KEY=VALUE: options that make every request fail, e.g. url=http://127.0.0.1:9",
    ),
    (
        "no make_slot_limited_backend fixture",
        "--slot-limit-option NAME: the option sizing the adapter's own pool, e.g. max_connections",
    ),
    (
        "no secret fixture",
        "the credential as an --option whose name holds token, key, secret or password",
    ),
    (
        "rejected_requests fixture is empty",
        "not from the command line: subclass BackendContract and override rejected_requests",
    ),
    (
        "finished within cancel_after",
        "not from the command line: subclass BackendContract with a lower cancel_after",
    ),
    ("capabilities.", "nothing: the backend's capabilities say it cannot (it must refuse such requests)"),
    ("added in contract version", "raise the class's contract_version pin"),
)


def _hint(reason: str) -> str | None:
    return next((hint for words, hint in _HINTS if words in reason), None)


class _Verdicts:
    """A pytest plugin object: hands the target to the plugin and records each test's outcome."""

    def __init__(
        self,
        name: str,
        options: Mapping[str, Any],
        failing_options: Mapping[str, Any] | None,
        slot_limit_option: str | None,
    ) -> None:
        self.target = (name, dict(options))
        self.extras = (dict(failing_options) if failing_options else None, slot_limit_option)
        self.outcomes: dict[str, int] = {}
        self.broken: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str]] = []
        self.config: pytest.Config | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[CONTRACT_TARGET] = self.target
        config.stash[CONTRACT_EXTRAS] = self.extras
        self.config = config

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
            if outcome == "skipped":
                longrepr = report.longrepr
                reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                self.skipped.append((test, reason.removeprefix("Skipped: ")))

    def write(self, name: str, stream: TextIO) -> None:
        unreachable = self.config.stash.get(UNREACHABLE, None) if self.config is not None else None
        if unreachable:
            stream.write(
                f"asyncbackends contract {name!r}: {unreachable}\n"
                "  no contract was checked: start the server, or fix the url/base_url option, and run again\n"
            )
            return
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes.items()))
        if not self.outcomes:
            # A usage error, or a -k that matched nothing: no verdict either way.
            stream.write(
                f"asyncbackends contract {name!r}: no contract test ran; see pytest's output above\n"
            )
            return
        if not self.broken:
            stream.write(f"asyncbackends contract {name!r}: no contract broken ({counts})\n")
        else:
            stream.write(
                f"asyncbackends contract {name!r}: {len(self.broken)} contract(s) broken ({counts})\n"
            )
        for test, message in self.broken:
            lines = message.splitlines() or [""]
            stream.write(f"  BROKEN {test}: {lines[0]}\n")
            for line in lines[1:_MAX_LINES]:
                stream.write(f"      {line}\n")
        for test, reason in self.skipped:
            stream.write(f"  skipped {test}: {reason}\n")
            hint = _hint(reason)
            if hint:
                stream.write(f"      to run it, give: {hint}\n")


def run_contract(
    name: str,
    options: Mapping[str, Any] | None = None,
    extra_pytest_args: Sequence[str] = (),
    *,
    fresh_backends: bool = True,
    failing_options: Mapping[str, Any] | None = None,
    slot_limit_option: str | None = None,
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
        failing_options: Options (over ``options``) that make every request fail in the transport or
            engine, e.g. ``{"url": "http://127.0.0.1:9"}``: enables the error-mapping and error-leak checks.
        slot_limit_option: The option sizing the adapter's own pool or slots (``"max_connections"``):
            enables the check that a per-attempt timeout does not time the wait for one.
        stream: Where the verdict goes; standard output by default.

    Returns:
        pytest's exit code: 0 when no contract is broken; `UNREACHABLE_EXIT` (3) when the server could not
        be reached, so no contract was checked.
    """
    from . import _registered

    verdicts = _Verdicts(name, options or {}, failing_options, slot_limit_option)
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
