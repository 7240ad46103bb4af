"""Compute the in-process `vllm` adapter's answers to `cases` and write them as JSON (run as a script).

It runs in its own process, beside the `vllm serve` under test, so the test process holds no engine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main(model: str, out: str) -> None:
    from vllm.config import StructuredOutputsConfig

    import asyncbackends as ab
    from tests.openai.cases import ENGINE_OPTIONS, GREEDY, ROLLING, SCORED, TOOL_PARSER, TOOLS

    # As the server is started (conftest.py): compact JSON under a schema, and the same tool parser.
    compact = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
    backend = ab.create_backend(
        "vllm", model=model, structured_outputs_config=compact, tool_parser=TOOL_PARSER, **ENGINE_OPTIONS
    )
    try:
        generated = ab.run_batch(backend, GREEDY)
        scored = ab.run_batch(backend, SCORED)
        rolling = ab.run_batch(backend, ROLLING)
        tools = ab.run_batch(backend, list(TOOLS.values()))
    finally:
        backend.close()
    data = {
        "generated": [[asdict(c) for c in r.completions] for r in generated],
        "scored": [asdict(r) for r in scored],
        "rolling": [asdict(r) for r in rolling],
        "tools": {name: asdict(r.completions[0]) for name, r in zip(TOOLS, tools, strict=True)},
    }
    with open(out, "w") as f:
        json.dump(data, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
