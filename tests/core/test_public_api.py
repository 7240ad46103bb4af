from __future__ import annotations

import inspect
import re
from pathlib import Path

import asyncbackends as ab

# The names DESIGN.md's public API promises (code outside the project calls exactly these).
CONTRACT = {
    "SamplingParams", "GenerationRequest", "GenerationResult", "Completion", "LoglikelihoodRequest",
    "LoglikelihoodResult", "AsyncBackend", "Capabilities", "create_backend", "acreate_backend",
    "register_backend", "available_backends", "gather", "as_completed", "run_batch", "RetryPolicy",
    "RateLimit", "get_loop_manager", "LoopManager", "AsyncBackendsError", "BackendNotFoundError", "LoopError",
    "InvalidRequestError", "BackendError", "BackendUnavailableError", "RateLimitedError", "BackendTimeoutError",
    "RequestRejectedError", "BackendBrokenError", "BackendClosedError", "pool",
}  # fmt: skip


def test_all_equals_the_public_names() -> None:
    public = {
        name
        for name, value in vars(ab).items()
        if (not name.startswith("_") or name == "__version__") and not inspect.ismodule(value)
    }
    assert set(ab.__all__) == public
    assert callable(ab.gather) and not inspect.ismodule(ab.gather)  # not shadowed by the submodule
    assert len(ab.__all__) == len(set(ab.__all__))


def test_contract_names_are_exported() -> None:
    assert set(ab.__all__) >= CONTRACT


def test_defaults_match_the_design() -> None:
    assert ab.RetryPolicy() == ab.RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=30.0, jitter=True)
    assert ab.RateLimit() == ab.RateLimit(requests_per_second=None, tokens_per_minute=None)
    params = ab.SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.stop, params.n) == (
        256, 0.0, 1.0, None, (), 1,
    )  # fmt: skip
    assert (params.seed, params.logprobs) == (None, False)


def test_changelog_has_an_unreleased_section() -> None:
    text = (Path(__file__).parents[2] / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", text, re.M)
