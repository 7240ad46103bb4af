"""Several vLLM engines on one GPU (``create_backend("vllm", engines=N)``) against vLLM's offline path.

Issue 29. Each row is a fresh process, one after another in one call, as in ``gpu_throughput.py`` (whose
machinery this runs: the synthetic model, the workload, the timing, the report): vLLM's offline
``LLM.generate`` first, then the adapter with ``engines=N``. Every process generates greedily on the same
token-id prompts (32-512 tokens, 128 generated) and scores the same loglikelihood pairs (lm-eval's
multiple-choice shape: a context, a short continuation); every greedy output is compared with the offline
process's (``--compare`` defaults to all prompts here) and every loglikelihood too.

    python benchmarks/engines/engines_per_gpu.py build --model-dir /tmp/synth-1b
    python benchmarks/engines/engines_per_gpu.py build --shape 8b --tokenizer-from /tmp/synth-1b \
        --model-dir /tmp/8b
    python benchmarks/engines/engines_per_gpu.py suite quick --model-dir /tmp/synth-1b  # offline, 2, 4, auto
    python benchmarks/engines/engines_per_gpu.py suite scaling scaling-compiled --model-dir /tmp/synth-1b
    python benchmarks/engines/engines_per_gpu.py suite large large-compiled --model-dir /tmp/8b

Suites (modes ``engines-N`` are the adapter with ``engines=N``; ``engines-auto`` with ``engines="auto"``):
    quick             offline, 2, 4 and auto engines, eager: the first call's rows
    scaling           offline, 1, 2, 3, 4, 6, 8 and auto engines, eager (the 1B shape)
    scaling-compiled  the same with torch.compile and CUDA graphs
    large             offline, 1, 2 and auto engines, eager (the 8B shape: auto must pick 1)
    large-compiled    the same, compiled
    auto              offline and auto only (the 8B shape's check: >= 0.98x offline)
    wide              offline, 6 and 8 engines, eager (past 4: where the scaling stops)
    wide-compiled     the same, compiled
    confirm           offline, auto and 4 engines, eager
    six               offline and 6 engines, eager (with a small --prompts: a long loglikelihood run)
    three             offline and 3 engines, eager
    auto-compiled     auto engines (6 on one GPU), then offline, compiled
    eight-compiled    offline, then 8 engines, compiled (decode batches of 4096 / 8 = 512 tokens fit vLLM's
                      largest CUDA graph, 512, where 6 engines' 683 do not)

The parent samples the GPU (busy share, SM clock, power) and the host (CPUs busy, stolen) all along and
reports their means over each process's timed phases (``gpu_monitor.py``); ``gpu_floor.py`` gives the least
GPU time the workload can take, to compare the rates with.

``BENCH_PYSPY_SECONDS=S`` (py-spy on PATH) profiles every process, offline included, with its engine-core
children, for S seconds of its timed generation and S of its timed scoring, all threads, collapsed stacks in
``$OUT/pyspy-<mode>-<phase>-<pid>.txt``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))

import gpu_throughput  # sets the GPU environment before vLLM is imported

Step = list[tuple[str, dict[str, Any]]]


def _rows(counts: list[str], compiled: bool) -> list[Step]:
    spec: dict[str, Any] = {"compiled": True} if compiled else {}
    return [[("offline", dict(spec))], *[[(f"engines-{n}", dict(spec))] for n in counts]]


SUITES: dict[str, list[Step]] = {
    "quick": _rows(["2", "4", "auto"], compiled=False),
    "scaling": _rows(["1", "2", "3", "4", "6", "8", "auto"], compiled=False),
    "scaling-compiled": _rows(["1", "2", "3", "4", "6", "8", "auto"], compiled=True),
    "large": _rows(["1", "2", "auto"], compiled=False),
    "large-compiled": _rows(["1", "2", "auto"], compiled=True),
    "auto": _rows(["auto"], compiled=False),
    "wide": _rows(["6", "8"], compiled=False),
    "wide-compiled": _rows(["6", "8"], compiled=True),
    "confirm": _rows(["auto", "4"], compiled=False),
    "six": _rows(["6"], compiled=False),
    "three": _rows(["3"], compiled=False),
    "auto-compiled": [[("engines-auto", {"compiled": True})], [("offline", {"compiled": True})]],
    "eight-compiled": _rows(["8"], compiled=True),
}


def main() -> int:
    """``gpu_throughput.py``'s command line with this file's suites; every greedy output compared."""
    gpu_throughput.SUITES.update(SUITES)
    if "--compare" not in sys.argv and "--prompts" in sys.argv:
        sys.argv += ["--compare", sys.argv[sys.argv.index("--prompts") + 1]]
    elif "--compare" not in sys.argv:
        sys.argv += ["--compare", "4000"]  # gpu_throughput's default prompt count: every output
    # Children run this file's modes through gpu_throughput.py's child command, which knows engines-N.
    return gpu_throughput.main()


if __name__ == "__main__":
    sys.exit(main())
