"""A backend whose requests named ``held*`` wait at a gate the test opens: state to scrape while a run goes."""

from __future__ import annotations

import asyncio
import threading

import asyncbackends as ab


class Gate:
    """How many requests are held, and the event that lets them go."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.held = 0
        self.changed = threading.Condition()

    def wait_for_held(self, count: int, timeout: float = 60.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.held >= count, timeout)


GATE = Gate()


class GatedBackend(ab.BaseBackend):
    """Echoes at once, except requests whose id starts with ``held``: those wait for ``GATE.opened``."""

    name = "gated"
    capabilities = ab.Capabilities()

    def __init__(self, model: str = "gated-model") -> None:
        self.model = model

    async def generate(self, request: ab.GenerationRequest) -> ab.GenerationResult:
        if (request.request_id or "").startswith("held"):
            with GATE.changed:
                GATE.held += 1
                GATE.changed.notify_all()
            await asyncio.get_running_loop().run_in_executor(None, GATE.opened.wait, 60.0)
        text = str(request.prompt)[: request.params.max_tokens]
        completion = ab.Completion(text, tuple(map(ord, text)), None, "length")
        return ab.GenerationResult(request.request_id, (completion,), prompt_tokens=len(str(request.prompt)))
