"""The GPU benchmark's monitor: which samples a process's timed phase is credited with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .scripts import benchmark_module


@pytest.fixture(scope="module")
def monitor_module() -> Iterator[ModuleType]:
    with benchmark_module("gpu_monitor") as module:
        yield module


@pytest.fixture
def monitor(monitor_module: ModuleType) -> Any:
    # Stopped at once: the tests put their own samples in (no GPU here; nvidia-smi may be missing).
    seen = monitor_module.Monitor(interval=0.05)
    seen.stop()
    seen.gpu[:] = [(1.0, [50.0, 1800.0, 400.0, 10.0]), (2.0, [100.0, 1900.0, 600.0, 10.0]), (5.0, [0.0] * 4)]
    seen.host[:] = [(1.5, 0.5, 0.01), (2.5, 0.3, 0.03), (9.0, 1.0, 0.5)]
    return seen


def test_a_window_averages_the_samples_inside_it_and_no_others(monitor: Any) -> None:
    window = monitor.window(1.0, 3.0)
    assert window == pytest.approx(
        {
            "gpu_samples": 2,
            "host_samples": 2,
            "gpu_util": 0.75,
            "gpu_util_min": 0.5,
            "sm_clock_mhz": 1850.0,
            "power_w": 500.0,
            "host_busy": 0.4,
            "host_steal": 0.02,
        }
    )
    assert monitor.window(3.0, 4.0) == {"gpu_samples": 0, "host_samples": 0}


def test_each_timed_phase_of_a_result_gets_its_own_window(monitor: Any) -> None:
    outcome = {"init_s": 9.0, "generate": {"wall": [0.5, 2.2]}, "loglikelihood": {"wall": [4.0, 9.5]}}
    monitor.attach(outcome)
    monitor.attach(None)  # a failed process: nothing to attach
    assert outcome["generate"]["monitor"]["gpu_util"] == pytest.approx(0.75)
    assert outcome["loglikelihood"]["monitor"] == pytest.approx(
        {
            "gpu_samples": 1,
            "host_samples": 1,
            "gpu_util": 0.0,
            "gpu_util_min": 0.0,
            "sm_clock_mhz": 0.0,
            "power_w": 0.0,
            "host_busy": 1.0,
            "host_steal": 0.5,
        }
    )


def test_every_sample_is_written_for_a_later_look(monitor: Any, tmp_path: Path) -> None:
    path = tmp_path / "monitor.csv"
    monitor.write(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "kind,time,values..."
    assert lines[1] == "gpu,1.000,50,1800,400,10"
    assert lines[-1] == "host,9.000,1.0000,0.5000"
    assert len(lines) == 1 + 3 + 3


def test_the_host_sampler_reads_this_machines_cpu_counters(monitor_module: ModuleType) -> None:
    jiffies = monitor_module._cpu_jiffies()
    assert jiffies is not None
    assert len(jiffies) == 8
    assert sum(jiffies) > 0
