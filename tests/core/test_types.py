from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import asyncbackends as ab


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"n": 0}, "n"),
        ({"n": 2}, "n=2 with temperature=0"),
        ({"seed": "1"}, "seed"),
        ({"logprobs": 1}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop": [1]}, "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=field):
        ab.SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampling_params_normalise_and_are_frozen() -> None:
    params = ab.SamplingParams(stop="\n", temperature=1, n=3)
    assert params.stop == ("\n",)
    assert isinstance(params.temperature, float)
    assert not params.greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.n = 4  # type: ignore[misc]
    assert not hasattr(params, "__dict__")  # slotted


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt must not be empty"),
        ([], "prompt must not be empty"),
        (b"bytes", "prompt must be a str"),
        (42, "prompt must be a str"),
        ([1, "a"], "only token ids"),
        ([-1, 2], "token ids must be >= 0"),
        ([True, 2], "only token ids"),
        ([{"role": "wizard", "content": "x"}], r"prompt\[0\].role"),
        ([{"role": "user", "content": 3}], r"prompt\[0\].content"),
        ([{"role": "user", "content": "x", "extra": 1}], "unknown keys"),
    ],
)
def test_bad_prompts_are_refused(prompt: object, message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=message):
        ab.GenerationRequest(prompt)  # type: ignore[arg-type]


def test_prompt_kinds_are_normalised() -> None:
    assert ab.GenerationRequest("hi").prompt_kind == "text"
    tokens = ab.GenerationRequest([1, 2, 3])
    assert tokens.prompt == (1, 2, 3) and tokens.prompt_kind == "tokens"
    message = {"role": "user", "content": "hi"}
    chat = ab.GenerationRequest([message])
    assert chat.prompt_kind == "chat"
    message["content"] = "changed"  # the request holds its own copy
    assert chat.prompt[0]["content"] == "hi"  # type: ignore[index]


def test_other_requests_validate() -> None:
    with pytest.raises(ab.InvalidRequestError, match="continuation"):
        ab.LoglikelihoodRequest("ctx", "")
    with pytest.raises(ab.InvalidRequestError, match="context"):
        ab.LoglikelihoodRequest(None, "x")  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="text"):
        ab.RollingLoglikelihoodRequest("")
    with pytest.raises(ab.InvalidRequestError, match="request_id"):
        ab.GenerationRequest("x", request_id=3)  # type: ignore[arg-type]
    with pytest.raises(ab.InvalidRequestError, match="params"):
        ab.GenerationRequest("x", params={"n": 1})  # type: ignore[arg-type]
    assert ab.LoglikelihoodRequest("", "x").context == ""


def test_defaults_are_valid() -> None:
    assert ab.Capabilities() == ab.Capabilities(loglikelihood=False)
    request = ab.GenerationRequest("x")
    assert request.params == ab.SamplingParams() and request.request_id is None
    result = ab.GenerationResult("id", (ab.Completion("ab", (1, 2)), ab.Completion("c", (3,))))
    assert result.text == "ab" and result.completion_tokens == 3 and result.prompt_tokens is None
    assert ab.LoglikelihoodResult("id", -1.0).is_greedy is None


def test_completion_tokens_prefer_the_backends_own_count() -> None:
    # A server's usage counts what it generated even where it returns no token ids (TGI chat, OpenAI chat).
    counted = ab.GenerationResult("id", (ab.Completion("ab"),), generated_tokens=7)
    assert counted.completion_tokens == 7
    assert ab.GenerationResult("id", (ab.Completion("ab"),)).completion_tokens == 0
    # Where both are given the backend's count wins (a stop sequence's tokens, an EOS it leaves out of ids).
    assert (
        ab.GenerationResult("id", (ab.Completion("ab", (1, 2)),), generated_tokens=3).completion_tokens == 3
    )
    assert ab.Completion("ab", token_texts=["a", "b"]).token_texts == ("a", "b")
    assert ab.Completion("ab", token_texts=None).token_texts == ()  # type: ignore[arg-type]


@given(
    max_tokens=st.integers(0, 4096),
    temperature=st.floats(0, 5),
    top_p=st.floats(0, 1, exclude_min=True),
    n=st.integers(1, 8),
    seed=st.none() | st.integers(),
)
def test_valid_params_construct_or_refuse_only_greedy_n(
    max_tokens: int, temperature: float, top_p: float, n: int, seed: int | None
) -> None:
    if n > 1 and temperature == 0:
        with pytest.raises(ab.InvalidRequestError):
            ab.SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, n=n, seed=seed)
        return
    params = ab.SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, n=n, seed=seed)
    assert (params.max_tokens, params.n, params.seed) == (max_tokens, n, seed)
