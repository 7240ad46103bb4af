"""Two vLLM engines, each in a Ray actor, against the in-process vllm adapter on the tiny model.

The in-process engine runs first and is closed before the actors start (one engine at a time in memory):
its greedy generations, scores and an lm-eval run are the reference. Then two actors (one CPU each) must
give the same greedy token ids and texts, the same scores, and lm-eval's evaluator, run through the
``ray`` backend on the local tasks in tests/data, must give the same per-sample answers and metrics.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab

from .conftest import make_ray_backend

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed", allow_module_level=True)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a loaded 2-core machine: three engine start-ups and two lm-eval runs
    pytest.mark.usefixtures("ray_cluster"),
    # vLLM's engine shutdown leaves a ZMQ context for the garbage collector (as in tests/vllm).
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ENGINE_OPTIONS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}
PROMPTS = (
    "The quick brown fox",
    "Paris is the capital of",
    "Question: What is two plus two? Answer:",
    "def add(a, b):",
    "Once upon a time",
    "Numbers: 1 2 3",
)
LM_EVAL_TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval_tasks"
TASKS = ["ab_mc", "ab_gen", "ab_ppl"]


def _requests() -> list[ab.Request]:
    greedy = ab.SamplingParams(max_tokens=12)
    generations: list[ab.Request] = [
        ab.GenerationRequest(p, greedy, request_id=f"g{i}") for i, p in enumerate(PROMPTS)
    ]
    scores: list[ab.Request] = [
        ab.LoglikelihoodRequest(p, " the", request_id=f"s{i}") for i, p in enumerate(PROMPTS)
    ]
    return generations + scores


def _evaluate(backend: Any) -> dict[str, Any]:
    pytest.importorskip("lm_eval")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    with pytest.MonkeyPatch.context() as mp:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            mp.setenv(name, "1")
        results = lm_eval.simple_evaluate(
            model=AsyncBackendsLM(backend, progress=False),  # wraps the backend; never closes it
            tasks=TASKS,
            task_manager=TaskManager(include_path=str(LM_EVAL_TASKS), include_defaults=False),
            log_samples=True,
        )
    assert results is not None
    return results


@pytest.fixture(scope="module")
def tiny_model() -> str:
    from asyncbackends.testing.tiny_model import build_tiny_model

    return str(build_tiny_model())


@pytest.fixture(scope="module")
def reference(tiny_model: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        backend = ab.create_backend("vllm", model=tiny_model, **ENGINE_OPTIONS)
    try:
        return {"results": ab.run_batch(backend, _requests()), "lm_eval": _evaluate(backend)}
    finally:
        backend.close()  # gone before the actors start: one engine's memory at a time


@pytest.fixture(scope="module")
def ray_vllm(tiny_model: str, reference: dict[str, Any]) -> Iterator[Any]:
    backend = make_ray_backend(
        "vllm",
        replicas=2,
        options={"model": tiny_model, **ENGINE_OPTIONS},
        actor_options={"num_cpus": 1, "runtime_env": {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1"}}},
        start_timeout=600,
    )
    yield backend
    backend.close()


def test_two_vllm_actors_match_the_in_process_adapter(ray_vllm: Any, reference: dict[str, Any]) -> None:
    assert len({r.pid for r in ray_vllm.replicas}) == 2
    assert ray_vllm.fingerprint["name"] == "vllm"
    got = ab.run_batch(ray_vllm, _requests(), concurrency=8)
    want = reference["results"]
    for ours, ref in zip(got, want, strict=True):
        assert ours.request_id == ref.request_id
        if isinstance(ref, ab.GenerationResult):
            assert ours.completions[0].token_ids == ref.completions[0].token_ids, ref.request_id
            assert ours.text == ref.text
        else:
            assert ours.logprob == pytest.approx(ref.logprob, abs=1e-4), ref.request_id
            assert ours.is_greedy == ref.is_greedy
    assert any(r.text for r in got if isinstance(r, ab.GenerationResult))  # the model does write something
    served = [s.successes for s in ray_vllm.replica_stats()]
    assert all(n > 0 for n in served), served  # both engines took a share


def test_lm_eval_runs_its_tasks_through_ray(ray_vllm: Any, reference: dict[str, Any]) -> None:
    ours, ref = _evaluate(ray_vllm), reference["lm_eval"]
    for task in TASKS:

        def by_doc(results: dict[str, Any], task: str = task) -> list[Any]:
            return [s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]

        got, want = by_doc(ours), by_doc(ref)
        assert len(got) == len(want) > 0
        if task == "ab_gen":
            assert got == want
        else:  # loglikelihoods (and is-greedy flags) per choice, or per text for perplexity
            leaves, ref_leaves = list(_leaves(got)), list(_leaves(want))
            assert [type(x) for x in leaves] == [type(x) for x in ref_leaves]
            for x, y in zip(leaves, ref_leaves, strict=True):
                assert x == (pytest.approx(y, abs=1e-3) if isinstance(y, float) else y), task
        for metric, value in ref["results"][task].items():
            if isinstance(value, float) and "stderr" not in metric:
                assert ours["results"][task][metric] == pytest.approx(value, rel=1e-4), (task, metric)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value
