"""``python -m asyncbackends.testing.fake_openai_batches``: serve the Batch API look-alike until killed.

Its flags mirror `FakeOpenAIBatchServer`'s options, so a batch that is held, fails or expires can be tried
from a shell, not only from Python: ``--hold`` keeps every batch ``in_progress`` until the process gets
SIGUSR1 (`FakeOpenAIBatchServer.release`), ``--fail-batches 1`` fails the first batch's validation,
``--expire-batches 2`` expires the second with half its lines answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "batch_server_options"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m asyncbackends.testing.fake_openai_batches",
        description="An OpenAI Files + Batches API look-alike server (prints its URL once it serves).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (the default) picks a free port")
    parser.add_argument("--model", default="fake-batch-model", help="the one model served")
    parser.add_argument(
        "--hold", action="store_true", help="keep every batch in_progress until the server gets SIGUSR1"
    )
    parser.add_argument(
        "--fail-batches",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="creation numbers (1 for the first) of the batches that fail validation",
    )
    parser.add_argument(
        "--expire-batches",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="creation numbers of the batches that expire with half their lines answered",
    )
    parser.add_argument("--max-requests", type=int, default=50_000, help="most lines in one batch")
    parser.add_argument(
        "--max-bytes", type=int, default=200 * 1024 * 1024, help="most bytes in one uploaded file"
    )
    return parser


def batch_server_options(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The `FakeOpenAIBatchServer` keyword arguments the command line ``argv`` asks for."""
    args = _parser().parse_args(argv)
    return {
        "model": args.model,
        "hold": args.hold,
        "fail_batches": tuple(args.fail_batches),
        "expire_batches": tuple(args.expire_batches),
        "max_requests": args.max_requests,
        "max_bytes": args.max_bytes,
        "host": args.host,
        "port": args.port,
    }


def main(server_class: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Serve a look-alike until killed: ``python -m asyncbackends.testing.fake_openai_batches``.

    Args:
        server_class: `FakeOpenAIBatchServer`, passed in by the module it lives in (which runs this), so
            that this module does not import it back.
        argv: The command line (``sys.argv[1:]`` when ``None``).
    """
    options = batch_server_options(argv)

    async def run() -> None:
        async with server_class(**options) as server:
            if hasattr(signal, "SIGUSR1"):  # none on Windows: held batches stay held until killed
                asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, server.release)
            print(f"listening on {server.url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
