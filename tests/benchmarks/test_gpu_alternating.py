"""The alternating GPU benchmark's helpers: CPU pinning and the busy x cost split docs/benchmarks.md quotes."""

from __future__ import annotations

import importlib
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    # The scripts set engine variables at import (for the GPU machine): keep them out of the other tests.
    saved_environ, saved_path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("gpu_alternating"), importlib.import_module("gpu_alternating_pool")
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.path[:] = saved_path
        for name in ("gpu_alternating", "gpu_alternating_pool", "gpu_workload"):
            sys.modules.pop(name, None)


def test_pinning_plan_gives_the_engine_loop_and_its_threads_a_cpu_each_and_the_caller_the_rest(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    alternating, _ = modules
    # CPUs this machine lacks have no topology file: each counts as a physical core of its own.
    plan = alternating.pinning_plan(set(range(100, 116)))
    assert plan["engine_loop"] == [115]
    assert plan["engine_other"] == [114]
    assert plan["frontend"] == list(range(100, 114))
    with pytest.raises(SystemExit, match="at least 3 physical cores"):
        alternating.pinning_plan({100, 101})


def test_pin_process_puts_the_main_thread_apart_and_last_cpu_reads_where_it_ran(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    alternating, _ = modules
    cpus = sorted(os.sched_getaffinity(0))
    code = "import threading, sys; t = threading.Thread(target=sys.stdin.read); t.start(); t.join()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        tasks: list[str] = []
        while len(tasks) < 2:  # the reader thread has started
            tasks = os.listdir(f"/proc/{child.pid}/task")
        main_cpu, other_cpus = [cpus[-1]], cpus[:1]
        assert alternating.pin_process(child.pid, other_cpus, main_cpu) == 2
        for task in tasks:
            expected = main_cpu if int(task) == child.pid else other_cpus
            assert sorted(os.sched_getaffinity(int(task))) == expected
        assert alternating.last_cpu(child.pid) in cpus
        assert alternating.last_cpu(2**22 + 7) is None  # no such process
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def _path(seconds: float, core_cpu: float) -> dict[str, Any]:
    return {"seconds": seconds, "req_s": 4096 / seconds, "engine_core_cpu": core_cpu}


def test_a_ratio_is_busy_times_cost(modules: tuple[ModuleType, ModuleType]) -> None:
    _, pool = modules
    # The adapter's core is as busy (0.95 CPU s/s) but needs 10% more CPU per request: 10% slower.
    same_busy = {"offline": _path(20.0, 0.95), "adapter": _path(22.0, 0.95)}
    same_busy["ratio"] = same_busy["adapter"]["req_s"] / same_busy["offline"]["req_s"]
    ratio, busy, cost = pool.factors(same_busy)
    assert busy == pytest.approx(1.0)
    assert cost == pytest.approx(20 / 22)
    assert ratio == pytest.approx(busy * cost)
    # The same CPU per request, but the adapter's core idles a fifth of the time: it was fed late.
    starved = {"offline": _path(20.0, 1.0), "adapter": _path(25.0, 0.8)}
    starved["ratio"] = starved["adapter"]["req_s"] / starved["offline"]["req_s"]
    ratio, busy, cost = pool.factors(starved)
    assert (busy, cost) == (pytest.approx(0.8), pytest.approx(1.0))
    assert ratio == pytest.approx(busy * cost)


def test_ratio_interval_is_a_geometric_mean_with_a_t_interval(modules: tuple[ModuleType, ModuleType]) -> None:
    alternating, _ = modules
    interval = alternating.ratio_interval([0.9, 1.0, 1.1, 1.0])
    logs = [math.log(r) for r in (0.9, 1.0, 1.1, 1.0)]
    mean = sum(logs) / 4
    assert interval["geomean"] == pytest.approx(math.exp(mean))
    # Student's t with 3 degrees of freedom (two-sided 90%: 2.353), symmetric on the log scale.
    half = 2.353 * statistics.stdev(logs) / 2
    assert interval["low90"] == pytest.approx(math.exp(mean - half))
    assert interval["high90"] == pytest.approx(math.exp(mean + half))
    assert math.isnan(alternating.ratio_interval([1.05])["low90"])
