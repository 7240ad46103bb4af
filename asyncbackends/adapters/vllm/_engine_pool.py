"""`VLLMEnginesBackend`: several engines of one model behind one ``vllm`` backend (``engines=N``).

The engines are replicas of a `PoolBackend` (its router, failover, ``affinity`` routing, `replica_stats`),
labelled ``engine-0``, ``engine-1``...; `VLLMBackend.create` (`_backend`) starts them from the plan
(`_engine_plan`) and builds this pool over them.
"""

from __future__ import annotations

from typing import Any

from ..._wrappers.pool import PoolBackend

__all__ = ["VLLMEnginesBackend"]


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
