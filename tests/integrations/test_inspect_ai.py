"""The inspect_ai provider on the deterministic mock: inspect's own `eval` drives it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import GenerateConfig, Model, ResponseSchema, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate
from inspect_ai.util import JSONSchema

import asyncbackends as ab
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.integrations import _inspect_convert as convert
from asyncbackends.integrations import inspect_ai as provider

ROOT = Path(__file__).resolve().parents[2]

# inspect's eval leaves anyio memory streams unclosed (seen with its own mockllm too); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")


def _close(model: Model) -> None:
    asyncio.run(model.__aexit__(None, None, None))


@pytest.fixture
def make_model() -> Iterator[Any]:
    made: list[Model] = []

    def make(name: str = "asyncbackends/mock", **kwargs: Any) -> Model:
        model = get_model(name, memoize=False, **kwargs)
        made.append(model)
        return model

    yield make
    for model in made:
        _close(model)


def _run(tmp_path: Path, model: Model, inputs: list[str], **config: Any) -> EvalLog:
    task = Task(
        dataset=[Sample(input=text, target=text) for text in inputs], solver=[generate()], scorer=includes()
    )
    logs = eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none", **config)
    assert len(logs) == 1
    return logs[0]


def _direct(backend: MockBackend, text: str, **params: Any) -> ab.GenerationResult:
    # The independent reference: the backend called directly with this library's own request type.
    request = ab.GenerationRequest([{"role": "user", "content": text}], params=ab.SamplingParams(**params))
    return ab.run_batch(backend, [request])[0]


def test_eval_on_the_mock_echoes_each_sample_with_usage(tmp_path: Path, make_model: Any) -> None:
    model = make_model()
    log = _run(tmp_path, model, ["hello there", "second sample"])
    assert log.status == "success", log.error
    assert log.samples is not None
    for sample in log.samples:
        expected = f"user: {sample.input}"  # the mock echoes its chat rendering
        assert sample.output.completion == expected
        assert sample.output.choices[0].stop_reason == "stop"
        usage = sample.output.usage
        assert usage is not None
        assert (usage.input_tokens, usage.output_tokens) == (len(expected), len(expected))
        assert usage.total_tokens == 2 * len(expected)


def test_model_args_arrive_as_text_and_are_parsed_as_the_cli_parses_options(make_model: Any) -> None:
    model = make_model("asyncbackends/mock/echo-7", max_concurrency="7", latency="0")
    api = model.api
    assert isinstance(api.backend, MockBackend)
    assert api.backend.capabilities.max_concurrency == 7
    assert api.max_connections() == 7
    assert api.backend.model == "echo-7"
    assert api.connection_key().startswith("mock:echo-7:")


def _eval_one_sample(tmp_path: Path, model: str, model_args: dict[str, Any]) -> None:
    task = Task(dataset=[Sample(input="hi", target="hi")], solver=[generate()])
    eval(task, model=model, model_args=model_args, log_dir=str(tmp_path / "logs"), display="none")


def test_a_model_model_arg_stops_inside_inspects_eval(tmp_path: Path) -> None:
    # inspect resolves a model as get_model(model=m, ..., **model_args) (inspect_ai/model/_model.py,
    # resolve_models): a `model` key cannot reach any provider. Should inspect lift this, the test fails
    # and docs/integrations/inspect.md's model-args section changes.
    with pytest.raises(TypeError, match="get_model\\(\\) got multiple values for keyword argument 'model'"):
        _eval_one_sample(tmp_path, "asyncbackends/mock", {"model": "m"})
    assert not (tmp_path / "logs").exists()  # stopped before any task ran


def test_a_backend_needing_a_model_without_one_names_the_model_name_form(tmp_path: Path) -> None:
    # Where the provider is reached (no `model` in the name), the refusal says where the model goes.
    before = dict(provider._shared)  # what earlier evaluations in this process still hold (inspect's cache)
    with pytest.raises(ab.InvalidRequestError) as info:
        _eval_one_sample(tmp_path, "asyncbackends/vllm", {"enforce_eager": "true"})
    message = str(info.value)
    assert "asyncbackends/vllm/<model>" in message
    assert "-M model=" in message
    assert provider._shared == before  # nothing built


def test_the_cli_takes_the_model_in_the_name_and_stops_on_a_model_model_arg(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(
        "from inspect_ai import Task, task\n"
        "from inspect_ai.dataset import Sample\n"
        "from inspect_ai.solver import generate\n\n"
        "@task\n"
        "def hi() -> Task:\n"
        "    return Task(dataset=[Sample(input='Say hi')], solver=[generate()])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def inspect_eval(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "inspect_ai", "eval", "task.py", "--display", "none", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=55)

    done = inspect_eval(
        "--model", "asyncbackends/mock/echo-1", "-M", "latency=0", "--log-dir", "ok", "--log-format", "json"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (log_file,) = (tmp_path / "ok").glob("*.json")
    log = read_eval_log(str(log_file))
    assert log.status == "success"
    assert log.samples is not None and log.samples[0].output.completion == "user: Say hi"
    assert log.eval.model == "asyncbackends/mock/echo-1"

    stopped = inspect_eval("--model", "asyncbackends/mock", "-M", "model=echo-1", "--log-dir", "stopped")
    assert stopped.returncode != 0
    assert "got multiple values for keyword argument 'model'" in stopped.stderr
    assert not (tmp_path / "stopped").exists()


def test_the_rest_of_the_name_is_the_model_option(make_model: Any) -> None:
    api = make_model("asyncbackends/mock/org/some-model").api
    assert api.backend.model == "org/some-model"
    with pytest.raises(ab.InvalidRequestError, match="model given twice"):
        provider.backend_options("mock/a", {"model": "b"})
    with pytest.raises(ab.BackendNotFoundError, match="no backend named"):
        provider.backend_options("mokc", {}, base_url="http://x")


def test_base_url_and_api_key_become_the_backends_url_and_key_options() -> None:
    name, options = provider.backend_options("openai", {"model": "m"}, "http://h:1/v1", "sk-1")
    assert (name, options) == ("openai", {"model": "m", "base_url": "http://h:1/v1", "api_key": "sk-1"})
    _, options = provider.backend_options("tgi", {}, "http://h:2", "hf-token")
    assert options == {"url": "http://h:2", "token": "hf-token"}
    with pytest.raises(ab.InvalidRequestError, match="takes no URL option"):
        provider.backend_options("mock", {}, "http://h:3")


def test_two_models_on_one_backend_share_it_and_the_last_close_closes_it() -> None:
    first = get_model("asyncbackends/mock/shared-1", memoize=False)
    second = get_model("asyncbackends/mock/shared-1", memoize=False, config=GenerateConfig(seed=3))
    other = get_model("asyncbackends/mock/shared-2", memoize=False)
    try:
        assert first.api.backend is second.api.backend
        assert other.api.backend is not first.api.backend
        assert first.api.connection_key() == second.api.connection_key() != other.api.connection_key()
        backend = first.api.backend
        _close(first)
        assert not backend.closed
        _close(second)
        assert backend.closed
    finally:
        _close(other)


def test_generate_config_reaches_the_backend_exactly(tmp_path: Path, make_model: Any) -> None:
    model = make_model()
    backend = model.api.backend
    text = "abcdefghijkl"
    config = {"temperature": 0.8, "seed": 11, "num_choices": 3, "max_tokens": 9, "stop_seqs": ["zz"]}
    log = _run(tmp_path, model, [text], **config)
    assert log.status == "success", log.error
    assert log.samples is not None
    output = log.samples[0].output
    expected = _direct(backend, text, temperature=0.8, seed=11, n=3, max_tokens=9, stop=("zz",))
    assert [c.message.text for c in output.choices] == [c.text for c in expected.completions]
    assert len({c.message.text for c in output.choices}) > 1  # really sampled, really three


def test_stop_seqs_max_tokens_and_logprobs(tmp_path: Path, make_model: Any) -> None:
    model = make_model()
    log = _run(tmp_path, model, ["one two three"], stop_seqs=["three"], logprobs=True)
    assert log.samples is not None
    choice = log.samples[0].output.choices[0]
    expected = _direct(model.api.backend, "one two three", stop=("three",), logprobs=True).completions[0]
    assert choice.message.text == expected.text == "user: one two "
    assert choice.logprobs is not None
    assert [(p.token, p.logprob) for p in choice.logprobs.content] == list(
        zip(expected.text, expected.logprobs or (), strict=True)
    )
    log = _run(tmp_path, model, ["one two three"], max_tokens=4)
    assert log.samples is not None
    assert log.samples[0].output.completion == "user"
    assert log.samples[0].output.choices[0].stop_reason == "max_tokens"


def test_response_schema_becomes_json_schema(tmp_path: Path, make_model: Any) -> None:
    model = make_model()
    schema = JSONSchema(type="object", properties={"a": JSONSchema(type="integer")}, required=["a"])
    log = _run(tmp_path, model, ["x"], response_schema=ResponseSchema(name="r", json_schema=schema))
    assert log.samples is not None
    expected = _direct(model.api.backend, "x", json_schema=schema.model_dump(exclude_none=True))
    assert log.samples[0].output.completion == expected.text == '{"a":0}'


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {5: 1.0}),
        ("top_logprobs", 3),
        ("reasoning_effort", "high"),  # mapped, but the mock does not think unless told to
        ("reasoning_tokens", 100),
        ("best_of", 2),
        ("presence_penalty", 0.5),  # mapped, but the mock has no logits to apply it to
        ("extra_body", {"x": 1}),
    ],
)
def test_a_field_that_cannot_reach_the_backend_fails_the_sample_naming_it(
    tmp_path: Path, make_model: Any, field: str, value: Any
) -> None:
    model = make_model()
    log = _run(tmp_path, model, ["hi"], fail_on_error=False, **{field: value})
    assert log.samples is not None
    error = log.samples[0].error
    assert error is not None
    assert f"GenerateConfig.{field}=" in error.message
    assert model.api.backend.attempts == {}  # refused before anything was sent


def test_every_generate_config_field_is_mapped_inspect_side_or_refused() -> None:
    values: dict[str, Any] = {
        "best_of": 2,
        "logit_bias": {1: 1.0},
        "top_logprobs": 2,
        "prompt_logprobs": 1,
        "parallel_tool_calls": False,
        "cache_prompt": True,
        "verbosity": "low",
        "effort": "low",
        "reasoning_mode": "pro",
        "reasoning_summary": "auto",
        "extra_headers": {"a": "b"},
        "extra_body": {"a": 1},
        "modalities": ["image"],
        "batch": True,
    }
    fields = set(GenerateConfig.model_fields)
    rest = fields - set(convert.MAPPED) - convert.INSPECT_SIDE
    # A field a later inspect adds fails here until it is classified (it is refused meanwhile).
    assert rest == set(values)
    for name, value in values.items():
        with pytest.raises(ab.InvalidRequestError, match=rf"GenerateConfig\.{name}="):
            convert.sampling_params(GenerateConfig(**{name: value}), MockBackend().capabilities, "mock")


def test_num_choices_with_greedy_names_inspects_field() -> None:
    with pytest.raises(ab.InvalidRequestError, match="num_choices -> n"):
        convert.sampling_params(GenerateConfig(num_choices=2), MockBackend().capabilities, "mock")


def test_rate_limits_are_retried_after_retry_after(tmp_path: Path, make_model: Any) -> None:
    model = make_model(fail_attempts=2, failure="rate_limited", retry_after=0.01)
    log = _run(tmp_path, model, ["again"])
    assert log.status == "success", log.error
    assert model.api.backend.attempts["user: again"] == 3


def test_a_final_error_fails_the_sample_after_one_attempt(tmp_path: Path, make_model: Any) -> None:
    model = make_model(fail_attempts=5, failure="rejected")
    log = _run(tmp_path, model, ["no"], fail_on_error=False)
    assert log.samples is not None
    assert log.samples[0].error is not None
    assert "injected rejected failure" in log.samples[0].error.message
    assert model.api.backend.attempts["user: no"] == 1


def test_should_retry_maps_errors_to_inspects_decisions(make_model: Any) -> None:
    api = make_model().api
    limited = api.should_retry(ab.RateLimitedError("slow", retry_after=4.0))
    assert (limited.retry, limited.kind, limited.retry_after) == (True, "rate_limit", 4.0)
    for transient in (ab.BackendUnavailableError("x"), ab.BackendTimeoutError("t"), ab.BackendError("5xx")):
        decision = api.should_retry(transient)
        assert (decision.retry, decision.kind) == (True, "transient")
    for final in (ab.RequestRejectedError("no"), ab.BackendBrokenError("dead"), ab.InvalidRequestError("x")):
        assert not api.should_retry(final)


class _Words:
    """A tokenizer reading one word as one token (the backend's own, where it has one)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


class _WithTokenizer(MockBackend):
    name = "worded"

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = _Words()


def test_tokens_are_counted_without_a_download(make_model: Any) -> None:
    # Each way of counting gives another number for the same text: which one was used shows.
    text = "seven words of text in this sentence"  # 7 words, 36 characters
    assert asyncio.run(make_model().api.count_tokens(text)) == 36  # the mock: a character a token
    own = _WithTokenizer()
    assert asyncio.run(provider.inspect_model(own).api.count_tokens(text)) == 7  # the backend's tokenizer
    plain = MockBackend()
    plain.name = "plain"  # neither the mock's rule nor a tokenizer: four characters a token
    assert asyncio.run(provider.inspect_model(plain).api.count_tokens(text)) == 9
    own.close()
    plain.close()


def test_inspect_model_wraps_a_backend_the_caller_keeps(tmp_path: Path) -> None:
    backend = MockBackend(model="mine")
    model = provider.inspect_model(backend)
    log = _run(tmp_path, model, ["own"])
    assert log.samples is not None
    assert log.samples[0].output.completion == "user: own"
    _close(model)
    assert not backend.closed  # the caller's to close
    ab.get_loop_manager().run(backend.aclose())


def test_the_entry_point_is_declared() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["inspect_ai"]
    assert declared == {"asyncbackends": "asyncbackends.integrations.inspect_ai"}


def test_the_installed_entry_point_loads_the_provider() -> None:
    # Needs the package's metadata to include the entry point (a reinstall after this change).
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="inspect_ai") if ep.name == "asyncbackends"]
    assert len(found) == 1
    assert found[0].load() is provider
