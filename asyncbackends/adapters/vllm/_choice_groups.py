"""`ChoiceGroups`: one-token continuations that share a context, scored by one engine request.

A multiple-choice question reaches the adapter as one `LoglikelihoodRequest` per choice, all sent together
by the harness, each handled by its own call (an adapter handles one request per call). When the choices are
one token each, one engine request on the shared context asking for the logprobs of every choice's token
(vLLM's ``logprob_token_ids``) gives each choice's exact score. Here the calls whose engine prompt (the
context's token ids) is the same and that arrive while a group is still open join that group: a group is
sent two loop iterations after its first member arrived (the members' plans finish together, from one encode
batch, and resume in the same iteration), never after a wall-clock wait, so a lone request goes at once.

Cancellation: a cancelled member leaves its group; the group's engine request is aborted only when no member
is left. Errors: every member gets the group's error, carrying its own request id.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence

from ..._tasks import read_outcome
from ...errors import BackendError

__all__ = ["ChoiceGroups", "SendGroup", "TokenScores"]

TokenScores = Mapping[int, tuple[float, bool]]
"""Each asked token's (logprob, is it the top-1 token) at the position after the prompt."""

SendGroup = Callable[[Sequence[int], Sequence[int]], Awaitable[TokenScores]]
"""Sends one engine request: the prompt's token ids and the tokens to score after it."""


class _Group:
    __slots__ = ("members", "task", "tokens")

    def __init__(self) -> None:
        self.tokens: dict[int, None] = {}  # the tokens asked for, once each, in arrival order
        self.members = 0
        self.task: asyncio.Task[TokenScores] | None = None


class ChoiceGroups:
    """Groups one-token scoring calls by prompt; created and used on one loop (the shared loop).

    Args:
        send: The engine request of one group.
        max_tokens: The most tokens one group asks for (vLLM's ``MAX_LOGPROB_TOKEN_IDS`` is 128).
    """

    def __init__(self, send: SendGroup, *, max_tokens: int = 128) -> None:
        self._send = send
        self._max_tokens = max_tokens
        self._open: dict[tuple[int, ...], _Group] = {}
        self.sent = 0
        """Engine requests sent so far (tests read it)."""

    async def score(self, prompt: tuple[int, ...], token: int, request_id: str | None) -> tuple[float, bool]:
        """The (logprob, is it the top-1 token) of ``token`` right after ``prompt``.

        Raises:
            BackendError: The group's engine request failed (a copy naming ``request_id``).
        """
        group = self._open.get(prompt)
        if group is None or (token not in group.tokens and len(group.tokens) >= self._max_tokens):
            group = _Group()
            self._open[prompt] = group
            group.task = asyncio.get_running_loop().create_task(self._gathered(prompt, group))
            # Every member may have left before the group failed: its error must not be logged as never
            # retrieved.
            group.task.add_done_callback(read_outcome)
        group.tokens[token] = None
        group.members += 1
        assert group.task is not None
        try:
            # Shielded: one member's cancellation must not cancel the others' engine request.
            scores = await asyncio.shield(group.task)
        except asyncio.CancelledError:
            group.members -= 1
            if group.members == 0 and not group.task.done():
                self._close(prompt, group)  # nobody may join a group being cancelled
                group.task.cancel()  # aborts its engine request (the adapter's _run does)
            raise
        except BackendError as exc:
            mine = copy.copy(exc)
            mine.request_id = request_id
            raise mine from exc
        return scores[token]

    async def _gathered(self, prompt: tuple[int, ...], group: _Group) -> TokenScores:
        try:
            # The task's first step runs in the next loop iteration; this yields once more, so the calls
            # resumed in the same iterations as the first member (a question's choices) join before it goes.
            await asyncio.sleep(0)
        finally:
            self._close(prompt, group)
        self.sent += 1
        return await self._send(prompt, tuple(group.tokens))

    def _close(self, prompt: tuple[int, ...], group: _Group) -> None:
        if self._open.get(prompt) is group:
            del self._open[prompt]
