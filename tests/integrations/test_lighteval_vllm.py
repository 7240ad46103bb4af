"""End to end: lighteval's pipeline on local tasks through the vllm adapter (pass@k sampling, loglikelihood).

Loglikelihoods are checked against transformers on the same weights, computed here independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lighteval")
pytest.importorskip("transformers")

import torch
import transformers
from lighteval.models.model_input import GenerationParameters

from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from .lighteval_helpers import custom_tasks_only, details, run_pipeline

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (reported to the adapter).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _reference_logprob(model: Any, tokenizer: Any, context: str, continuation: str) -> float:
    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped) :] + continuation
    context_ids = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    with torch.no_grad():
        logprobs = model(torch.tensor([whole])).logits.float().log_softmax(-1)[0]
    return sum(
        float(logprobs[position - 1, whole[position]]) for position in range(len(context_ids), len(whole))
    )


def test_lighteval_pipeline_on_vllm(
    vllm_backend: Any, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom_tasks_only(monkeypatch)
    config = AsyncBackendsModelConfig(
        model_name="tiny-llama",
        backend="vllm",
        cache_dir=str(tmp_path / "cache"),
        generation_parameters=GenerationParameters(temperature=1.0, seed=1234),
        progress=False,
        use_chat_template=False,  # plain prompts: the reference scores each doc's query as it is
    )
    # The session's engine is shared: wrap it (cleanup then leaves it open).
    model = AsyncBackendsModel(config, backend=vllm_backend)
    pipeline = run_pipeline("ab_mc|0,ab_pass|0", tmp_path / "out", model=model)
    results = pipeline.get_results()["results"]
    assert 0.0 <= results["ab_pass:0"]["pass@k:k=1&n=4"] <= 1.0
    assert 0.0 <= results["ab_mc:0"]["acc"] <= 1.0

    generated = details(pipeline, "ab_pass|0")
    assert len(generated) == 8
    for doc, response in generated:
        assert doc.num_samples == 4
        assert len(response.text) == len(response.output_tokens) == 4
        assert all(0 < len(tokens) <= 8 for tokens in response.output_tokens)  # generation_size=8 tokens
    all_texts = [text for _, response in generated for text in response.text]
    assert len(set(all_texts)) > len(generated)  # samples differ: temperature 1, not four greedy copies

    reference = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    scored = details(pipeline, "ab_mc|0")
    assert len(scored) == 10
    correct = 0
    for doc, response in scored:
        expected = [_reference_logprob(reference, tokenizer, doc.query, choice) for choice in doc.choices]
        assert response.logprobs == pytest.approx(expected, abs=1e-3)
        correct += int(max(range(len(expected)), key=expected.__getitem__) == doc.gold_index)
    assert results["ab_mc:0"]["acc"] == pytest.approx(correct / len(scored))
