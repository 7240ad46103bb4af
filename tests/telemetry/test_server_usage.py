"""Generated tokens from a server's usage where it sends no token ids (TGI's chat route, OpenAI chat).

The reference is the server's own answer: the same chat request posted by hand, its ``usage`` read back.
The run's metrics, callbacks and OpenTelemetry span must report that count, not 0 (no token ids to count).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_tgi import FakeTGIServer

from ..shared_tgi import chat_answer, served_tgi
from .conftest import OTel

MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeTGIServer]:
    yield from served_tgi()


def _server_usage(server: FakeTGIServer, max_tokens: int) -> dict[str, int]:
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0}
    usage: dict[str, int] = chat_answer(server, body)["usage"]
    return usage


def _backend(kind: str, server: FakeTGIServer) -> Any:
    if kind == "tgi":
        return ab.create_backend("tgi", url=server.url)
    # TGI's chat route is OpenAI's chat API: the openai adapter talks to it as to any compatible server.
    return ab.create_backend("openai", base_url=server.url + "/v1", model="tgi")


@pytest.mark.parametrize("kind", ["tgi", "openai"])
@pytest.mark.parametrize("max_tokens", [4, 400])  # stopped by the length, and by the model's end of text
def test_metrics_callbacks_and_spans_count_the_servers_generated_tokens(
    otel: OTel, server: FakeTGIServer, kind: str, max_tokens: int
) -> None:
    usage = _server_usage(server, max_tokens)
    backend = _backend(kind, server)
    try:
        metrics = ab.RunMetrics()
        seen: list[ab.TokenUsage] = []
        request = ab.GenerationRequest(MESSAGES, ab.SamplingParams(max_tokens=max_tokens), request_id="u")
        [result] = ab.run_batch(
            backend, [request], metrics=metrics, callbacks=ab.RunCallbacks(on_usage=seen.append)
        )
    finally:
        ab.get_loop_manager().run(backend.aclose())
    assert result.completions[0].token_ids == ()  # nothing to count: only the server's usage says it
    assert usage["completion_tokens"] > 0
    assert metrics.completion_tokens == usage["completion_tokens"]
    assert metrics.summary()["completion_tokens_per_s"] > 0
    assert [(u.input_tokens, u.output_tokens) for u in seen] == [
        (usage["prompt_tokens"], usage["completion_tokens"])
    ]
    [span] = otel.finished()
    assert dict(span.attributes or {})["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    tokens = {p.attributes["gen_ai.token.type"]: p for p in otel.points("gen_ai.client.token.usage")}
    assert tokens["output"].sum == usage["completion_tokens"]
    assert result.generated_tokens == result.completion_tokens == usage["completion_tokens"]
    assert result.completions[0].finish_reason == ("length" if max_tokens == 4 else "stop")


def test_n_chat_samples_add_up_each_calls_usage(server: FakeTGIServer) -> None:
    # TGI answers one sequence a call: n=2 is two calls, each with its own usage.
    backend = ab.create_backend("tgi", url=server.url)
    try:
        params = ab.SamplingParams(max_tokens=5, n=2, temperature=1.0, seed=3)
        [result] = ab.run_batch(backend, [ab.GenerationRequest(MESSAGES, params)])
    finally:
        ab.get_loop_manager().run(backend.aclose())
    assert result.generated_tokens == 2 * _server_usage(server, 5)["completion_tokens"]
