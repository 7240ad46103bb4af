"""LoRA adapters on the OpenAI look-alike (`fake_openai_stream.FakeOpenAIServer`), as ``vllm serve`` has them.

What vLLM 0.32's server does (``vllm/entrypoints/openai/models/serving.py`` and
``vllm/entrypoints/serve/engine/serving.py``, ``serve/lora/api_router.py``):

- each adapter is a model of its own: ``GET /v1/models`` lists the base, then each adapter as ``{"id": name,
  "root": path, "parent": base}``; a request's ``model`` names one;
- a ``model`` that is neither is ``404 {"error": {"message": "The model `x` does not exist. Valid aliases:
  base.", "type": "NotFoundError", "param": "model", "code": 404}}``;
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` exists only with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (else FastAPI's ``404 {"detail": "Not Found"}``); it answers 200
  with the text ``Success: LoRA adapter 'x' added successfully.``, 400 ``InvalidUserInput`` for a missing
  field, a base model's name or a name already loaded, and 404 ``NotFoundError`` ("Loading lora x failed: No
  adapter found for path") for a path that holds no adapter (here: no ``adapter_config.json`` in it).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["ServedAdapters"]


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """The ``ErrorResponse`` of vLLM: ``code`` is the HTTP status, as an int."""
    error = {"message": message, "type": kind, "param": param, "code": status}
    return web.json_response({"error": error}, status=status)


class ServedAdapters:
    """The adapters a look-alike serves, and its ``/v1/load_lora_adapter`` route.

    Args:
        base: The base model's name.
        modules: Adapters served from the start, by name: their paths (``--lora-modules name=path``).
        runtime_loading: Whether ``POST /v1/load_lora_adapter`` exists (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
        load_delay: Seconds a load takes (a real one reads the weights), so that loads can overlap.
    """

    def __init__(
        self, base: str, modules: Mapping[str, str], *, runtime_loading: bool, load_delay: float = 0.0
    ) -> None:
        self.base = base
        self.modules = dict(modules)
        self.runtime_loading = runtime_loading
        self.load_delay = load_delay
        self.load_requests: Counter[str] = Counter()  # POST /v1/load_lora_adapter by lora_name, any answer
        self._locks: dict[str, asyncio.Lock] = {}

    def route(self, app: web.Application) -> None:
        """Add the load route to ``app`` where runtime loading is on (vLLM registers it only then)."""
        if self.runtime_loading:
            app.router.add_post("/v1/load_lora_adapter", self._load)

    def entries(self, owned_by: str) -> list[dict[str, Any]]:
        """The adapters' ``/v1/models`` entries (after the base's), as vLLM lists them."""
        return [
            {"id": name, "object": "model", "owned_by": owned_by, "root": path, "parent": self.base}
            for name, path in self.modules.items()
        ]

    def adapter(self, model: Any) -> str | None:
        """The adapter a request's ``model`` names (``None``: the base, or no model given)."""
        return model if isinstance(model, str) and model in self.modules else None

    def refusal(self, model: Any) -> web.Response | None:
        """The 404 vLLM answers for a ``model`` neither the base nor an adapter; ``None`` when served."""
        if not model or model == self.base or model in self.modules:
            return None
        return _error(
            404,
            f"The model `{model}` does not exist. Valid aliases: {self.base}.",
            "NotFoundError",
            "model",
        )

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        self.load_requests[str(name)] += 1
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        async with self._locks.setdefault(name, asyncio.Lock()):  # vLLM's per-name lock
            if name == self.base:
                message = f"The lora adapter '{name}' conflicts with a served base model."
                return _error(400, message, "InvalidUserInput")
            if name in self.modules and not body.get("load_inplace"):
                message = (
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                    "place, set 'load_inplace' to True."
                )
                return _error(400, message, "InvalidUserInput")
            if self.load_delay:
                await asyncio.sleep(self.load_delay)
            if not (Path(path) / "adapter_config.json").is_file():
                message = f"Loading lora {name} failed: No adapter found for {path}"
                return _error(404, message, "NotFoundError")
            self.modules[name] = path
        return web.Response(status=200, text=f"Success: LoRA adapter '{name}' added successfully.")
