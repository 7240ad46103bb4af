"""Cache administration on a 1M-entry file: ``stats``, ``export`` and ``prune`` beside SQLite's own floor.

A file of N entries is built once (mock generation results, as a run stores them; half dated 30 days back).
Then, in fresh processes and alternating rounds, each operation runs twice: through `ResponseCache` (what
``asyncbackends cache stats|export|prune`` call) and as the bare SQL statement it comes down to (``SELECT
backend, kind, COUNT(*) ... GROUP BY``; a cursor over every row written to a file; the one ``DELETE``), so
the ratio is the library's own overhead on top of SQLite. Every process's time and max RSS is printed, then
the medians and ratios. A prune runs on a copy of the file, made outside the timed region. Usage::

    python benchmarks/core/cache_admin.py [--n 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPERATIONS = ("stats", "export", "prune")


def build(path: Path, n: int) -> None:
    """A cache file of ``n`` entries as runs store them: rows written through the cache's own encoder."""
    import asyncbackends as ab
    from asyncbackends._cache_codec import encode_result

    ab.ResponseCache(path).close()  # the schema, as the library creates it
    with sqlite3.connect(path) as db:
        chunk = 50_000
        for start in range(0, n, chunk):
            rows = []
            for i in range(start, min(n, start + chunk)):
                text = f"question {i}"
                completion = ab.Completion(text, tuple(map(ord, text)))
                result = ab.GenerationResult(str(i), (completion,), 10, "mock")
                kind, value = encode_result(result)
                rows.append((f"{i:064x}", kind, value, "mock", 30 if i % 2 else 0))
            db.executemany(
                "INSERT INTO results (key, kind, value, backend, created) "
                "VALUES (?, ?, ?, ?, julianday('now') - ?)",
                rows,
            )


def one(operation: str, how: str, path: str, out: str) -> dict[str, float]:
    """One operation in this process: seconds, rows touched, max RSS (MB); imports are not timed."""
    from contextlib import closing

    import asyncbackends as ab

    start = time.perf_counter()
    if how == "library":
        with closing(ab.ResponseCache(path)) as cache:
            if operation == "stats":
                rows = cache.stats()["entries"]
            elif operation == "export":
                with open(out, "w", encoding="utf-8") as file:
                    rows = cache.export(file)
            else:
                rows = cache.prune(older_than_days=15)
    else:
        db = sqlite3.connect(path, isolation_level=None)
        if operation == "stats":
            rows = sum(r[2] for r in db.execute("SELECT backend, kind, COUNT(*) FROM results GROUP BY 1, 2"))
        elif operation == "export":
            rows = 0
            with open(out, "w", encoding="utf-8") as file:
                for row in db.execute("SELECT key, backend, kind, created, value FROM results ORDER BY key"):
                    file.write(json.dumps(row[:4]) + row[4] + "\n")
                    rows += 1
        else:
            rows = db.execute("DELETE FROM results WHERE created < julianday('now') - 15").rowcount
        db.close()
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "rows": rows, "rss_mb": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=4, metavar=("OPERATION", "HOW", "PATH", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "cache.sqlite"
        started = time.perf_counter()
        build(source, args.n)
        size = source.stat().st_size / 1e6
        print(f"built {args.n} entries, {size:.0f} MB, in {time.perf_counter() - started:.0f} s", flush=True)
        figures: dict[tuple[str, str], list[dict[str, float]]] = {}
        for round_ in range(args.rounds):
            for operation in OPERATIONS:
                for how in ("library", "sqlite") if round_ % 2 == 0 else ("sqlite", "library"):
                    path = source
                    if operation == "prune":  # on a fresh copy each time, copied outside the timed part
                        path = Path(folder) / f"prune-{how}.sqlite"
                        shutil.copyfile(source, path)
                    command = [sys.executable, __file__, "--one", operation, how, str(path)]
                    command.append(str(Path(folder) / "export.jsonl"))
                    done = subprocess.run(command, capture_output=True, text=True, check=True)
                    figure = json.loads(done.stdout.strip().splitlines()[-1])
                    figures.setdefault((operation, how), []).append(figure)
                    print(f"round {round_} {operation:6} {how:7} {json.dumps(figure)}", flush=True)
        print("\nmedians (library / bare SQLite):")
        for operation in OPERATIONS:
            lib = statistics.median(f["seconds"] for f in figures[(operation, "library")])
            raw = statistics.median(f["seconds"] for f in figures[(operation, "sqlite")])
            rss = max(f["rss_mb"] for f in figures[(operation, "library")])
            rows = figures[(operation, "library")][0]["rows"]
            print(
                f"{operation:6} library {lib:6.2f} s, SQLite {raw:6.2f} s, ratio {lib / raw:4.2f}x; "
                f"{rows:.0f} rows, library max RSS {rss:.0f} MB"
            )


if __name__ == "__main__":
    main()
