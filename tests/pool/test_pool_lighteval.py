"""lighteval takes a pool through its config: ``backend="pool", backend_options={"replicas": path}``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lighteval")

from asyncbackends._wrappers.pool import PoolBackend
from asyncbackends.integrations.lighteval import AsyncBackendsModel, AsyncBackendsModelConfig

from .test_pool_frontends import replicas_file


def test_lighteval_config_takes_a_replicas_file(tmp_path: Path) -> None:
    config = AsyncBackendsModelConfig(
        model_name="mock-echo",
        backend="pool",
        backend_options={"replicas": str(replicas_file(tmp_path))},
        cache_dir=str(tmp_path / "cache"),
        progress=False,
    )
    model = AsyncBackendsModel(config)
    try:
        assert isinstance(model.backend, PoolBackend)
        assert [s.label for s in model.backend.replica_stats()] == ["m0", "m1"]
    finally:
        model.cleanup()
    assert all(getattr(s.backend, "closed", False) for s in model.backend.router.replicas)
