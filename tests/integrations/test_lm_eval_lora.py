"""LoRA adapters through lm-eval's `LM`: ``lora_local_path`` (as lm-eval's ``vllm`` model), ``lora_modules``
and ``adapter``, on a mock that takes ``lora_modules`` as the ``vllm`` backend does (`tests.lora_testing`).

The real engine against lm-eval's own ``vllm`` model with ``lora_local_path`` is in test_lm_eval_lora_vllm.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

import asyncbackends as ab
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

from ..lora_testing import NAME, LoraMock

LM_EVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lm_eval_tasks"
_EXTRAS = {"batch_size": 1, "max_batch_size": 64, "device": "cuda"}


def _lm(args: str) -> Any:
    return get_model("asyncbackends").create_from_arg_string(f"backend={NAME},progress=False,{args}", _EXTRAS)


def _gen(lm: Any, prompt: str = "hello") -> str:
    (text,) = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": []}), 0)])
    return str(text)


def _score(lm: Any) -> float:
    ((logprob, _),) = lm.loglikelihood([Instance("loglikelihood", {}, ("2+2=", "4"), 0)])
    return float(logprob)


def _direct_score(adapter: str | None) -> float:
    mock = ab.create_backend("mock", adapters=("x", "math", "code", "tiny-lora"))
    (result,) = ab.run_batch(mock, [ab.LoglikelihoodRequest("2+2=", "4", adapter=adapter)])
    return float(result.logprob)  # type: ignore[union-attr]


def test_lora_local_path_serves_the_directory_named_by_its_name_and_every_request_names_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tiny-lora"
    lm = _lm(f"lora_local_path={path}")
    try:
        inner = lm.backend.backend
        assert isinstance(inner, LoraMock) and inner.lora_modules == {"tiny-lora": str(path)}
        assert lm.adapter == "tiny-lora"
        assert _gen(lm) == "[tiny-lora] hello"
        assert _score(lm) == _direct_score("tiny-lora") != _direct_score(None)
        (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("some text",), 0)])
        mock = ab.create_backend("mock", adapters=("tiny-lora",))
        want = ab.run_batch(mock, [ab.RollingLoglikelihoodRequest("some text", adapter="tiny-lora")])[0]
        assert rolling == want.logprob  # type: ignore[union-attr]
        assert lm.tokenizer_name == "asyncbackends/mock/mock-echo"  # the wrapper hides no fingerprint
    finally:
        lm.close()


_BOTH = {"math": "/ckpt/math", "code": "/ckpt/code"}


@pytest.mark.parametrize(
    ("spelling", "modules"),
    [
        ("lora_modules=math=/ckpt/math|code=/ckpt/code", _BOTH),
        ("lora_modules=/ckpt/math|code=/ckpt/code", _BOTH),  # a bare path is named by its directory
        # JSON, for paths holding | or =; one entry only here: lm-eval's string splits on every comma.
        ('lora_modules={"code": "/ckpt/c=1"}', {"code": "/ckpt/c=1"}),
    ],
)
def test_lora_modules_survive_the_model_args_string_and_adapter_picks_one(
    spelling: str, modules: dict[str, str]
) -> None:
    lm = _lm(f"{spelling},adapter=code")
    try:
        assert lm.backend.backend.lora_modules == modules
        assert _gen(lm) == "[code] hello"
    finally:
        lm.close()


def test_lora_modules_through_lm_eval_command_line_parser() -> None:
    from lm_eval._cli.utils import key_val_to_dict

    args = key_val_to_dict(f"backend={NAME},lora_modules=math=/ckpt/math|code=/ckpt/code,adapter=math")
    assert args["lora_modules"] == "math=/ckpt/math|code=/ckpt/code"
    json_args = key_val_to_dict(
        f'backend={NAME},lora_modules={{"math": "/ckpt/math", "code": "/ckpt/code"}},adapter=math'
    )
    for parsed in (args, json_args):
        lm = AsyncBackendsLM(**parsed, progress=False)
        try:
            assert lm.backend.backend.lora_modules == {"math": "/ckpt/math", "code": "/ckpt/code"}  # type: ignore[attr-defined]
            assert _gen(lm) == "[math] hello"
        finally:
            lm.close()


def test_adapter_over_a_backend_object_and_a_sweep_on_one_backend() -> None:
    engine = ab.create_backend("mock", adapters=("math", "code"))
    texts = {}
    for name in ("math", "code"):
        lm = AsyncBackendsLM(engine, adapter=name, progress=False)
        texts[name] = _gen(lm)
    assert texts == {"math": "[math] hello", "code": "[code] hello"}
    assert _gen(AsyncBackendsLM(engine, progress=False)) == "hello"  # no adapter: the base


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("lora_modules=math=/ckpt/math", r"name the one this model evaluates with adapter=NAME"),
        ("lora_local_path=/ckpt/math,adapter=code", r"'math' \(its directory's name\).*'code'"),
        ("lora_modules=math=/a|math=/b,adapter=math", "'math' is given twice"),
        ("lora_modules=math=/a,lora_local_path=/b/math", "one name, two directories"),
        ("lora_modules=math=,adapter=math", "'math' has no path"),
    ],
)
def test_ambiguous_or_incomplete_adapters_are_refused_before_the_backend_is_built(
    args: str, message: str
) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        _lm(args)


def test_the_same_directory_in_lora_modules_and_lora_local_path_is_one_adapter() -> None:
    lm = _lm("lora_modules=math=/ckpt/math|code=/ckpt/code,lora_local_path=/ckpt/math/")
    try:
        assert lm.adapter == "math" and _gen(lm) == "[math] hello"
    finally:
        lm.close()


def test_an_adapter_on_a_backend_serving_none_is_refused_at_construction() -> None:
    with pytest.raises(ab.InvalidRequestError, match="serves no LoRA adapters"):
        AsyncBackendsLM("mock", adapter="math", progress=False)


def test_simple_evaluate_evaluates_the_adapter_named_in_model_args() -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="asyncbackends",
        model_args=f"backend={NAME},lora_modules=math=/ckpt/math|code=/ckpt/code,adapter=code,progress=False",
        tasks=["ab_gen", "ab_mc"],
        task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
        log_samples=True,
    )
    assert results is not None
    for sample in results["samples"]["ab_gen"]:
        assert sample["resps"][0][0].startswith("[code] Q:")
    first = results["samples"]["ab_mc"][0]
    context = f"Question: {first['doc']['question']}\nAnswer:"
    mock = ab.create_backend("mock", adapters=("code",))
    want = ab.run_batch(
        mock,
        [ab.LoglikelihoodRequest(context, " " + c, adapter="code") for c in first["doc"]["choices"]],
    )
    assert [r[0] for r in first["filtered_resps"]] == [w.logprob for w in want]  # type: ignore[union-attr]
