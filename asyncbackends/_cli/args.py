"""The ``asyncbackends`` command's arguments, help texts and examples (`main` runs them)."""

from __future__ import annotations

import argparse

from .cache_commands import add_cache_parser
from .observability import add_observability_options, add_report_command

__all__ = ["build_parser"]

_DESCRIPTION = "Send JSONL files of requests to LLM backends, manage response caches, check adapters."

_EXAMPLES = """\
examples:
  asyncbackends list
  asyncbackends run examples/demo.jsonl --backend mock --output out.jsonl
  asyncbackends run requests.jsonl --backend vllm --option model=/path/to/model \\
      --option max_model_len=4096 --cache run.sqlite > results.jsonl
  asyncbackends run requests.jsonl --backend tgi --option url=http://localhost:8080 --concurrency 64
  asyncbackends cache stats run.sqlite
  asyncbackends cache export run.sqlite --output entries.jsonl
  asyncbackends cache prune run.sqlite --older-than 30
  asyncbackends contract mock -- -x

Results go to --output or stdout (one JSON record per input line, in input order); logs, progress and
the run summary go to stderr. Exit status: 0 all succeeded, 1 some failed, 2 bad input or options,
130 interrupted (Ctrl-C; what finished is kept), 143 terminated (SIGTERM, as Ctrl-C).
"""

_RUN_EXAMPLES = """\
examples:
  asyncbackends run examples/demo.jsonl --backend mock
  asyncbackends run in.jsonl --backend vllm --option model=/path/to/model --option dtype=float32 \\
      --output out.jsonl --cache run.sqlite
  asyncbackends run in.jsonl --backend vllm --option model=/path/to/model --option engines=auto
  asyncbackends run in.jsonl --backend openai --option base_url=http://localhost:8000/v1 \\
      --option model=my-model --timeout 60 | head
  asyncbackends run in.jsonl --backend openai --option base_url=https://api.openai.com/v1 \\
      --option model=my-model --price input=1.75 --price cached_input=0.175 --price output=14 \\
      --budget-cost 5 --cache run.sqlite
  asyncbackends run in.jsonl --backend vllm --option model=/path/to/base \
      --option 'lora_modules=math=/ckpt/math|code=/ckpt/code' --adapter math

--option values are read as JSON where they parse (8, 0.5, true, [1, 2]), else as text; lora_modules
takes name=path pairs joined by | (or a JSON object). An input line may name its own "adapter".
Ctrl-C stops the run, keeps the finished results and exits 130 (SIGTERM: the same, exit 143);
with --cache a rerun resumes.
"""


def _concurrency(text: str) -> int | str:
    """``--concurrency``: a number, or ``adaptive``."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'adaptive', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``asyncbackends`` command line: list, run, cache, contract and report, with their options."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="asyncbackends", description=_DESCRIPTION, epilog=_EXAMPLES, formatter_class=raw
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered adapters, whether each is installed, and how to install it")

    run = sub.add_parser(
        "run",
        help="send every request of a JSONL file, write one record per line",
        description="Send every request of a JSONL file to a backend; write one record per input line.",
        epilog=_RUN_EXAMPLES,
        formatter_class=raw,
    )
    run.add_argument("input", help="JSONL file, one request per line")
    run.add_argument("--backend", required=True, help="adapter name (see `asyncbackends list`)")
    run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option")
    run.add_argument("--replicas", metavar="FILE", help="replicas file (TOML/JSON) for --backend pool")
    run.add_argument(
        "--adapter",
        metavar="NAME",
        help="LoRA adapter every request names (the backend must serve it, e.g. vllm's lora_modules); a "
        'line naming another "adapter" fails',
    )
    run.add_argument("--output", help="JSONL file for results (default: standard output)")
    run.add_argument(
        "--concurrency",
        type=_concurrency,
        help="requests in flight, or 'adaptive' to find the server's capacity (default: the backend's hint)",
    )
    run.add_argument("--timeout", type=float, help="seconds per attempt in all (default: no limit)")
    run.add_argument(
        "--idle-timeout",
        type=float,
        help="seconds an attempt may wait for the next byte or token; a streamed generation that keeps "
        "producing is never cut (default 120; 0: no limit)",
    )
    run.add_argument("--max-attempts", type=int, default=3, help="attempts per request (default 3)")
    run.add_argument("--cache", help="SQLite response cache: resume a run, skip what is done")
    run.add_argument(
        "--batch",
        action="store_true",
        help="send through the provider's Batch API (openai): half the price; with --cache a rerun polls "
        "the batches a stopped run started",
    )
    run.add_argument(
        "--budget-tokens", type=int, help="most tokens the run may spend; the rest is not sent (resumable)"
    )
    run.add_argument(
        "--budget-cost",
        type=float,
        help="most the run may cost at the backend's --price; the rest is not sent",
    )
    run.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the backend's price per 1M tokens: input=, output=, cached_input=, reasoning=, batch= (a "
        "multiplier), per= (see docs/cost.md)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_observability_options(run)
    run.add_argument(
        "--warm-up",
        action="store_true",
        help="send the first request once before the run, untimed and not written (engine warm-up)",
    )

    add_cache_parser(sub)

    contract = sub.add_parser("contract", help="run the adapter contract suite against a registered adapter")
    contract.add_argument("name", help="adapter name")
    contract.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option")
    contract.add_argument(
        "--failing-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option (over the others) making every request fail, e.g. url=http://127.0.0.1:9",
    )
    contract.add_argument(
        "--slot-limit-option",
        metavar="NAME",
        help="option sizing the adapter's own pool: max_connections",
    )
    contract.epilog = "Arguments after -- go to pytest, for example: -- -x -k cancel"
    add_report_command(sub)
    return parser
