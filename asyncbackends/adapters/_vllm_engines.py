"""Several ``AsyncLLM`` engines behind one ``vllm`` backend: ``create_backend("vllm", model=..., engines=N)``.

Why: one engine core is a CPU-bound Python loop; with a small model it cannot keep a big GPU busy (issue 29:
on one H200 a 1B-shaped model ran 2.8-2.9x vLLM's offline ``LLM.generate`` with 6 engines, while an 8B-shaped
one ran 0.90x with 2). The engines are replicas of a `PoolBackend` (its router, failover, ``affinity``
routing, `replica_stats`), labelled ``engine-0``, ``engine-1``...

This module holds the plan (pure, tested without vLLM): which device each engine gets, how the user's memory
settings are split, and what ``engines="auto"`` picks; and the building of the engines from that plan.

Memory: the user's ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` and ``VLLM_CPU_KVCACHE_SPACE`` are
the total for a device, divided between the engines placed on it. On a CPU, ``VLLM_CPU_KVCACHE_SPACE`` wins
over ``kv_cache_memory_bytes`` (as in vLLM, whose CPU platform overwrites the option with it); being whole
GiB, it is turned into each engine's ``kv_cache_memory_bytes`` and hidden from that engine's start.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._wrappers.pool import PoolBackend
from ..errors import InvalidRequestError

__all__ = [
    "AUTO_ENGINES_PER_GPU",
    "AUTO_MAX_PARAMETERS",
    "EnginePlan",
    "VLLMEnginesBackend",
    "auto_engines",
    "check_engines",
    "estimate_parameters",
    "plan_engines",
]

AUTO_MAX_PARAMETERS = 1.5e9
"""``engines="auto"`` runs several engines a GPU only for models up to this many parameters (the 1B-shaped
model measured, ~1.1e9, gained; the 8B-shaped one, ~7.2e9, lost 10% with 2; nothing between was measured)."""
AUTO_ENGINES_PER_GPU = 6
"""Engines a GPU for such a model: on one H200, 6 gave 2.90x and 2.82x offline (4: 2.25-2.63x; 8: 2.83x, no
better than 6)."""

_ROUTINGS = ("least_loaded", "affinity")
_CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
_PARALLEL_OPTIONS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
# vLLM's own default when neither gpu_memory_utilization nor kv_cache_memory_bytes is given (EngineArgs).
_DEFAULT_UTILIZATION = 0.92
_GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class EnginePlan:
    """How one engine of several is started.

    Attributes:
        label: Its replica label, ``engine-<i>``.
        options: Its engine arguments (the user's, with its share of the memory).
        env: Environment overrides while it starts (``None`` removes a variable); its processes inherit them.
        device: The device it runs on (a ``CUDA_VISIBLE_DEVICES`` entry), ``None`` on a CPU or the one GPU.
    """

    label: str
    options: dict[str, Any]
    env: dict[str, str | None]
    device: str | None


def check_engines(engines: Any, routing: str | None, options: Mapping[str, Any]) -> int | str:
    """Validate ``engines`` (an int >= 1 or ``"auto"``) and ``routing`` before anything is imported.

    Raises:
        InvalidRequestError: A bad count, ``routing`` with one engine, or engines with a parallel setting.
    """
    if engines == "auto":
        count: int | str = "auto"
    elif isinstance(engines, int) and not isinstance(engines, bool) and engines >= 1:
        count = engines
    else:
        raise InvalidRequestError(f"engines must be an int >= 1 or 'auto', got {engines!r}")
    if routing is not None and routing not in _ROUTINGS:
        raise InvalidRequestError(f"routing must be one of {', '.join(_ROUTINGS)}, got {routing!r}")
    if routing is not None and count == 1:
        raise InvalidRequestError("routing= needs engines > 1 (or 'auto'): one engine has nothing to route")
    if count != 1:
        parallel = [k for k in _PARALLEL_OPTIONS if _as_int(options.get(k, 1)) != 1]
        if parallel:
            raise InvalidRequestError(
                f"engines= runs single-device engines; it cannot be combined with {', '.join(parallel)} > 1"
            )
    return count


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def visible_devices(environ: Mapping[str, str], device_count: int) -> list[str]:
    """The GPUs engines are spread over: ``CUDA_VISIBLE_DEVICES``'s entries, else ``0..device_count-1``."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()]
    return [str(i) for i in range(device_count)]


def plan_engines(
    count: int,
    options: Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    on_cpu: bool,
    devices: Sequence[str] = (),
) -> list[EnginePlan]:
    """Place ``count`` engines round-robin over ``devices``; split each device's memory between its engines.

    Args:
        count: Engines to start.
        options: The user's engine arguments (with the adapter's defaults applied).
        environ: The process environment (read only).
        on_cpu: Whether vLLM runs on the CPU (one device: the RAM).
        devices: The visible GPUs (`visible_devices`); ignored on a CPU.

    Returns:
        One plan per engine, ``engine-0`` first.
    """
    places: list[str | None] = (
        [None] * count if on_cpu or len(devices) <= 1 else [devices[i % len(devices)] for i in range(count)]
    )
    sharing = {place: places.count(place) for place in places}
    cpu_space = environ.get(_CPU_KV_ENV, "").strip() if on_cpu else ""
    plans = []
    for i, place in enumerate(places):
        share = sharing[place]
        own = dict(options)
        env: dict[str, str | None] = {}
        if place is not None:
            env["CUDA_VISIBLE_DEVICES"] = place  # the engine's processes see their one GPU as cuda:0
        if cpu_space:
            # vLLM's CPU platform would overwrite each engine's kv_cache_memory_bytes with the whole space.
            own["kv_cache_memory_bytes"] = int(cpu_space) * _GIB // share
            env[_CPU_KV_ENV] = None
        elif "kv_cache_memory_bytes" in own:
            own["kv_cache_memory_bytes"] = int(own["kv_cache_memory_bytes"]) // share
        if "kv_cache_memory_bytes" not in own or "gpu_memory_utilization" in own:
            total = float(own.get("gpu_memory_utilization", _DEFAULT_UTILIZATION))
            own["gpu_memory_utilization"] = total / share
        plans.append(EnginePlan(f"engine-{i}", own, env, place))
    return plans


def estimate_parameters(config: Mapping[str, Any]) -> float | None:
    """A decoder's parameter count from its ``config.json`` (Llama-style names); ``None`` if it lacks them."""
    text = config.get("text_config")
    if isinstance(text, Mapping):  # a multimodal model: its language model decides
        config = text
    try:
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        vocab = int(config["vocab_size"])
        heads = int(config["num_attention_heads"])
        intermediate = int(config.get("intermediate_size") or 4 * hidden)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    mlp = 3 * hidden * intermediate  # gate, up, down
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return float(layers * (attention + mlp) + embeddings)


def read_config(model: str) -> dict[str, Any] | None:
    """A local model directory's ``config.json``; ``None`` for a hub id or an unreadable file."""
    path = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def auto_engines(config: Mapping[str, Any] | None, *, on_cpu: bool, gpus: int) -> int:
    """The rule behind ``engines="auto"`` (docs/adapters/vllm.md says which figures back it).

    1 on a CPU, or where the model's size is unknown; `AUTO_ENGINES_PER_GPU` on each visible GPU for a model
    of at most `AUTO_MAX_PARAMETERS` parameters; otherwise one engine a GPU.
    """
    if on_cpu or gpus < 1:
        return 1
    parameters = estimate_parameters(config) if config is not None else None
    if parameters is None:
        return 1
    per_gpu = AUTO_ENGINES_PER_GPU if parameters <= AUTO_MAX_PARAMETERS else 1
    return per_gpu * gpus


class VLLMEnginesBackend(PoolBackend):
    """Several ``vllm`` engines of one model behind one backend (see the module docstring).

    Its fingerprint is one engine's: the engines give the same greedy results as one, so one response cache
    serves any number of engines.
    """

    name = "vllm"

    @property
    def engines(self) -> list[Any]:
        """The engines' `VLLMBackend` objects, ``engine-0`` first."""
        return [replica.backend for replica in self.router.replicas]

    @property
    def fingerprint(self) -> dict[str, Any]:
        """One engine's fingerprint (the model, its files, the options that change outputs)."""
        fingerprint: dict[str, Any] = self.engines[0].fingerprint
        return fingerprint

    def __repr__(self) -> str:
        return f"VLLMEnginesBackend({self.model!r}, engines={len(self.engines)}, routing={self.routing!r})"


async def create_engines(
    cls: Any,
    model: str,
    engines: int | str,
    routing: str | None,
    engine_args: dict[str, Any],
    chat: Mapping[str, Any] | None = None,
) -> Any:
    """Build the engines one after another from the plan, then the pool over them (see `VLLMBackend.create`).

    One after another, not at once: vLLM's start-up changes process-wide state (``os.environ``, torch's thread
    count) without a lock, and each engine gets its device and memory share through the environment its
    processes inherit, so `start_engine` holds a lock for each start.
    """
    from ._vllm_checks import _on_cpu, engine_defaults

    cpu = _on_cpu()
    devices = [] if cpu else visible_devices(os.environ, _device_count())
    if engines == "auto":
        count = auto_engines(read_config(model), on_cpu=cpu, gpus=len(devices))
        if count == 1:
            return await cls._build(model, engine_args, env=None, **(chat or {}))
    else:
        count = int(engines)
    options = {**engine_defaults(engine_args), **engine_args}
    plans = plan_engines(count, options, environ=os.environ, on_cpu=cpu, devices=devices)
    built: list[Any] = []
    try:
        for plan in plans:
            built.append(await cls._build(model, plan.options, env=plan.env, **(chat or {})))
        backend = VLLMEnginesBackend(
            built, routing=routing or "least_loaded", labels=[plan.label for plan in plans]
        )
    except BaseException:
        for engine in built:
            await engine.aclose()
        raise
    try:
        await backend.ready()
    except BaseException:
        await backend.aclose()
        raise
    return backend


def _device_count() -> int:
    import torch

    return int(torch.cuda.device_count())
