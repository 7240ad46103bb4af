"""LoRA adapters on the ``tgi`` adapter: TGI's ``adapter_id``, through the look-alike TGI server.

TGI's wire, read from its source (huggingface/text-generation-inference, router/src/lib.rs): ``/generate``
and ``/generate_stream`` take ``parameters.adapter_id``; the Messages API takes the chat request's ``model``
as the adapter id (any name but ``"tgi"``). TGI refuses no adapter id: its model server looks an unknown one
up with index 0, the base model, so the backend refuses names outside its ``adapters`` before sending.
"""

from __future__ import annotations

import pytest

import asyncbackends as ab
from asyncbackends.adapters.tgi._wire import parse_lora_adapters
from asyncbackends.testing._fake_tgi.model import adapter_salt

from .conftest import MakeBackend, MakeServer

pytestmark = pytest.mark.asyncio

CHAT = [{"role": "user", "content": "hi"}]


def _generations(server: object) -> list[dict[str, object]]:
    return [body for path, body in server.received if path in ("/generate", "/generate_stream")]  # type: ignore[attr-defined]


async def test_adapter_requests_send_adapter_id_and_are_answered_by_the_adapter(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters="math,code=/data/code")
    backend = await make_backend(server.url, adapters=("math", "code"))
    assert backend.capabilities.adapters
    params = ab.SamplingParams(max_tokens=40)
    results = await ab.gather(
        backend,
        [
            ab.GenerationRequest("hello", params, adapter="math"),
            ab.GenerationRequest("hello", params),
            ab.GenerationRequest("hello", params, adapter="code"),
        ],
    )
    assert [r.completions[0].text for r in results] == ["[math] hello", "hello", "[code] hello"]
    sent = sorted(str(body["parameters"].get("adapter_id")) for body in _generations(server))
    assert sent == ["None", "code", "math"]


async def test_both_generate_routes_carry_the_adapter(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url, adapters=("math",))
    request = ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=20), adapter="math")
    whole = await ab.gather(backend, [request], timeout=ab.Timeouts(total=30, idle=None))
    streamed = await ab.gather(backend, [request], timeout=ab.Timeouts(total=None, idle=30))
    assert whole[0].completions[0].text == streamed[0].completions[0].text == "[math] hi"
    paths = {path: body["parameters"]["adapter_id"] for path, body in server.received if path != "/tokenize"}
    assert paths == {"/generate": "math", "/generate_stream": "math"}


async def test_chat_sends_the_adapter_as_the_model(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url, adapters=("math",))
    params = ab.SamplingParams(max_tokens=60)
    math, base = await ab.gather(
        backend, [ab.GenerationRequest(CHAT, params, adapter="math"), ab.GenerationRequest(CHAT, params)]
    )
    chats = [body for path, body in server.received if path == "/v1/chat/completions"]
    assert sorted(str(body.get("model")) for body in chats) == ["None", "math"]
    assert math.completions[0].text.startswith("[math] ") and not base.completions[0].text.startswith("[")


async def test_loglikelihood_scores_with_the_adapter(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url, adapters=("math",))
    math, base = await ab.gather(
        backend, [ab.LoglikelihoodRequest("2+2=", "4", adapter="math"), ab.LoglikelihoodRequest("2+2=", "4")]
    )
    scored = [body for path, body in server.received if path == "/generate"]
    assert sorted(str(b["parameters"].get("adapter_id")) for b in scored) == ["None", "math"]
    assert all(b["parameters"]["decoder_input_details"] for b in scored)
    assert math.logprob == pytest.approx(base.logprob - adapter_salt("math") * math.num_tokens)


async def test_an_unknown_adapter_is_refused_before_sending(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url, adapters="math")
    errors = await ab.gather(
        backend,
        [ab.GenerationRequest("hi", adapter="maths"), ab.LoglikelihoodRequest("a", "b", adapter="maths")],
        return_exceptions=True,
    )
    for error in errors:
        assert isinstance(error, ab.RequestRejectedError) and not error.retryable
        assert "'maths'" in str(error) and "'math'" in str(error) and "adapters" in str(error)
    assert _generations(server) == []


async def test_tgi_itself_answers_an_unknown_adapter_id_from_the_base(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    # Why the backend refuses unknown names: TGI's server maps an unknown adapter_id to index 0, the base.
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url, adapters=("math", "maths"))  # the user's list is wrong
    (result,) = await ab.gather(
        backend, [ab.GenerationRequest("hi", ab.SamplingParams(max_tokens=9), adapter="maths")]
    )
    assert result.completions[0].text == "hi"
    assert server.adapter_answers == {None: 1}


async def test_without_adapters_the_backend_claims_none(
    make_server: MakeServer, make_backend: MakeBackend
) -> None:
    server = await make_server(lora_adapters=("math",))
    backend = await make_backend(server.url)
    assert not backend.capabilities.adapters
    (error,) = await ab.gather(backend, [ab.GenerationRequest("hi", adapter="math")], return_exceptions=True)
    assert isinstance(error, ab.RequestRejectedError) and "serves no LoRA adapters" in str(error)
    assert _generations(server) == []


@pytest.mark.parametrize("bad", ["", "a==b", "a@b@c", ("math", " code"), ()])
async def test_adapters_that_tgi_would_not_parse_are_refused_at_build(
    bad: object, make_backend: MakeBackend
) -> None:
    with pytest.raises(ab.InvalidRequestError, match="adapters"):
        await make_backend("http://127.0.0.1:9", adapters=bad)


async def test_lora_adapters_are_parsed_as_tgi_parses_them() -> None:
    assert parse_lora_adapters("a, b=/data/b ,c@rev,d=/p@rev") == ("a", "b", "c", "d")
    with pytest.raises(ValueError, match="Invalid LoRA adapter format"):
        parse_lora_adapters("a=b=c")
