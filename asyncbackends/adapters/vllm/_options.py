"""`AdapterOptions`: the ``vllm`` adapter's own options, the ones that are not ``AsyncEngineArgs`` fields.

`VLLMBackend.create` (`_backend`) checks them once and hands the same frozen value to every engine it starts
(`_engine_start`), so ``engines=N`` builds N engines that read one set of options.
"""

from __future__ import annotations

import dataclasses

from .._lora_dirs import LoraModules
from ._restart import DEFAULT_MAX_RESTARTS

__all__ = ["DEFAULT_OPTIONS", "AdapterOptions"]


@dataclasses.dataclass(frozen=True)
class AdapterOptions:
    """What a backend does with its engine beyond the engine's own options (see `VLLMBackend`).

    Args:
        tool_parser: vLLM's name of the tool parser that reads ``tool_choice="auto"`` output (``hermes``,
            ``llama3_json``, ...); without one, ``"auto"`` with tools is refused.
        allow_remote_images: Let the engine fetch http(s) image URLs; off by default (data URLs only).
        reasoning_parser: vLLM's name of the reasoning parser (``deepseek_r1``, ``qwen3``, ...; the engine is
            built with it): a chat's completions come back split into ``reasoning`` and the answer, as ``vllm
            serve --reasoning-parser`` splits them, and stop strings end only the answer (`_reasoning`); a
            text or token prompt's come back whole, as the server's ``/v1/completions`` returns them.
        max_restarts: How many times a dead engine core is started again over the backend's life (`_restart`).
        lora_modules: The LoRA adapters requests may name, read once (`read_lora_modules`); ``None``: the base
            only.
    """

    tool_parser: str | None = None
    allow_remote_images: bool = False
    reasoning_parser: str | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    lora_modules: LoraModules | None = None


DEFAULT_OPTIONS = AdapterOptions()
"""Every adapter option at its default."""
