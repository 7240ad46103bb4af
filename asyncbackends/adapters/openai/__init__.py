"""The ``openai`` adapter: `OpenAIBackend`, any OpenAI-compatible server (docs/adapters/openai.md).

Its parts: the backend (`_backend`), the wire format (`_wire`), provider batches (`_batch`) and scoring
through a vLLM server's echo (`_scoring`); what it shares with ``tgi`` lives in `adapters._http`.
"""

from ._backend import OpenAIBackend

__all__ = ["OpenAIBackend"]
