"""The command line's observability parts: ``run --metrics-file/--metrics-port`` and ``report``.

Kept apart from `asyncbackends._cli.main`, which calls these four functions.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from .._observability.callbacks import RunCallbacks
from .._observability.run_metrics import RunMetrics
from ..errors import InvalidRequestError

__all__ = ["add_observability_options", "add_report_command", "cmd_report", "observed"]


@contextlib.contextmanager
def observed(
    args: argparse.Namespace, backend: Any, requests: int, metrics: RunMetrics
) -> Iterator[RunCallbacks | None]:
    """The run's ``--metrics-port`` server and ``--metrics-file`` log, open while the run goes."""
    from .._observability.prometheus import MetricsServer
    from .._observability.runlog import RunLog

    with contextlib.ExitStack() as stack:
        if args.metrics_port is not None:
            server = MetricsServer(args.metrics_port, args.metrics_host)
            stack.callback(server.close)
            sys.stderr.write(f"serving Prometheus metrics on {server.url}\n")
        if not args.metrics_file:
            yield None
            return
        run_log = RunLog(args.metrics_file, backend, requests)
        stack.callback(lambda: run_log.close(metrics.summary()))
        yield run_log.callbacks


def add_observability_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--metrics-file", metavar="RUN.jsonl", help="write the run's events, for `asyncbackends report`"
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve metrics to Prometheus while the run goes (0: any)",
    )
    run.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for --metrics-port (default loopback)"
    )


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from .._observability.report import write_report

    source = Path(args.run)
    if not source.exists():
        raise InvalidRequestError(f"no metrics file at {source}")
    target = Path(args.output) if args.output else source.with_suffix(".html")
    write_report(source, target)
    out.write(f"report: {target}\n")
    return 0


def add_report_command(sub: Any) -> None:
    report = sub.add_parser("report", help="an HTML report of a run from its --metrics-file")
    report.add_argument("run", help="the JSONL file `run --metrics-file` wrote")
    report.add_argument("--output", help="HTML file to write (default: RUN with .html)")
