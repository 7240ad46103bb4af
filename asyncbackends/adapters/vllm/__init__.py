"""The ``vllm`` adapter: `VLLMBackend`, an in-process vLLM engine (the ``vllm`` extra, docs/adapters/vllm.md).

Its parts: the backend and request path (`_backend`), engine planning for ``engines=N`` (`_engine_plan`),
starting and stopping one engine (`_engine_lifecycle`), an engine started again after its engine core died
(`_restart`) and the shared memory a killed one leaves (`_shm`), request and result translation
(`_requests`), chat (`_chat`), the checks made before vLLM is imported (`_checks`), vLLM version differences
(`_compat`) and the batched tokenizer (`_text_encoder`). Importing this package does not import vLLM.
"""

from ._backend import VLLMBackend

__all__ = ["VLLMBackend"]
