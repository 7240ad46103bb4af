"""LoRA adapters named per request: the field, the refusals, the cache keys, and `ab.with_adapter`.

The engine-side behaviour (a real vLLM engine serving several adapters) is tested in tests/lora; here the
mock stands in, whose adapters are predictable (its echo starts with ``[name] ``, its scores shift by a salt).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import asyncbackends as ab
from asyncbackends._cache_codec import request_key


def mock(**options: object) -> ab.AsyncBackend:
    return ab.create_backend("mock", adapters=("math", "code"), **options)


@pytest.mark.parametrize("name", ["", " math", "math\n", "a\x00b", 3])
def test_an_adapter_that_is_not_a_name_is_refused_when_the_request_is_built(name: object) -> None:
    for build in (
        lambda: ab.GenerationRequest("hi", adapter=name),  # type: ignore[arg-type]
        lambda: ab.LoglikelihoodRequest("a", "b", adapter=name),  # type: ignore[arg-type]
        lambda: ab.RollingLoglikelihoodRequest("ab", adapter=name),  # type: ignore[arg-type]
    ):
        with pytest.raises(ab.InvalidRequestError, match="adapter"):
            build()


def test_requests_for_several_adapters_and_the_base_are_answered_in_one_run() -> None:
    backend = mock()
    requests = [
        ab.GenerationRequest("hello", adapter="math"),
        ab.GenerationRequest("hello"),
        ab.GenerationRequest("hello", adapter="code"),
        ab.LoglikelihoodRequest("2+2=", "4", adapter="math"),
        ab.LoglikelihoodRequest("2+2=", "4"),
        ab.RollingLoglikelihoodRequest("some text", adapter="code"),
        ab.RollingLoglikelihoodRequest("some text"),
    ]
    results = ab.run_batch(backend, requests)
    texts = [r.text for r in results[:3]]  # type: ignore[union-attr]
    assert texts == ["[math] hello", "hello", "[code] hello"]
    scores = [r.logprob for r in results[3:]]  # type: ignore[union-attr]
    assert scores[0] != scores[1] and scores[2] != scores[3]


def test_an_unknown_adapter_is_refused_before_sending_naming_the_known_ones() -> None:
    backend = mock()
    (error,) = ab.run_batch(backend, [ab.GenerationRequest("hi", adapter="mathh")], return_exceptions=True)
    assert isinstance(error, ab.RequestRejectedError) and not error.retryable
    assert "'mathh'" in str(error) and "'code', 'math'" in str(error)
    assert sum(backend.attempts.values()) == 0  # type: ignore[attr-defined]


class _Unaware(ab.BaseBackend):
    """A third-party backend written before adapters: it would answer from its base model."""

    name = "unaware"
    capabilities = ab.Capabilities()

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        self.calls += 1
        return ab.GenerationResult(request.request_id, (ab.Completion("base"),))

    async def loglikelihood(self, request: ab.LoglikelihoodRequest) -> ab.LoglikelihoodResult:
        self.calls += 1
        return ab.LoglikelihoodResult(request.request_id, -1.0)


def test_gather_refuses_an_adapter_for_a_backend_that_claims_none() -> None:
    for backend in (_Unaware(), ab.create_backend("mock")):
        results = ab.run_batch(
            backend,
            [ab.GenerationRequest("hi", adapter="math"), ab.LoglikelihoodRequest("a", "b", adapter="math")],
            return_exceptions=True,
        )
        for error in results:
            assert isinstance(error, ab.RequestRejectedError), error
            assert "serves no LoRA adapters" in str(error) and "'math'" in str(error)
    assert backend.attempts.total() == 0  # type: ignore[attr-defined]


def test_the_adapter_is_part_of_the_cache_key_and_an_unset_one_is_not() -> None:
    backend = mock()
    base = request_key(backend, ab.GenerationRequest("hi"))
    keys = {request_key(backend, ab.GenerationRequest("hi", adapter=name)) for name in ("math", "code")} | {
        base
    }
    assert len(keys) == 3
    # The general path (loglikelihood requests) leaves an unset adapter out too: old cache files still serve.
    plain = request_key(backend, ab.LoglikelihoodRequest("a", "b"))
    assert plain != request_key(backend, ab.LoglikelihoodRequest("a", "b", adapter="math"))


def test_with_adapter_names_it_on_every_request_and_keeps_the_side_doors() -> None:
    inner = mock(max_model_len=1000)
    backend = ab.with_adapter(inner, "code")
    assert backend.capabilities == inner.capabilities and backend.max_model_len == 1000  # type: ignore[attr-defined]
    results = ab.run_batch(
        backend,
        [
            ab.GenerationRequest("hi"),
            ab.GenerationRequest("hi", adapter="code"),
            ab.LoglikelihoodRequest("a", "b"),
            ab.RollingLoglikelihoodRequest("ab"),
        ],
    )
    direct = ab.run_batch(
        inner,
        [
            ab.GenerationRequest("hi", adapter="code"),
            ab.LoglikelihoodRequest("a", "b", adapter="code"),
            ab.RollingLoglikelihoodRequest("ab", adapter="code"),
        ],
    )
    assert [r.text for r in results[:2]] == ["[code] hi", "[code] hi"]  # type: ignore[union-attr]
    assert [r.logprob for r in results[2:]] == [r.logprob for r in direct[1:]]  # type: ignore[union-attr]
    (error,) = ab.run_batch(backend, [ab.GenerationRequest("hi", adapter="math")], return_exceptions=True)
    assert isinstance(error, ab.InvalidRequestError) and "'math'" in str(error) and "'code'" in str(error)


def test_with_adapter_refuses_a_backend_that_serves_no_adapters() -> None:
    with pytest.raises(ab.InvalidRequestError, match="serves no LoRA adapters"):
        ab.with_adapter(ab.create_backend("mock"), "math")
    with pytest.raises(ab.InvalidRequestError, match="adapter"):
        ab.with_adapter(mock(), " math")


def test_a_cache_never_serves_one_adapters_answers_for_another_or_the_base(tmp_path: Path) -> None:
    cache = tmp_path / "cache.sqlite"
    inner = mock()
    request = ab.GenerationRequest("hi")
    (math,) = ab.run_batch(ab.with_adapter(inner, "math"), [request], cache=cache)
    (code,) = ab.run_batch(ab.with_adapter(inner, "code"), [request], cache=cache)
    (base,) = ab.run_batch(inner, [request], cache=cache)
    assert [math.text, code.text, base.text] == ["[math] hi", "[code] hi", "hi"]  # type: ignore[union-attr]
    assert inner.attempts.total() == 3  # type: ignore[attr-defined]
    (again,) = ab.run_batch(ab.with_adapter(inner, "math"), [request], cache=cache)
    assert again.text == "[math] hi" and inner.attempts.total() == 3  # type: ignore[attr-defined]


def test_wrappers_compose_around_and_inside_with_adapter() -> None:
    inner = mock()
    for backend in (
        ab.limited(ab.with_adapter(inner, "math"), concurrency=2),
        ab.with_adapter(ab.limited(inner, concurrency=2), "math"),
        ab.with_adapter(ab.pool([mock(), mock()]), "math"),
    ):
        (result,) = ab.run_batch(backend, [ab.GenerationRequest("x")])
        assert result.text == "[math] x", backend  # type: ignore[union-attr]
