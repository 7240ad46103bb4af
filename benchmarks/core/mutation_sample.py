"""The fixed mutant sample of docs/reliability.md ("Mutation testing"), and its per-module counts.

mutmut 3 runs one pytest session per mutant; on a shared 2-core machine the ~1,500 mutants of the core take
hours, so the score is measured on a fixed random sample of each module's mutants (seeded, so a later run
draws the same sample while the modules are unchanged). Run from the repository root, after a first
``mutmut run`` has generated ``mutants/`` (an interrupted one will do):

    nice -n 19 mutmut run --max-children 1 $(python benchmarks/core/mutation_sample.py)
    python benchmarks/core/mutation_sample.py --summary        # the table: killed, survived, ... per module
    python benchmarks/core/mutation_sample.py --list survived  # the sampled mutants in that state
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

# Mutants sampled per module, in the order the modules matter to the gathering path.
SAMPLE = {
    "_run": 45,
    "gather": 30,
    "options": 25,
    "cache": 25,
    "loop": 25,
    "registry": 20,
    "_clock": 20,
    "_limits": 20,
}
SEED = 14

# mutmut's exit codes (mutmut.stats.status_by_exit_code), restated so this runs without importing mutmut.
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", None: "not checked"}
STATUS |= dict.fromkeys((36, 24, -24, 152, 255), "timeout")


def exit_codes(module: str) -> dict[str, int | None]:
    meta = Path("mutants/asyncbackends") / f"{module}.py.meta"
    return json.loads(meta.read_text())["exit_code_by_key"]  # type: ignore[no-any-return]


def sample() -> dict[str, list[str]]:
    """The sampled mutant names of each module."""
    rng = random.Random(SEED)
    return {module: sorted(rng.sample(sorted(exit_codes(module)), size)) for module, size in SAMPLE.items()}


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--summary", action="store_true", help="print the per-module counts")
    parser.add_argument("--list", metavar="STATUS", help="print the sampled mutants in this state")
    args = parser.parse_args()
    picked = sample()
    if not args.summary and not args.list:
        print(" ".join(name for names in picked.values() for name in names))
        return
    columns = ("killed", "survived", "timeout", "no tests", "not checked")
    if args.summary:
        print(f"{'module':9} {'sampled':>7} " + " ".join(f"{c:>11}" for c in columns) + "  score")
    for module, names in picked.items():
        codes = exit_codes(module)
        states = {name: STATUS.get(codes[name], "other") for name in names}
        if args.list:
            for name in (name for name, state in states.items() if state == args.list):
                print(name)
            continue
        counts = Counter(states.values())
        tested = len(names) - counts["not checked"]
        score = (counts["killed"] + counts["timeout"]) / tested if tested else 0.0
        print(f"{module:9} {len(names):7} " + " ".join(f"{counts[c]:11}" for c in columns) + f"  {score:.0%}")


if __name__ == "__main__":
    main()
