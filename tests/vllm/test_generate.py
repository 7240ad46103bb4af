"""Generation on the real engine, checked against transformers and vLLM's offline LLM on the same weights."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.abc import backend_fingerprint
from asyncbackends.adapters._checkpoint import checkpoint_identity

# The first test to use the session engine also waits for its start-up (minutes on a busy 2-core machine).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

EOS = 1  # the tiny tokenizer's </s>


def _hf_greedy(hf_model: Any, prompt: list[int], max_tokens: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(hf_model: Any, prompt: list[int], generated: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + generated])).logits[0].log_softmax(-1)
    return [logits[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(generated)]


def _strip_eos(ids: tuple[int, ...] | list[int]) -> list[int]:
    ids = list(ids)
    return ids[: ids.index(EOS)] if EOS in ids else ids


def test_three_run_batch_calls_in_a_row_from_sync_code(backend: Any) -> None:
    # The seed's bug: the second asyncio.run() on one AsyncLLM fails with EngineDeadError.
    requests = [
        ab.GenerationRequest(f"Once upon a time {i}", ab.SamplingParams(max_tokens=6), request_id=str(i))
        for i in range(8)
    ]
    runs = [ab.run_batch(backend, requests) for _ in range(3)]
    for results in runs:
        assert [r.request_id for r in results] == [str(i) for i in range(8)]
        assert all(len(r.completions) == 1 and r.completions[0].token_ids for r in results)
    assert [r.completions[0].token_ids for r in runs[0]] == [r.completions[0].token_ids for r in runs[2]]


def test_greedy_matches_transformers_and_offline_llm(
    backend: Any,
    hf_model: Any,
    reference_prompts: list[list[int]],
    offline_greedy: list[list[int]],
    reference_max_tokens: int,
) -> None:

    requests = [
        ab.GenerationRequest(ids, ab.SamplingParams(max_tokens=reference_max_tokens))
        for ids in reference_prompts
    ]
    ours = [_strip_eos(r.completions[0].token_ids) for r in ab.run_batch(backend, requests)]
    hf = [_strip_eos(_hf_greedy(hf_model, ids, reference_max_tokens)) for ids in reference_prompts]
    offline = [_strip_eos(ids) for ids in offline_greedy]
    assert all(ours), "every prompt should generate something"
    assert ours == hf
    assert ours == offline


def test_text_prompt_gets_the_tokenizers_special_tokens(backend: Any, hf_tokenizer: Any) -> None:
    text = "The quick brown fox"
    by_text, by_ids = ab.run_batch(
        backend,
        [
            ab.GenerationRequest(text, ab.SamplingParams(max_tokens=8)),
            ab.GenerationRequest(hf_tokenizer(text).input_ids, ab.SamplingParams(max_tokens=8)),
        ],
    )
    assert by_text.prompt_tokens == len(hf_tokenizer(text).input_ids)
    assert by_text.completions[0].token_ids == by_ids.completions[0].token_ids
    assert by_text.completions[0].text == hf_tokenizer.decode(
        list(by_text.completions[0].token_ids), skip_special_tokens=True
    )


def test_chat_prompt_goes_through_the_chat_template(backend: Any, hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
    ]
    rendered = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf_tokenizer(rendered, add_special_tokens=False).input_ids
    assert ids[0] == hf_tokenizer.bos_token_id and ids.count(hf_tokenizer.bos_token_id) == 1
    chat, tokens = ab.run_batch(
        backend,
        [
            ab.GenerationRequest(messages, ab.SamplingParams(max_tokens=8)),
            ab.GenerationRequest(ids, ab.SamplingParams(max_tokens=8)),
        ],
    )
    assert chat.prompt_tokens == len(ids)
    assert chat.completions[0].token_ids == tokens.completions[0].token_ids


def test_logprobs_match_transformers(backend: Any, hf_model: Any, reference_prompts: list[list[int]]) -> None:
    prompt = reference_prompts[0]
    (result,) = ab.run_batch(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=6, logprobs=True))]
    )
    completion = result.completions[0]
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)
    expected = _hf_logprobs(hf_model, prompt, list(completion.token_ids))
    assert completion.logprobs == pytest.approx(expected, abs=1e-3)
    (plain,) = ab.run_batch(backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=6))])
    assert plain.completions[0].logprobs is None


def test_finish_reason_length_and_stop(backend: Any, reference_prompts: list[list[int]]) -> None:
    prompt = reference_prompts[1]
    (free,) = ab.run_batch(backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=10))])
    text = free.completions[0].text
    assert free.completions[0].finish_reason == "length" and len(free.completions[0].token_ids) == 10
    stop = text[len(text) // 2 :][:2].strip() or text[-1]
    (stopped,) = ab.run_batch(
        backend, [ab.GenerationRequest(prompt, ab.SamplingParams(max_tokens=10, stop=(stop,)))]
    )
    assert stopped.completions[0].finish_reason == "stop"
    assert stopped.completions[0].text == text[: text.index(stop)]


def test_n_samples_at_temperature_one_returns_all_of_them(backend: Any) -> None:
    params = ab.SamplingParams(max_tokens=8, temperature=1.0, n=5)
    (result,) = ab.run_batch(backend, [ab.GenerationRequest("Once upon a time", params)])
    assert len(result.completions) == 5
    assert all(len(c.token_ids) >= 1 for c in result.completions)
    assert len({c.token_ids for c in result.completions}) > 1, "five samples at temperature 1 should differ"


def test_same_seed_gives_same_samples(backend: Any) -> None:
    def sample(seed: int) -> list[tuple[int, ...]]:
        params = ab.SamplingParams(max_tokens=8, temperature=1.0, n=3, seed=seed)
        (result,) = ab.run_batch(backend, [ab.GenerationRequest("Paris is the capital of", params)])
        return [c.token_ids for c in result.completions]

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other


def test_n_above_one_at_temperature_zero_is_refused_before_sending(backend: Any) -> None:
    with pytest.raises(ab.InvalidRequestError, match="temperature"):
        ab.GenerationRequest("hi", ab.SamplingParams(n=2, temperature=0.0))
    assert _unfinished(backend) == 0


def test_max_tokens_zero_returns_empty_completions(backend: Any, hf_tokenizer: Any) -> None:
    (result,) = ab.run_batch(
        backend, [ab.GenerationRequest("hi there", ab.SamplingParams(max_tokens=0, n=2, temperature=1))]
    )
    assert [c.text for c in result.completions] == ["", ""]
    assert result.prompt_tokens == len(hf_tokenizer("hi there").input_ids)


def test_a_prompt_the_model_cannot_hold_is_a_context_length_error_and_the_run_goes_on(backend: Any) -> None:
    # vLLM's own check (max_model_len=512): a prompt over it, and one that leaves no room for a token.
    requests = [
        ab.GenerationRequest([5] * 600, request_id="over"),
        ab.GenerationRequest([5] * 8, ab.SamplingParams(max_tokens=4), request_id="fits"),
        ab.GenerationRequest([5] * 512, request_id="full"),
    ]
    metrics = ab.RunMetrics()
    over, fits, full = ab.run_batch(backend, requests, return_exceptions=True, metrics=metrics)
    assert type(over) is ab.ContextLengthError and not over.retryable and over.request_id == "over"
    assert "maximum context length is 512 tokens" in str(over)
    assert type(full) is ab.ContextLengthError and "512" in str(full)
    assert isinstance(fits, ab.GenerationResult) and len(fits.completions[0].token_ids) == 4
    assert metrics.retries == 0 and metrics.errors == {"ContextLengthError": 2}
    assert metrics.context_length_errors == 2
    results = ab.run_batch(backend, [ab.GenerationRequest([100_000])], return_exceptions=True)
    assert type(results[0]) is ab.RequestRejectedError  # refused, but not for its length


def test_gather_from_a_foreign_loop(backend: Any) -> None:
    requests = [ab.GenerationRequest(f"Numbers: {i}", ab.SamplingParams(max_tokens=4)) for i in range(6)]

    async def main() -> list[Any]:
        return await ab.gather(backend, requests)

    first = asyncio.run(main())
    second = asyncio.run(main())  # a second foreign loop: the engine still lives on the shared one
    assert [r.completions[0].token_ids for r in first] == [r.completions[0].token_ids for r in second]
    assert all(len(r.completions[0].token_ids) >= 1 for r in first)


def test_cancelling_a_gather_aborts_engine_requests(backend: Any) -> None:
    requests = [
        ab.GenerationRequest(f"Once upon a time {i}", ab.SamplingParams(max_tokens=480)) for i in range(24)
    ]

    async def main() -> None:
        task = asyncio.ensure_future(ab.gather(backend, requests))
        # Cancel once the engine holds every request (state, not a guess: on a quiet machine the tiny model
        # finishes all 24 in about 1.4 s).
        while _unfinished(backend) < len(requests) and not task.done():  # noqa: ASYNC110 (no event to await)
            await asyncio.sleep(0.005)
        assert not task.done(), "the long generations finished before they could be cancelled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # Cancelling from a foreign loop returns at once; the aborts finish on the shared loop right after.
    deadline = time.monotonic() + 10
    while _unfinished(backend) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _unfinished(backend) == 0
    (after,) = ab.run_batch(
        backend, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=3))], timeout=30
    )
    assert len(after.completions[0].token_ids) >= 1


def test_equal_sampling_params_share_one_engine_object_which_requests_leave_unchanged(backend: Any) -> None:
    from asyncbackends.adapters.vllm._requests import vllm_sampling

    def params(max_tokens: int = 5) -> ab.SamplingParams:
        return ab.SamplingParams(max_tokens=max_tokens, temperature=0.8, top_k=5, stop=("zz",), seed=3)

    shared = vllm_sampling(params())
    assert vllm_sampling(params()) is shared  # equal parameters, distinct objects: one engine object
    assert vllm_sampling(params(6)) is not shared
    assert (shared.max_tokens, shared.temperature, shared.top_k, shared.stop, shared.seed) == (
        5,
        0.8,
        5,
        ["zz"],
        3,
    )
    with_schema = ab.SamplingParams(json_schema={"type": "object"})
    assert vllm_sampling(with_schema) is not vllm_sampling(with_schema)  # a dict the caller may change
    before = repr(shared)
    requests = [ab.GenerationRequest(f"Once upon a time {i}", params()) for i in range(6)]
    first = ab.run_batch(backend, requests)
    second = ab.run_batch(backend, requests)
    assert repr(shared) == before  # the engine copied it before setting anything of a request's own
    # Seeded samples repeat run after run: no request's state travelled through the shared object.
    assert [r.completions[0].token_ids for r in first] == [r.completions[0].token_ids for r in second]
    assert len({r.completions[0].token_ids for r in first}) > 1


def test_fingerprint_names_the_model_and_settings(backend: Any, tiny_model: str) -> None:
    fingerprint = backend.fingerprint
    assert fingerprint["model"] == tiny_model
    assert fingerprint["dtype"] == "float32"
    assert fingerprint["max_model_len"] == 512
    # A local checkpoint is named by its files too (its path alone gave stale hits once retrained in place).
    assert fingerprint["checkpoint"] == checkpoint_identity(tiny_model)
    assert backend_fingerprint(backend)["checkpoint"] == fingerprint["checkpoint"]
    assert "tokenizer_checkpoint" not in fingerprint
    caps = backend.capabilities
    assert (
        caps.loglikelihood and caps.rolling_loglikelihood and caps.n_samples and caps.chat and caps.token_ids
    )
    assert caps.max_concurrency is not None and caps.max_concurrency >= backend.max_num_seqs


def test_unknown_option_names_close_matches(tiny_model: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match="max_num_seqs"):
        ab.create_backend("vllm", model=tiny_model, max_num_seq=8)


def _unfinished(backend: Any) -> int:
    async def count() -> int:
        return int(backend.engine.get_num_unfinished_requests())

    return ab.get_loop_manager().run(count())
