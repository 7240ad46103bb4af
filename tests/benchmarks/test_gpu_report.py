"""The GPU benchmark's report: how rounds and processes become the ratios docs/benchmarks.md quotes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .scripts import load_script

REPORT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "gpu_report.py"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return load_script(REPORT, "gpu_report")


def child(
    rates: list[float],
    tokens: list[list[int]] | None = None,
    init: float = 20.0,
    cpu: float = 0.25,
    logprobs: list[float] | None = None,
) -> dict[str, Any]:
    """A child's result as gpu_modes writes it: 100 requests a round at the given rates."""
    rounds = [
        {
            "elapsed_s": 100 / r,
            "cpu_s": cpu * 100 / r,
            "requests": 100,
            "prompt_tokens": 1000,
            "output_tokens": 12800,
        }
        for r in rates
    ]
    middle = sorted(rounds, key=lambda r: r["requests"] / r["elapsed_s"])[len(rounds) // 2]
    result: dict[str, Any] = {
        "init_s": init,
        "generate": {**rounds[0], **middle, "tokens": tokens or [[1, 2, 3]], "rounds": rounds},
    }
    if logprobs is not None:
        result["loglikelihood"] = {"elapsed_s": 10.0, "cpu_s": 10.0, "requests": 50, "logprobs": logprobs}
    return result


def test_abba_pairs_each_adapter_round_with_the_same_round_of_the_offline_process_next_to_it(
    report: ModuleType,
) -> None:
    outcomes = {
        "offline": [child([100, 120], init=40), child([200, 110], init=14)],
        "adapter": [child([105, 120], init=30), child([190, 121], init=26)],
    }
    summary = report.summarize("compiled-abba", outcomes, compare=1)
    adapter = summary["adapter"]["generate"]
    assert adapter["round_ratios"] == pytest.approx([1.05, 1.0, 0.95, 1.1])
    assert adapter["ratio_to_offline"] == pytest.approx(1.025)  # the median of the four, not of rates
    assert summary["adapter"]["init_s"] == [30, 26]
    assert summary["offline"]["generate"]["rounds_req_per_s"] == pytest.approx([100, 120, 200, 110])
    assert adapter["rounds_frontend_cpu"] == pytest.approx([0.25] * 4)
    text = report.markdown({"suites": {"compiled-abba": summary}})
    assert "compiled-abba/adapter: ratios to offline, round by round: 1.05, 1.00, 0.95, 1.10" in text
    assert "| compiled-abba | adapter | generate |" in text


def test_a_skipped_process_leaves_its_partner_unpaired(report: ModuleType) -> None:
    # ABBA with the last offline process skipped: the first adapter process ran next to the only offline
    # one and is compared with it; the second has no partner.
    outcomes = {
        "offline": [child([100, 110]), None],
        "adapter": [child([90, 130]), child([120, 100])],
    }
    summary = report.summarize("compiled-abba", outcomes, compare=1)
    adapter = summary["adapter"]["generate"]
    assert adapter["round_ratios"] == pytest.approx([0.9, 130 / 110])
    assert adapter["ratio_to_offline"] == pytest.approx((0.9 + 130 / 110) / 2)
    assert adapter["req_per_s"] == pytest.approx(120)  # the upper median of 90, 100, 120, 130


def test_processes_are_never_paired_with_one_that_did_not_run_next_to_them(report: ModuleType) -> None:
    outcomes = {
        "offline": [child([100, 110]), None],
        "adapter": [None, child([120, 100])],
    }
    summary = report.summarize("compiled-abba", outcomes, compare=1)
    adapter = summary["adapter"]["generate"]
    assert "round_ratios" not in adapter
    assert adapter["ratio_to_offline"] == pytest.approx(120 / 110)  # only the median rates remain


def test_a_mode_that_failed_everywhere_is_reported_as_failed(report: ModuleType) -> None:
    summary = report.summarize("compiled", {"offline": [child([100])], "adapter": [None]}, compare=1)
    assert summary["adapter"] is None
    text = report.markdown({"suites": {"compiled": summary}})
    assert "| compiled | adapter | - | failed or skipped |" in text


def test_dp_times_the_offline_shards_by_the_slowest(report: ModuleType) -> None:
    shards = [child([10.0]), child([8.0])]  # 100 requests each: 10 s and 12.5 s
    summary = report.summarize("dp", {"offline": shards, "adapter": [child([20.0])]}, compare=0)
    assert summary["offline"]["generate"]["req_per_s"] == pytest.approx(200 / 12.5)
    assert summary["adapter"]["generate"]["ratio_to_offline"] == pytest.approx(20.0 / 16.0)


def test_greedy_and_scoring_agreement_with_offline(report: ModuleType) -> None:
    offline = child([100], tokens=[[1, 2, 3], [4, 5, 6], [7, 8, 9]], logprobs=[-1.0, -2.0, -3.0])
    adapter = child([100], tokens=[[1, 2, 3], [4, 0, 6], [7, 8, 9]], logprobs=[-1.0, -2.5, -3.0])
    summary = report.summarize("eager", {"offline": [offline], "adapter": [adapter]}, compare=3)
    greedy = summary["adapter"]["greedy_vs_offline"]
    assert greedy == {
        "compared": 3,
        "identical": 2,
        "identical_tokens": 8,
        "tokens": 9,
        "median_first_divergence": 1,
    }
    scoring = summary["adapter"]["loglikelihood_vs_offline"]
    assert scoring["max_abs_diff"] == pytest.approx(0.5)
    assert scoring["median_abs_diff"] == 0.0
    assert summary["adapter"]["loglikelihood"]["ratio_to_offline"] == pytest.approx(1.0)


def test_the_gpu_and_host_means_over_a_phase_are_reported(report: ModuleType) -> None:
    ours = child([400])
    ours["generate"]["monitor"] = {
        "gpu_samples": 40,
        "host_samples": 39,
        "gpu_util": 0.97,
        "gpu_util_min": 0.15,
        "sm_clock_mhz": 1851.0,
        "power_w": 657.0,
        "host_busy": 0.33,
        "host_steal": 0.024,
    }
    summary = report.summarize("six", {"offline": [child([200])], "engines-6": [ours]}, compare=1)
    assert summary["engines-6"]["generate"]["monitor"]["gpu_util"] == 0.97
    text = report.markdown({"suites": {"six": summary}})
    assert (
        "six/engines-6: generate: GPU busy 97% (lowest sample 15%), SM 1851 MHz, 657 W; host CPUs busy 33%, "
        "stolen 2.4%; 40 GPU / 39 host samples" in text
    )
    assert "six/offline: generate:" not in text  # no samples, no note
