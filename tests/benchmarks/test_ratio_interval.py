"""The lm-eval benchmarks' shared ratio summary: a geometric mean with its 90 % interval, none for one round."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest
from scipy import stats

from .scripts import load_script

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "integrations" / "lm_eval_speed.py"


@pytest.fixture(scope="module")
def speed() -> ModuleType:
    return load_script(SCRIPT, "lm_eval_speed_under_test")


def test_one_round_prints_no_interval_rather_than_nan(speed: ModuleType) -> None:
    text = speed.ratio_text([1.5])
    assert text == "1.500x (one round: no interval)"
    assert "nan" not in text


def test_rounds_print_the_t_interval_of_the_log_ratios(speed: ModuleType) -> None:
    ratios = [1.2, 1.5, 1.35, 1.1]
    logs = [math.log(r) for r in ratios]
    low, high = stats.t.interval(0.90, len(logs) - 1, loc=stats.tmean(logs), scale=stats.sem(logs))
    mean = math.exp(stats.tmean(logs))
    assert (
        speed.ratio_text(ratios, digits=2)
        == f"{mean:.2f}x (90 % CI {math.exp(low):.2f}-{math.exp(high):.2f})"
    )
