"""Token buckets for client-side rate limits, and the token estimate a request is charged.

Used by one run's `RateLimit` (`asyncbackends._run`) and by `ab.limited`, whose buckets every run shares.
A bucket holds an `asyncio.Lock`, so it is created on the loop that uses it (the shared loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from ._types import GenerationRequest, LoglikelihoodRequest, Request

__all__ = ["RateBuckets", "TokenBucket", "estimated_tokens"]


class TokenBucket:
    """A token bucket; callers queue on a lock so waiting callers are served in order.

    Args:
        rate_per_s: Tokens added per second.
        capacity: Most tokens held (the largest burst); the bucket starts full.
    """

    def __init__(self, rate_per_s: float, capacity: float) -> None:
        self.rate, self.capacity = rate_per_s, capacity
        self.tokens = capacity
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, amount: float) -> None:
        """Wait until ``amount`` tokens (at most the capacity) are in the bucket, and take them."""
        amount = min(amount, self.capacity)
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= amount:
                    self.tokens -= amount
                    return
                await asyncio.sleep((amount - self.tokens) / self.rate)


class RateBuckets:
    """A rate limit's buckets, requests a second and tokens a minute, and the wait for one request's share.

    Args:
        requests_per_second: Requests started per second, in bursts of up to a second's worth (at least
            one); ``None`` for no limit.
        tokens_per_minute: Estimated tokens per minute (`estimated_tokens`), in bursts of up to a minute's
            worth; ``None`` for no limit.
    """

    def __init__(self, requests_per_second: float | None, tokens_per_minute: float | None) -> None:
        rps, tpm = requests_per_second, tokens_per_minute
        self.requests = TokenBucket(rps, max(1.0, rps)) if rps else None
        self.tokens = TokenBucket(tpm / 60, tpm) if tpm else None

    async def take(self, request: Request) -> None:
        """Wait until ``request`` may start: one request from the first bucket, its tokens from the second."""
        if self.requests is not None:
            await self.requests.take(1)
        if self.tokens is not None:
            await self.tokens.take(estimated_tokens(request))


_IMAGE_CHARS = 1024
"""An image part's charge in characters (256 tokens): a base64 data URL's length says nothing of it."""


def _content_size(content: object) -> int:
    if isinstance(content, list):
        return sum(len(p.get("text", "")) if p.get("type") == "text" else _IMAGE_CHARS for p in content)
    return len(str(content))


def estimated_tokens(request: Request) -> float:
    """Tokens charged to ``request`` before it is sent: its prompt's size plus ``max_tokens * n``.

    Token ids count one each; text counts four characters a token.
    """
    if isinstance(request, GenerationRequest):
        prompt = request.prompt
        size: float
        if isinstance(prompt, str):
            size = len(prompt) / 4
        elif request.prompt_kind == "tokens":
            size = len(prompt)
        else:
            size = sum(_content_size(m.get("content", "")) for m in prompt if isinstance(m, Mapping)) / 4
        return size + request.params.max_tokens * request.params.n
    if isinstance(request, LoglikelihoodRequest):
        return (len(request.context) + len(request.continuation)) / 4 + 1
    return len(request.text) / 4 + 1
