"""The ``asyncbackends`` command: list adapters, run a JSONL file of requests, manage caches, check adapters.

```
asyncbackends list
asyncbackends run INPUT.jsonl --backend NAME [--option key=value ...] [--output OUT.jsonl] [--concurrency N]
asyncbackends run INPUT.jsonl --backend pool --replicas replicas.toml
asyncbackends cache stats|clear PATH
asyncbackends contract NAME [--option key=value ...]
```

Input lines (one JSON object each; ``type`` defaults to ``"generate"``):

```
{"prompt": "text" | [{"role": ..., "content": ...}] | [token ids], "params": {...}, "request_id": "..."}
{"type": "loglikelihood", "context": "...", "continuation": "...", "request_id": "..."}
{"type": "loglikelihood_rolling", "text": "...", "request_id": "..."}
```

Every input line is validated before anything is sent: a bad line is reported with its line number and the
run does not start. The output has exactly one record per input line, in input order: ``result`` or
``error``. Exit status: 0 when every request succeeded, 1 when some failed (their records say why), 2 for
bad input or options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .cache import ResponseCache
from .errors import AsyncBackendsError, BackendError, InvalidRequestError
from .gather import RetryPolicy, run_batch
from .loop import get_loop_manager
from .metrics import RunMetrics
from .registry import available_backends, create_backend, extra_installed
from .types import (
    GenerationRequest,
    LoglikelihoodRequest,
    Request,
    RollingLoglikelihoodRequest,
    SamplingParams,
)

__all__ = ["main", "parse_option_value", "parse_options", "parse_request"]

_MAX_REPORTED = 20


_OPTION_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None, "null": None}


def parse_option_value(text: str) -> Any:
    """Read one option value: JSON where it parses, else true/false/none in any case, else the text.

    Examples: ``"8"`` -> ``8``, ``"0.5"`` -> ``0.5``, ``"True"`` -> ``True``, ``"[1, 2]"`` -> ``[1, 2]``,
    ``'"8"'`` -> ``"8"`` (quote a number to keep it text), ``"float32"`` -> ``"float32"``.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        return _OPTION_WORDS.get(stripped.lower(), text)


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` to a dict, values read by `parse_option_value`.

    Raises:
        InvalidRequestError: An item has no ``=``.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequestError(f"--option must look like key=value, got {pair!r}")
        options[key.strip()] = parse_option_value(value)
    return options


def parse_request(record: Any) -> Request:
    """One decoded JSONL record to a request.

    Raises:
        InvalidRequestError: The record is not a valid request (the message names the field).
    """
    if not isinstance(record, dict):
        raise InvalidRequestError(f"expected a JSON object, got {type(record).__name__}")
    record = dict(record)
    kind = record.pop("type", "generate")
    request_id = record.pop("request_id", None)
    if request_id is not None and not isinstance(request_id, str):
        request_id = str(request_id)
    fields: dict[str, Sequence[str]] = {
        "generate": ("prompt", "params"),
        "loglikelihood": ("context", "continuation"),
        "loglikelihood_rolling": ("text",),
    }
    if kind not in fields:
        raise InvalidRequestError(f"type must be one of {sorted(fields)}, got {kind!r}")
    unknown = set(record) - set(fields[kind])
    if unknown:
        raise InvalidRequestError(f"unknown field(s) for {kind}: {sorted(unknown)}")
    try:
        if kind == "generate":
            if "prompt" not in record:
                raise InvalidRequestError("missing field 'prompt'")
            params = record.get("params") or {}
            if not isinstance(params, dict):
                raise InvalidRequestError("params must be an object")
            return GenerationRequest(record["prompt"], SamplingParams(**params), request_id)
        if kind == "loglikelihood":
            return LoglikelihoodRequest(record.get("context", ""), record.get("continuation", ""), request_id)
        return RollingLoglikelihoodRequest(record.get("text", ""), request_id)
    except TypeError as exc:  # an unknown SamplingParams field
        raise InvalidRequestError(str(exc).replace("SamplingParams.__init__() got an ", "params: ")) from exc


def _read_requests(path: Path) -> list[Request]:
    requests: list[Request] = []
    problems: list[str] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                problems.append(f"{path}:{number}: empty line (every line must be one request)")
                continue
            try:
                requests.append(parse_request(json.loads(line)))
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{number}: not valid JSON: {exc.msg} (column {exc.colno})")
            except InvalidRequestError as exc:
                problems.append(f"{path}:{number}: {exc}")
    if problems:
        shown = problems[:_MAX_REPORTED]
        more = len(problems) - len(shown)
        raise InvalidRequestError(
            "\n".join([*shown, *([f"... and {more} more bad lines"] if more else [])])
            + f"\n{len(problems)} bad line(s): nothing was sent"
        )
    return requests


def _record(index: int, request: Request, outcome: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "request_id": request.request_id}
    if isinstance(outcome, AsyncBackendsError):
        record["error"] = {
            "type": type(outcome).__name__,
            "message": getattr(outcome, "message", str(outcome)),
            "retryable": outcome.retryable if isinstance(outcome, BackendError) else False,
        }
    else:
        result = dataclasses.asdict(outcome)
        result.pop("request_id", None)
        record["result"] = result
    return record


def _cmd_list(_: argparse.Namespace, out: TextIO) -> int:
    for name, target in available_backends().items():
        installed = extra_installed(name)
        state = {True: "installed", False: "extra not installed", None: "entry point / registered"}[installed]
        out.write(f"{name:<12} {target:<52} {state}\n")
    return 0


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    requests = _read_requests(Path(args.input))
    options = parse_options(args.option)
    if args.replicas:
        options["replicas"] = args.replicas  # the pool backend's replicas file
    backend = create_backend(args.backend, **options)
    metrics = RunMetrics()
    metrics.track_replicas(backend)  # a pool's per-replica figures in the summary; nothing otherwise
    try:
        outcomes = run_batch(
            backend,
            requests,
            concurrency=args.concurrency,
            timeout=args.timeout,
            retry=RetryPolicy(max_attempts=args.max_attempts),
            progress=not args.no_progress and args.backend,
            cache=args.cache,
            return_exceptions=True,
            metrics=metrics,
        )
    finally:
        get_loop_manager().run(backend.aclose())
    sink = open(args.output, "w", encoding="utf-8") if args.output else out  # noqa: SIM115
    try:
        for index, (request, outcome) in enumerate(zip(requests, outcomes, strict=True)):
            sink.write(json.dumps(_record(index, request, outcome), ensure_ascii=False) + "\n")
    finally:
        if sink is not out:
            sink.close()
    sys.stderr.write(metrics.format() + "\n")
    return 1 if metrics.failed else 0


def _cmd_cache(args: argparse.Namespace, out: TextIO) -> int:
    path = Path(args.path)
    if not path.exists():
        raise InvalidRequestError(f"no cache at {path}")
    cache = ResponseCache(path)
    try:
        if args.action == "stats":
            out.write(json.dumps(cache.stats(), indent=2) + "\n")
        else:
            out.write(f"removed {cache.clear()} entries from {path}\n")
    finally:
        cache.close()
    return 0


def _cmd_contract(args: argparse.Namespace, out: TextIO) -> int:
    from .testing.contract import run_contract

    return run_contract(args.name, parse_options(args.option), list(args.pytest_args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncbackends", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered adapters and whether their extras are installed")

    run = sub.add_parser("run", help="send every request of a JSONL file, write one record per line")
    run.add_argument("input", help="JSONL file, one request per line")
    run.add_argument("--backend", required=True, help="adapter name (see `asyncbackends list`)")
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option")
    run.add_argument("--replicas", metavar="FILE", help="replicas file (TOML/JSON) for --backend pool")
    run.add_argument("--output", help="JSONL file for results (default: standard output)")
    run.add_argument("--concurrency", type=int, help="requests in flight (default: the backend's hint)")
    run.add_argument("--timeout", type=float, help="seconds per attempt")
    run.add_argument("--max-attempts", type=int, default=3, help="attempts per request (default 3)")
    run.add_argument("--cache", help="SQLite response cache: resume a run, skip what is done")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    cache = sub.add_parser("cache", help="inspect or clear a response cache")
    cache.add_argument("action", choices=["stats", "clear"])
    cache.add_argument("path")

    contract = sub.add_parser("contract", help="run the adapter contract suite against a registered adapter")
    contract.add_argument("name", help="adapter name")
    contract.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option")
    contract.epilog = "Arguments after -- go to pytest, for example: -- -x -k cancel"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" is for pytest (contract only); argparse would mix it with our own options.
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, passed_on = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if passed_on and args.command != "contract":
        _parser().error(f"arguments after -- are only for `contract`: {' '.join(passed_on)}")
    args.pytest_args = passed_on
    commands = {"list": _cmd_list, "run": _cmd_run, "cache": _cmd_cache, "contract": _cmd_contract}
    try:
        return commands[args.command](args, sys.stdout)
    except (InvalidRequestError, LookupError) as exc:
        sys.stderr.write(f"asyncbackends {args.command}: {exc}\n")
        return 2
    except AsyncBackendsError as exc:  # the backend could not be built or reached: no traceback
        sys.stderr.write(f"asyncbackends {args.command}: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
