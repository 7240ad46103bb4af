"""asyncbackends: one async protocol, one shared event loop and one request-gathering path for LLM backends.

```python
import asyncbackends as ab

backend = ab.create_backend("vllm", model="path/to/model")
results = ab.run_batch(backend, [ab.GenerationRequest("Hello")], progress=True)
```

Importing this package imports no engine: adapters import theirs when they are built. What extensions
(adapters, wrappers, observers) build on is in `asyncbackends.abc`; modules named with a leading
underscore are private.
"""

import inspect as _inspect

from ._adaptive import AdaptiveConcurrency
from ._budget import Budget
from ._cache import ResponseCache
from ._chat import Tool, ToolCall, image_part
from ._gather import as_completed, gather, run_batch
from ._loop import LoopManager, get_loop_manager
from ._observability.callbacks import RequestDone, RetryEvent, RunCallbacks, TokenUsage
from ._observability.run_metrics import RunMetrics
from ._observability.runlog import RunLog
from ._options import DEFAULT_CONCURRENCY, RateLimit, RetryPolicy, RunOptions
from ._protocol import AsyncBackend, BaseBackend, Secret
from ._registry import acreate_backend, available_backends, create_backend, register_backend
from ._routing.replica import ReplicaStats
from ._timeouts import Timeouts
from ._types import (
    Capabilities,
    Completion,
    GenerationRequest,
    GenerationResult,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Request,
    Result,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from ._usage import Pricing, Usage
from ._version import __version__ as __version__
from ._wrappers.limited import LimitedBackend, limited
from ._wrappers.pool import PoolBackend, pool
from ._wrappers.with_adapter import AdapterBackend, with_adapter
from .errors import (
    AsyncBackendsError,
    AuthenticationError,
    BackendBrokenError,
    BackendClosedError,
    BackendError,
    BackendNotFoundError,
    BackendTimeoutError,
    BackendUnavailableError,
    BudgetExceededError,
    ContextLengthError,
    InvalidRequestError,
    LoopError,
    RateLimitedError,
    RequestRejectedError,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "AdapterBackend",
    "AdaptiveConcurrency",
    "AsyncBackend",
    "AsyncBackendsError",
    "AuthenticationError",
    "BackendBrokenError",
    "BackendClosedError",
    "BackendError",
    "BackendNotFoundError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "BaseBackend",
    "Budget",
    "BudgetExceededError",
    "Capabilities",
    "Completion",
    "ContextLengthError",
    "GenerationRequest",
    "GenerationResult",
    "InvalidRequestError",
    "LoglikelihoodRequest",
    "LoglikelihoodResult",
    "LoopError",
    "LimitedBackend",
    "LoopManager",
    "PoolBackend",
    "Pricing",
    "RateLimit",
    "RateLimitedError",
    "ReplicaStats",
    "Request",
    "RequestDone",
    "RequestRejectedError",
    "ResponseCache",
    "Result",
    "RetryEvent",
    "RetryPolicy",
    "RollingLoglikelihoodRequest",
    "RunCallbacks",
    "RunLog",
    "RunMetrics",
    "RunOptions",
    "SamplingParams",
    "Secret",
    "Timeouts",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "Usage",
    "__version__",
    "acreate_backend",
    "as_completed",
    "available_backends",
    "create_backend",
    "gather",
    "get_loop_manager",
    "image_part",
    "limited",
    "pool",
    "register_backend",
    "run_batch",
    "with_adapter",
]

# Public names report the package as their home, as httpx's do: reprs, tracebacks, pickles and help() say
# ``asyncbackends.GenerationRequest``, not the private module it is written in (moving it changes nothing).
for _name in __all__:
    _value = globals()[_name]
    _own = isinstance(_value, type) or _inspect.isfunction(_value)
    if _own and _value.__module__.startswith(f"{__name__}."):
        _value.__module__ = __name__
del _name, _value, _own, _inspect
