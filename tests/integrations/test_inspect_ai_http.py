"""The inspect_ai provider on HTTP backends that name tokens by text and count them in ``usage``.

TGI's chat route and OpenAI-compatible servers return logprobs with each token's text but no token ids, and
the generated-token count only in ``usage``. The reference is the server's own answer to the same request,
posted by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.solver import generate

from asyncbackends.testing.fake_tgi import FakeTGIServer

from ..shared_tgi import chat_answer, served_tgi

# inspect's eval leaves anyio memory streams unclosed (seen with its own mockllm too); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning")

TEXT = "hello there"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server() -> Iterator[FakeTGIServer]:
    yield from served_tgi()


def _server_answer(server: FakeTGIServer) -> dict[str, Any]:
    messages = [{"role": "user", "content": TEXT}]
    return chat_answer(
        server, {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0, "logprobs": True}
    )


@pytest.mark.parametrize("kind", ["tgi", "openai"])
def test_logprobs_keep_the_servers_token_texts_and_usage_its_count(
    tmp_path: Path, server: FakeTGIServer, kind: str
) -> None:
    if kind == "tgi":
        model = get_model("asyncbackends/tgi", memoize=False, url=server.url)
    else:
        model = get_model("asyncbackends/openai/tgi", memoize=False, base_url=server.url + "/v1")
    try:
        task = Task(dataset=[Sample(input=TEXT, target=TEXT)], solver=[generate()])
        [log] = eval(
            task,
            model=model,
            log_dir=str(tmp_path / "logs"),
            display="none",
            logprobs=True,
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
    finally:
        asyncio.run(model.__aexit__(None, None, None))
    assert log.status == "success", log.error
    assert log.samples is not None
    [sample] = log.samples
    assert sample.error is None
    reply = _server_answer(server)
    expected = [(t["token"], t["logprob"]) for t in reply["choices"][0]["logprobs"]["content"]]
    assert len(expected) == MAX_TOKENS
    choice = sample.output.choices[0]
    assert choice.logprobs is not None
    assert [(p.token, p.logprob) for p in choice.logprobs.content] == expected
    usage = sample.output.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (
        reply["usage"]["prompt_tokens"],
        reply["usage"]["completion_tokens"],
    )
