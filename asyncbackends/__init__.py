"""asyncbackends: one async protocol, one shared event loop and one request-gathering path for LLM backends.

```python
import asyncbackends as ab

backend = ab.create_backend("vllm", model="path/to/model")
results = ab.run_batch(backend, [ab.GenerationRequest("Hello")], progress=True)
```

Importing this package imports no engine: adapters import theirs when they are built.
"""

from .cache import ResponseCache
from .callbacks import RequestDone, RetryEvent, RunCallbacks, TokenUsage
from .chat import Tool, ToolCall, image_part
from .errors import (
    AsyncBackendsError,
    AuthenticationError,
    BackendBrokenError,
    BackendClosedError,
    BackendError,
    BackendNotFoundError,
    BackendTimeoutError,
    BackendUnavailableError,
    InvalidRequestError,
    LoopError,
    RateLimitedError,
    RequestRejectedError,
)
from .gather import as_completed, gather, run_batch
from .loop import LoopManager, get_loop_manager
from .metrics import RunMetrics
from .options import DEFAULT_CONCURRENCY, RateLimit, RetryPolicy, RunOptions
from .protocol import AsyncBackend, BaseBackend, Secret
from .registry import acreate_backend, available_backends, create_backend, register_backend
from .types import (
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
from .wrappers.limited import limited
from .wrappers.pool import pool

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_CONCURRENCY",
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
    "Capabilities",
    "Completion",
    "GenerationRequest",
    "GenerationResult",
    "InvalidRequestError",
    "LoglikelihoodRequest",
    "LoglikelihoodResult",
    "LoopError",
    "LoopManager",
    "RateLimit",
    "RateLimitedError",
    "Request",
    "RequestDone",
    "RequestRejectedError",
    "ResponseCache",
    "Result",
    "RetryEvent",
    "RetryPolicy",
    "RollingLoglikelihoodRequest",
    "RunCallbacks",
    "RunMetrics",
    "RunOptions",
    "SamplingParams",
    "Secret",
    "TokenUsage",
    "Tool",
    "ToolCall",
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
]
