"""LoRA adapters on the ``endpoints`` adapter: a TGI endpoint's adapters are TGI's ``adapter_id``.

The endpoint's server here is the TGI look-alike serving two adapters, as TGI's launcher does with
``LORA_ADAPTERS`` (which the Endpoints UI sets in the container's environment, ``model.env``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import asyncbackends as ab
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import MakeBackend

pytestmark = pytest.mark.asyncio

SERVED = "math,code=/repository/code"


@pytest_asyncio.fixture
async def tgi() -> AsyncIterator[FakeTGIServer]:
    async with FakeTGIServer(lora_adapters=SERVED) as server:
        yield server


async def test_the_endpoints_lora_adapters_env_names_the_adapters(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    api.add("ep", env={"LORA_ADAPTERS": SERVED})
    backend = await make_backend()
    assert backend.capabilities.adapters
    params = ab.SamplingParams(max_tokens=30)
    math, base = await ab.gather(
        backend, [ab.GenerationRequest("hi", params, adapter="math"), ab.GenerationRequest("hi", params)]
    )
    assert math.completions[0].text == "[math] hi" and base.completions[0].text == "hi"
    sent = [body["parameters"].get("adapter_id") for path, body in tgi.received if "generate" in path]
    assert sorted(map(str, sent)) == ["None", "math"]
    (error,) = await ab.gather(backend, [ab.GenerationRequest("hi", adapter="mth")], return_exceptions=True)
    assert isinstance(error, ab.RequestRejectedError) and "'code', 'math'" in str(error)


async def test_the_adapters_option_overrides_the_env_and_without_either_none_are_claimed(
    api: FakeEndpointsAPI, tgi: FakeTGIServer, make_backend: MakeBackend
) -> None:
    api.add("ep", env={"LORA_ADAPTERS": SERVED})
    api.add("plain")
    only_code = await make_backend(adapters=("code",))
    (error,) = await ab.gather(
        only_code, [ab.GenerationRequest("hi", adapter="math")], return_exceptions=True
    )
    assert isinstance(error, ab.RequestRejectedError) and "'math'" in str(error)
    plain = await make_backend("plain")
    assert not plain.capabilities.adapters


async def test_an_openai_endpoint_refuses_the_adapters_option(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    api.add("ep", image={"vllm": {"url": "vllm/vllm-openai:latest"}})
    with pytest.raises(ab.InvalidRequestError, match="OpenAI-protocol endpoint takes a request's adapter"):
        await make_backend(adapters=("math",))
