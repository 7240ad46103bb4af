"""lm-eval's generation kwargs for the optional sampling parameters: mapped, refused, or opted out of."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance

import asyncbackends as ab
from asyncbackends.integrations.lm_eval import AsyncBackendsLM


@pytest.fixture
def lm() -> Any:
    model = AsyncBackendsLM("mock", progress=False)
    yield model
    model.close()


def test_optional_keys_pass_through(lm: Any) -> None:
    params = lm.sampling_params(
        {
            "until": ["\\n"],
            "do_sample": True,
            "temperature": 0.7,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.2,
            "frequency_penalty": -0.3,
            "min_p": 0.05,
            "min_new_tokens": 3,
        }
    )
    assert params.optional_params() == {
        "repetition_penalty": 1.1,
        "presence_penalty": 0.2,
        "frequency_penalty": -0.3,
        "min_p": 0.05,
        "min_tokens": 3,
    }
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert lm.sampling_params({"json_schema": schema}).json_schema == schema
    assert lm.sampling_params({"regex": "[0-9]+", "min_tokens": 1}).regex == "[0-9]+"


def test_default_valued_beam_keys_ask_for_nothing(lm: Any) -> None:
    assert lm.sampling_params({"num_beams": 1, "num_return_sequences": 1}) == lm.sampling_params({})


def test_opt_out_drops_a_key_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    lm = AsyncBackendsLM("mock", progress=False, ignore_gen_kwargs="num_beams|length_penalty")
    try:
        for _ in range(2):
            lm.sampling_params({"num_beams": 4, "length_penalty": 0.5})
        assert lm.ignore_gen_kwargs == {"num_beams", "length_penalty"}
        warnings = [r for r in caplog.records if "num_beams" in r.getMessage()]
        assert len(warnings) == 1
        with pytest.raises(ab.InvalidRequestError, match="early_stopping"):
            lm.sampling_params({"early_stopping": True})
    finally:
        lm.close()


def test_a_parameter_the_backend_cannot_honour_fails_the_run(lm: Any) -> None:
    # The mock has no logits: a task asking for repetition_penalty is refused, not run without it.
    request = Instance("generate_until", {}, ("abc", {"until": [], "repetition_penalty": 1.3}), 0)
    with pytest.raises(ab.RequestRejectedError, match="repetition_penalty"):
        lm.generate_until([request])
    constrained = Instance("generate_until", {}, ("abc", {"until": [], "regex": "(yes|no)"}), 0)
    assert lm.generate_until([constrained]) == ["yes"]
