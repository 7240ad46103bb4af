"""The extension surface: what adapters, wrappers and observers are built from (as ``anyio.abc``).

`asyncbackends` itself holds what a caller uses (requests, results, ``gather``, ``create_backend``, the
wrappers); this module holds what an extension author builds on:

- **Adapters**: the `AsyncBackend` protocol and its optional members (`SupportsRollingLoglikelihood`,
  `SupportsFingerprint`, and the side doors integrations and routers read where a backend has them:
  `SupportsTokenizer`, `SupportsMaxModelLen`, `SupportsCheckReady`, `SupportsInfo`, `SupportsAdaptiveLimit`;
  every wrapper forwards them, a pool what its replicas share), the optional base class `BaseBackend`,
  `Secret` for credentials,
  `refuse_unsupported` and `refuse_unclaimed_chat` (the first calls in an adapter's ``generate``: optional
  sampling parameters, images and tools it does not claim), `backend_fingerprint` (the identity
  the response cache keys on), `held_slot` (an adapter's own connection slots, which ``gather``'s
  per-attempt timeout does not time), `idle_timeout` (how long the current attempt may wait for the next byte
  or token: an adapter that reads its answer as it comes bounds each read by it), and the registry's option
  checks (`check_options`, `required_options`).
- **Timeouts, for adapter authors**: ``gather`` enforces ``Timeouts.total`` itself, around the whole attempt,
  whatever the adapter does. ``Timeouts.idle`` only the adapter can see: read `idle_timeout()` where the
  request is sent (the run sets it in the attempt's task and the tasks it spawns; ``None`` means no limit),
  stream the answer where the server can, and bound each read by it (aiohttp's
  ``ClientTimeout(sock_read=idle)``, or ``asyncio.timeout`` around each chunk), raising
  `BackendTimeoutError` when it passes, so the attempt is retried. An adapter that cannot see progress
  (an answer sent whole after a long generation) should not apply it to such a request: it would cut a
  long answer; a short request (scoring) may be bounded by it as a whole.
- **Provider batches**: `SupportsBatch`, what ``gather(..., batch=True)`` asks of a backend with a batch API,
  with `BatchLimits`, `BatchLine` and `BatchStatus`; `BatchRecord`, a batch in flight as the response cache
  keeps it for a restarted run.
- **Routing**: `Router` (the one router over replicas of one model, which pools and Ray actors use),
  its replicas and their life (`ReplicaSet`, a router's ``replicas``), its record of a replica (`Replica`,
  `ReplicaStats`) and the two rules that decide what a failed attempt means (`is_replica_fault`,
  `sent_nothing`).
- **Observers**: `RunObserver` and `RequestObserver`, the hooks a run calls, and `note_replica`, which a
  routing wrapper calls inside an attempt.

Every other module of the package is private by name (a leading underscore) and may change without notice;
``asyncbackends.errors``, ``asyncbackends.adapters.<name>`` (the registry's targets),
``asyncbackends.integrations`` and ``asyncbackends.testing`` are public too.
"""

from ._batch import BatchLimits, BatchLine, BatchStatus, SupportsBatch
from ._cache import BatchRecord, backend_fingerprint
from ._clock import held_slot
from ._observability.observe import RequestObserver, RunObserver, note_replica
from ._protocol import AsyncBackend, BaseBackend, Secret, SupportsFingerprint, SupportsRollingLoglikelihood
from ._refusals import refuse_unclaimed_chat, refuse_unsupported
from ._registry import check_options, required_options
from ._routing.replica import Replica, ReplicaStats, is_replica_fault, sent_nothing
from ._routing.replica_set import ReplicaSet
from ._routing.router import Router
from ._side_doors import (
    SupportsAdaptiveLimit,
    SupportsCheckReady,
    SupportsInfo,
    SupportsMaxModelLen,
    SupportsTokenizer,
)
from ._timeouts import idle_timeout

__all__ = [
    "AsyncBackend",
    "BaseBackend",
    "BatchLimits",
    "BatchLine",
    "BatchRecord",
    "BatchStatus",
    "Replica",
    "ReplicaSet",
    "ReplicaStats",
    "RequestObserver",
    "Router",
    "RunObserver",
    "Secret",
    "SupportsAdaptiveLimit",
    "SupportsBatch",
    "SupportsCheckReady",
    "SupportsFingerprint",
    "SupportsInfo",
    "SupportsMaxModelLen",
    "SupportsRollingLoglikelihood",
    "SupportsTokenizer",
    "backend_fingerprint",
    "check_options",
    "held_slot",
    "idle_timeout",
    "is_replica_fault",
    "note_replica",
    "refuse_unclaimed_chat",
    "refuse_unsupported",
    "required_options",
    "sent_nothing",
]
