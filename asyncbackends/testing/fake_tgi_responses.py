"""The JSON bodies and headers `FakeTGIServer` answers with, shaped as TGI's (``Details``, ``Token``...)."""

from __future__ import annotations

import time
from typing import Any

from .fake_tgi_model import FakeModel, Generation
from .fake_tgi_validation import ValidRequest

__all__ = ["details_json", "timing_headers", "tokens_json"]


def tokens_json(gen: Generation) -> list[dict[str, Any]]:
    """The generated tokens as TGI's ``Token`` objects."""
    return [{"id": t.id, "text": t.text, "logprob": t.logprob, "special": t.special} for t in gen.tokens]


def details_json(model: FakeModel, req: ValidRequest, gen: Generation) -> dict[str, Any]:
    """TGI's ``Details``: prefill (when asked for), tokens, finish reason, seed."""
    prefill = []
    if req.decoder_input_details:
        prefill = [{"id": t.id, "text": t.text, "logprob": t.logprob} for t in model.prefill(req.inputs)]
    return {
        "finish_reason": gen.finish_reason,
        "generated_tokens": len(gen.tokens),
        "seed": gen.seed,
        "prefill": prefill,
        "tokens": tokens_json(gen),
        "top_tokens": [],
    }


def timing_headers(req: ValidRequest, gen: Generation, started: float) -> dict[str, str]:
    """The ``x-*`` headers TGI sets on a generation: timings and token counts."""
    total_ms = str(int((time.monotonic() - started) * 1000))
    return {
        "x-compute-type": "cpu+fake",
        "x-compute-time": total_ms,
        "x-compute-characters": str(len(req.inputs)),
        "x-total-time": total_ms,
        "x-validation-time": "0",
        "x-queue-time": "0",
        "x-inference-time": total_ms,
        "x-time-per-token": str(int(total_ms) // max(1, len(gen.tokens))),
        "x-prompt-tokens": str(req.input_length),
        "x-generated-tokens": str(len(gen.tokens)),
        "x-total-tokens": str(req.input_length + len(gen.tokens)),
    }
