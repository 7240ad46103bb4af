"""`TextEncoder`: scoring's texts encoded in a worker thread, concurrent callers' texts in one batch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from asyncbackends.adapters.vllm._text_encoder import TextEncoder

pytestmark = pytest.mark.asyncio


class Tokenizer:
    """Encodes characters to code points in a worker thread, recording each batch; ``gate`` holds a batch."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, texts: list[str]) -> list[list[int]]:
        self.batches.append(list(texts))
        self.threads.add(threading.get_ident())
        self.started.set()
        self.gate.wait(timeout=60)
        if any("!" in text for text in texts):
            raise ValueError("cannot encode '!'")
        return [[ord(c) for c in text] for text in texts]


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


async def _encoding(encoder: TextEncoder, tokenizer: Tokenizer, text: str) -> asyncio.Future[list[list[int]]]:
    """Ask for ``text`` with the tokenizer held, and return once its batch is being encoded."""
    tokenizer.gate.clear()
    asked = asyncio.ensure_future(encoder.encode([text]))
    await asyncio.to_thread(tokenizer.started.wait, 60)
    return asked


async def test_texts_asked_for_while_a_batch_is_encoded_go_in_the_next_batch() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer)
    first = await _encoding(encoder, tokenizer, "a")  # the first batch is being encoded: ["a"]
    rest = [asyncio.ensure_future(encoder.encode([f"c{i}", f"c{i}x"])) for i in range(20)]
    await asyncio.sleep(0)  # every caller has queued its texts
    tokenizer.gate.set()
    assert await first == [_ids("a")]
    assert await asyncio.gather(*rest) == [[_ids(f"c{i}"), _ids(f"c{i}x")] for i in range(20)]
    assert tokenizer.batches == [["a"], [t for i in range(20) for t in (f"c{i}", f"c{i}x")]]
    assert threading.get_ident() not in tokenizer.threads, "encoding must leave the loop thread"


async def test_a_text_asked_for_together_is_encoded_once_and_then_kept() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer, cache_size=2)
    got = await asyncio.gather(encoder.encode(["ctx", "ctx a"]), encoder.encode(["ctx", "ctx b"]))
    assert got == [[_ids("ctx"), _ids("ctx a")], [_ids("ctx"), _ids("ctx b")]]
    assert sorted(t for batch in tokenizer.batches for t in batch) == ["ctx", "ctx a", "ctx b"]
    encoded = len(tokenizer.batches)
    assert await encoder.encode(["ctx b"]) == [_ids("ctx b")]  # kept: the two newest
    assert len(tokenizer.batches) == encoded
    assert await encoder.encode(["ctx"]) == [_ids("ctx")]  # the oldest fell out of a cache of two
    assert tokenizer.batches[encoded:] == [["ctx"]]


async def test_keep_false_is_encoded_every_time() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer)
    for _ in range(2):
        assert await encoder.encode(["a whole document"], keep=False) == [_ids("a whole document")]
    assert tokenizer.batches == [["a whole document"]] * 2


async def test_a_text_the_tokenizer_refuses_fails_only_its_caller() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer)
    first = await _encoding(encoder, tokenizer, "a")
    bad = asyncio.ensure_future(encoder.encode(["ok", "bad!"]))
    good = asyncio.ensure_future(encoder.encode(["fine"]))
    await asyncio.sleep(0)
    tokenizer.gate.set()
    assert await first == [_ids("a")]
    with pytest.raises(ValueError, match="cannot encode"):
        await bad
    assert await good == [_ids("fine")]
    assert await encoder.encode(["ok"]) == [_ids("ok")]  # encoded alone after the batch failed, and kept
    assert tokenizer.batches[-1] != ["ok"]


async def test_a_cancelled_caller_leaves_the_others_their_encoding() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer)
    gone = await _encoding(encoder, tokenizer, "shared")
    stays = asyncio.ensure_future(encoder.encode(["shared", "other"]))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    tokenizer.gate.set()
    assert await stays == [_ids("shared"), _ids("other")]
    assert tokenizer.batches == [["shared"], ["other"]]


async def test_a_lone_text_after_the_worker_went_idle_is_encoded_at_once() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer)
    assert await encoder.encode(["one"]) == [_ids("one")]
    assert await encoder.encode(["two"]) == [_ids("two")]
    assert tokenizer.batches == [["one"], ["two"]]


async def test_a_long_queue_is_encoded_in_batches_of_max_batch_oldest_first() -> None:
    tokenizer = Tokenizer()
    encoder = TextEncoder(tokenizer, max_batch=4)
    first = await _encoding(encoder, tokenizer, "a")
    rest = [asyncio.ensure_future(encoder.encode([f"t{i}"])) for i in range(10)]
    await asyncio.sleep(0)
    tokenizer.gate.set()
    assert await asyncio.gather(first, *rest) == [[_ids("a")], *[[_ids(f"t{i}")] for i in range(10)]]
    assert tokenizer.batches == [["a"], ["t0", "t1", "t2", "t3"], ["t4", "t5", "t6", "t7"], ["t8", "t9"]]
