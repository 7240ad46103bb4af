"""Where vLLM's logs go once the library imports it: standard error, unless the user chose otherwise.

vLLM logs to standard output by default (its ``VLLM_LOGGING_STREAM`` is ``ext://sys.stdout``), so a script
that prints one result gets some forty lines of engine logs around it, and piping its output breaks. The
stream is read when vLLM is imported, in this process and in each engine process it starts (which inherit
the environment), so `route_vllm_logs_to_stderr` sets it before the adapter imports vLLM. A user who chose
already keeps the choice: ``VLLM_LOGGING_STREAM`` set, a logging config file (``VLLM_LOGGING_CONFIG_PATH``),
or vLLM's logging configuration turned off (``VLLM_CONFIGURE_LOGGING=0``: its records reach the user's own).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["route_vllm_logs_to_stderr"]

_STREAM = "VLLM_LOGGING_STREAM"


def route_vllm_logs_to_stderr(environ: MutableMapping[str, str] | None = None) -> None:
    """Send vLLM's logs to standard error (``environ``, ``os.environ`` by default), unless the user chose."""
    env = os.environ if environ is None else environ
    chosen = _STREAM in env or "VLLM_LOGGING_CONFIG_PATH" in env
    if chosen or env.get("VLLM_CONFIGURE_LOGGING", "1").strip() == "0":
        return
    env[_STREAM] = "ext://sys.stderr"
