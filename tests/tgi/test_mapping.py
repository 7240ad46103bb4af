"""How SamplingParams and prompts become TGI requests, and TGI responses become results."""

from __future__ import annotations

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import EOS_ID, FakeModel, token_logprob
from asyncbackends.testing.fake_tgi import FakeTGIServer, Limits

from .conftest import MakeBackend, MakeServer, sent

NO_RETRY = ab.RetryPolicy(max_attempts=1)
PROMPT = "hello world"


async def one(backend: ab.AsyncBackend, request: ab.GenerationRequest) -> ab.GenerationResult:
    (result,) = await ab.gather(backend, [request], retry=NO_RETRY)
    assert isinstance(result, ab.GenerationResult)
    return result


@pytest.mark.asyncio
async def test_greedy_sends_no_sampling_fields(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    # top_k/top_p on a greedy request would switch TGI's sampler on: they must not be sent at all.
    params = ab.SamplingParams(max_tokens=5, temperature=0.0, top_k=7, top_p=0.5)
    result = await one(backend, ab.GenerationRequest(PROMPT, params))
    (body,) = sent(server)
    assert body == {
        "inputs": PROMPT,
        "parameters": {"do_sample": False, "max_new_tokens": 5, "return_full_text": False, "details": True},
    }
    assert result.text == PROMPT[:5]
    assert result.completions[0].finish_reason == "length"
    assert result.completions[0].token_ids == tuple(FakeModel.token_id(c) for c in PROMPT[:5])


@pytest.mark.asyncio
async def test_sampling_fields(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    params = ab.SamplingParams(max_tokens=3, temperature=0.7, top_k=4, top_p=0.9, seed=11)
    await one(backend, ab.GenerationRequest(PROMPT, params))
    (body,) = sent(server)
    assert body["parameters"] == {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 4,
        "top_p": 0.9,
        "seed": 11,
        "max_new_tokens": 3,
        "return_full_text": False,
        "details": True,
    }


@pytest.mark.asyncio
async def test_top_p_one_and_temperature_one(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    # top_p=1.0 is rejected by TGI (it needs 0 < top_p < 1), so it is left out; temperature 1 still samples.
    await one(
        backend, ab.GenerationRequest(PROMPT, ab.SamplingParams(max_tokens=2, temperature=1.0, top_p=1.0))
    )
    (body,) = sent(server)
    assert "top_p" not in body["parameters"] and "top_k" not in body["parameters"]
    assert body["parameters"]["do_sample"] is True and body["parameters"]["temperature"] == 1.0
    assert "seed" not in body["parameters"]


@pytest.mark.asyncio
async def test_stop_sequences_sent_and_stripped(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    result = await one(
        backend, ab.GenerationRequest(PROMPT, ab.SamplingParams(max_tokens=50, stop=("o w", "zz")))
    )
    (body,) = sent(server)
    assert body["parameters"]["stop"] == ["o w", "zz"]
    assert result.text == "hell"  # TGI's text ends with "o w"; ours never includes the stop string
    assert result.completions[0].finish_reason == "stop"


@pytest.mark.asyncio
async def test_eos_finish_usage_and_logprobs(backend: ab.AsyncBackend) -> None:
    result = await one(backend, ab.GenerationRequest("abc", ab.SamplingParams(max_tokens=50, logprobs=True)))
    completion = result.completions[0]
    assert completion.text == "abc"
    assert completion.finish_reason == "stop"
    assert completion.token_ids[-1] == EOS_ID
    expected = (
        token_logprob("c", "a"),
        token_logprob("a", "b"),
        token_logprob("b", "c"),
        token_logprob("c", "</s>"),
    )
    assert completion.logprobs == pytest.approx(expected)
    assert completion.token_texts == ("a", "b", "c", "</s>")
    assert result.prompt_tokens == len("abc") + 1  # x-prompt-tokens: BOS + one token per character
    assert result.model == FakeModel.model_id


@pytest.mark.asyncio
async def test_logprobs_off_gives_none(backend: ab.AsyncBackend) -> None:
    result = await one(backend, ab.GenerationRequest("abc", ab.SamplingParams(max_tokens=2)))
    assert result.completions[0].logprobs is None


@pytest.mark.asyncio
async def test_n_fans_out_with_consecutive_seeds(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    params = ab.SamplingParams(max_tokens=20, temperature=0.8, n=3, seed=40)
    result = await one(backend, ab.GenerationRequest(PROMPT, params))
    assert sorted(b["parameters"]["seed"] for b in sent(server)) == [40, 41, 42]
    assert len(result.completions) == 3
    # Same seeds, same samples: a second call reproduces each completion in index order.
    again = await one(backend, ab.GenerationRequest(PROMPT, params))
    assert [c.text for c in again.completions] == [c.text for c in result.completions]
    assert len({c.text for c in result.completions}) > 1


@pytest.mark.asyncio
async def test_n_without_seed_sends_no_seed(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    await one(backend, ab.GenerationRequest(PROMPT, ab.SamplingParams(max_tokens=4, temperature=0.5, n=2)))
    bodies = sent(server)
    assert len(bodies) == 2 and all("seed" not in b["parameters"] for b in bodies)


@pytest.mark.asyncio
async def test_chat_goes_to_chat_route(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    messages = [{"role": "user", "content": "hi"}]
    result = await one(backend, ab.GenerationRequest(messages, ab.SamplingParams(max_tokens=8, stop=("x",))))
    (body,) = sent(server, "/v1/chat/completions")
    assert body == {"messages": messages, "max_tokens": 8, "temperature": 0.0, "stop": ["x"]}
    assert result.text == "<|user|>"
    assert result.completions[0].finish_reason == "length"
    assert result.prompt_tokens == len("<|user|>\nhi\n<|assistant|>\n") + 1


@pytest.mark.asyncio
async def test_chat_sampling_and_logprobs(server: FakeTGIServer, backend: ab.AsyncBackend) -> None:
    params = ab.SamplingParams(max_tokens=3, temperature=0.5, top_p=0.8, seed=3, logprobs=True)
    result = await one(backend, ab.GenerationRequest([{"role": "user", "content": "hi"}], params))
    (body,) = sent(server, "/v1/chat/completions")
    assert (
        body["temperature"] == 0.5 and body["top_p"] == 0.8 and body["seed"] == 3 and body["logprobs"] is True
    )
    assert result.completions[0].logprobs is not None and len(result.completions[0].logprobs) == 3
    # The chat route names tokens by text and counts them only in its usage.
    assert "".join(result.completions[0].token_texts) == result.text
    assert result.completions[0].token_ids == () and result.completion_tokens == 3


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (ab.GenerationRequest([1, 2, 3]), ab.RequestRejectedError),
        (ab.GenerationRequest("x", ab.SamplingParams(max_tokens=0)), ab.InvalidRequestError),
        (
            ab.GenerationRequest("x", ab.SamplingParams(stop=("a", "b", "c", "d", "e"))),
            ab.InvalidRequestError,
        ),
        (ab.GenerationRequest("x", ab.SamplingParams(seed=-1)), ab.InvalidRequestError),
        (
            ab.GenerationRequest([{"role": "user", "content": "x"}], ab.SamplingParams(top_k=3)),
            ab.InvalidRequestError,
        ),
        (ab.GenerationRequest("x", ab.SamplingParams(max_tokens=5000)), ab.ContextLengthError),
    ],
)
async def test_refused_before_sending(
    server: FakeTGIServer, backend: ab.AsyncBackend, request_: ab.GenerationRequest, error: type[Exception]
) -> None:
    (outcome,) = await ab.gather(backend, [request_], return_exceptions=True, retry=NO_RETRY)
    assert type(outcome) is error
    assert sent(server) == [] and sent(server, "/v1/chat/completions") == []


@pytest.mark.asyncio
async def test_long_prompt_checked_locally_with_a_tokenizer(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(limits=Limits(max_input_tokens=10, max_total_tokens=20))
    backend = await make_backend(server.url, tokenizer=lambda text: [0, *map(ord, text)])
    (outcome,) = await ab.gather(
        backend, [ab.GenerationRequest("x" * 12, ab.SamplingParams(max_tokens=2))], return_exceptions=True
    )
    assert isinstance(outcome, ab.RequestRejectedError) and "at most 10" in str(outcome)
    assert sent(server) == []
    (ok,) = await ab.gather(backend, [ab.GenerationRequest("x" * 8, ab.SamplingParams(max_tokens=2))])
    assert ok.text == "xx"


@pytest.mark.asyncio
async def test_legacy_info_max_input_length(make_server: MakeServer, make_backend: MakeBackend) -> None:
    server = await make_server(limits=Limits(max_input_tokens=10, max_total_tokens=20), legacy_info=True)
    backend = await make_backend(server.url, tokenizer=lambda text: [0, *map(ord, text)])
    info = await ab.get_loop_manager().arun(backend.info())
    assert (info.max_input_tokens, info.max_total_tokens) == (10, 20)
    (outcome,) = await ab.gather(backend, [ab.GenerationRequest("x" * 12)], return_exceptions=True)
    assert isinstance(outcome, ab.RequestRejectedError)
    assert server.paths["/info"] == 1
