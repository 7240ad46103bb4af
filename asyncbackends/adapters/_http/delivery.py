"""How an HTTP adapter asks for one answer, so that the idle limit (``ab.Timeouts.idle``) always bounds it.

One choice for every HTTP adapter (``tgi``, ``openai``, and ``endpoints`` through them), made by
`choose_delivery`:

- **whole**, when no idle limit applies: ``total`` alone bounds the attempt (the run enforces it), and one
  body costs the server and the client less than an event a token;
- **streamed**, where the route's streamed answer assembles into exactly the answer it sends whole: each
  token resets the idle limit, so a long generation that keeps producing is never cut;
- **watched**, where the streamed answer may differ from the whole one (a server's reasoning or tool parser
  splits a stream otherwise) and the server has a health route (vLLM's and TGI's ``GET /health``): asked
  whole, the idle limit kept by the server's signs of life (`HealthWatch`);
- **streamed** all the same where the stream may differ but the server has no health route (a generic
  OpenAI-compatible server's tool calls): the stream is the only bound such a server offers.

No route goes without a bound: a route with neither a stream nor a watch is refused as the adapter's bug.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from ..._timeouts import idle_timeout
from .health_watch import HealthWatch

__all__ = ["Delivery", "ask", "choose_delivery"]

T = TypeVar("T")

Delivery = Literal["whole", "streamed", "watched"]
"""How one answer is asked for (see the module docstring)."""


def choose_delivery(
    idle: float | None, *, can_stream: bool, streams_exactly: bool, watched: bool
) -> Delivery:
    """How to ask for an answer under the idle limit ``idle``.

    Args:
        idle: The attempt's idle limit (``idle_timeout()``); ``None`` for none.
        can_stream: The route has a streamed form the adapter assembles.
        streams_exactly: That streamed form assembles into exactly the answer sent whole.
        watched: The server has a health route a `HealthWatch` can ask.

    Raises:
        ValueError: An idle limit applies and the route can be neither streamed nor watched.
    """
    if idle is None:
        return "whole"
    if can_stream and (streams_exactly or not watched):
        return "streamed"
    if watched:
        return "watched"
    raise ValueError("an answer that can be neither streamed nor watched would have no idle bound")


async def ask(
    *,
    whole: Callable[[], Awaitable[T]],
    streamed: Callable[[float], Awaitable[T]] | None,
    streams_exactly: bool,
    watch: HealthWatch | None,
    backend: str,
    request_id: str | None,
) -> T:
    """One answer, asked for as `choose_delivery` says under the current attempt's idle limit.

    Args:
        whole: Sends the request and reads its answer whole.
        streamed: Sends it streamed, each read bounded by the idle limit it is given, and returns the
            answer assembled as ``whole`` returns it; ``None`` where the route has no streamed form.
        streams_exactly: ``streamed`` returns exactly what ``whole`` would.
        watch: The backend's health watch; ``None`` where the server has no health route.
        backend: Named in a timeout error.
        request_id: Named in a timeout error.

    Raises:
        BackendTimeoutError: The idle limit passed without a byte of a streamed answer, or without a sign
            of life from a watched server.
    """
    idle = idle_timeout()
    how = choose_delivery(
        idle, can_stream=streamed is not None, streams_exactly=streams_exactly, watched=watch is not None
    )
    if how == "whole":
        return await whole()
    assert idle is not None
    if how == "streamed":
        assert streamed is not None
        return await streamed(idle)
    assert watch is not None
    return await watch.watch(whole(), idle, backend=backend, request_id=request_id)
