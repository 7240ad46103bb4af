"""A batch run in its own process, for the kill-and-resume test: ``python -m tests.openai.batch_client URL CACHE``.

It sends `requests()` with ``batch=True`` on the cache file and writes nothing else: the test kills it
(SIGKILL) once the look-alike has seen its batches, then resumes the run on the same cache.
"""

from __future__ import annotations

import sys

import asyncbackends as ab

COUNT = 1000
SPLIT = 500  # batch_max_requests: 1,000 requests make two batches


def requests(count: int = COUNT) -> list[ab.GenerationRequest]:
    """Text prompts (one endpoint: the split limit alone makes two batches), greedy and seeded sampling."""
    made = []
    for i in range(count):
        params = ab.SamplingParams(
            max_tokens=1 + i % 7,
            temperature=0.0 if i % 3 else 0.8,
            seed=None if i % 3 else i,
            stop=("lima",) if i % 5 == 0 else (),
            logprobs=i % 4 == 0,
        )
        prompt = f"question {i}: what follows {i * 7 % 13}?"
        made.append(ab.GenerationRequest(prompt, params, request_id=f"r{i}"))
    return made


def backend(url: str) -> ab.AsyncBackend:
    """The ``openai`` backend on the look-alike, with batches of `SPLIT` polled every 50 ms."""
    return ab.create_backend("openai", base_url=url, batch_max_requests=SPLIT, batch_poll_interval=0.05)


def main() -> None:
    url, cache = sys.argv[1], sys.argv[2]
    with backend(url) as built:  # type: ignore[attr-defined]
        ab.run_batch(built, requests(), batch=True, cache=cache, return_exceptions=True)


if __name__ == "__main__":
    main()
