"""The ``vllm`` adapter: `VLLMBackend`, an in-process vLLM engine (the ``vllm`` extra, docs/adapters/vllm.md).

Its parts: the backend and request path (`_backend`), its own options (`_options`), starting its engines
(`_engine_start`) as planned for ``engines=N`` (`_engine_plan`) behind one pool (`_engine_pool`), starting
and stopping one engine (`_engine_lifecycle`), one engine request sent and its errors translated
(`_engine_calls`), an engine started again after its engine core died (`_restart`) and the shared memory a
killed one leaves (`_shm`), request and result translation (`_requests`), chat (`_chat`), reasoning
(`_reasoning`), loglikelihood requests (`_loglikelihoods`, `_scoring_path`), LoRA adapters (`_lora`), the
checks made before vLLM is imported (`_checks`), vLLM version differences (`_compat`) and the batched
tokenizer (`_text_encoder`). Importing this package does not import vLLM.
"""

from ._backend import VLLMBackend

__all__ = ["VLLMBackend"]
