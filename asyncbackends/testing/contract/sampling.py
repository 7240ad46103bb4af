"""Contract checks for the optional sampling parameters: a claimed one is honoured, an unclaimed one refused.

`Capabilities` has a flag for each of `OPTIONAL_SAMPLING_PARAMS`. A backend that claims one must accept it
(those acting on logits: `SamplingParamSpec.needs_logits`), honour it where the output shows it
(``min_tokens`` makes the completion that long, a ``regex`` output matches it in full, a ``json_schema``
output parses and is valid against the schema, with ``jsonschema`` when it is installed); a backend that does
not claim one must refuse a request setting it with `RequestRejectedError` naming it, never run the request
without it. The values sent are the table's examples (`asyncbackends._sampling_table`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from ..._protocol import AsyncBackend
from ..._sampling_table import OPTIONAL_SPECS
from ..._types import OPTIONAL_SAMPLING_PARAMS
from ...errors import RequestRejectedError
from ._base import ContractBase, expect

__all__ = ["SamplingContract"]

# A value each optional parameter accepts everywhere it is honoured (and one that changes outputs).
_VALUES: dict[str, Any] = {spec.name: spec.example for spec in OPTIONAL_SPECS}
_LOGIT_PARAMS = [spec.name for spec in OPTIONAL_SPECS if spec.needs_logits]


class SamplingContract(ContractBase):
    """Optional sampling parameters: honoured where claimed, refused with `RequestRejectedError` otherwise.

    Knobs: ``structured_max_tokens`` (room for a constrained output to finish), ``sampling_regex`` and
    ``sampling_json_schema`` (short, closed constraints a model of random weights can satisfy).
    """

    structured_max_tokens: ClassVar[int] = 64
    """Tokens a regex or JSON Schema output may take: enough for the constraint to close."""
    sampling_regex: ClassVar[str] = _VALUES["regex"]
    """The regex the structured-output check asks for."""
    sampling_json_schema: ClassVar[Mapping[str, Any]] = _VALUES["json_schema"]
    """The JSON Schema the structured-output check asks for."""

    def test_unclaimed_sampling_params_refused(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """Each optional parameter the backend does not claim is refused, naming it, not dropped."""
        unclaimed = [n for n in OPTIONAL_SAMPLING_PARAMS if not getattr(backend.capabilities, n)]
        if not unclaimed:
            pytest.skip(f"backend {backend.name!r} claims every optional sampling parameter")
        for name in unclaimed:
            try:
                result = self.generate(
                    backend, prompts[0], request_id=f"refuse-{name}", **{name: _VALUES[name]}
                )
            except RequestRejectedError as exc:
                expect(name in str(exc), f"the refusal of {name} does not name it: {exc}")
                continue
            expect(
                False,
                f"capabilities.{name} is False but a request with {name} was answered ({result.text!r}) "
                "instead of refused with RequestRejectedError",
            )

    @pytest.mark.parametrize("name", _LOGIT_PARAMS)
    def test_claimed_logit_params_accepted(
        self, backend: AsyncBackend, prompts: Sequence[str], name: str
    ) -> None:
        """A claimed parameter acting on logits is accepted, greedy and seeded-sampled, and yields outputs."""
        self.require(backend, name)
        sampled = {"temperature": 1.0, "seed": 0} if backend.capabilities.seed else {"temperature": 1.0}
        for extra in ({}, sampled):
            result = self.generate(
                backend, prompts[0], request_id=f"claim-{name}", **{name: _VALUES[name]}, **extra
            )
            expect(len(result.completions) == 1, f"{name}: {len(result.completions)} completions for n=1")

    def test_claimed_min_tokens_honoured(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """With ``min_tokens == max_tokens`` every completion runs to the token limit."""
        self.require(backend, "min_tokens")
        for index, prompt in enumerate(prompts[:2]):
            result = self.generate(
                backend, prompt, request_id=f"min-tokens-{index}", min_tokens=self.max_tokens
            )
            completion = result.completions[0]
            if completion.token_ids:
                expect(
                    len(completion.token_ids) == self.max_tokens,
                    f"min_tokens={self.max_tokens}: {len(completion.token_ids)} tokens generated",
                )
            expect(
                completion.finish_reason == "length",
                f"min_tokens=max_tokens={self.max_tokens}: finish_reason {completion.finish_reason!r}, "
                "not 'length' (the completion ended early)",
            )

    def test_claimed_regex_matched(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A claimed ``regex`` constrains every completion to match it in full."""
        self.require(backend, "regex")
        for index, prompt in enumerate(prompts[:2]):
            result = self.generate(
                backend,
                prompt,
                request_id=f"regex-{index}",
                regex=self.sampling_regex,
                max_tokens=self.structured_max_tokens,
            )
            expect(
                re.fullmatch(self.sampling_regex, result.text) is not None,
                f"regex {self.sampling_regex!r}: the output {result.text!r} does not match it",
            )

    def test_claimed_json_schema_parses(self, backend: AsyncBackend, prompts: Sequence[str]) -> None:
        """A claimed ``json_schema`` makes every completion JSON valid against the schema."""
        self.require(backend, "json_schema")
        for index, prompt in enumerate(prompts[:2]):
            result = self.generate(
                backend,
                prompt,
                request_id=f"json-{index}",
                json_schema=self.sampling_json_schema,
                max_tokens=self.structured_max_tokens,
            )
            try:
                value = json.loads(result.text)
            except ValueError as exc:
                expect(False, f"json_schema: the output {result.text!r} is not JSON ({exc})")
            problem = _schema_problem(value, self.sampling_json_schema)
            expect(problem is None, f"json_schema: the output {result.text!r} breaks the schema: {problem}")


def _schema_problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    try:
        import jsonschema
    except ModuleNotFoundError:  # the suite ships in the wheel; jsonschema is a test dependency
        required = schema.get("required", ())
        if schema.get("type") == "object" and not (isinstance(value, dict) and set(required) <= set(value)):
            return f"not an object with the required keys {list(required)}"
        return None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    return None if error is None else error.message
