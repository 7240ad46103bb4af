"""``python -m asyncbackends.testing.fake_openai_batches``: serve the Batch API look-alike until killed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from ..fake_openai_batches import FakeOpenAIBatchServer

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Serve a look-alike until killed: ``python -m asyncbackends.testing.fake_openai_batches``."""
    parser = argparse.ArgumentParser(description="An OpenAI Batch API look-alike server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="fake-batch-model")
    args = parser.parse_args(argv)

    async def run() -> None:
        async with FakeOpenAIBatchServer(model=args.model, host=args.host, port=args.port) as server:
            print(f"listening on {server.url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
