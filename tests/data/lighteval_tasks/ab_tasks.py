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


ab_mc = LightevalTaskConfig(
    name="ab_mc",
    prompt_function=mc_prompt,
    hf_repo=str(_DATA / "mc"),
    hf_subset="default",
    hf_avail_splits=["test"],
    evaluation_splits=["test"],
    metrics=[Metrics.loglikelihood_acc],
    version=0,
)

ab_pass = LightevalTaskConfig(
    name="ab_pass",
    prompt_function=gen_prompt,
    hf_repo=str(_DATA / "gen"),
    hf_subset="default",
    hf_avail_splits=["test"],
    evaluation_splits=["test"],
    generation_size=8,
    stop_sequence=["\n"],
    metrics=[Metrics.pass_at_k(sample_params={"k": 1, "n": NUM_SAMPLES})],
    version=0,
)

ab_think = LightevalTaskConfig(
    name="ab_think",
    prompt_function=think_prompt,
    hf_repo=str(_DATA / "think"),
    hf_subset="default",
    hf_avail_splits=["test"],
    evaluation_splits=["test"],
    generation_size=32,
    stop_sequence=["\n"],
    metrics=[Metrics.exact_match],
    version=0,
)

TASKS_TABLE = [ab_mc, ab_pass, ab_think]
