"""The JSON bodies and headers `FakeTGIServer` answers with, shaped as TGI's (``Details``, ``Token``...)."""

from __future__ import annotations

import time
from typing import Any

from .model import FakeModel, Generation
from .validation import Limits, ValidRequest

__all__ = ["chat_json", "details_json", "info_json", "stream_events", "timing_headers", "tokens_json"]

_FINISH_OPENAI = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


def tokens_json(gen: Generation) -> list[dict[str, Any]]:
    """The generated tokens as TGI's ``Token`` objects."""
    return [{"id": t.id, "text": t.text, "logprob": t.logprob, "special": t.special} for t in gen.tokens]


def details_json(model: FakeModel, req: ValidRequest, gen: Generation) -> dict[str, Any]:
    """TGI's ``Details``: prefill (when asked for), tokens, finish reason, seed."""
    prefill = []
    if req.decoder_input_details:
        prefill = [
            {"id": t.id, "text": t.text, "logprob": t.logprob}
            for t in model.prefill(req.model_inputs, req.adapter_id)
        ]
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


def stream_events(req: ValidRequest, gen: Generation) -> list[dict[str, Any]]:
    """``/generate_stream``'s ``StreamResponse`` events: one a token, the last with the text and details."""
    tokens = tokens_json(gen)
    events = []
    for index, token in enumerate(tokens):
        event: dict[str, Any] = {"index": index, "token": token, "top_tokens": [], "generated_text": None}
        event["details"] = None
        if index == len(tokens) - 1:
            event["generated_text"] = (req.inputs if req.return_full_text else "") + gen.text
            event["details"] = {
                "finish_reason": gen.finish_reason,
                "generated_tokens": len(tokens),
                "input_length": req.input_length,
                "seed": gen.seed,
            }
        events.append(event)
    return events


def chat_json(model_id: str, req: ValidRequest, gen: Generation, *, logprobs: bool) -> dict[str, Any]:
    """The Messages API's ``ChatCompletion`` for one generation."""
    content: dict[str, Any] | None = None
    if logprobs:
        content = {
            "content": [
                {"token": t.text, "logprob": t.logprob, "top_logprobs": []}
                for t in gen.tokens
                if not t.special
            ]
        }
    return {
        "id": "",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_id,
        "system_fingerprint": "fake-tgi",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": gen.text},
                "logprobs": content,
                "finish_reason": _FINISH_OPENAI[gen.finish_reason],
            }
        ],
        "usage": {
            "prompt_tokens": req.input_length,
            "completion_tokens": len(gen.tokens),
            "total_tokens": req.input_length + len(gen.tokens),
        },
    }


def info_json(model_id: str, limits: Limits, *, legacy: bool, model_sha: str | None = None) -> dict[str, Any]:
    """``GET /info``; ``legacy`` answers as TGI 1.x did (``max_input_length``, not ``max_input_tokens``)."""
    info: dict[str, Any] = {
        "model_id": model_id,
        "model_sha": model_sha,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": limits.max_concurrent_requests,
        "max_best_of": limits.max_best_of,
        "max_stop_sequences": limits.max_stop_sequences,
        "max_input_tokens": limits.max_input_tokens,
        "max_total_tokens": limits.max_total_tokens,
        "validation_workers": 2,
        "max_client_batch_size": 4,
        "router": "text-generation-router",
        "version": "3.3.6-dev0",
        "sha": None,
        "docker_label": None,
    }
    if legacy:
        info["max_input_length"] = info.pop("max_input_tokens")
        info["version"] = "1.4.5"
    return info


def forced_tool_call(response: dict[str, Any], body: Any) -> dict[str, Any]:
    """The chat answer as one tool call where ``body`` forces one (``"required"``: the first tool; a name).

    TGI constrains the model with a grammar from the tool's schema; the look-alike's stand-in for that is
    the smallest arguments valid against it. ``"auto"`` and ``"none"`` answer in text.
    """
    tools = body.get("tools") if isinstance(body, dict) else None
    choice = body.get("tool_choice", "auto") if isinstance(body, dict) else "auto"
    if not tools or choice in ("auto", "none"):
        return response
    from ...adapters._minimal_match import minimal_json

    wanted = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
    function = next(t["function"] for t in tools if t["function"]["name"] == wanted)
    call = {
        "id": "0",
        "type": "function",
        "function": {"name": wanted, "description": None, "arguments": minimal_json(function["arguments"])},
    }
    choice_out = response["choices"][0]
    choice_out["message"] = {"role": "assistant", "tool_calls": [call]}
    choice_out["finish_reason"] = "tool_calls"
    return response
