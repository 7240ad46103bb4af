"""One run in batch mode: ``gather(..., batch=True)`` through a provider's batch API (`SupportsBatch`).

The run keeps the gathering path's policy: results already in the cache are not sent; each request's
outcome goes to the same sink, metrics, callbacks and progress bar as a plain run's. The rest is the batch
API's: the requests left are written as lines (one custom id each: the request's cache key and its
occurrence among identical requests, so the same request gets the same id in a restarted run), cut into
batches at the backend's `BatchLimits` (and by endpoint), uploaded and started. Each uploaded file is
recorded in the response cache before its batch is created and the batch id as soon as it is known, so a
run killed at any instant and started again on the same cache polls those batches (or finds the batch
started over a recorded file) and sends none of their requests again. Finished batches are read back,
their results stored, then their record dropped.

Failures: a request the backend refuses before sending, a batch that fails (the provider's validation),
expires or is cancelled, and each line's own error come back as that request's error, mapped as the plain
path maps them; nothing is resubmitted within the run (run it again on the same cache: only the failed
requests are sent). Uploads, creation and polls are retried by the run's `RetryPolicy`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ._batch import BatchLine, BatchStatus, SupportsBatch
from ._cache import ResponseCache, open_cache
from ._cache_batches import BatchRecord, custom_id_key
from ._cache_codec import Keyer
from ._observability.observe import RequestObserver, RunObserver
from ._options import RetryPolicy, RunOptions
from ._run import Outcome
from ._run_cache import looked_up
from ._types import GenerationRequest, GenerationResult, Request
from ._usage import pricing_of
from .errors import (
    AsyncBackendsError,
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    InvalidRequestError,
    RequestRejectedError,
)

__all__ = ["BatchRun"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# After these the provider is no longer asked: the run's outcomes can be read.
_EXPIRED, _CANCELLED = "expired", "cancelled"


class _Batch:
    """A batch this run waits for: its record, the custom ids this run needs from it, and the others.

    ``others`` are the requests of an adopted batch that this run does not send (a killed run's, with a
    different request set): their answers are paid for, so they are read and stored with this run's.
    """

    def __init__(
        self, record: BatchRecord, wanted: set[str], others: dict[str, GenerationRequest] | None = None
    ) -> None:
        self.record, self.wanted, self.others = record, wanted, others or {}
        self.status: BatchStatus | None = None
        self.poll_failures = 0


class BatchRun:
    """One batch-mode run (the batch twin of `asyncbackends._run.Run`); same arguments.

    Raises:
        InvalidRequestError: From `run`, before anything is sent: the backend has no batch API, or a request
            is not a `GenerationRequest`.
    """

    def __init__(
        self,
        backend: Any,
        requests: Sequence[Request],
        options: RunOptions,
        sink: Callable[[int, Outcome], None],
        observer: RunObserver | None = None,
    ) -> None:
        self.backend, self.requests, self.sink, self.observer = backend, requests, sink, observer
        self.options = options
        self.pricing = pricing_of(backend)
        self.retry = options.retry or RetryPolicy()
        self.metrics = options.metrics
        self.cache: ResponseCache | None = None
        self.bar: Any = None
        self.pending: dict[str, int] = {}  # custom id -> index, for requests not yet answered
        self.ids: dict[int, str] = {}  # and back
        self.watched: dict[int, RequestObserver] = {}
        self.batches: list[_Batch] = []

    def _check(self) -> None:
        name = getattr(self.backend, "name", type(self.backend).__name__)
        if not isinstance(self.backend, SupportsBatch):
            raise InvalidRequestError(f"batch=True: backend {name!r} has no batch API (SupportsBatch)")
        for request in self.requests:
            if not isinstance(request, GenerationRequest):
                raise InvalidRequestError(
                    f"batch=True sends generation requests only, got a {type(request).__name__}; "
                    "run scoring requests without batch=True"
                )

    async def run(self) -> None:
        """Send every request through batches; return when all ended, or raise the first error."""
        self._check()
        owns_cache = self.options.cache is not None and not isinstance(self.options.cache, ResponseCache)
        if self.options.cache is not None:
            self.cache = open_cache(self.options.cache)
        if self.metrics is not None:
            self.metrics.requests += len(self.requests)
            self.metrics.started = self.metrics.started or time.perf_counter()
        try:
            if self.options.progress:
                from tqdm.auto import tqdm

                progress = self.options.progress
                desc = progress if isinstance(progress, str) else f"{self.backend.name} batch"
                self.bar = tqdm(total=len(self.requests), desc=desc, unit="req", dynamic_ncols=True)
            await self._run()
        except BaseException:
            for watched in self.watched.values():
                watched.cancelled()
            if self.cache is None:
                await self._cancel_remote()
            raise
        finally:
            if self.bar is not None:
                self.bar.close()
            if owns_cache and self.cache is not None:
                self.cache.close()
            if self.metrics is not None:
                self.metrics.finished = time.perf_counter()
            if self.observer is not None:
                self.observer.run_ended()

    async def _cancel_remote(self) -> None:
        """Stop the batches still running: with no cache to record them, no later run could collect them."""
        backend: SupportsBatch = self.backend
        for batch in self.batches:
            if batch.record.batch_id is not None:
                try:
                    await asyncio.wait_for(backend.cancel_batch(batch.record.batch_id), 10)
                except (AsyncBackendsError, TimeoutError) as exc:
                    log.warning("batch: could not cancel %s: %s", batch.record.batch_id, exc)

    async def _run(self) -> None:
        backend: SupportsBatch = self.backend
        seen: Counter[str] = Counter()
        if self.cache is not None:
            found = looked_up(self.cache, self.backend, self.requests, self.metrics)
        else:
            keyer = Keyer(self.backend)
            found = ((i, keyer(r), None) for i, r in enumerate(self.requests))
        for index, key, cached in found:
            assert key is not None  # checked: every request is a GenerationRequest
            if cached is not None:
                if self.metrics is not None:
                    self.metrics.cache_hits += 1
                self._deliver(index, cached, cache_hit=True)
                continue
            custom_id = f"{key}-{seen[key]}"
            seen[key] += 1
            self.pending[custom_id] = index
            self.ids[index] = custom_id
        self._adopt_recorded()
        lines: dict[str, list[tuple[str, BatchLine]]] = {}
        waiting = {c for b in self.batches for c in b.wanted}
        for custom_id, index in list(self.pending.items()):
            if custom_id in waiting:
                continue
            request = self.requests[index]
            assert isinstance(request, GenerationRequest)
            try:
                line = backend.batch_line(custom_id, request)
                if line is None:  # answered without the server (max_tokens=0)
                    self._deliver(index, await self.backend.generate(request))
                    continue
            except BackendError as exc:
                self._deliver(index, self._owned(exc, request))
                continue
            lines.setdefault(line.endpoint, []).append((custom_id, line))
        for endpoint, items in lines.items():
            for chunk in self._split(items):
                await self._submit(endpoint, chunk)
        await self._wait()

    def _adopt_recorded(self) -> None:
        """Batches a killed run started for these requests: waited for, not sent again.

        A batch holding any of this run's requests is adopted whole: every answer in it is stored, this
        run's and the killed run's others alike, so none is paid for twice. A record none of whose requests
        this run sends is another run's, left for it, unless its answers are all stored already (a run
        killed between storing them and dropping the record, before both were one transaction).
        """
        if self.cache is None:
            return
        for record in self.cache.batch_records(self.backend):
            wanted = {c for c in record.custom_ids if c in self.pending}
            if wanted:
                others = {
                    c: r for c, r in zip(record.custom_ids, record.requests, strict=False) if c not in wanted
                }
                log.info("batch: resuming %s (%d requests)", record.batch_id or record.file_id, len(wanted))
                self.batches.append(_Batch(record, wanted, others))
                self._started(wanted)
            elif self._answered(record):
                log.info("batch: %s was read back already; forgetting it", record.batch_id or record.file_id)
                self.cache.remove_batch(record.file_id)

    def _answered(self, record: BatchRecord) -> bool:
        """Whether every cacheable answer of ``record`` is stored (one it cannot cache counts as read)."""
        assert self.cache is not None
        cache = self.cache
        if record.requests:
            ids = [c for c, r in zip(record.custom_ids, record.requests, strict=False) if cache.cacheable(r)]
        else:
            ids = list(record.custom_ids)
        keys = {custom_id_key(c) for c in ids}
        return len(cache.stored_keys(keys)) == len(keys)

    def _split(self, items: list[tuple[str, BatchLine]]) -> list[list[tuple[str, BatchLine]]]:
        limits = self.backend.batch_limits
        chunks: list[list[tuple[str, BatchLine]]] = [[]]
        size = 0
        for custom_id, line in items:
            length = len(line.data) + 1
            if length > limits.max_bytes:
                error = BackendError(
                    f"request is {length} bytes as a batch line, over the batch limit of {limits.max_bytes}",
                    retryable=False,
                )
                self._deliver(self.pending[custom_id], self._owned(error, self._request(custom_id)))
                continue
            if chunks[-1] and (len(chunks[-1]) >= limits.max_requests or size + length > limits.max_bytes):
                chunks.append([])
                size = 0
            chunks[-1].append((custom_id, line))
            size += length
        return [c for c in chunks if c]

    async def _submit(self, endpoint: str, chunk: list[tuple[str, BatchLine]]) -> None:
        backend: SupportsBatch = self.backend
        ids = tuple(c for c, _ in chunk)
        self._started(set(ids))
        try:
            file_id = await self._retrying(lambda _: backend.upload_batch_file([line for _, line in chunk]))
        except BackendError as exc:
            self._fail(set(ids), exc)
            return
        record = BatchRecord(file_id, endpoint, None, ids, tuple(self._request(c) for c in ids))
        # Recorded before the batch exists: killed before the next write, a restart finds it by its file.
        if self.cache is not None:
            self.cache.add_batch(self.backend, record)
        batch = _Batch(record, set(ids))
        self.batches.append(batch)
        await self._create(batch, look_first=False)

    async def _create(self, batch: _Batch, *, look_first: bool) -> None:
        backend: SupportsBatch = self.backend
        record = batch.record

        async def create(attempt: int) -> str:
            # A retried creation (or a resumed one) looks first: the lost answer may have created it.
            found = await backend.find_batch(record.file_id) if attempt > 1 or look_first else None
            return found or await backend.create_batch(record.file_id, record.endpoint)

        try:
            batch_id = await self._retrying(create)
        except BackendError as exc:
            self.batches.remove(batch)
            self._fail(batch.wanted, exc)
            if self.cache is not None:
                self.cache.remove_batch(record.file_id)
            return
        batch.record = dataclasses.replace(record, batch_id=batch_id)
        if self.cache is not None:
            self.cache.set_batch_id(record.file_id, batch_id)
        log.info("batch: started %s (%d requests)", batch_id, len(record.custom_ids))

    async def _wait(self) -> None:
        backend: SupportsBatch = self.backend
        interval = backend.batch_limits.poll_interval
        for batch in list(self.batches):
            if batch.record.batch_id is None:  # recorded by a run killed before it knew the batch id
                await self._create(batch, look_first=True)
        while self.batches:
            for batch in list(self.batches):
                await self._poll(batch)
            self._show()
            if self.batches:
                await asyncio.sleep(interval)

    async def _poll(self, batch: _Batch) -> None:
        backend: SupportsBatch = self.backend
        batch_id = batch.record.batch_id
        assert batch_id is not None
        try:
            status = await backend.poll_batch(batch_id)
        except BackendError as exc:
            batch.poll_failures += 1
            if exc.retryable and batch.poll_failures < self.retry.max_attempts:
                log.warning("batch: polling %s failed (%s); trying again", batch_id, exc)
                return
            self.batches.remove(batch)
            self._fail(batch.wanted, exc)
            if self.cache is not None and self._gone(exc):
                self.cache.remove_batch(batch.record.file_id)  # a later run sends its requests again
            # Otherwise the batch may still run: its record stays, so a later run on the same cache reads it.
            return
        batch.poll_failures = 0
        if batch.status is None or batch.status.status != status.status:
            log.info("batch: %s is %s", batch_id, status.status)
        batch.status = status
        if status.done:
            await self._collect(batch, status)

    @staticmethod
    def _gone(error: BackendError) -> bool:
        """Whether the provider refuses the batch itself (404: deleted, another account's), not the caller."""
        return isinstance(error, RequestRejectedError) and not isinstance(error, AuthenticationError)

    async def _collect(self, batch: _Batch, status: BatchStatus) -> None:
        backend: SupportsBatch = self.backend
        wanted = {c: self._request(c) for c in batch.wanted if c in self.pending}
        every = {**batch.others, **wanted}
        try:
            outcomes = await self._retrying(lambda _: backend.batch_outcomes(status, every))
        except BackendError as exc:
            self.batches.remove(batch)
            self._fail(set(wanted), exc)
            return
        self.batches.remove(batch)
        if self.cache is not None:
            results = [(every[c], r) for c, r in outcomes.items() if isinstance(r, GenerationResult)]
            try:
                # Stored and the record dropped at once (killed before, a restart reads the batch again),
                # and before any is delivered: a failed request raised from here is sent again next run.
                self.cache.store_batch(self.backend, batch.record.file_id, results)
            except sqlite3.Error as exc:  # as a failed single write: the caller still gets the results
                log.warning("response cache %s: write failed: %s", self.cache.path, exc)
        for custom_id, request in wanted.items():
            outcome = outcomes.get(custom_id)
            if outcome is None:
                kind = BackendTimeoutError if status.status == _EXPIRED else BackendError
                outcome = kind(f"batch {status.id} ended {status.status} without an answer for this request")
            self._deliver(self.pending[custom_id], self._owned(outcome, request))

    async def _retrying(self, call: Callable[[int], Awaitable[T]]) -> T:
        attempt = 1
        while True:
            try:
                return await call(attempt)
            except BackendError as exc:
                if not exc.retryable or attempt >= self.retry.max_attempts:
                    raise
                if self.metrics is not None:
                    self.metrics.retries += 1
                    self.metrics.retried_errors[type(exc).__name__] += 1
                await asyncio.sleep(self.retry.delay(attempt, exc))
                attempt += 1

    def _request(self, custom_id: str) -> GenerationRequest:
        request = self.requests[self.pending[custom_id]]
        assert isinstance(request, GenerationRequest)
        return request

    def _owned(self, outcome: Outcome, request: GenerationRequest) -> Outcome:
        if isinstance(outcome, BackendError):
            if outcome.backend is None:
                outcome.backend = self.backend.name
            if outcome.request_id is None:
                outcome.request_id = request.request_id
        elif isinstance(outcome, GenerationResult) and outcome.request_id != request.request_id:
            outcome = GenerationResult(
                request.request_id, outcome.completions, outcome.prompt_tokens, outcome.model
            )
        return outcome

    def _fail(self, custom_ids: set[str], error: BackendError) -> None:
        for custom_id in sorted(custom_ids, key=lambda c: self.pending.get(c, -1)):
            if custom_id in self.pending:
                request = self._request(custom_id)
                copy = type(error)(error.message, retryable=error.retryable)
                copy.__cause__ = error
                self._deliver(self.pending[custom_id], self._owned(copy, request))

    def _started(self, custom_ids: set[str]) -> None:
        if self.observer is None:
            return
        for custom_id in custom_ids:
            index = self.pending[custom_id]
            watched = self.observer.request_started(index, self.requests[index], 0.0)
            watched.attempt_started(1)
            self.watched[index] = watched

    def _show(self) -> None:
        if self.bar is None:
            return
        statuses = [b.status for b in self.batches if b.status is not None]
        counts = Counter(s.status for s in statuses)
        answered = sum(s.completed + s.failed for s in statuses)
        total = sum(s.total for s in statuses)
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        self.bar.set_postfix_str(f"batches: {states or 'none left'}; in flight answered {answered}/{total}")

    def _deliver(self, index: int, outcome: Outcome, *, cache_hit: bool = False) -> None:
        custom_id = self.ids.pop(index, None)
        if custom_id is not None:
            del self.pending[custom_id]
        watched = self.watched.pop(index, None)
        if watched is None and self.observer is not None:
            watched = self.observer.request_started(index, self.requests[index], 0.0)
            if cache_hit:
                watched.cache_hit()
        elif watched is not None:
            watched.attempt_ended(1, outcome if isinstance(outcome, BaseException) else None)
        if watched is not None:
            watched.done(outcome)
        metrics = self.metrics
        if isinstance(outcome, AsyncBackendsError) and not self.options.return_exceptions:
            raise outcome
        if metrics is not None:
            metrics._record_outcome(outcome, self.pricing, batch=True)  # at the batch price
        self.sink(index, outcome)
        if metrics is not None and metrics.on_update is not None:
            metrics.on_update(metrics)
        if self.bar is not None:
            self.bar.update(1)
