"""Local datasets for the lm-eval test tasks: JSONL files next to this module, no hub, no cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

_HERE = Path(__file__).parent


def _load(name: str) -> dict[str, datasets.Dataset]:
    rows = [json.loads(line) for line in (_HERE / f"{name}.jsonl").read_text().splitlines() if line]
    return {"test": datasets.Dataset.from_list(rows)}


def load_mc(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("mc")


def load_gen(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("gen")


def load_ppl(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("ppl")


def load_think(**_: Any) -> dict[str, datasets.Dataset]:
    return _load("think")
