"""The ``asyncbackends`` command: list adapters, run a JSONL file of requests, manage caches, check adapters.

```
asyncbackends list
asyncbackends run INPUT.jsonl --backend NAME [--option key=value ...] [--output OUT.jsonl] [--concurrency N]
asyncbackends run INPUT.jsonl --backend pool --replicas replicas.toml
asyncbackends run INPUT.jsonl --backend vllm --option model=BASE --option lora_modules=a=/ckpt/a|b=/ckpt/b
asyncbackends run INPUT.jsonl ... --adapter NAME
asyncbackends run ... [--metrics-file RUN.jsonl] [--metrics-port PORT]
asyncbackends report RUN.jsonl [--output REPORT.html]
asyncbackends cache stats|export|prune|clear PATH
asyncbackends contract NAME [--option k=v ...] [--failing-option k=v ...] [--slot-limit-option NAME]
```

Input lines (one JSON object each; ``type`` defaults to ``"generate"``):

```
{"prompt": "text" | [{"role": ..., "content": ...}] | [token ids], "params": {...}, "request_id": "..."}
{"type": "loglikelihood", "context": "...", "continuation": "...", "request_id": "..."}
{"type": "loglikelihood_rolling", "text": "...", "request_id": "..."}
```

Any line may name a LoRA adapter, ``"adapter": "name"`` (the request's `adapter`); ``--adapter NAME`` names
one for every line (`ab.with_adapter`), and a line naming another fails alone, as that wrapper refuses it.
Output records keep the adapter a request was sent with (``"adapter"``, left out for the base model).

Every input line is validated before anything is sent: a bad line is reported with its line number and the
run does not start. The output has exactly one record per input line, in input order: ``result`` or
``error``. Exit status: 0 when every request succeeded, 1 when some failed (their records say why), 2 for
bad input or options.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .._budget import Budget
from .._field_checks import check_adapter
from .._gather import RetryPolicy, run_batch
from .._install import pip_install
from .._loop import get_loop_manager
from .._observability.run_metrics import RunMetrics
from .._options import RunOptions
from .._parse import parse_option_value as parse_option_value
from .._parse import parse_options as parse_options
from .._registry import available_backends, create_backend, extra_installed, required_options
from .._timeouts import DEFAULT_IDLE, Timeouts
from .._types import (
    GenerationRequest,
    LoglikelihoodRequest,
    Request,
    RollingLoglikelihoodRequest,
    SamplingParams,
)
from .._usage import Pricing, as_pricing
from ..errors import AsyncBackendsError, BackendNotFoundError, InvalidRequestError
from ..integrations._adapters import adapter_named, parse_lora_modules
from .args import build_parser
from .cache_commands import cmd_cache
from .observability import cmd_report, observed
from .output import RecordWriter, RunInterrupted, results_only_stdout, stream_outcomes
from .signals import engines_in_own_group, exit_status, interrupt_on_termination

__all__ = ["main", "parse_request"]

_MAX_REPORTED = 20


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
    adapter = record.pop("adapter", None)
    fields: dict[str, Sequence[str]] = {
        "generate": ("prompt", "params", "tools", "tool_choice"),
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
            return GenerationRequest(
                record["prompt"],
                SamplingParams(**params),
                request_id,
                # OpenAI's {"type": "function", "function": {...}} entries, read by GenerationRequest.
                tools=record.get("tools") or (),
                tool_choice=record.get("tool_choice", "auto"),
                adapter=adapter,
            )
        if kind == "loglikelihood":
            return LoglikelihoodRequest(
                record.get("context", ""), record.get("continuation", ""), request_id, adapter=adapter
            )
        return RollingLoglikelihoodRequest(record.get("text", ""), request_id, adapter=adapter)
    except TypeError as exc:  # an unknown SamplingParams field
        raise InvalidRequestError(str(exc).replace("SamplingParams.__init__() got an ", "params: ")) from exc


def _read_requests(path: Path) -> list[Request]:
    requests: list[Request] = []
    problems: list[str] = []
    try:
        lines = path.open(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with lines:
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


def _cmd_list(_: argparse.Namespace, out: TextIO) -> int:
    for name, target in available_backends().items():
        installed = extra_installed(name)
        state = {True: "installed", None: "entry point / registered"}.get(installed, "not installed")
        hint = f": {pip_install(name)}" if installed is False else ""
        out.write(f"{name:<12} {target:<52} {state}{hint}\n")
    return 0


def _check_required_options(name: str, options: dict[str, Any]) -> None:
    """Refuse a run whose adapter needs options that were not given, before anything starts."""
    missing = [option for option in required_options(name) if option not in options]
    if missing:
        needed = " ".join(f"--option {option}=..." for option in missing)
        raise InvalidRequestError(f"backend {name!r} needs {', '.join(map(repr, missing))}: add {needed}")


def _check_writable(flag: str, path: str | None, *, makes_folders: bool = False) -> None:
    """Refuse a ``flag`` path that cannot be written, before anything starts and without touching it.

    ``makes_folders``: the path's missing folders are created when it is opened (``--cache``).
    """
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise InvalidRequestError(f"cannot write {flag} {path}: Is a directory")
    folder = target if target.exists() else target.parent
    while makes_folders and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.exists():
        raise InvalidRequestError(f"cannot write {flag} {path}: No such file or directory")
    if folder != target and not folder.is_dir():
        raise InvalidRequestError(f"cannot write {flag} {path}: Not a directory")
    if not os.access(folder, os.W_OK):
        raise InvalidRequestError(f"cannot write {flag} {path}: Permission denied")


def _open_output(path: str) -> TextIO:
    """Open ``--output`` for writing, once the backend is up: a start that fails keeps the old file."""
    try:
        return open(path, "w", encoding="utf-8")  # closed by _cmd_run
    except OSError as exc:
        raise InvalidRequestError(f"cannot write --output {path}: {exc.strerror or exc}") from exc


def _exit_during_start_up(status: int) -> NoReturn:
    """Ctrl-C (or SIGTERM) while the backend starts: stop the processes it started and leave at once.

    An engine loading in a thread of its own cannot be interrupted, and a normal interpreter exit would tear
    that thread down inside native code (vLLM's start-up aborts the process with "FATAL: exception not
    rethrown"). Nothing was sent yet, so nothing is lost by skipping the interpreter's clean-up.
    """
    sys.stderr.write("asyncbackends run: interrupted while the backend was starting: nothing was sent\n")
    children = multiprocessing.active_children()
    for child in children:  # vLLM's engine core stops its own workers when it gets SIGTERM
        child.terminate()
    for child in children:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join(5)  # reaped before we exit: a killed process is not gone until then
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _warm_up(backend: Any, request: Request) -> None:
    """One request before the timed run, so the metrics leave out an engine's first-request costs."""
    run_batch(backend, [request], return_exceptions=True, retry=RetryPolicy(max_attempts=1))


def _interrupted_message(kept: int, total: int, args: argparse.Namespace) -> str:
    where = args.output or "standard output"
    if args.cache:
        resume = "run the same command again to resume: finished requests come from the cache"
    else:
        resume = "add --cache FILE to make a run resumable"
    return f"asyncbackends run: interrupted: kept {kept} of {total} results in {where}; {resume}\n"


def _timeouts(total: float | None, idle: float | None) -> Timeouts:
    """``--timeout`` (the total, none by default) and ``--idle-timeout`` (120 s by default, 0 for none)."""
    if idle is None:
        idle = DEFAULT_IDLE
    if total is not None and total <= 0:
        raise InvalidRequestError(f"--timeout must be > 0, got {total:g}")
    if idle < 0:
        raise InvalidRequestError(f"--idle-timeout must be >= 0 (0: no limit), got {idle:g}")
    return Timeouts(total=total, idle=idle or None)


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The run's policy from the command line, checked before anything starts.

    A bad value must not start an engine or empty ``--output``: gather alone would refuse it only once the run
    starts, after both.
    """
    # Said in the command line's terms: RunOptions would name its Python parameters and types.
    if isinstance(args.concurrency, int) and args.concurrency < 1:
        raise InvalidRequestError(
            f"--concurrency must be a positive integer or 'adaptive', got {args.concurrency}"
        )
    if args.max_attempts < 1:
        raise InvalidRequestError(f"--max-attempts must be a positive integer, got {args.max_attempts}")
    options: dict[str, Any] = {
        "concurrency": args.concurrency,
        "timeout": _timeouts(args.timeout, args.idle_timeout),
        "retry": RetryPolicy(max_attempts=args.max_attempts),
        "batch": args.batch,
    }
    if args.budget_tokens is not None or args.budget_cost is not None:
        options["budget"] = Budget(tokens=args.budget_tokens, cost=args.budget_cost)
        if args.budget_cost is not None and not args.price:
            raise InvalidRequestError(
                "--budget-cost needs the backend's prices: --price input=... --price output=..."
            )
    RunOptions(**options)
    return options


def _pricing(prices: list[str]) -> Pricing | None:
    """``--price KEY=VALUE`` (repeated) as the backend's `Pricing`, or ``None`` without any."""
    if not prices:
        return None
    return as_pricing(parse_options(prices), where="--price")


def _cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    requests = _read_requests(Path(args.input))
    if not requests:
        raise InvalidRequestError(f"no requests in {args.input}: nothing was sent and no output was written")
    run_options = _run_options(args)
    check_adapter(args.adapter)  # a name that cannot be one must not cost an engine's start-up
    options = parse_options(args.option)
    pricing = _pricing(args.price)
    if pricing is not None:
        options["pricing"] = pricing
    if args.replicas:
        options["replicas"] = args.replicas  # the pool backend's replicas file
    if "lora_modules" in options:
        # A mapping on a command line: name=path pairs joined by | (or a JSON object, read as JSON already).
        options["lora_modules"] = parse_lora_modules(options["lora_modules"], where="--option lora_modules")
    _check_required_options(args.backend, options)
    # Checked before the backend starts: a path that cannot be written must not cost an engine's start-up.
    _check_writable("--output", args.output)
    _check_writable("--cache", args.cache, makes_folders=True)
    _check_writable("--metrics-file", args.metrics_file)
    with contextlib.ExitStack() as stack:
        # Entered before the backend starts, so that an engine's logs (and its child processes') go to
        # stderr: stdout carries results only.
        stdout = stack.enter_context(results_only_stdout(out))
        # A terminal's Ctrl-C and `timeout`'s SIGTERM reach this process alone, never the engine's: it aborts
        # the requests and stops the engine in order (`signals`).
        stack.enter_context(engines_in_own_group())
        stack.enter_context(interrupt_on_termination())
        try:
            backend = create_backend(args.backend, **options)
        except KeyboardInterrupt as interrupt:
            _exit_during_start_up(exit_status(interrupt))
        stack.callback(get_loop_manager().run, backend.aclose())
        # Every request through the wrapper names --adapter; one naming another fails alone, as it refuses.
        backend = adapter_named(backend, args.adapter)
        if args.warm_up:
            _warm_up(backend, requests[0])
        metrics = RunMetrics()
        metrics.track_replicas(backend)  # a pool's per-replica figures in the summary; nothing otherwise
        callbacks = stack.enter_context(observed(args, backend, len(requests), metrics))
        # Opened (truncated) only now that the backend and the metrics server are up: a start that fails
        # leaves a previous run's results as they were.
        sink = stack.enter_context(_open_output(args.output)) if args.output is not None else stdout
        writer = RecordWriter(sink, requests, adapter=args.adapter)
        try:
            stream_outcomes(
                backend,
                requests,
                writer.add,
                **run_options,
                progress=not args.no_progress and args.backend,
                cache=args.cache,
                return_exceptions=True,
                metrics=metrics,
                callbacks=callbacks,
            )
        except RunInterrupted as interrupted:
            writer.keep_finished(interrupted.late)
            sys.stderr.write(_interrupted_message(writer.written, len(requests), args))
            return interrupted.status
    sys.stderr.write(metrics.format() + "\n")
    return 1 if metrics.failed else 0


def _cmd_contract(args: argparse.Namespace, out: TextIO) -> int:
    if importlib.util.find_spec("pytest") is None:
        raise BackendNotFoundError(f"the contract suite runs on pytest: {pip_install('testing')}")
    from ..testing.contract import run_contract

    # Load the adapter first: one that cannot be imported is one line and status 2, not every contract
    # broken by the same import error.
    required_options(args.name)
    failing = parse_options(args.failing_option) if args.failing_option else None
    return run_contract(
        args.name,
        parse_options(args.option),
        list(args.pytest_args),
        failing_options=failing,
        slot_limit_option=args.slot_limit_option,
    )


def _import_from_working_folder() -> None:
    """Let ``module:Class`` name a module in the working folder, as ``python -m asyncbackends`` does.

    The console script's own folder heads ``sys.path`` instead. The working folder goes last, so that a file
    there cannot shadow an installed package.
    """
    here = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        sys.path.append(here)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _import_from_working_folder()
    # Everything after "--" is for pytest (contract only); argparse would mix it with our own options.
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, passed_on = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if passed_on and args.command != "contract":
        build_parser().error(f"arguments after -- are only for `contract`: {' '.join(passed_on)}")
    args.pytest_args = passed_on
    commands = {
        "list": _cmd_list,
        "run": _cmd_run,
        "cache": cmd_cache,
        "contract": _cmd_contract,
        "report": cmd_report,
    }
    try:
        return commands[args.command](args, sys.stdout)
    except (InvalidRequestError, LookupError) as exc:
        sys.stderr.write(f"asyncbackends {args.command}: {exc}\n")
        return 2
    except AsyncBackendsError as exc:  # the backend could not be built or reached: no traceback
        sys.stderr.write(f"asyncbackends {args.command}: {type(exc).__name__}: {exc}\n")
        return 1
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing more can be delivered, and nothing needs saying.
        return 141
    except KeyboardInterrupt as interrupt:
        sys.stderr.write(f"asyncbackends {args.command}: interrupted\n")
        return exit_status(interrupt)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
