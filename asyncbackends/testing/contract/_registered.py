"""The test class `run_contract` collects: the whole contract against the backend the plugin builds.

Not a test module of this project (its name does not start with ``test_``); pytest collects it only when
`run_contract` names it, with the ``asyncbackends.testing.plugin`` plugin enabled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from . import BackendContract

__all__ = ["TestRegisteredBackend"]


class TestRegisteredBackend(BackendContract):
    """The contract against ``create_backend(--backend-name, **--backend-option)``."""

    @pytest.fixture
    def backend(self, registered_backend: Any) -> Any:
        """The session's backend, built once by the plugin."""
        return registered_backend

    @pytest.fixture
    def make_backend(self, make_registered_backend: Callable[[], Any] | None) -> Callable[[], Any] | None:
        """Fresh backends built with the same name and options."""
        return make_registered_backend

    @pytest.fixture
    def failing_backend(
        self, make_failing_registered_backend: Callable[[], Any] | None
    ) -> Callable[[], Any] | None:
        """Backends built with the failing-backend options, if any were given."""
        return make_failing_registered_backend

    @pytest.fixture
    def make_slot_limited_backend(
        self, make_slot_limited_registered_backend: Callable[[int], Any] | None
    ) -> Callable[[int], Any] | None:
        """Backends with the slot-limit option set, if its name was given."""
        return make_slot_limited_registered_backend

    @pytest.fixture
    def secret(self, backend_secret: str | None) -> str | None:
        """The credential among the options, if any."""
        return backend_secret
