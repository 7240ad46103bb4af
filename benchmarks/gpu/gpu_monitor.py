"""What the GPU and the host did while each process of ``gpu_throughput.py`` worked.

Issue 29's question: with several engines on one GPU, does the GPU set the pace (busy all the time, the
engine cores waiting on it) or does the host (its CPUs busy, or taken by the hypervisor: steal time)? And why
does one offline engine run at 140 req/s in one call and 236 in the next? The parent process samples, every
``interval`` seconds for the whole call:

- the GPU through ``nvidia-smi`` (one long-running process): ``utilization.gpu``, the share of the sample
  period in which at least one kernel ran (any process's: time-sliced engines count as busy), the SM clock
  and the power draw;
- the host through ``/proc/stat``: the share of all CPUs busy, and the share stolen by the hypervisor.

Children report the wall-clock window of each timed phase; `Monitor.window` averages the samples inside it.
Every sample is written to ``$OUT`` as CSV too, so a window can be re-read later.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

_GPU_QUERY = "utilization.gpu,clocks.sm,power.draw,memory.used"
# /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice (jiffies).
_IDLE_FIELDS = (3, 4)  # idle, iowait
_STEAL_FIELD = 7


def _cpu_jiffies() -> list[int] | None:
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return None
    return [int(x) for x in fields[:8]]


class Monitor:
    """Samples the GPU and the host in the background (see the module docstring); `stop` ends it."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.gpu: list[tuple[float, list[float]]] = []  # (time, [util %, SM MHz, W, MiB]) of GPU 0
        self.host: list[tuple[float, float, float]] = []  # (time, busy share, steal share) since last
        self._stop = threading.Event()
        self._smi: subprocess.Popen[str] | None = None
        with contextlib.suppress(OSError):
            self._smi = subprocess.Popen(
                [
                    "nvidia-smi",
                    f"--query-gpu={_GPU_QUERY}",
                    "--format=csv,noheader,nounits",
                    f"-lms={int(interval * 1000)}",
                    "--id=0",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        self._threads = [threading.Thread(target=self._read_host, daemon=True)]
        if self._smi is not None:
            self._threads.append(threading.Thread(target=self._read_gpu, daemon=True))
        for thread in self._threads:
            thread.start()

    def _read_gpu(self) -> None:
        assert self._smi is not None
        assert self._smi.stdout is not None
        for line in self._smi.stdout:
            try:
                values = [float(x) for x in line.split(",")]
            except ValueError:  # "[N/A]" or a header: not a sample
                continue
            self.gpu.append((time.time(), values))

    def _read_host(self) -> None:
        last = _cpu_jiffies()
        while not self._stop.wait(self.interval):
            now = _cpu_jiffies()
            if last is None or now is None:
                return
            delta = [b - a for a, b in zip(last, now, strict=True)]
            total = sum(delta)
            if total > 0:
                idle = sum(delta[i] for i in _IDLE_FIELDS)
                self.host.append((time.time(), 1 - idle / total, delta[_STEAL_FIELD] / total))
            last = now

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Means over the samples taken between ``start`` and ``end`` (wall clock, seconds)."""
        gpu = [v for t, v in self.gpu if start <= t <= end]
        host = [(b, s) for t, b, s in self.host if start <= t <= end]
        result: dict[str, Any] = {"gpu_samples": len(gpu), "host_samples": len(host)}
        if gpu:
            result["gpu_util"] = sum(v[0] for v in gpu) / len(gpu) / 100
            result["gpu_util_min"] = min(v[0] for v in gpu) / 100
            result["sm_clock_mhz"] = sum(v[1] for v in gpu) / len(gpu)
            result["power_w"] = sum(v[2] for v in gpu) / len(gpu)
        if host:
            result["host_busy"] = sum(b for b, _ in host) / len(host)
            result["host_steal"] = sum(s for _, s in host) / len(host)
        return result

    def attach(self, outcome: dict[str, Any] | None) -> None:
        """Add the window of each timed phase (``wall``: [start, end]) of a child's result, in place."""
        if not outcome:
            return
        for part in ("generate", "loglikelihood"):
            phase = outcome.get(part)
            if isinstance(phase, dict) and "wall" in phase:
                phase["monitor"] = self.window(*phase["wall"])

    def write(self, path: Path) -> None:
        """Every sample so far as CSV: kind, time, then the values."""
        rows = [f"gpu,{t:.3f},{','.join(f'{x:g}' for x in v)}" for t, v in self.gpu]
        rows += [f"host,{t:.3f},{b:.4f},{s:.4f}" for t, b, s in self.host]
        path.write_text("kind,time,values...\n" + "\n".join(rows) + "\n")

    def stop(self) -> None:
        """End the sampling; no sample is added once this returns."""
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._smi.wait(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
