"""Choosing a replica: least-loaded routing, prefix affinity, adapter affinity (the policy is in `router`).

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

__all__ = [
    "POWER_OF_TWO_ABOVE",
    "ROUTINGS",
    "Routing",
    "adapter_home",
    "affine",
    "affinity_key",
    "has_room",
    "least_loaded",
    "prefix_digest",
    "sibling_key",
    "within_share",
]

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


def prefix_digest(request: Request, chars: int = 256) -> str | None:
    """A short digest of `affinity_key`: the name a provider's prompt cache routes a shared prefix by.

    Few-shot prompts that open alike get one digest (as affinity routing sends them to one replica), so a
    provider that routes on it (OpenAI's ``prompt_cache_key``) serves their shared prefix from one cache.
    """
    key = affinity_key(request, chars)
    return None if key is None else hashlib.blake2b(key, digest_size=16).hexdigest()


def sibling_key(request: Request) -> bytes | None:
    """What a loglikelihood request shares with the other choices of its question: a digest of its context.

    The choices of a question arrive together and share their context; on one replica they read its prefix
    cache, and an adapter that groups them (vLLM's one request per question) scores them at once. ``None`` for
    any other request, and for an empty context (nothing shared). The adapter is part of it: a context scored
    under two adapters shares no cache (vLLM's prefix cache is per adapter) and no engine request.
    """
    if isinstance(request, LoglikelihoodRequest) and request.context:
        digest = hashlib.blake2b(request.context.encode(), digest_size=16)
        if request.adapter is not None:
            digest.update(b"\x00" + request.adapter.encode())  # a name holds no NUL: no two pairs collide
        return digest.digest()
    return None


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


def has_room(replica: Replica, candidates: list[Replica], slack: float) -> bool:
    """Whether ``replica`` may take one more request kept on it for its prefix (bounded loads).

    Yes below its capacity (keeping the prefix there costs no throughput); otherwise (full, or of unknown
    capacity) while it holds fewer than ``slack`` times its share of the requests in flight.
    """
    if replica.capacity is not None and replica.in_flight < replica.capacity:
        return True
    return within_share(replica, candidates, slack)


def within_share(replica: Replica, candidates: list[Replica], slack: float) -> bool:
    """Whether ``replica``, given one more request, holds at most ``slack`` times its share of the load.

    Its share of the requests in flight, by weight (capacity) among ``candidates``: the bound of consistent
    hashing with bounded loads.
    """
    total = sum(r.in_flight for r in candidates) + 1
    weights = sum(r.weight for r in candidates)
    return replica.in_flight + 1 <= math.ceil(slack * total * replica.weight / weights)


def adapter_home(adapter: str, candidates: list[Replica], slack: float, rng: random.Random) -> Replica | None:
    """The candidate that holds ``adapter`` already and may take one more of its requests; ``None`` if none.

    Among the candidates sent that adapter lately (`Replica.adapters_held`: it is in their adapter slots),
    the least loaded, while it holds at most ``slack`` times its share of the requests in flight
    (`within_share`), and not also while below its capacity, as `has_room` lets a prefix: adapters are few,
    so one run of one adapter would fill a single replica up to its capacity while the others idle.
    """
    # One pass (the router's hot path): the totals of `within_share` and the least-loaded home together.
    total, weights, home, ties = 1, 0.0, None, 0
    for r in candidates:
        total += r.in_flight
        weights += r.weight
        if adapter in r.adapters_held:
            if home is None or r.load < home.load:
                home, ties = r, 1
            elif r.load == home.load:
                ties += 1
                if rng.random() * ties < 1:  # each of the equals kept with chance 1/ties: at random
                    home = r
    if home is None:
        return None
    return home if home.in_flight + 1 <= math.ceil(slack * total * home.weight / weights) else None


def affine(key: bytes, candidates: list[Replica], slack: float, rng: random.Random) -> Replica:
    """The candidate that keeps requests with this ``key`` together while it has room.

    Candidates are ranked by rendezvous hashing of ``key``; the first below its capacity, or holding fewer
    than ``slack`` times its share of the requests in flight, takes it (bounded loads).
    """
    digest = hashlib.blake2b(key, digest_size=8).digest()

    def rank(r: Replica) -> bytes:
        return hashlib.blake2b(digest, key=r.salt, digest_size=8).digest()

    for replica in sorted(candidates, key=rank, reverse=True):
        if has_room(replica, candidates, slack):
            return replica
    return least_loaded(candidates, rng)  # pragma: no cover  (the bounds sum above the total)
