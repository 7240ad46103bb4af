"""Loglikelihood through TGI's prefill logprobs."""

from __future__ import annotations

import pytest

import asyncbackends as ab
from asyncbackends.testing._fake_tgi.model import token_logprob
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import MakeBackend, sent


def expected(context: str, continuation: str) -> list[float]:
    previous = [context[-1:], *continuation[:-1]]  # "" before the first character of an empty context
    return [token_logprob(p, c) for p, c in zip(previous, continuation, strict=True)]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("context", "continuation"), [("The cat", " sat"), ("", "abc"), ("a", "b"), ("ab", "ünï")]
)
async def test_sum_of_last_k_prefill_logprobs(
    server: FakeTGIServer, backend: ab.AsyncBackend, context: str, continuation: str
) -> None:
    (result,) = await ab.gather(backend, [ab.LoglikelihoodRequest(context, continuation, request_id="r")])
    parts = expected(context, continuation)
    assert result.request_id == "r"
    assert result.num_tokens == len(continuation)
    assert result.token_logprobs == pytest.approx(parts)
    assert result.logprob == pytest.approx(sum(parts))
    assert result.is_greedy is None
    (body,) = sent(server, "/generate")
    assert body["inputs"] == context + continuation
    assert body["parameters"] == {
        "do_sample": False,
        "max_new_tokens": 1,
        "details": True,
        "decoder_input_details": True,
    }
    assert sent(server, "/tokenize") == [{"inputs": context + continuation}]


@pytest.mark.asyncio
async def test_local_tokenizer_skips_tokenize(server: FakeTGIServer, make_backend: MakeBackend) -> None:
    class CharTokenizer:
        def encode(self, text: str) -> list[int]:
            return [1, *map(ord, text)]

    backend = await make_backend(server.url, tokenizer=CharTokenizer())
    (result,) = await ab.gather(backend, [ab.LoglikelihoodRequest("The cat", " sat")])
    assert result.logprob == pytest.approx(sum(expected("The cat", " sat")))
    assert server.paths["/tokenize"] == 0


@pytest.mark.asyncio
async def test_many_in_order(backend: ab.AsyncBackend) -> None:
    requests = [ab.LoglikelihoodRequest(f"context {i}", f" cont{'x' * (i % 5)}") for i in range(30)]
    results = await ab.gather(backend, requests, concurrency=8)
    for request, result in zip(requests, results, strict=True):
        assert result.logprob == pytest.approx(sum(expected(request.context, request.continuation)))
        assert result.num_tokens == len(request.continuation)


@pytest.mark.asyncio
async def test_capabilities(backend: ab.AsyncBackend) -> None:
    caps = backend.capabilities
    assert caps.loglikelihood and not caps.is_greedy and caps.n_samples and caps.chat and not caps.token_ids


@pytest.mark.asyncio
async def test_trailing_space_moves_to_the_continuation_on_both_paths(
    server: FakeTGIServer, backend: ab.AsyncBackend, make_backend: MakeBackend
) -> None:
    class CharTokenizer:
        def encode(self, text: str) -> list[int]:
            return [1, *map(ord, text)]

    local = await make_backend(server.url, tokenizer=CharTokenizer())
    request = ab.LoglikelihoodRequest("The cat ", "sat")
    (remote_result,) = await ab.gather(backend, [request])
    (local_result,) = await ab.gather(local, [request])
    parts = expected("The cat", " sat")  # scored as lm-eval does: "The cat" + " sat"
    for result in (remote_result, local_result):
        assert result.num_tokens == 4
        assert result.logprob == pytest.approx(sum(parts))
