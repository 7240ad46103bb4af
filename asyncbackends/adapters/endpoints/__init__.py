"""The ``endpoints`` adapter: `EndpointsBackend`, Hugging Face Inference Endpoints.

See docs/adapters/endpoints.md.

Its parts: the backend (`_backend`), which speaks TGI's or OpenAI's wire through those adapters, and the
endpoint's lifecycle (`_lifecycle`: create, resume, wake, wait, pause or delete on close).
"""

from ._backend import EndpointsBackend

__all__ = ["EndpointsBackend"]
