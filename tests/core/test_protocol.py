"""The protocol declares what the core calls; its documented example type-checks and runs."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pytest

import asyncbackends as ab
from asyncbackends._protocol import (
    REQUEST_METHODS,
    SupportsFingerprint,
    SupportsRollingLoglikelihood,
    backend_method,
)
from asyncbackends._text import split_trailing_space


def _docstring_example() -> str:
    doc = ab.BaseBackend.__doc__ or ""
    match = re.search(r"```python\n(.*?)```", doc, re.S)
    assert match is not None
    lines = match.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def test_the_base_backend_example_runs() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_docstring_example(), "example", "exec"), namespace)
    main = namespace["main"]
    assert asyncio.run(main()) == "hi"  # type: ignore[operator]


@pytest.mark.timeout(600)
def test_the_base_backend_example_passes_mypy_strict(tmp_path: Path) -> None:
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed")
    example = tmp_path / "example.py"
    example.write_text(_docstring_example())
    done = subprocess.run(
        [mypy, "--strict", "--follow-imports=silent", str(example)],
        capture_output=True,
        text=True,
        cwd=Path(ab.__file__).parent.parent,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


class Minimal:
    """A third-party backend with only the required members: still an `AsyncBackend`."""

    name = "minimal"
    capabilities = ab.Capabilities()

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        return ab.GenerationResult(request.request_id, (ab.Completion("m"),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        return ab.LoglikelihoodResult(request.request_id, -1.0)

    async def aclose(self) -> None:
        return None


class Rolling(Minimal):
    fingerprint: Mapping[str, str] | None = MappingProxyType({"model": "m1"})

    async def loglikelihood_rolling(self, request: ab.RollingLoglikelihoodRequest) -> ab.LoglikelihoodResult:
        return ab.LoglikelihoodResult(request.request_id, -2.0)


def test_optional_capabilities_are_protocols() -> None:
    assert isinstance(Minimal(), ab.AsyncBackend)
    assert not isinstance(Minimal(), SupportsRollingLoglikelihood)
    assert not isinstance(Minimal(), SupportsFingerprint)
    assert isinstance(Rolling(), SupportsRollingLoglikelihood) and isinstance(Rolling(), SupportsFingerprint)


def test_one_table_from_request_type_to_method() -> None:
    backend = Rolling()
    assert {
        ab.GenerationRequest: "generate",
        ab.LoglikelihoodRequest: "loglikelihood",
        ab.RollingLoglikelihoodRequest: "loglikelihood_rolling",
    } == REQUEST_METHODS
    for request_type, name in REQUEST_METHODS.items():
        assert backend_method(backend, request_type) == getattr(backend, name)
    assert backend_method(Minimal(), ab.RollingLoglikelihoodRequest) is None
    assert backend_method(backend, str) is None  # type: ignore[arg-type]


def test_gather_dispatches_rolling_only_to_backends_that_have_it() -> None:
    text = [ab.RollingLoglikelihoodRequest("some text")]
    assert ab.run_batch(Rolling(), text)[0] == ab.LoglikelihoodResult(None, -2.0)
    (outcome,) = ab.run_batch(Minimal(), text, return_exceptions=True)
    assert isinstance(outcome, ab.InvalidRequestError) and "loglikelihood_rolling()" in str(outcome)


def test_cache_keys_use_the_fingerprint_protocol(tmp_path: Path) -> None:
    with contextlib.closing(ab.ResponseCache(tmp_path / "c.sqlite")) as cache:
        request = ab.GenerationRequest("x")
        assert cache.key(Rolling(), request) != cache.key(Minimal(), request)
        unknown = Rolling()
        unknown.fingerprint = None
        assert cache.key(unknown, request) == cache.key(Minimal(), request)  # name alone


def test_split_trailing_space_is_one_function() -> None:
    from asyncbackends.adapters import _scoring

    assert split_trailing_space("Answer: ", "Paris") == ("Answer:", " Paris")
    assert split_trailing_space("Answer:\n\n", "B") == ("Answer:", "\n\nB")
    assert split_trailing_space("Answer:", " Paris") == ("Answer:", " Paris")
    assert _scoring.split_trailing_space is split_trailing_space
    package = Path(ab.__file__).parent
    defined = [p for p in package.rglob("*.py") if re.search(r"def _?split_trailing_space\(", p.read_text())]
    assert defined == [package / "_text.py"]
