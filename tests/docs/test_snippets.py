"""Every ```python block of README.md and the docs pages runs, so the docs cannot drift from the code.

Each block runs alone, as a reader who pastes just that block would run it: in a fresh namespace and a
fresh temporary directory of its own (a block must not need an earlier block's names or files), as
``__main__`` (so ``if __name__ == "__main__":`` guards run). A block that cannot
run here says so where readers see it, on the line before the block::

    <!-- not-run: the reason -->

Engines are shared: the first ``create_backend("vllm", ...)`` builds a real engine on the tiny model with
that snippet's own options; later ones have their option names and model path checked as the adapter
checks them, then get the same engine, whose ``close`` is left to this module.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), marker.group(1) if marker else None))
    return found


def test_every_page_with_python_is_collected() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES if blocks(page)}
    assert {"README.md", "docs/index.md", "docs/quickstart.md", "docs/adapters/vllm.md"} <= names
    markers = [block for page in PAGES for block in blocks(page) if block.not_run]
    assert all(block.not_run for block in markers)  # a marker without a reason does not count
    runnable = [block for page in PAGES for block in blocks(page) if not block.not_run]
    assert len(markers) < len(runnable)  # skipping stays the exception


class _Shared:
    """A shared backend whose close does nothing: the test session closes the real one."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Shared:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    async def __aenter__(self) -> _Shared:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Any]]:
    built: dict[str, Any] = {}
    yield built
    for backend in built.values():
        backend.close()


@pytest.fixture
def shared_vllm(engines: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncbackends.adapters.vllm import _checks as _vllm_checks

    real_create, real_acreate = ab.create_backend, ab.acreate_backend

    def create(name: str, /, **options: Any) -> Any:
        if name != "vllm":
            return real_create(name, **options)
        if "vllm" not in engines:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            with warnings.catch_warnings():  # vLLM's own import-time warnings are not the docs' concern
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                engines["vllm"] = real_create("vllm", **options)
        else:
            options = dict(options)
            _vllm_checks.check_before_import("vllm", options.pop("model", None), options)
        return _Shared(engines["vllm"])

    async def acreate(name: str, /, **options: Any) -> Any:
        if name == "vllm":
            return create(name, **options)
        return await real_acreate(name, **options)

    monkeypatch.setattr(ab, "create_backend", create)
    monkeypatch.setattr(ab, "acreate_backend", acreate)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    "page", [page for page in PAGES if blocks(page)], ids=lambda page: page.relative_to(ROOT).as_posix()
)
def test_page_snippets_run(
    page: Path, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runnable = [block for block in blocks(page) if not block.not_run]
    if not runnable:
        pytest.skip("no runnable python block")
    if any("vllm" in block.code for block in runnable):
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("the page's snippets need vllm")
        request.getfixturevalue("shared_vllm")
    for block in runnable:
        where = f"{page.relative_to(ROOT)}:{block.line}"
        folder = tmp_path / f"line{block.line}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        namespace: dict[str, Any] = {"__name__": "__main__"}  # fresh: pasted alone, the block must run
        try:
            exec(compile(block.code, where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(
                f"the ```python block at {where} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            del namespace
    # Collected here, a session or engine a page's snippets leave open fails that page, not a later test.
    gc.collect()
