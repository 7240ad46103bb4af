"""The in-process ``vllm`` adapter with ``reasoning_parser`` against a real ``vllm serve --reasoning-parser``
on the tiny reasoning model, for two parser families: the same token ids, thinking and answer; thinking
budgets; ``reasoning_tokens`` equal to the server's ``usage`` (issue 53 item 12); stop strings that end the
answer only; the ``openai`` adapter reading the server's split and count."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import asyncbackends as ab

from .conftest import Pair

# The first test of each parser family starts its pair (a `vllm serve` and an in-process engine at once),
# waiting up to conftest's START_TIMEOUT: more than the suite's 120 s on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX_TOKENS = 24
CLOSES = ("What is two plus two?", "hello there", "Tell me a story.")
"""Greedy thoughts that close within MAX_TOKENS (the lm_head row of </think> is scaled up)."""
RUNS_ON = ("Name the capital of France.", "Count to five.")
"""Greedy thoughts that do not."""


def _messages(prompt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}]


def _generate(backend: Any, prompt: str, **params: Any) -> ab.Completion:
    request = ab.GenerationRequest(_messages(prompt), ab.SamplingParams(temperature=0, **params))
    [completion] = ab.get_loop_manager().run(backend.generate(request)).completions
    return completion  # type: ignore[no-any-return]


def _piece(text: str) -> str:
    """The first two characters of ``text`` that are whole (a random model's text has partial UTF-8 in it,
    which vLLM's detokenizer holds back until the next token and a one-shot decode shows as U+FFFD)."""
    return next(text[i : i + 2] for i in range(len(text) - 1) if "\ufffd" not in text[i : i + 2])


def _thought_length(backend: Any, token_ids: Any) -> int | None:
    """The generated tokens up to and including the thought's closing marker (``None``: it never closed)."""
    end = backend.tokenizer.convert_tokens_to_ids("</think>")
    return list(token_ids).index(end) + 1 if end in token_ids else None


def _served_reasoning_tokens(served: dict[str, Any]) -> int:
    """What the server reports in ``usage.completion_tokens_details.reasoning_tokens``."""
    details = served["usage"]["completion_tokens_details"]
    assert isinstance(details["reasoning_tokens"], int)  # a server with a reasoning parser always says
    return int(details["reasoning_tokens"])


def _assert_same_as_server(completion: ab.Completion, served: dict[str, Any]) -> None:
    choice = served["choices"][0]
    message = choice["message"]
    assert list(completion.token_ids) == choice["token_ids"]
    assert completion.reasoning_tokens == _served_reasoning_tokens(served)
    assert completion.reasoning == message.get("reasoning")
    assert completion.finish_reason == choice["finish_reason"]
    # The server returns the unfinished thought with no content; the adapter says so and gives no answer.
    assert completion.text == (message.get("content") or "")


def test_split_equals_vllm_serve_where_the_thought_closes_and_where_it_does_not(pair: Pair) -> None:
    truncated, counts = [], []
    for prompt in CLOSES + RUNS_ON:
        completion = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS)
        _assert_same_as_server(completion, pair.chat(_messages(prompt), max_tokens=MAX_TOKENS))
        truncated.append(completion.reasoning_truncated)
        counts.append(completion.reasoning_tokens)
        thought = _thought_length(pair.backend, completion.token_ids)
        if completion.reasoning_truncated:
            assert completion.text == "" and completion.finish_reason == "length" and thought is None
        else:  # the thought closed within the output
            assert thought is not None and 0 < thought < MAX_TOKENS
    assert truncated == [False] * len(CLOSES) + [True] * len(RUNS_ON)
    # What makes the count's equality above a real check: the two parser families count differently.
    # deepseek_r1 counts only tokens between markers in the output (none: the template opens the thought in
    # the prompt); qwen3 counts the thought's tokens without its closing marker.
    assert any(counts) if pair.parser == "qwen3" else not any(counts), counts


@pytest.mark.parametrize("budget", [0, 2, 5])
def test_thinking_budget_equals_vllm_serve_and_bounds_the_thought(pair: Pair, budget: int) -> None:
    assert pair.backend.capabilities.thinking_budget
    for prompt in RUNS_ON:
        completion = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS, thinking_budget=budget)
        served = pair.chat(_messages(prompt), max_tokens=MAX_TOKENS, thinking_token_budget=budget)
        _assert_same_as_server(completion, served)
        # Forced closed: never truncated, and no more than the budget plus the closing marker.
        assert not completion.reasoning_truncated
        thought = _thought_length(pair.backend, completion.token_ids)
        assert thought is not None and 1 <= thought <= budget + 1


@pytest.mark.parametrize(
    "idle", [pytest.param(None, id="no-idle-limit"), pytest.param(120.0, id="idle-limit")]
)
def test_openai_adapter_reads_the_same_split_from_the_server(pair: Pair, idle: float | None) -> None:
    # A vLLM server's chats are asked whole either way: its streaming parser (parse_delta) splits some
    # outputs otherwise than its whole-answer parse (a partial UTF-8 character lands on the other side of
    # </think>, a second </think> in the answer is dropped), as this random model's outputs showed when the
    # adapter streamed them. Under an idle limit the server's /health keeps it.
    backend = ab.create_backend("openai", base_url=pair.url + "/v1", api_key="")
    timeout = ab.Timeouts(total=None, idle=idle)
    try:
        assert backend.capabilities.reasoning and backend.capabilities.thinking_budget
        for prompt in (*CLOSES, *RUNS_ON):
            for extra in ({}, {"thinking_budget": 2}):
                inproc = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS, **extra)
                request = ab.GenerationRequest(
                    _messages(prompt), ab.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, **extra)
                )
                [result] = ab.run_batch(backend, [request], timeout=timeout)
                [remote] = result.completions
                assert remote.token_ids == inproc.token_ids
                assert (remote.reasoning, remote.text) == (inproc.reasoning, inproc.text)
                assert remote.reasoning_tokens == inproc.reasoning_tokens
                assert (remote.finish_reason, remote.reasoning_truncated) == (
                    inproc.finish_reason,
                    inproc.reasoning_truncated,
                )
    finally:
        backend.close()


def test_the_openai_adapter_reads_vllm_serves_health_as_a_sign_of_life(pair: Pair) -> None:
    # The watched exchange ends once two probes were answered; had /health not answered below 500, the
    # watch would have raised after the idle limit instead.
    backend = ab.create_backend("openai", base_url=pair.url + "/v1", api_key="")
    watch = backend._health

    async def until_probed() -> int:
        while watch.probes < 2:  # noqa: ASYNC110  (a counter the watch bumps)
            await asyncio.sleep(0.05)
        return watch.probes

    try:
        exchange = watch.watch(until_probed(), 4.0, backend="openai", request_id=None)
        assert ab.get_loop_manager().run(exchange) == 2
        # The route itself answers (a 404 would count as a sign of life too).
        assert ab.get_loop_manager().run(backend._http.request("GET", "/health")).status == 200
    finally:
        backend.close()


def test_a_stop_string_inside_the_thought_does_not_cut_it(pair: Pair) -> None:
    prompt = CLOSES[0]
    free = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS)
    assert free.reasoning and len(free.text) > 4, free
    in_thought, in_answer = _piece(free.reasoning), _piece(free.text[1:])
    assert in_thought not in free.text[: free.text.find(in_answer) + 2]  # else the two would not differ
    stopped = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS, stop=[in_thought, in_answer])
    assert stopped.reasoning == free.reasoning
    assert stopped.reasoning_tokens == free.reasoning_tokens
    cut = min(i for i in (free.text.find(in_thought), free.text.find(in_answer)) if i >= 0)
    assert stopped.text == free.text[:cut]
    assert stopped.finish_reason == "stop"
    # The tokens kept are those of the unstopped run up to the one that completed the stop string, as vLLM
    # keeps them for a stop it applies itself: one token fewer would not hold it yet.
    kept = stopped.token_ids
    assert kept == free.token_ids[: len(kept)]
    tokenizer = pair.backend.tokenizer
    stop = in_answer if free.text.find(in_answer) == cut else in_thought
    after = _thought_length(pair.backend, free.token_ids)
    assert after is not None
    assert stop in tokenizer.decode(list(kept[after:]))
    assert stop not in tokenizer.decode(list(kept[after:-1]))


def test_a_thought_that_never_closes_ignores_stop_strings(pair: Pair) -> None:
    prompt = RUNS_ON[0]
    free = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS)
    assert free.reasoning_truncated and free.reasoning
    stopped = _generate(pair.backend, prompt, max_tokens=MAX_TOKENS, stop=[free.reasoning[2:4], "\n\n"])
    assert stopped == free


def test_parallel_samples_with_stops_are_the_samples_without_them_cut_in_the_answer(pair: Pair) -> None:
    # n=2 with stops runs one engine request per sample with the seeds vLLM gives its parallel samples.
    params = {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7, "n": 2, "thinking_budget": 2}
    run = ab.get_loop_manager().run
    free = run(
        pair.backend.generate(ab.GenerationRequest(_messages(RUNS_ON[0]), ab.SamplingParams(**params)))
    )
    assert all(c.text for c in free.completions), free
    stops = [_piece(c.text) for c in free.completions]
    request = ab.GenerationRequest(_messages(RUNS_ON[0]), ab.SamplingParams(stop=stops, **params))
    stopped = run(pair.backend.generate(request))
    for cut, whole in zip(stopped.completions, free.completions, strict=True):
        assert (cut.reasoning, cut.reasoning_tokens) == (whole.reasoning, whole.reasoning_tokens)
        assert cut.text == whole.text[: min(i for i in map(whole.text.find, stops) if i >= 0)]
        assert cut.finish_reason == "stop" and cut.token_ids == whole.token_ids[: len(cut.token_ids)]
