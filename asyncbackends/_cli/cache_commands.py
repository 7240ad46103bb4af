"""``asyncbackends cache stats|export|prune|clear PATH``: what a user looks at, keeps and trims of a cache.

Each opens the file only if it exists (a mistyped path is an error, not a new empty cache) and streams:
``export`` writes JSON lines as SQLite yields them, ``prune`` is one statement (`asyncbackends._cache_admin`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from .._cache import ResponseCache
from ..errors import InvalidRequestError

__all__ = ["add_cache_parser", "cmd_cache"]


def add_cache_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``cache`` subcommand and its options."""
    cache = sub.add_parser(
        "cache",
        help="inspect, export, prune or clear a response cache",
        description="stats: entries by backend; export: every entry as JSON lines; prune: delete entries "
        "older than --older-than days and/or of one --backend (provider batch records stay); clear: "
        "delete everything.",
    )
    cache.add_argument("action", choices=["stats", "export", "prune", "clear"])
    cache.add_argument("path")
    cache.add_argument("--backend", help="export / prune: only the entries written through this backend name")
    cache.add_argument(
        "--older-than", type=float, metavar="DAYS", help="prune: entries stored before DAYS ago"
    )
    cache.add_argument("--output", help="export: write to this file instead of standard output")


def cmd_cache(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``cache ACTION PATH``; its summary line goes to standard error where the data goes to ``out``."""
    path = Path(args.path)
    if not path.exists():
        raise InvalidRequestError(f"no cache at {path}")
    if args.action != "prune" and args.older_than is not None:
        raise InvalidRequestError("--older-than is a prune option")
    if args.action in ("stats", "clear") and args.backend is not None:
        raise InvalidRequestError(f"--backend is an export and prune option, not a {args.action} one")
    if args.action != "export" and args.output is not None:
        raise InvalidRequestError("--output is an export option")
    cache = ResponseCache(path)
    try:
        if args.action == "stats":
            out.write(json.dumps(cache.stats(), indent=2) + "\n")
        elif args.action == "export":
            if args.output is None:
                count = cache.export(out, backend=args.backend)
            else:
                with open(args.output, "w", encoding="utf-8") as file:
                    count = cache.export(file, backend=args.backend)
            sys.stderr.write(f"exported {count} entries from {path}\n")
        elif args.action == "prune":
            deleted = cache.prune(older_than_days=args.older_than, backend=args.backend)
            out.write(f"removed {deleted} entries from {path}\n")
        else:
            out.write(f"removed {cache.clear()} entries from {path}\n")
    finally:
        cache.close()
    return 0
