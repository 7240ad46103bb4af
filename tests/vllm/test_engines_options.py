"""``engines`` reaches the vllm adapter from every front end: lm-eval, lighteval and the CLI.

The adapter's ``create`` is replaced by a recorder that hands back a mock backend, so no engine starts: what
is checked is the value (its type too: ``4`` an int, ``auto`` a string) each front end passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncbackends.adapters.mock import MockBackend
from asyncbackends.adapters.vllm import VLLMBackend

EXAMPLE = Path(__file__).parents[2] / "examples" / "demo.jsonl"


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def create(
        cls: Any, model: str, *, engines: int | str = 1, routing: str | None = None, **engine_args: Any
    ) -> MockBackend:
        calls.append({"model": model, "engines": engines, "routing": routing, **engine_args})
        return MockBackend(model=model)

    monkeypatch.setattr(VLLMBackend, "create", classmethod(create))
    return calls


@pytest.mark.parametrize(("given", "expected"), [("4", 4), ("auto", "auto")])
def test_lm_eval_model_args_pass_engines(received: list[dict[str, Any]], given: str, expected: Any) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model

    import asyncbackends.integrations.lm_eval  # noqa: F401  # registers the model

    lm = get_model("asyncbackends").create_from_arg_string(
        f"backend=vllm,model=/m,engines={given},routing=affinity", {"batch_size": 1}
    )
    try:
        assert received == [{"model": "/m", "engines": expected, "routing": "affinity"}]
    finally:
        lm.close()


def test_lighteval_backend_options_pass_engines(received: list[dict[str, Any]], tmp_path: Path) -> None:
    pytest.importorskip("lighteval")
    from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

    config = AsyncBackendsModelConfig(
        model_name="m",
        backend="vllm",
        backend_options={"model": "/m", "engines": 2},
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )
    model = AsyncBackendsModel(config)
    try:
        assert received == [{"model": "/m", "engines": 2, "routing": None}]
    finally:
        model.cleanup()


@pytest.mark.parametrize(("given", "expected"), [("3", 3), ("auto", "auto")])
def test_cli_options_pass_engines(
    received: list[dict[str, Any]], tmp_path: Path, given: str, expected: Any
) -> None:
    from asyncbackends._cli.main import main

    output = tmp_path / "out.jsonl"
    args = ["run", str(EXAMPLE), "--backend", "vllm", "--option", "model=/m", "--option", f"engines={given}"]
    assert main([*args, "--output", str(output), "--no-progress"]) == 0
    assert received == [{"model": "/m", "engines": expected, "routing": None}]
    # Exit status 0: every request answered, by the backend built from those options.
    assert len(output.read_text().splitlines()) == len(EXAMPLE.read_text().splitlines())
