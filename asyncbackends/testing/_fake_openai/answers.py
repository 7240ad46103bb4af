"""The deterministic answers of the OpenAI look-alike (`fake_openai_batches`), shared by both paths.

`answer` turns one ``/v1/completions`` or ``/v1/chat/completions`` body into the HTTP status and body the
server answers, the same whether the request came alone or as a batch line, so a batch run's results can
be compared with the plain path's. The text is drawn from a digest of the prompt and the sampling fields,
``max_tokens`` words long (cut at the first ``stop`` string). Prompts carrying a marker fail as a real
server would: ``[reject]`` with a 400 ``invalid_request_error``, ``[fail]`` with a 500 ``server_error``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["answer", "error_body", "line_key"]

_VOCABULARY = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
)  # fmt: skip


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def line_key(path: str, body: Any) -> str:
    """What identifies one generation request: its endpoint and canonical body (for the counters)."""
    return path + " " + json.dumps(body, sort_keys=True, separators=(",", ":"))


def _prompt_text(chat: bool, body: Mapping[str, Any]) -> str:
    if not chat:
        prompt = body["prompt"]
        return prompt if isinstance(prompt, str) else " ".join(str(int(t)) for t in prompt)
    parts = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "\n".join(parts)


def _choice(text: str, body: Mapping[str, Any], index: int, chat: bool) -> tuple[dict[str, Any], int]:
    fields = [text, body.get("temperature"), body.get("top_p"), body.get("seed"), index]
    digest = hashlib.sha256(json.dumps(fields).encode()).digest()
    count = int(body.get("max_tokens") or 16)
    words = [_VOCABULARY[digest[i % len(digest)] % len(_VOCABULARY)] for i in range(count)]
    logprobs = [-((digest[(i + 7) % len(digest)] % 50) / 10) for i in range(count)]
    output, finish = " " + " ".join(words), "length"
    stops = body.get("stop") or []
    for stop in [stops] if isinstance(stops, str) else stops:
        cut = output.find(stop)
        if cut >= 0:
            output, finish = output[:cut], "stop"
            kept = len(output.split())
            words, logprobs = words[:kept], logprobs[:kept]
    choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
    want = body.get("logprobs")
    if chat:
        choice["message"] = {"role": "assistant", "content": output}
        if want:
            content: list[dict[str, Any]] = [
                {"token": w, "logprob": p, "bytes": None, "top_logprobs": []}
                for w, p in zip(words, logprobs, strict=True)
            ]
            choice["logprobs"] = {"content": content}
    else:
        choice["text"] = output
        if want is not None and want is not False:
            choice["logprobs"] = {"tokens": words, "token_logprobs": logprobs, "top_logprobs": None}
    return choice, len(words)


def answer(path: str, body: Any, model: str, adapters: Collection[str] = ()) -> tuple[int, dict[str, Any]]:
    """The status and body the look-alike answers for one generation request on ``path``.

    A ``model`` in ``adapters`` (LoRA adapters served beside the base) is answered as that adapter: each
    choice's text starts with ``[name]`` (as the mock's adapters answer) and the answer names it.
    """
    chat = path.endswith("/chat/completions")
    if not isinstance(body, Mapping):
        return 400, error_body("the body must be a JSON object", "invalid_request_error")
    adapter = body.get("model") if body.get("model") in adapters else None
    if body.get("model") != model and adapter is None:
        message = f"The model `{body.get('model')}` does not exist or you do not have access to it."
        return 404, error_body(message, "invalid_request_error", "model_not_found", "model")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return 400, error_body(
            "max_tokens must be an integer >= 1", "invalid_request_error", None, "max_tokens"
        )
    try:
        text = _prompt_text(chat, body)
    except (KeyError, TypeError, ValueError, AttributeError):
        field = "messages" if chat else "prompt"
        return 400, error_body(f"'{field}' is missing or malformed", "invalid_request_error", None, field)
    if "[reject]" in text:
        return 400, error_body("the prompt was refused ([reject])", "invalid_request_error", None, "prompt")
    if "[fail]" in text:
        return 500, error_body("the server had an error ([fail])", "server_error")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return 400, error_body("n must be an integer >= 1", "invalid_request_error", None, "n")
    choices, generated = [], 0
    for index in range(n):
        choice, count = _choice(text, body, index, chat)
        if adapter is not None:
            holder = choice["message"] if chat else choice
            holder["content" if chat else "text"] = f"[{adapter}]" + holder["content" if chat else "text"]
        choices.append(choice)
        generated += count
    prompt_tokens = len(text.split())
    digest = hashlib.sha256(line_key(path, body).encode()).hexdigest()[:24]
    return 200, {
        "id": ("chatcmpl-" if chat else "cmpl-") + digest,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": adapter or model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
        },
    }
