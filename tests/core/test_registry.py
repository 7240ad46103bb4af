from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends import _registry as registry

ADAPTER = """
import asyncbackends as ab

class Upper(ab.BaseBackend):
    name = "upper"

    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix
        self.capabilities = ab.Capabilities()

    async def generate(self, request):
        return ab.GenerationResult(request.request_id, (ab.Completion(request.prompt.upper() + self.suffix),))
"""


@pytest.fixture
def installed_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution on sys.path exposing an adapter through the entry-point group."""
    (tmp_path / "upper_adapter.py").write_text(ADAPTER)
    info = tmp_path / "upper_adapter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: upper-adapter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[asyncbackends.adapters]\nupper = upper_adapter:Upper\nmock = upper_adapter:Upper\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_point_adapter_is_discovered_without_import(installed_distribution: Path) -> None:
    assert "upper_adapter" not in sys.modules
    backends = ab.available_backends()
    assert backends["upper"] == "upper_adapter:Upper"
    assert "upper_adapter" not in sys.modules  # listed, not imported
    backend = ab.create_backend("upper", suffix="!")
    assert ab.run_batch(backend, [ab.GenerationRequest("hi")])[0].text == "HI!"
    sys.modules.pop("upper_adapter", None)


def test_entry_point_never_shadows_a_builtin(
    installed_distribution: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert ab.available_backends()["mock"] == "asyncbackends.adapters.mock:MockBackend"
    assert "entry point 'mock' (upper_adapter:Upper) ignored: the name is already taken" in caplog.messages


def test_register_backend_clashes_are_explicit() -> None:
    with pytest.raises(ab.InvalidRequestError, match="already registered"):
        ab.register_backend("mock", "somewhere:Else")
    with pytest.raises(ab.InvalidRequestError, match="module:Class"):
        ab.register_backend("nocolon", "no_colon_here")
    ab.register_backend("mock-alias", "asyncbackends.adapters.mock:MockBackend", replace=True)
    assert ab.create_backend("mock-alias").name == "mock"


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(ab.BackendNotFoundError, match="did you mean 'mock'"):
        ab.create_backend("mokc")


def test_unknown_option_lists_close_matches() -> None:
    with pytest.raises(ab.InvalidRequestError, match="'latncy' \\(did you mean 'latency'\\?\\)"):
        ab.create_backend("mock", latncy=1)


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        registry._BUILTINS,
        "ghost",
        registry._Builtin("ghost_engine_xyz.adapter:Ghost", "ghost", ("ghost_engine_xyz",)),
    )
    with pytest.raises(ab.BackendNotFoundError, match=r"pip install 'asyncbackends\[ghost\]'"):
        ab.create_backend("ghost")
    assert registry.extra_installed("ghost") is False
    assert registry.extra_installed("mock") is True


def test_module_class_target_works_directly() -> None:
    backend = ab.create_backend("asyncbackends.adapters.mock:MockBackend", model="direct")
    assert backend.fingerprint == {"name": "mock", "model": "direct"}  # type: ignore[attr-defined]


def test_object_without_the_protocol_is_refused() -> None:
    ab.register_backend("not-a-backend", "collections:OrderedDict", replace=True)
    with pytest.raises(TypeError, match="without"):
        ab.create_backend("not-a-backend")


def test_async_factory_is_awaited_on_the_shared_loop() -> None:
    async def main() -> ab.AsyncBackend:
        return await ab.acreate_backend("mock")

    backend = asyncio.run(main())
    assert ab.run_batch(backend, [ab.GenerationRequest("x")])[0].text == "x"


def test_importing_the_package_imports_no_engine() -> None:
    script = textwrap.dedent(
        """
        import sys
        import asyncbackends as ab
        ab.create_backend("mock")
        heavy = [m for m in ("vllm", "torch", "transformers", "aiohttp", "huggingface_hub", "tqdm")
                 if m in sys.modules]
        print(heavy)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_each_adapter_extra_installs_what_the_registry_requires() -> None:
    import re
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[;!~ ]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}

    for name, builtin in registry._BUILTINS.items():
        if builtin.extra is None:
            continue
        assert set(builtin.requires) <= names(extras[builtin.extra]), name
    core = names(project["dependencies"])
    assert "anyio" not in core and "aiohttp" not in core and "huggingface_hub" not in core
    assert {"pytest", "jsonschema", "aiohttp"} <= names(extras["testing"])


def test_a_new_name_registers_without_replace_and_then_clashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registered", {})
    ab.register_backend("echo-fresh", "asyncbackends.adapters.mock:MockBackend")
    assert ab.available_backends()["echo-fresh"] == "asyncbackends.adapters.mock:MockBackend"
    with pytest.raises(ab.InvalidRequestError) as info:
        ab.register_backend("echo-fresh", "elsewhere:Other")
    assert str(info.value) == (
        "a backend named 'echo-fresh' is already registered (asyncbackends.adapters.mock:MockBackend); "
        "pass replace=True to replace it"
    )
    for target in ("no_colon_here", ":Class", "module:"):
        with pytest.raises(
            ab.InvalidRequestError, match=r"^target must look like 'package\.module:Class', got"
        ):
            ab.register_backend("other", target)
    assert "other" not in ab.available_backends()


class AsyncBuilt(ab.BaseBackend):
    """Built by an async ``create`` classmethod, which says where it ran."""

    name = "async-built"

    def __init__(self, via: str) -> None:
        self.via = via

    @classmethod
    async def create(cls, suffix: str = "") -> AsyncBuilt:
        return cls(f"create on {threading.current_thread().name}{suffix}")


def test_an_async_create_is_awaited_on_the_shared_loop_with_checked_options() -> None:
    backend = ab.create_backend(f"{__name__}:AsyncBuilt", suffix="!")
    assert isinstance(backend, AsyncBuilt) and backend.via == "create on asyncbackends-loop!"
    with pytest.raises(ab.InvalidRequestError, match="'sufix' \\(did you mean 'suffix'\\?\\)"):
        ab.create_backend(f"{__name__}:AsyncBuilt", sufix="!")


def test_not_found_messages_name_what_is_missing() -> None:
    with pytest.raises(ab.BackendNotFoundError) as info:
        ab.create_backend("zzzz-no-such-backend")
    assert str(info.value).endswith(f"(available: {', '.join(ab.available_backends())})")
    with pytest.raises(ab.BackendNotFoundError) as info:
        ab.create_backend("asyncbackends.adapters.mock:Nope")
    assert str(info.value) == (
        "backend 'asyncbackends.adapters.mock:Nope': 'asyncbackends.adapters.mock' has no attribute 'Nope'"
    )
