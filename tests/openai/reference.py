"""Compute the in-process `vllm` adapter's answers to `cases` and write them as JSON (run as a script).

It runs in its own process, beside the `vllm serve` under test, so the test process holds no engine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main(model: str, out: str) -> None:
    import asyncbackends as ab
    from tests.openai.cases import ENGINE_OPTIONS, GREEDY, ROLLING, SCORED

    backend = ab.create_backend("vllm", model=model, **ENGINE_OPTIONS)
    try:
        generated = ab.run_batch(backend, GREEDY)
        scored = ab.run_batch(backend, SCORED)
        rolling = ab.run_batch(backend, ROLLING)
    finally:
        backend.close()
    data = {
        "generated": [[asdict(c) for c in r.completions] for r in generated],
        "scored": [asdict(r) for r in scored],
        "rolling": [asdict(r) for r in rolling],
    }
    with open(out, "w") as f:
        json.dump(data, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
