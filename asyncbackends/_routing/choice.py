"""Choosing a replica: least-loaded routing and prefix-affinity routing (the policy is in `router`).

Pure choices over the healthy candidates the router passes in; nothing here changes a replica's state.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Literal

from .._types import GenerationRequest, LoglikelihoodRequest, Request, RollingLoglikelihoodRequest
from .replica import Replica

__all__ = ["POWER_OF_TWO_ABOVE", "ROUTINGS", "Routing", "affine", "affinity_key", "least_loaded"]

Routing = Literal["least_loaded", "affinity"]
ROUTINGS: tuple[str, ...] = ("least_loaded", "affinity")
"""The routing policies `Router` accepts."""

POWER_OF_TWO_ABOVE = 8
"""With more healthy replicas than this, least-loaded routing compares two drawn at random."""


def affinity_key(request: Request, chars: int) -> bytes | None:
    """The part of a request that decides its replica under affinity routing.

    Its prompt's first ``chars`` characters (a token prompt's first ``chars // 4`` tokens); a loglikelihood
    request's context's last ``chars``: the choices of one question share it and stay together (the adapter
    may score them in one engine request), while few-shot questions, alike at the start, spread over the
    replicas (each caches the shared shots once); ``None`` for anything else.
    """
    text: str
    if isinstance(request, GenerationRequest):
        prompt = request.prompt
        if isinstance(prompt, str):
            text = prompt
        elif request.prompt_kind == "tokens":
            return repr(prompt[: max(1, chars // 4)]).encode()
        else:
            text = json.dumps([dict(m) for m in prompt], sort_keys=True)  # type: ignore[arg-type]
    elif isinstance(request, LoglikelihoodRequest):
        return (request.context[-chars:] or request.continuation[:chars]).encode()
    elif isinstance(request, RollingLoglikelihoodRequest):
        text = request.text
    else:
        return None
    return text[:chars].encode()


def least_loaded(candidates: list[Replica], rng: random.Random) -> Replica:
    """The candidate with the fewest requests in flight relative to its capacity (ties at random).

    With more than `POWER_OF_TWO_ABOVE` candidates, the less loaded of two drawn at random.
    """
    if len(candidates) > POWER_OF_TWO_ABOVE:
        a, b = rng.sample(candidates, 2)
        return a if a.load <= b.load else b
    best = min(r.load for r in candidates)
    ties = [r for r in candidates if r.load == best]
    # At random among equals: a rule such as "the one sent the fewest" would favour a slow replica.
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def affine(key: bytes, candidates: list[Replica], slack: float, rng: random.Random) -> Replica:
    """The candidate that keeps requests with this ``key`` together while it has room.

    Candidates are ranked by rendezvous hashing of ``key``; the first below its capacity, or holding fewer
    than ``slack`` times its share of the requests in flight, takes it (bounded loads).
    """
    digest = hashlib.blake2b(key, digest_size=8).digest()

    def rank(r: Replica) -> bytes:
        return hashlib.blake2b(digest, key=r.salt, digest_size=8).digest()

    total = sum(r.in_flight for r in candidates) + 1
    weights = sum(r.weight for r in candidates)
    for replica in sorted(candidates, key=rank, reverse=True):
        if replica.capacity is not None and replica.in_flight < replica.capacity:
            return replica  # room to spare: keeping the prefix here costs no throughput
        bound = math.ceil(slack * total * replica.weight / weights)
        if replica.in_flight + 1 <= bound:
            return replica
    return least_loaded(candidates, rng)  # pragma: no cover  (the bounds sum above the total)
