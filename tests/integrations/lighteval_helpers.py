"""Running lighteval offline on the local tasks in tests/data/lighteval_tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

LIGHTEVAL_TASKS = Path(__file__).resolve().parent.parent / "data" / "lighteval_tasks" / "ab_tasks.py"


def custom_tasks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load only the custom tasks file.

    lighteval 0.13 imports every built-in task module to build its registry, and one of them
    (tiny_benchmarks) downloads a file at import time, which fails offline.
    """
    from lighteval.tasks.registry import Registry

    def load(custom_tasks: Any = None, load_multilingual: bool = False) -> dict[str, Any]:
        if custom_tasks is None:
            return {}
        return Registry._extract_configs(Registry.create_custom_tasks_module(custom_tasks))  # type: ignore[no-any-return]

    monkeypatch.setattr(Registry, "load_all_task_configs", staticmethod(load))


def run_pipeline(tasks: str, output_dir: Path, *, model: Any = None, model_config: Any = None) -> Any:
    from lighteval.logging.evaluation_tracker import EvaluationTracker
    from lighteval.pipeline import ParallelismManager, Pipeline, PipelineParameters

    pipeline = Pipeline(
        tasks=tasks,
        pipeline_parameters=PipelineParameters(
            launcher_type=ParallelismManager.CUSTOM, custom_tasks_directory=str(LIGHTEVAL_TASKS)
        ),
        evaluation_tracker=EvaluationTracker(output_dir=str(output_dir), save_details=False),
        model=model,
        model_config=model_config,
    )
    pipeline.evaluate()
    return pipeline


def details(pipeline: Any, task: str) -> list[Any]:
    """The (doc, model_response) of each document of ``task``, in document order."""
    found = pipeline.evaluation_tracker.details_logger.details[task]
    return sorted(((d.doc, d.model_response) for d in found), key=lambda pair: int(pair[0].id))
