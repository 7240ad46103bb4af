"""The adapter contract suite: pytest classes an adapter author subclasses to ask "is my adapter right?".

Modelled on fsspec's ``fsspec.tests.abstract``: mixins of tests plus fixtures the implementer overrides, with
the backend's own `Capabilities` deciding which tests apply (a test whose capability is ``False`` is skipped,
with the reason). And on langchain-tests' rule: a contract test may only be overridden as an expected failure
with a reason (``@pytest.mark.xfail(reason=...)``); ``test_no_overrides_DO_NOT_OVERRIDE`` fails when one was
deleted or silently overridden.

Every test is a plain sync test (requests go through `run_batch` or the shared loop), so the suite works
whatever your pytest-asyncio configuration.

```python
import pytest
import asyncbackends as ab
from asyncbackends.testing.contract import BackendContract


class TestMyBackend(BackendContract):
    @pytest.fixture(scope="class")  # engines are expensive: the suite never closes this one
    @classmethod  # wider-scoped fixtures are classmethods (pytest 9 deprecates instance methods there)
    def backend(cls):
        backend = ab.create_backend("my-backend", url="http://localhost:8080")
        yield backend
        backend.close()

    @pytest.fixture
    def make_backend(self):  # fresh backends for the checks that close one
        return lambda: ab.create_backend("my-backend", url="http://localhost:8080")

    @pytest.mark.xfail(reason="the server cannot honour seeds yet")
    def test_seeded_sampling_reproducible(self, backend, prompts):
        super().test_seeded_sampling_reproducible(backend, prompts)
```

Fixtures to override (see `ContractBase` for each one's default): ``backend`` (required), ``make_backend``,
``failing_backend``, ``make_slot_limited_backend``, ``rejected_requests``, ``secret``, ``prompts``,
``token_prompt``, ``decode``. Knobs are class attributes: ``max_tokens``, ``long_max_tokens``,
``concurrency``, ``cancel_after``, ``cancel_timeout``, ``request_timeout``, ``score_tolerance``,
``greedy_batch_invariant``, ``loop_stall_threshold``, ``loop_stalls_allowed``, ``varied_samples``,
``contract_version``, ``structured_max_tokens``, ``sampling_regex``, ``sampling_json_schema``, ``tool``.

`CONTRACT_VERSION` is the suite's version, raised whenever a contract test is added or made stricter. Pin it
with ``contract_version = N`` on your class: contract tests added after version N then skip (naming their
version) until you raise the pin, so upgrading asyncbackends never turns your CI red unannounced.

`run_contract` runs the whole suite against any registered adapter (the ``asyncbackends contract`` command).
"""

from __future__ import annotations

from ._base import CONTRACT_VERSION, GUARD_TEST, ContractBase, added_in, contract_tests, expect
from .chat import ChatContract
from .closing import ClosingContract
from .concurrency import ConcurrencyContract
from .credentials import CredentialsContract
from .generation import GenerationContract
from .lifecycle import LifecycleContract
from .runner import parse_option_value, run_contract
from .sampling import SamplingContract
from .scoring import LoglikelihoodContract

__all__ = [
    "CONTRACT_VERSION",
    "GUARD_TEST",
    "BackendContract",
    "ChatContract",
    "ClosingContract",
    "ConcurrencyContract",
    "ContractBase",
    "CredentialsContract",
    "GenerationContract",
    "LifecycleContract",
    "LoglikelihoodContract",
    "SamplingContract",
    "added_in",
    "contract_tests",
    "expect",
    "parse_option_value",
    "run_contract",
]


class BackendContract(
    GenerationContract,
    SamplingContract,
    LoglikelihoodContract,
    LifecycleContract,
    ClosingContract,
    CredentialsContract,
    ConcurrencyContract,
    ChatContract,
):
    """The whole contract: subclass it, override the ``backend`` fixture; capabilities pick the tests."""
