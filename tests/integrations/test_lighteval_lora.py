"""LoRA adapters through lighteval's model config: ``adapter`` and ``lora_modules``.

On the mock (its ``adapters`` option; echo prefixed ``[name] ``, scores salted) and on a mock taking
``lora_modules`` as the ``vllm`` backend does (tests/lora_testing.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")

from lighteval.tasks.requests import Doc
from lighteval.utils.cache_management import SampleCache

import asyncbackends as ab
from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from ..lora_testing import NAME as LORA_MOCK


def _config(tmp_path: Path, **fields: Any) -> AsyncBackendsModelConfig:
    fields.setdefault("progress", False)
    fields.setdefault("use_chat_template", False)
    return AsyncBackendsModelConfig(model_name="mock-echo", cache_dir=str(tmp_path / "cache"), **fields)


def _doc(query: str, **fields: Any) -> Doc:
    fields.setdefault("choices", ["x"])
    return Doc(query=query, gold_index=0, task_name="t|0", id="0", **fields)


def test_lora_modules_in_the_config_reach_the_backend_and_adapter_names_every_request(tmp_path: Path) -> None:
    config = _config(
        tmp_path, backend=LORA_MOCK, lora_modules="math=/ckpt/math|code=/ckpt/code", adapter="code"
    )
    model = AsyncBackendsModel(config)
    try:
        assert model.backend.backend.lora_modules == {"math": "/ckpt/math", "code": "/ckpt/code"}  # type: ignore[attr-defined]
        (generated,) = model.greedy_until([_doc("hello", generation_size=40)])
        assert generated.text == ["[code] hello"]
        (scored,) = model.loglikelihood([_doc("Answer:", choices=[" Paris"])])
        mock = ab.create_backend("mock", adapters=("code",))
        want = ab.run_batch(mock, [ab.LoglikelihoodRequest("Answer:", " Paris", adapter="code")])[0]
        base = ab.run_batch(mock, [ab.LoglikelihoodRequest("Answer:", " Paris")])[0]
        assert scored.logprobs == pytest.approx([want.logprob])  # type: ignore[union-attr]
        assert want.logprob != base.logprob  # type: ignore[union-attr]
    finally:
        model.cleanup()


def test_adapter_over_a_built_backend_and_lora_modules_given_in_backend_options(tmp_path: Path) -> None:
    engine = ab.create_backend("mock", adapters=("math", "code"))
    texts = []
    for adapter in ("math", "code", None):
        model = AsyncBackendsModel(_config(tmp_path, adapter=adapter), backend=engine)
        texts.append(model.greedy_until([_doc("hi", generation_size=20)])[0].text[0])
        model.cleanup()
    assert texts == ["[math] hi", "[code] hi", "hi"]
    assert not engine.closed  # type: ignore[attr-defined]  # the caller's backend, left open
    same = {"math": "/ckpt/math"}
    model = AsyncBackendsModel(
        _config(
            tmp_path,
            backend=LORA_MOCK,
            backend_options={"lora_modules": same},
            lora_modules=same,
            adapter="math",
        )
    )
    assert model.greedy_until([_doc("hi", generation_size=20)])[0].text == ["[math] hi"]
    model.cleanup()


def test_each_adapter_has_its_own_sample_cache(tmp_path: Path) -> None:
    hashes = {
        SampleCache(_config(tmp_path, backend="mock", adapter=adapter)).model_hash
        for adapter in ("a", "b", None)
    }
    assert len(hashes) == 3


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"adapter": " math"}, "adapter must be a non-empty name"),
        ({"lora_modules": "math=|code=/x"}, "'math' has no path"),
        (
            {
                "backend": LORA_MOCK,
                "lora_modules": "math=/a",
                "backend_options": {"lora_modules": {"math": "/b"}},
            },
            "given in the config and in backend_options, different",
        ),
    ],
)
def test_bad_adapter_fields_are_refused(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises((ab.InvalidRequestError, ValueError), match=message):
        AsyncBackendsModel(_config(tmp_path, **fields))


def test_an_adapter_for_a_backend_serving_none_is_refused_and_the_backend_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Any] = []
    original = ab.create_backend

    def spy(name: str, **options: Any) -> Any:
        built.append(original(name, **options))
        return built[-1]

    monkeypatch.setattr("asyncbackends.integrations.lighteval.create_backend", spy)
    with pytest.raises(ab.InvalidRequestError, match="serves no LoRA adapters"):
        AsyncBackendsModel(_config(tmp_path, adapter="math"))
    assert built and built[0].closed
