"""`TextEncoder`: a tokenizer's encoding off the loop thread, the texts of many requests in one batch.

Scoring encodes every request's texts (context, context+continuation) before the engine sees it. Done on the
loop thread, text by text, that encoding was 88% of the loop thread's time while six engines scored on an
H200 (docs/benchmarks.md), so more engines could not score faster. Here a request's texts wait while one
batch is encoded in a worker thread (a fast tokenizer releases the GIL there and spreads a batch over the
cores); the texts that arrived meanwhile go in the next batch, at most ``max_batch`` of them, so the first
requests of a long run reach the engine while the rest are still being encoded. No timer: a lone request is
encoded at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["TextEncoder"]

EncodeBatch = Callable[[list[str]], list[list[int]]]
"""Encodes texts to token ids, one list per text, in order; runs in a worker thread."""


class TextEncoder:
    """Encodes texts in a worker thread, batching the texts of concurrent callers.

    Identical texts asked for together are encoded once, and the last ``cache_size`` encodings are kept: a
    multiple-choice question's continuations share its context, and harnesses send them one after another.
    Created and used on one loop (the shared loop).

    Args:
        encode_batch: The tokenizer's batch encoding (thread-safe for one caller at a time: this class never
            runs two batches at once).
        cache_size: How many finished encodings to keep.
        max_batch: The most texts one batch encodes.
    """

    def __init__(self, encode_batch: EncodeBatch, *, cache_size: int = 256, max_batch: int = 128) -> None:
        self._encode_batch = encode_batch
        self._max_batch = max_batch
        self._cache_size = cache_size
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._queued: dict[str, asyncio.Future[list[int]]] = {}  # for the next batch
        self._encoding: dict[str, asyncio.Future[list[int]]] = {}  # in the batch being encoded
        self._worker: asyncio.Task[None] | None = None
        self._keep: set[str] = set()  # texts waiting for their encoding that go in the cache once encoded

    async def encode(self, texts: Sequence[str], *, keep: bool = True) -> list[list[int]]:
        """The token ids of each text, in order.

        Args:
            texts: What to encode.
            keep: Keep these encodings in the cache (off for texts that will not come again).

        Raises:
            Exception: Whatever the tokenizer raised for one of these texts (other callers' texts unharmed).
        """
        found: list[list[int] | asyncio.Future[list[int]]] = []
        for text in texts:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                found.append(cached)
            else:
                found.append(self._future(text, keep))
        if self._queued and self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())
        # Shielded: a caller that is cancelled must not cancel a future other callers wait on too.
        return [item if isinstance(item, list) else await asyncio.shield(item) for item in found]

    def _future(self, text: str, keep: bool) -> asyncio.Future[list[int]]:
        future = self._encoding.get(text) or self._queued.get(text)
        if future is None:
            future = self._queued[text] = asyncio.get_running_loop().create_future()
        if keep:
            self._keep.add(text)
        return future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queued:
                texts = list(itertools.islice(self._queued, self._max_batch))  # the oldest first
                self._encoding = {text: self._queued.pop(text) for text in texts}
                try:
                    encoded = await loop.run_in_executor(None, self._encode_batch, texts)
                    if len(encoded) != len(texts):
                        raise RuntimeError(f"the tokenizer encoded {len(encoded)} of {len(texts)} texts")
                except Exception:
                    # One bad text must not fail the others: find it by encoding them one at a time.
                    await self._one_by_one(loop, texts)
                else:
                    for text, ids in zip(texts, encoded, strict=True):
                        self._finish(text, ids)
                self._encoding = {}
        finally:
            self._worker = None
            self._keep.clear()
            for future in [*self._encoding.values(), *self._queued.values()]:
                if not future.done():  # the loop is shutting down: nobody is left waiting to be answered
                    future.cancel()

    async def _one_by_one(self, loop: asyncio.AbstractEventLoop, texts: list[str]) -> None:
        for text in texts:
            try:
                [ids] = await loop.run_in_executor(None, self._encode_batch, [text])
            except Exception as exc:
                self._keep.discard(text)
                future = self._encoding[text]
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved here: a caller that gave up must not leave it unlogged
            else:
                self._finish(text, ids)

    def _finish(self, text: str, ids: list[int]) -> None:
        if text in self._keep:
            self._keep.discard(text)
            self._cache[text] = ids
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        future = self._encoding[text]
        if not future.done():
            future.set_result(ids)
