"""End to end against a real `vllm serve`: answers equal the in-process vllm adapter's; errors mapped."""

from __future__ import annotations

import pytest

import asyncbackends as ab
from asyncbackends.adapters.endpoints import EndpointsBackend
from asyncbackends.adapters.openai import OpenAIBackend
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI

from .cases import GREEDY, ROLLING, SCORED
from .conftest import API_KEY, Served

# The first test waits for the server's start-up (about 30 s on an idle machine, minutes on a busy one).
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def test_discovers_the_served_model(served: Served, backend: OpenAIBackend) -> None:
    assert backend.model == served.model
    assert backend.server == "vllm" and backend.max_model_len == 512
    caps = backend.capabilities
    assert caps.loglikelihood and caps.rolling_loglikelihood and caps.is_greedy and caps.token_ids


def test_greedy_generation_equals_in_process_vllm(served: Served, backend: OpenAIBackend) -> None:
    results = ab.run_batch(backend, GREEDY)
    for request, result, expected in zip(GREEDY, results, served.reference["generated"], strict=True):
        (completion,) = result.completions
        assert completion.token_ids == tuple(expected[0]["token_ids"]), request.prompt
        assert completion.text == expected[0]["text"]
        assert completion.finish_reason == expected[0]["finish_reason"]
        if request.params.logprobs:
            assert completion.logprobs == pytest.approx(expected[0]["logprobs"], abs=1e-3)
        assert result.model == served.model and result.prompt_tokens


def test_loglikelihoods_equal_in_process_vllm(served: Served, backend: OpenAIBackend) -> None:
    results = ab.run_batch(backend, SCORED)
    for result, expected in zip(results, served.reference["scored"], strict=True):
        assert result.num_tokens == expected["num_tokens"]
        assert result.logprob == pytest.approx(expected["logprob"], abs=1e-3)
        assert result.token_logprobs == pytest.approx(expected["token_logprobs"], abs=1e-3)
        assert result.is_greedy == expected["is_greedy"]


def test_a_greedy_continuation_is_recognised(backend: OpenAIBackend) -> None:
    # The model's own greedy continuation of a context must score as greedy, token by token.
    context = "The quick brown fox"
    generated = ab.run_batch(backend, [ab.GenerationRequest(context, ab.SamplingParams(max_tokens=3))])[0]
    ids = list(generated.completions[0].token_ids)
    text = generated.text
    scored = ab.run_batch(backend, [ab.LoglikelihoodRequest(context, text)])[0]
    if scored.num_tokens == len(ids):  # the decoded text re-encodes to the same tokens
        assert scored.is_greedy is True
    other = ab.run_batch(backend, [ab.LoglikelihoodRequest(context, " zebra zebra")])[0]
    assert other.is_greedy is False


def test_rolling_loglikelihood_equals_in_process_vllm(served: Served, backend: OpenAIBackend) -> None:
    (result,) = ab.run_batch(backend, ROLLING)
    (expected,) = served.reference["rolling"]
    assert result.num_tokens == expected["num_tokens"]
    assert result.logprob == pytest.approx(expected["logprob"], abs=1e-3)


def test_n_samples_with_seed(backend: OpenAIBackend) -> None:
    params = ab.SamplingParams(max_tokens=6, temperature=1.0, n=4, seed=7)
    first, again = ab.run_batch(backend, [ab.GenerationRequest("Once upon", params)] * 2)
    assert len(first.completions) == 4
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in first.completions)
    assert len({c.token_ids for c in first.completions}) > 1  # n distinct samples, not one repeated
    assert [c.token_ids for c in first.completions] == [c.token_ids for c in again.completions]
    assert first.completion_tokens == 24


def test_stop_strings_are_not_in_the_text(backend: OpenAIBackend) -> None:
    free = ab.run_batch(
        backend, [ab.GenerationRequest("The quick brown fox", ab.SamplingParams(max_tokens=12))]
    )[0]
    stop = free.text[3:5]
    assert stop.strip()
    stopped = ab.run_batch(
        backend, [ab.GenerationRequest("The quick brown fox", ab.SamplingParams(max_tokens=12, stop=(stop,)))]
    )[0]
    assert stopped.completions[0].finish_reason == "stop"
    assert stop not in stopped.text and free.text.startswith(stopped.text)


def test_prompt_over_max_model_len_is_a_context_length_error_and_the_run_goes_on(
    backend: OpenAIBackend,
) -> None:
    requests = [
        ab.GenerationRequest("word " * 600, request_id="long"),
        ab.GenerationRequest("Numbers: 1", ab.SamplingParams(max_tokens=4), request_id="short"),
    ]
    metrics = ab.RunMetrics()
    error, short = ab.run_batch(backend, requests, return_exceptions=True, metrics=metrics)
    assert type(error) is ab.ContextLengthError and not error.retryable
    assert error.request_id == "long" and "maximum context length" in str(error)
    assert isinstance(short, ab.GenerationResult) and short.completions[0].finish_reason == "length"
    assert metrics.retries == 0 and metrics.errors == {"ContextLengthError": 1}
    assert metrics.context_length_errors == 1


def test_continuation_over_max_model_len_is_rejected_before_sending(backend: OpenAIBackend) -> None:
    (error,) = ab.run_batch(backend, [ab.LoglikelihoodRequest("a", " b" * 600)], return_exceptions=True)
    assert type(error) is ab.ContextLengthError and "max_model_len=512" in str(error)


def test_wrong_model_name_is_rejected(served: Served) -> None:
    with ab.create_backend(
        "openai", base_url=served.base_url, api_key=API_KEY, model="no-such-model"
    ) as wrong:
        (error,) = ab.run_batch(wrong, [ab.GenerationRequest("hi")], return_exceptions=True)
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert "no-such-model" in str(error) and "404" in str(error)


def test_wrong_api_key_is_an_authentication_error(served: Served) -> None:
    # The key is checked when the backend is built (GET /v1/models), not at the first request of a run.
    with pytest.raises(ab.AuthenticationError, match="401") as info:
        ab.create_backend("openai", base_url=served.base_url, api_key="sk-wrong", model=served.model)
    assert not info.value.retryable
    assert "sk-wrong" not in str(info.value) and API_KEY not in str(info.value)


def test_api_key_never_shown(backend: OpenAIBackend) -> None:
    shown = [repr(backend), repr(vars(backend)), repr(vars(backend._http)), repr(backend.fingerprint)]
    assert not any(API_KEY in text for text in shown)


def test_endpoint_running_vllm_speaks_openai(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    manager = ab.get_loop_manager()
    api = manager.run(FakeEndpointsAPI(upstream=served.url, token=API_KEY).start())
    try:
        monkeypatch.setattr(constants, "ENDPOINT", api.url)
        monkeypatch.setattr(constants, "INFERENCE_ENDPOINTS_ENDPOINT", api.url + "/v2")
        endpoint = api.add("served", state="paused", image={"vllm": {"url": "vllm/vllm-openai:latest"}})
        with ab.create_backend("endpoints", name="served", token=API_KEY, poll_interval=0.05) as backend:
            assert isinstance(backend, EndpointsBackend) and backend.protocol == "openai"
            result = ab.run_batch(backend, GREEDY[:1])[0]
            scored = ab.run_batch(backend, SCORED[:1])[0]
        assert result.completions[0].token_ids == tuple(served.reference["generated"][0][0]["token_ids"])
        assert scored.logprob == pytest.approx(served.reference["scored"][0]["logprob"], abs=1e-3)
        assert endpoint.actions == ["resume"] and "/v1/completions" in endpoint.proxied
    finally:
        manager.run(api.stop())
