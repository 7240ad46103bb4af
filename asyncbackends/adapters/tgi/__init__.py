"""The ``tgi`` adapter: `TGIBackend`, Hugging Face Text Generation Inference (docs/adapters/tgi.md).

Its parts: the backend (`_backend`) and TGI's wire format (`_wire`); the HTTP pieces it shares with ``openai``
live in `asyncbackends.adapters._http`.
"""

from ._backend import TGIBackend

__all__ = ["TGIBackend"]
