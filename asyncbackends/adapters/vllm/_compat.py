"""vLLM exception classes under one set of names, whichever vLLM release is installed.

The adapter is written against vLLM's newer exception tree (``VLLMError`` > ``VLLMClientError`` for
request validation, ``GracefulHTTPError`` for the engine's queue limits). Older releases (0.26, the newest
that pins the torch of some CUDA 13 GPU images) have none of the three: their validation errors are
``ValueError`` subclasses or plain ``ValueError`` (vLLM's own ``AsyncLLM.generate`` treats any
``ValueError`` as a bad request), and they have no queue limits to report. This module gives the adapter
the same names with the same meaning on both, so its ``except`` clauses need no version checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["GracefulHTTPError", "VLLMClientError", "VLLMError"]

if TYPE_CHECKING:
    from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMError
else:
    try:
        from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMError
    except ImportError:  # vLLM <= 0.26
        from vllm.exceptions import VLLMNotFoundError

        class GracefulHTTPError(Exception):
            """Stands in for the queue-limit error: such a vLLM has no queue limits, so it never raises it."""

        # Every option or sampling-parameter error such a vLLM raises is a ValueError.
        VLLMError = ValueError
        # A tuple is a valid ``except`` target: the request errors of such a vLLM have no common base.
        VLLMClientError = (ValueError, VLLMNotFoundError)
