"""lm-eval's `LM` on the deterministic mock backend: model args, request mapping, order, retries, caching."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.api.model import CachingLM
from lm_eval.api.registry import get_model

import asyncbackends as ab
from asyncbackends._cache import request_key
from asyncbackends._text import EncodePairRequest, split_of
from asyncbackends.adapters.mock import MockBackend
from asyncbackends.integrations import lm_eval as ab_lm_eval
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

LM_EVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lm_eval_tasks"


def _instances(kind: str, args: list[tuple[Any, ...]]) -> list[Instance]:
    return [Instance(kind, {}, arg, index) for index, arg in enumerate(args)]


def _mock_score(context: str, continuation: str) -> ab.LoglikelihoodResult:
    backend = MockBackend()
    return ab.run_batch(backend, [ab.LoglikelihoodRequest(context, continuation)])[0]  # type: ignore[no-any-return]


@pytest.fixture
def lm() -> Any:
    model = AsyncBackendsLM("mock", progress=False)
    yield model
    model.close()


def test_registered_under_its_name_and_registration_is_idempotent() -> None:
    assert get_model("asyncbackends") is AsyncBackendsLM
    ab_lm_eval._register()  # a second registration must not trip lm-eval's duplicate-name check
    assert get_model(ab_lm_eval.MODEL_NAME) is AsyncBackendsLM


def test_model_args_string_forwards_backend_options_and_drops_lm_eval_extras() -> None:
    lm = get_model("asyncbackends").create_from_arg_string(
        "backend=mock,model=my-model,latency=0.001,concurrency=7,max_gen_toks=32",
        {"batch_size": 1, "max_batch_size": 64, "device": "cuda"},
    )
    try:
        assert isinstance(lm.backend, MockBackend)
        assert lm.backend.model == "my-model"
        assert lm.backend.latency == 0.001
        assert lm.concurrency == 7
        assert lm.max_gen_toks == 32
    finally:
        lm.close()


@pytest.mark.parametrize(
    ("model_args", "python", "expected"),
    [
        ("idle_timeout=None", {"idle_timeout": None}, ab.Timeouts(total=None, idle=120)),
        (
            "idle_timeout='None'",
            {"idle_timeout": "none"},
            ab.Timeouts(total=None, idle=120),
        ),  # text reaches us
        ("idle_timeout=0", {"idle_timeout": 0}, ab.Timeouts(total=None, idle=None)),
        ("timeout=0", {"timeout": 0}, ab.Timeouts(total=None, idle=120)),
        ("timeout='None'", {"timeout": None}, ab.Timeouts(total=None, idle=120)),
        (
            "timeout=30,idle_timeout=0.5",
            {"timeout": "30", "idle_timeout": 0.5},
            ab.Timeouts(total=30, idle=0.5),
        ),
    ],
)
def test_timeouts_mean_the_same_in_model_args_and_in_python(
    model_args: str, python: dict[str, Any], expected: ab.Timeouts
) -> None:
    # None (however spelled) keeps the default, 0 turns a limit off: for both options.
    lm = get_model("asyncbackends").create_from_arg_string(f"backend=mock,{model_args}", {"batch_size": 1})
    direct = AsyncBackendsLM("mock", progress=False, **python)
    try:
        assert lm.timeout == direct.timeout == expected
    finally:
        lm.close()
        direct.close()


@pytest.mark.parametrize("model_args", ["timeout=-1", "idle_timeout=-5", "idle_timeout=true", "timeout=soon"])
def test_a_timeout_that_is_not_seconds_is_refused(model_args: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match="must be a number of seconds >= 0"):
        get_model("asyncbackends").create_from_arg_string(f"backend=mock,{model_args}", {"batch_size": 1})


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "expected"),
    [
        (None, 1, None),
        (None, 16, 16),
        (None, "16", 16),
        (None, "auto", None),
        (None, "auto:4", None),
        (8, 16, 8),
    ],
)
def test_batch_size_maps_to_concurrency_only_above_one(
    concurrency: Any, batch_size: Any, expected: Any
) -> None:
    lm = AsyncBackendsLM("mock", concurrency=concurrency, batch_size=batch_size)
    try:
        assert lm.concurrency == expected
    finally:
        lm.close()


def test_backend_object_with_options_is_refused() -> None:
    backend = ab.create_backend("mock")
    with pytest.raises(TypeError, match="latency"):
        AsyncBackendsLM(backend, latency=1.0)
    backend.close()


def test_loglikelihood_moves_trailing_space_and_keeps_order(lm: Any) -> None:
    lm.backend.jitter = 0.01  # completions arrive out of order
    pairs = [("The cat ", "sat"), ("Paris is", " the capital"), ("", "hello"), ("a\n\n", "b"), ("xyz", "z")]
    got = lm.loglikelihood(_instances("loglikelihood", pairs))
    expected = []
    for context, continuation in pairs:
        stripped = context.rstrip()
        result = _mock_score(stripped, context[len(stripped) :] + continuation)
        expected.append((result.logprob, bool(result.is_greedy)))
    assert got == expected
    # The mock's score depends on the last context character, so the move is visible.
    assert got[0] != (_mock_score("The cat ", "sat").logprob, False)
    assert got[4] == (_mock_score("xyz", "z").logprob, False)


def test_split_trailing_space() -> None:
    assert ab_lm_eval.split_trailing_space("Answer: ", "Paris") == ("Answer:", " Paris")
    assert ab_lm_eval.split_trailing_space("Answer:\n\n", "B") == ("Answer:", "\n\nB")
    assert ab_lm_eval.split_trailing_space("Answer:", " Paris") == ("Answer:", " Paris")


def test_loglikelihood_rolling_scores_whole_texts(lm: Any) -> None:
    texts = ["hello world", "abc", "The quick brown fox"]
    got = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(t,) for t in texts]))
    backend = MockBackend()
    expected = [r.logprob for r in ab.run_batch(backend, [ab.RollingLoglikelihoodRequest(t) for t in texts])]
    assert got == expected
    assert all(isinstance(x, float) and x < 0 for x in got)


def test_generation_kwargs_mapping(lm: Any) -> None:
    greedy = lm.sampling_params(
        {"until": ["\n", ""], "max_gen_toks": 5, "do_sample": False, "temperature": 0.7}
    )
    assert (greedy.max_tokens, greedy.temperature, greedy.stop) == (5, 0.0, ("\n",))
    sampled = lm.sampling_params(
        {"until": "Q:", "do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 3}
    )
    assert (sampled.temperature, sampled.top_p, sampled.seed, sampled.stop) == (0.8, 0.9, 3, ("Q:",))
    assert sampled.max_tokens == 256  # lm-eval's default when a task does not say
    # Temperature alone (no do_sample) means sampling, as lm-eval normalises it; max_new_tokens is an alias.
    implicit = lm.sampling_params({"temperature": 0.5, "max_new_tokens": 9, "top_k": 4})
    assert (implicit.temperature, implicit.max_tokens, implicit.top_k) == (0.5, 9, 4)


def test_unknown_generation_kwargs_are_errors(lm: Any) -> None:
    # Dropping one in silence would run the evaluation with settings nobody asked for (issue 19).
    with pytest.raises(ab.InvalidRequestError, match=r"num_beams=4.*ignore_gen_kwargs=num_beams"):
        lm.sampling_params({"until": [], "num_beams": 4})
    # Special tokens are left out of the text by every backend: asking for that asks for nothing; asking to
    # keep them (lm-eval's vllm model does by default) cannot be honoured.
    assert lm.sampling_params({"until": [], "skip_special_tokens": True}) == lm.sampling_params({"until": []})
    with pytest.raises(ab.InvalidRequestError, match=r"skip_special_tokens=False"):
        lm.sampling_params({"until": [], "skip_special_tokens": False})


def test_generate_until_stops_and_keeps_order(lm: Any) -> None:
    lm.backend.jitter = 0.01
    args = [
        ("Q: one. two", {"until": ["."], "max_gen_toks": 50}),
        ("short", {"until": ["\n"], "max_gen_toks": 3}),
        ("line one\nline two", {"until": ["\n"], "max_gen_toks": 50, "do_sample": False}),
    ]
    assert lm.generate_until(_instances("generate_until", args)) == ["Q: one", "sho", "line one"]


class _Recording:
    """The mock backend, recording the order in which requests reach it."""

    name = "mock"

    def __init__(self) -> None:
        self.inner = MockBackend()
        self.capabilities = self.inner.capabilities
        self.seen: list[Any] = []

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        self.seen.append(request.context)
        return await self.inner.loglikelihood(request)

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.seen.append(request.prompt)
        return await self.inner.generate(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_requests_go_longest_first_with_a_contexts_continuations_together() -> None:
    backend = _Recording()
    lm = AsyncBackendsLM(backend, concurrency=1, progress=False)  # one at a time: arrival order = send order
    try:
        pairs = [("short", " a"), ("a much longer one", " x"), ("short", " bb"), ("mid one", " z")]
        pairs.append(("a much longer one", " yy"))
        got = lm.loglikelihood(_instances("loglikelihood", pairs))
        assert backend.seen == ["a much longer one"] * 2 + ["mid one"] + ["short"] * 2
        assert got == [(r.logprob, bool(r.is_greedy)) for r in (_mock_score(c, x) for c, x in pairs)]
        backend.seen.clear()
        prompts = ["b", "ccc", "a", "dd"]
        texts = lm.generate_until(_instances("generate_until", [(p, {"max_gen_toks": 2}) for p in prompts]))
        assert backend.seen == ["ccc", "dd", "a", "b"]
        assert texts == [p[:2] for p in prompts]  # the mock echoes its prompt: each answer in its place
    finally:
        lm.close()


def test_scoring_requests_ask_for_lm_evals_split_and_are_cached_apart() -> None:
    class Kinds(_Recording):
        async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
            self.seen.append(split_of(request))
            return await self.inner.loglikelihood(request)

    backend = Kinds()
    lm = AsyncBackendsLM(backend, progress=False)
    try:
        lm.loglikelihood(_instances("loglikelihood", [("The answer is 4", "2."), ("", "x")]))
    finally:
        lm.close()
    # Split as lm-eval's _encode_pair splits (tests/parity/test_lm_eval_scoring.py has the scores).
    assert backend.seen == ["encode_pair", "encode_pair"]
    plain, pair = ab.LoglikelihoodRequest("a", "b"), EncodePairRequest("a", "b")
    assert split_of(plain) == "whole"
    inner: Any = backend.inner
    assert request_key(inner, plain) != request_key(inner, pair)


def test_concurrency_bounds_in_flight_requests() -> None:
    lm = AsyncBackendsLM("mock", concurrency=4, latency=0.01, progress=False)
    try:
        lm.loglikelihood(_instances("loglikelihood", [(f"ctx {i}", "x") for i in range(40)]))
        assert lm.backend.max_in_flight == 4
    finally:
        lm.close()


def test_retryable_errors_are_retried_and_others_raised() -> None:
    flaky = AsyncBackendsLM("mock", fail_attempts=1, failure="unavailable", progress=False)
    flaky.retry = ab.RetryPolicy(max_attempts=2, initial_delay=0.0)
    try:
        assert len(flaky.loglikelihood(_instances("loglikelihood", [("a", "b"), ("c", "d")]))) == 2
        assert sum(flaky.backend.attempts.values()) == 4
    finally:
        flaky.close()
    broken = AsyncBackendsLM("mock", fail_attempts=1, failure="rejected", progress=False)
    try:
        with pytest.raises(ab.RequestRejectedError):
            broken.generate_until(_instances("generate_until", [("a", {"until": []})]))
        assert sum(broken.backend.attempts.values()) == 1
    finally:
        broken.close()


def test_lm_eval_request_cache_hook_is_filled(tmp_path: Path) -> None:
    lm = AsyncBackendsLM("mock", progress=False)
    args = [("The cat", " sat"), ("a", "b")]
    try:
        first = CachingLM(lm, str(tmp_path / "cache.db")).loglikelihood(_instances("loglikelihood", args))
        attempts = sum(lm.backend.attempts.values())
        again = CachingLM(lm, str(tmp_path / "cache.db")).loglikelihood(_instances("loglikelihood", args))
        assert again == first
        assert sum(lm.backend.attempts.values()) == attempts  # answered from lm-eval's cache, not the backend
    finally:
        lm.close()


def test_response_cache_resumes_without_resending(tmp_path: Path) -> None:
    cache = str(tmp_path / "responses.sqlite")
    texts = [("alpha",), ("beta",)]
    first = AsyncBackendsLM("mock", cache=cache, progress=False)
    try:
        expected = first.loglikelihood_rolling(_instances("loglikelihood_rolling", texts))
    finally:
        first.close()
    second = AsyncBackendsLM("mock", cache=cache, progress=False)
    try:
        assert second.loglikelihood_rolling(_instances("loglikelihood_rolling", texts)) == expected
        assert sum(second.backend.attempts.values()) == 0
    finally:
        second.close()


def test_simple_evaluate_on_local_tasks_with_mock() -> None:
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="asyncbackends",
        model_args="backend=mock,concurrency=16,progress=False",
        tasks=["ab_mc", "ab_gen", "ab_ppl"],
        task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
        log_samples=True,
    )
    assert results is not None
    assert set(results["results"]) == {"ab_mc", "ab_gen", "ab_ppl"}
    samples = results["samples"]
    assert [len(samples[t]) for t in ("ab_mc", "ab_gen", "ab_ppl")] == [12, 10, 10]
    # The mock echoes its prompt: a generation is the prompt's first 12 characters, cut at "\n" or ".".
    for sample in samples["ab_gen"]:
        prompt = f"Q: {sample['doc']['question']}\nA:"
        assert sample["filtered_resps"][0] == prompt[:12].split("\n")[0].split(".")[0]
    assert results["results"]["ab_gen"]["exact_match,none"] == 0.0
    # Multiple choice: each choice scored with the mock's fixed distribution after " " moved over.
    first = samples["ab_mc"][0]
    context = f"Question: {first['doc']['question']}\nAnswer:"
    scores = [r[0] for r in first["filtered_resps"]]
    assert scores == [_mock_score(context, " " + c).logprob for c in first["doc"]["choices"]]
    assert results["results"]["ab_ppl"]["word_perplexity,none"] > 1
