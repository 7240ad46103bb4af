"""Several ``AsyncLLM`` engines behind one ``vllm`` backend: ``create_backend("vllm", model=..., engines=N)``.

Why: one engine core is a CPU-bound Python loop; with a small model it cannot keep a big GPU busy (issue 29:
on one H200 vLLM's offline ``LLM.generate`` left the GPU idle 49-65% of its run on a 1B-shaped model, and 6
engines, busy 97-98%, ran 1.7-2.9x its speed; an 8B-shaped one ran 0.90x with 2). The engines are
replicas of a `PoolBackend` (its router, failover, ``affinity`` routing, `replica_stats`), labelled
``engine-0``, ``engine-1``...

This module holds the plan (pure, tested without vLLM): which device each engine gets, how the user's memory
settings are split, which engines may start at once, and what ``engines="auto"`` picks; and the building of
the engines from that plan.

Start-up: engines start at once where vLLM allows it (`start_waves`), which is on a CPU only. On a GPU vLLM's
start-up is not safe to overlap within one process: its launcher sets ``OMP_NUM_THREADS`` around each
engine-core launch and restores it, with no lock (two overlapping starts can leave an engine core without the
limit); it forks the engine core by default, and a fork taken while other threads are inside vLLM's start-up
can copy a lock one of them holds into the child, which then waits on it forever (six engines started at once
on one H200 had not come up after 170 s; one after another they took 78 s); and it sizes an engine's KV cache
by profiling the GPU's free memory, assuming no other process changes it meanwhile. On a CPU vLLM spawns the
engine core, skips those thread settings and is given the KV cache size: the engines start together, a
compiling engine-0 alone first (it fills vLLM's compile cache, which the others then read).

Memory: the user's ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` and ``VLLM_CPU_KVCACHE_SPACE`` are
the total for a device, divided between the engines placed on it. On a CPU, ``VLLM_CPU_KVCACHE_SPACE`` wins
over ``kv_cache_memory_bytes`` (as in vLLM, whose CPU platform overwrites the option with it); being whole
GiB, it is turned into each engine's ``kv_cache_memory_bytes`` and hidden from that engine's start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..._wrappers.pool import PoolBackend
from ...errors import InvalidRequestError

__all__ = [
    "AUTO_ENGINES_PER_GPU",
    "AUTO_MAX_PARAMETERS",
    "EnginePlan",
    "VLLMEnginesBackend",
    "auto_engines",
    "check_engines",
    "estimate_parameters",
    "plan_engines",
    "start_waves",
]

AUTO_MAX_PARAMETERS = 1.5e9
"""``engines="auto"`` runs several engines a GPU only for models up to this many parameters (the 1B-shaped
model measured, ~1.1e9, gained; the 8B-shaped one, ~7.2e9, lost 10% with 2; nothing between was measured)."""
AUTO_ENGINES_PER_GPU = 6
"""Engines a GPU for such a model: on one H200, 6 kept the GPU 97-98% busy (409-426 req/s, eager or compiled);
4 equalled 6 in one call (403 req/s), 8 did no better (398-413), 3 left the GPU 17% idle."""

_ROUTINGS = ("least_loaded", "affinity")
_CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
_PARALLEL_OPTIONS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
_DEVICE_OPTION = "device_ids"  # vLLM's own GPU placement, which would fight the engines' (refused with them)
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
        if options.get(_DEVICE_OPTION) is not None:
            raise InvalidRequestError(
                "engines= places each engine on a GPU itself; choose the GPUs with CUDA_VISIBLE_DEVICES, "
                f"not {_DEVICE_OPTION}"
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
        # On a GPU every engine's start checks that the device's free memory covers gpu_memory_utilization
        # of it, even when the KV cache size is given (vLLM's request_memory): each engine asks its share.
        if not on_cpu or "kv_cache_memory_bytes" not in own or "gpu_memory_utilization" in own:
            total = float(own.get("gpu_memory_utilization", _DEFAULT_UTILIZATION))
            own["gpu_memory_utilization"] = total / share
        plans.append(EnginePlan(f"engine-{i}", own, env, place))
    return plans


def start_waves(plans: Sequence[EnginePlan], *, on_cpu: bool) -> list[list[EnginePlan]]:
    """Which engines start at once: waves in order, each wave's engines together (see the module docstring).

    On a GPU one engine a wave. On a CPU all together (they start with the same environment), except that a
    compiling engine-0 (``enforce_eager`` not set) starts alone first.
    """
    if not on_cpu or any(plan.env != plans[0].env for plan in plans):
        return [[plan] for plan in plans]
    rest = list(plans)
    alone = [[rest.pop(0)]] if rest and not rest[0].options.get("enforce_eager") else []
    return alone + ([rest] if rest else [])


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
    def restarts(self) -> int:
        """How many times an engine was started again after its engine core died, all engines together."""
        return sum(int(engine.restarts) for engine in self.engines)

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
    """Build the engines from the plan, wave by wave (`start_waves`), then the pool over them.

    See `VLLMBackend.create`. If an engine fails to start, the others of its wave finish starting; then every
    started engine is closed and the first failure raised (the others noted on it). If the caller gives up
    (cancellation), the starts under way are cancelled (each shuts its engine down once built) and the
    engines already started are closed.
    """
    from ._checks import _on_cpu, engine_defaults

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
    built: dict[str, Any] = {}
    try:
        for wave in start_waves(plans, on_cpu=cpu):
            await _start_wave(cls, model, wave, chat or {}, built)
        backend = VLLMEnginesBackend(
            [built[p.label] for p in plans],
            routing=routing or "least_loaded",
            labels=[p.label for p in plans],
        )
    except BaseException:
        for engine in built.values():
            await engine.aclose()
        raise
    try:
        await backend.ready()
    except BaseException:
        await backend.aclose()
        raise
    return backend


async def _start_wave(
    cls: Any, model: str, wave: list[EnginePlan], chat: Mapping[str, Any], built: dict[str, Any]
) -> None:
    """Start a wave's engines at once (one start-gate group), adding each started one to ``built``."""
    group = object() if len(wave) > 1 else None  # the token the wave's starts share (`start_engine`)
    tasks = [
        asyncio.ensure_future(
            cls._build(model, p.options, env=p.env, start_group=group, label=f"vllm {p.label}", **chat)
        )
        for p in wave
    ]
    try:
        await asyncio.wait(tasks)
    finally:
        for plan, task in zip(wave, tasks, strict=True):
            if not task.done():
                task.cancel()  # the caller gave up: the start shuts its engine down once built
            elif not task.cancelled() and task.exception() is None:
                built[plan.label] = task.result()
    failed = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]
    if failed:
        for other in failed[1:]:
            failed[0].add_note(f"another engine failed to start too: {other!r}")
        raise failed[0]


def _device_count() -> int:
    import torch

    return int(torch.cuda.device_count())
