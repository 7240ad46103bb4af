"""LoRA adapters through the inspect_ai provider: ``asyncbackends/<backend>/<base>:<adapter>`` model names.

On the mock (its ``adapters`` option; echo prefixed ``[name] ``) and on a mock taking ``lora_modules`` as
the ``vllm`` backend does (tests/lora_testing.py); inspect's own ``eval`` drives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai._util.config import parse_cli_args
from inspect_ai.dataset import Sample
from inspect_ai.model import Model, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate

import asyncbackends as ab
from asyncbackends.integrations.inspect_ai import split_adapter

from ..lora_testing import NAME as LORA_MOCK

pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")


@pytest.fixture
def make_model() -> Iterator[Any]:
    made: list[Model] = []

    def make(name: str, **kwargs: Any) -> Model:
        model = get_model(name, memoize=False, **kwargs)
        made.append(model)
        return model

    yield make
    for model in made:
        asyncio.run(model.__aexit__(None, None, None))


def _answers(tmp_path: Path, model: Model, inputs: list[str]) -> list[str]:
    task = Task(dataset=[Sample(input=t, target=t) for t in inputs], solver=[generate()], scorer=includes())
    (log,) = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    assert log.samples is not None
    return [sample.output.completion for sample in log.samples]


def test_the_part_after_the_colon_is_the_adapter_every_sample_names(tmp_path: Path, make_model: Any) -> None:
    model = make_model(f"asyncbackends/{LORA_MOCK}/base:math", lora_modules="math=/ckpt/math")
    assert model.api.adapter == "math"
    assert _answers(tmp_path, model, ["hello there"]) == ["[math] user: hello there"]


def test_a_backend_that_loads_no_adapters_keeps_colons_in_its_model_name(make_model: Any) -> None:
    # Server model names hold ':' (OpenAI's fine-tunes, Ollama's tags): never read as an adapter there.
    for name in ("openai/ft:gpt-4o-mini:org::abc123", "mock/llama3:8b"):
        assert split_adapter(name, {}) == (name, {}, None)
    assert split_adapter("mock/m:x", {"adapter": "math"}) == ("mock/m:x", {}, "math")
    model = make_model("asyncbackends/mock/llama3:8b", adapters="math")
    assert model.api.backend.model == "llama3:8b" and model.api.adapter is None
    with pytest.raises(ab.InvalidRequestError, match="loads no adapter directories"):
        split_adapter("mock/m", {"lora_modules": "math=/ckpt/math", "adapter": "math"})


def test_adapters_of_one_lora_modules_share_one_engine(tmp_path: Path, make_model: Any) -> None:
    # As inspect's -M reads it: a YAML scalar, commas splitting it into a list.
    modules = parse_cli_args(["lora_modules=math=/ckpt/math,code=/ckpt/code"])["lora_modules"]
    assert modules == ["math=/ckpt/math", "code=/ckpt/code"]
    math = make_model(f"asyncbackends/{LORA_MOCK}/base:math", lora_modules=modules)
    code = make_model(f"asyncbackends/{LORA_MOCK}/base:code", lora_modules="math=/ckpt/math|code=/ckpt/code")
    base = make_model(
        f"asyncbackends/{LORA_MOCK}/base", lora_modules={"math": "/ckpt/math", "code": "/ckpt/code"}
    )
    engine = math.api.backend.backend
    assert code.api.backend.backend is engine and base.api.backend is engine
    assert engine.lora_modules == {"math": "/ckpt/math", "code": "/ckpt/code"}
    answers = [_answers(tmp_path, model, ["hi"])[0] for model in (math, code, base)]
    assert answers == ["[math] user: hi", "[code] user: hi", "user: hi"]


def test_an_adapter_directory_in_the_name_is_served_named_by_the_directory(
    tmp_path: Path, make_model: Any
) -> None:
    adapter = tmp_path / "math-v3"
    adapter.mkdir()
    model = make_model(f"asyncbackends/{LORA_MOCK}/base:{adapter}")
    assert model.api.backend.backend.lora_modules == {"math-v3": str(adapter)}
    assert _answers(tmp_path, model, ["hi"]) == ["[math-v3] user: hi"]


def test_adapter_model_arg_names_it_without_the_colon_form(tmp_path: Path, make_model: Any) -> None:
    model = make_model("asyncbackends/mock/mock-echo", adapters="math,code", adapter="code")
    assert _answers(tmp_path, model, ["hi"]) == ["[code] user: hi"]


def test_a_model_path_holding_colons_is_the_model_where_it_exists(tmp_path: Path) -> None:
    folder = tmp_path / "run:3" / "llama"
    folder.mkdir(parents=True)
    assert split_adapter(f"vllm/{folder}", {}) == (f"vllm/{folder}", {}, None)
    name, options, adapter = split_adapter(f"vllm/{folder}:math", {"lora_modules": "math=/ckpt/math"})
    assert (name, options, adapter) == (f"vllm/{folder}", {"lora_modules": {"math": "/ckpt/math"}}, "math")


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("vllm/models/run:3/llama:math", {}, "more than one ':'"),
        ("vllm/base:", {}, "with both parts"),
        ("vllm/:math", {}, "with both parts"),
        ("vllm/base:math", {"adapter": "code"}, "names adapter 'math' and -M adapter names 'code'"),
        ("vllm/base:org/my-lora", {}, "given no lora_modules, and not a local directory"),
        ("vllm/base:nope", {"lora_modules": "math=/ckpt/math"}, r"'nope': not among lora_modules \['math'\]"),
        ("vllm/base:/ckpt/x/math", {"lora_modules": "math=/ckpt/math"}, "not a local directory"),
        ("vllm/base:math", {"lora_modules": "math=/a|math=/b"}, "'math' is given twice"),
    ],
)
def test_ambiguous_or_unknown_adapters_are_refused_naming_the_way_out(
    name: str, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        split_adapter(name, args)


def test_one_name_for_two_directories_is_refused(tmp_path: Path) -> None:
    adapter = tmp_path / "math"
    adapter.mkdir()
    with pytest.raises(ab.InvalidRequestError, match="one name, two directories"):
        split_adapter(f"vllm/base:{adapter}", {"lora_modules": "math=/elsewhere/math"})


def test_an_adapter_for_a_backend_serving_none_fails_the_model_and_frees_the_backend(make_model: Any) -> None:
    from asyncbackends.integrations import inspect_ai as provider

    before = dict(provider._shared)  # what earlier evaluations in this process still hold (inspect's cache)
    with pytest.raises(ab.InvalidRequestError, match="serves no LoRA adapters"):
        make_model("asyncbackends/mock/mock-echo", adapter="math")
    assert provider._shared == before  # the backend built for it was released, not leaked
