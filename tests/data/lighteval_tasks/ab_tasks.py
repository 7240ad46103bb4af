"""Local lighteval tasks for the integration tests: JSONL files next to this module, no hub.

``ab_mc`` is a multiple-choice loglikelihood task; ``ab_pass`` a generative task sampled four times per
document and scored with pass@k; ``ab_think`` a generative task for reasoning models (the mock that thinks its
prompt backwards: short questions close their thought within the 32 tokens, long ones are cut off thinking).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc

_DATA = Path(__file__).resolve().parent / "data"
NUM_SAMPLES = 4


def mc_prompt(line: dict[str, Any], task_name: str = "") -> Doc:
    return Doc(
        task_name=task_name,
        query=f"Question: {line['question']}\nAnswer:",
        choices=[f" {choice}" for choice in line["choices"]],
        gold_index=int(line["answer"]),
    )


def gen_prompt(line: dict[str, Any], task_name: str = "") -> Doc:
    return Doc(
        task_name=task_name, query=f"Q: {line['question']}\nA:", choices=[line["answer"]], gold_index=0
    )


def think_prompt(line: dict[str, Any], task_name: str = "") -> Doc:
    return Doc(task_name=task_name, query=f"{line['question']}\nA:", choices=[line["answer"]], gold_index=0)


def _local(name: str, prompt_function: Any, data: str, **fields: Any) -> LightevalTaskConfig:
    """A task on the JSONL file ``data/<data>/test.jsonl``."""
    return LightevalTaskConfig(
        name=name,
        prompt_function=prompt_function,
        hf_repo=str(_DATA / data),
        hf_subset="default",
        hf_avail_splits=["test"],
        evaluation_splits=["test"],
        version=0,
        **fields,
    )


ab_mc = _local("ab_mc", mc_prompt, "mc", metrics=[Metrics.loglikelihood_acc])
ab_pass = _local(
    "ab_pass",
    gen_prompt,
    "gen",
    generation_size=8,
    stop_sequence=["\n"],
    metrics=[Metrics.pass_at_k(sample_params={"k": 1, "n": NUM_SAMPLES})],
)
ab_think = _local(
    "ab_think", think_prompt, "think", generation_size=32, stop_sequence=["\n"], metrics=[Metrics.exact_match]
)

TASKS_TABLE = [ab_mc, ab_pass, ab_think]
