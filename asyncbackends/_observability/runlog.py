"""`RunLog`: a run's events as JSON lines, the input of ``asyncbackends report``.

``asyncbackends run ... --metrics-file run.jsonl`` writes one. It is built on `RunCallbacks`, so any program
can write the same file from its own runs::

    with RunLog("run.jsonl", backend, len(requests)) as run_log:
        ab.run_batch(backend, requests, callbacks=run_log.callbacks, return_exceptions=True)

Lines (``t`` is seconds since the run started)::

    {"event": "run", "backend": "mock", "model": "...", "requests": 1000, "started_at": 1764550000.0}
    {"event": "request", "t": 0.12, "index": 3, "request_id": "...", "latency_s": 0.1, "slot_wait_s": 0.0,
     "rate_wait_s": 0.0, "attempts": 1, "cached": false, "error": null, "replica": null,
     "input_tokens": 12, "output_tokens": 32}
    {"event": "retry", "t": 0.05, "index": 7, "attempt": 1, "reason": "RateLimitedError", "delay_s": 1.0,
     "retry_after_s": 1.0, "replica": "http://a:8080"}
    {"event": "end", "t": 12.3, "summary": {...RunMetrics.summary()...}}
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .._types import GenerationResult
from .callbacks import RequestDone, RetryEvent, RunCallbacks
from .run_metrics import thinking_of

__all__ = ["RunLog"]


class RunLog:
    """Write one run's events to ``path`` as JSON lines.

    Args:
        path: The file to write (replaced if it exists).
        backend: The run's backend (its name and model head the file).
        requests: The number of requests in the run.
    """

    def __init__(self, path: str | Path, backend: Any, requests: int) -> None:
        self.path = Path(path)
        self._file = self.path.open("w", encoding="utf-8")
        self.started_at = time.time()
        fingerprint = getattr(backend, "fingerprint", None)
        model = fingerprint.get("model") if isinstance(fingerprint, dict) else getattr(backend, "model", None)
        self._write(
            {
                "event": "run",
                "backend": getattr(backend, "name", type(backend).__name__),
                "model": model if isinstance(model, str) else None,
                "requests": requests,
                "started_at": self.started_at,
            }
        )
        self.callbacks = RunCallbacks(on_request_done=self._done, on_retry=self._retry)
        """The `RunCallbacks` to pass to the run."""

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _done(self, event: RequestDone) -> None:
        outcome = event.outcome
        result = outcome if isinstance(outcome, GenerationResult) else None
        thinking = None if result is None else thinking_of(result)
        self._write(
            {
                "event": "request",
                "t": round(event.finished_at - self.started_at, 6),
                "index": event.index,
                "request_id": event.request_id,
                "latency_s": round(event.latency_s, 6),
                "slot_wait_s": round(event.slot_wait_s, 6),
                "rate_wait_s": round(event.rate_wait_s, 6),
                "attempts": event.attempts,
                "cached": event.cached,
                "error": event.error_type,
                "replica": event.replica,
                "input_tokens": None if result is None else result.prompt_tokens,
                "cached_input_tokens": None if result is None else result.cached_prompt_tokens,
                "output_tokens": None if result is None else result.completion_tokens,
                "reasoning_tokens": thinking[0] if thinking else None,
                "reasoning_truncated": thinking[1] if thinking else None,
            }
        )

    def _retry(self, event: RetryEvent) -> None:
        self._write(
            {
                "event": "retry",
                "t": round(time.time() - self.started_at, 6),
                "index": event.index,
                "attempt": event.attempt,
                "reason": event.reason,
                "delay_s": round(event.delay_s, 6),
                "retry_after_s": event.retry_after_s,
                "replica": event.replica,
            }
        )

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Write the closing line (with the run's `RunMetrics.summary`, if given) and close the file."""
        if self._file.closed:
            return
        self._write({"event": "end", "t": round(time.time() - self.started_at, 6), "summary": summary})
        self._file.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
