"""``python -m asyncbackends.testing.fake_tgi``: the options its command line asks for, then serving."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any, Protocol

from .validation import Limits

__all__ = ["serve_until_killed", "server_options"]


class _Server(Protocol):
    @property
    def url(self) -> str: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...


def server_options(argv: list[str] | None = None) -> dict[str, Any]:
    """The `FakeTGIServer` keyword arguments the command line asks for (``--latency 0.02`` and so on)."""
    parser = argparse.ArgumentParser(description="A TGI look-alike server for tests and benchmarks.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--max-concurrent-requests", type=int, default=128)
    parser.add_argument("--rate-429", type=float, default=0.0)
    parser.add_argument("--rate-503", type=float, default=0.0)
    parser.add_argument("--model-id", default=None, help="the model id /info reports")
    parser.add_argument("--concurrency", type=int, default=None, help="served at once; the rest queue")
    parser.add_argument("--check-schema", action="store_true", help="validate exchanges (slow)")
    parser.add_argument("--lora-adapters", default="", help="LoRA adapter ids served, as TGI's launcher")
    args = parser.parse_args(argv)
    return {
        "limits": Limits(max_concurrent_requests=args.max_concurrent_requests),
        "latency": args.latency,
        "jitter": args.jitter,
        "rate_429": args.rate_429,
        "rate_503": args.rate_503,
        "check_schema": args.check_schema,
        "record": False,
        "model_id": args.model_id,
        "concurrency": args.concurrency,
        "lora_adapters": args.lora_adapters,
        "host": args.host,
        "port": args.port,
    }


def serve_until_killed(server: _Server) -> None:
    """Serve until killed (on uvloop where installed), printing ``listening on URL`` once it serves."""

    async def serve() -> None:
        async with server:
            print(f"listening on {server.url}", flush=True)
            await asyncio.Event().wait()

    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve())
