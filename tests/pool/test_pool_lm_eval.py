"""lm-eval takes a pool through its model args: ``backend=pool,replicas=replicas.toml``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

import asyncbackends as ab
import asyncbackends.integrations.lm_eval
from asyncbackends._wrappers.pool import PoolBackend

from .test_pool_frontends import replicas_file


def test_lm_eval_model_args_take_a_replicas_file(tmp_path: Path) -> None:
    path = replicas_file(tmp_path)
    lm = get_model("asyncbackends").create_from_arg_string(
        f"backend=pool,replicas={path},progress=False", {"batch_size": 4, "device": "cpu"}
    )
    try:
        assert isinstance(lm.backend, PoolBackend)
        args = [(f"context {i}", " answer") for i in range(30)]
        scores = lm.loglikelihood([Instance("loglikelihood", {}, a, i) for i, a in enumerate(args)])
        reference = ab.run_batch(ab.create_backend("mock"), [ab.LoglikelihoodRequest(c, x) for c, x in args])
        assert [s[0] for s in scores] == [r.logprob for r in reference]
        assert all(s.requests > 0 for s in lm.backend.replica_stats())
    finally:
        lm.close()
