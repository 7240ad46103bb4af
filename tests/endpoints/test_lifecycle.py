"""Bringing an endpoint up through the Endpoints API look-alike: states, failures, timeouts, on_close."""

from __future__ import annotations

import asyncio
import time

import pytest

import asyncbackends as ab
from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI
from asyncbackends.testing.fake_tgi import FakeTGIServer

from .conftest import TOKEN, MakeBackend

REQUEST = ab.GenerationRequest("hello endpoint", ab.SamplingParams(max_tokens=5), request_id="r1")


@pytest.mark.asyncio
async def test_running_endpoint_serves_tgi_requests(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep")
    backend = await make_backend()
    assert backend.protocol == "tgi"
    assert backend.url == f"{api.url}/proxy/tester/ep"
    assert backend.namespace == "tester"  # from whoami: no namespace was given
    result = await ab.gather(backend, [REQUEST])
    assert result[0].request_id == "r1" and result[0].completions[0].text
    assert "/generate_stream" in endpoint.proxied and endpoint.proxied[0] == "/health"
    assert endpoint.actions == []  # running already: nothing to resume or wake


@pytest.mark.asyncio
async def test_pending_then_initializing_then_running(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    endpoint = api.add("ep", state="pending")
    api.start_up(endpoint, [("pending", 0.15), ("initializing", 0.15)])
    started = time.monotonic()
    backend = await make_backend()
    assert time.monotonic() - started >= 0.3
    assert endpoint.state == "running" and endpoint.actions == []
    assert (await ab.gather(backend, [REQUEST]))[0].text


@pytest.mark.asyncio
async def test_paused_endpoint_is_resumed(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep", state="paused")
    backend = await make_backend()
    assert endpoint.actions == ["resume"]
    assert (await ab.gather(backend, [REQUEST]))[0].text


@pytest.mark.asyncio
async def test_scaled_to_zero_endpoint_is_woken_by_a_held_request(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    endpoint = api.add("ep", state="scaledToZero")
    backend = await make_backend()
    assert endpoint.actions == ["wake"] and endpoint.state == "running"
    assert (await ab.gather(backend, [REQUEST]))[0].text


@pytest.mark.asyncio
async def test_requests_wait_while_a_scaled_to_zero_endpoint_wakes(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    endpoint = api.add("ep")
    backend = await make_backend()
    api.startup = (("initializing", 0.3),)
    endpoint.state = "scaledToZero"  # scaled down mid-run, as after its idle timeout
    requests = [ab.GenerationRequest(f"prompt {i}", ab.SamplingParams(max_tokens=3)) for i in range(6)]
    # No retries allowed: the proxy must hold every request (X-Scale-Up-Timeout), none may see a 503.
    results = await ab.gather(backend, requests, retry=ab.RetryPolicy(max_attempts=1))
    assert [r.text for r in results] and all(r.text for r in results)
    assert endpoint.actions.count("wake") == 1


@pytest.mark.asyncio
async def test_a_cold_start_503_is_retried(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep")
    backend = await make_backend(scale_up_timeout=0.01)  # the proxy gives up holding almost at once
    api.startup = (("initializing", 0.2),)
    endpoint.state = "scaledToZero"
    with pytest.raises(ab.BackendUnavailableError) as caught:
        await ab.gather(backend, [REQUEST], retry=ab.RetryPolicy(max_attempts=1))
    assert caught.value.retryable and "503" in str(caught.value)
    retry = ab.RetryPolicy(max_attempts=20, initial_delay=0.05, max_delay=0.1, jitter=False)
    assert (await ab.gather(backend, [REQUEST], retry=retry))[0].text


@pytest.mark.asyncio
@pytest.mark.parametrize("state", ["failed", "updateFailed"])
async def test_failed_endpoint_raises_its_message(
    api: FakeEndpointsAPI, make_backend: MakeBackend, state: str
) -> None:
    api.add("ep", state=state, message="Server message: CUDA out of memory")
    with pytest.raises(ab.BackendUnavailableError, match="CUDA out of memory") as caught:
        await make_backend()
    assert state in str(caught.value) and not caught.value.retryable


@pytest.mark.asyncio
async def test_endpoint_failing_during_start_up(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep", state="paused", fail_message="Image pull failed")
    with pytest.raises(ab.BackendUnavailableError, match="Image pull failed"):
        await make_backend()
    assert endpoint.actions == ["resume"]


@pytest.mark.asyncio
async def test_wait_timeout(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep", state="pending")
    api.start_up(endpoint, [("initializing", 30.0)])
    started = time.monotonic()
    with pytest.raises(ab.BackendTimeoutError, match="still initializing"):
        await make_backend(wait_timeout=0.3)
    assert time.monotonic() - started < 10  # the wait_timeout, not the 30 s start-up


@pytest.mark.asyncio
async def test_unhealthy_server_times_out(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    api.add("ep", health_route="/not-there")
    with pytest.raises(ab.BackendTimeoutError, match=r"not ready .*404"):
        await make_backend(wait_timeout=0.3)


@pytest.mark.asyncio
async def test_failed_start_applies_on_close(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    endpoint = api.add("ep", state="paused")
    api.startup = (("initializing", 30.0),)
    with pytest.raises(ab.BackendTimeoutError):
        await make_backend(wait_timeout=0.2, on_close="pause")
    assert endpoint.actions == ["resume", "pause"] and endpoint.state == "paused"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("on_close", "action", "final"),
    [
        ("keep", None, "running"),
        ("pause", "pause", "paused"),
        ("scale_to_zero", "scale-to-zero", "scaledToZero"),
    ],
)
async def test_on_close(
    api: FakeEndpointsAPI, make_backend: MakeBackend, on_close: str, action: str | None, final: str
) -> None:
    endpoint = api.add("ep")
    backend = await make_backend(on_close=on_close)
    await backend.aclose()
    await backend.aclose()  # idempotent: the action runs once
    assert endpoint.actions == ([action] if action else []) and endpoint.advance() == final
    with pytest.raises(ab.BackendClosedError):
        await backend.generate(REQUEST)


@pytest.mark.asyncio
async def test_on_close_delete(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    api.add("ep")
    backend = await make_backend(on_close="delete")
    await backend.aclose()
    assert ("tester", "ep") not in api.endpoints


@pytest.mark.asyncio
async def test_missing_endpoint_is_created(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    create = {
        "repository": "acme/tiny-model",
        "framework": "pytorch",
        "accelerator": "gpu",
        "instance_size": "x1",
        "instance_type": "nvidia-a10g",
        "region": "us-east-1",
        "vendor": "aws",
    }
    backend = await make_backend("fresh", namespace="acme-org", create=create)
    endpoint = api.endpoints[("acme-org", "fresh")]
    assert endpoint.actions == ["create"]
    assert api.created[0]["model"]["repository"] == "acme/tiny-model"
    assert api.created[0]["compute"]["instanceType"] == "nvidia-a10g"
    assert backend.namespace == "acme-org"
    assert (await ab.gather(backend, [REQUEST]))[0].text


@pytest.mark.asyncio
async def test_missing_endpoint_without_create(api: FakeEndpointsAPI, make_backend: MakeBackend) -> None:
    with pytest.raises(ab.RequestRejectedError, match=r"404.*not found") as caught:
        await make_backend("nowhere")
    assert not caught.value.retryable and api.created == []


@pytest.mark.asyncio
async def test_wrong_token_is_an_authentication_error(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    api.add("ep")
    with pytest.raises(ab.AuthenticationError, match="401") as caught:
        await make_backend(token="hf_wrong_token_000", namespace="tester")
    assert "hf_wrong_token_000" not in str(caught.value) and TOKEN not in str(caught.value)


@pytest.mark.asyncio
async def test_token_from_huggingface_hub(
    api: FakeEndpointsAPI, make_backend: MakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    endpoint = api.add("ep")
    backend = await make_backend(token=None)
    assert (await ab.gather(backend, [REQUEST]))[0].text
    assert "/generate_stream" in endpoint.proxied  # the proxy checks the token: it was sent


@pytest.mark.asyncio
async def test_token_never_shown(
    api: FakeEndpointsAPI, make_backend: MakeBackend, tgi: FakeTGIServer
) -> None:
    api.add("ep")
    backend = await make_backend()
    shown = [repr(backend), str(backend), repr(vars(backend)), repr(backend.fingerprint), repr(backend.raw)]
    shown += [repr(vars(backend._inner)), repr(vars(backend._lifecycle))]
    assert not any(TOKEN in text for text in shown)
    await ab.gather(backend, [REQUEST])
    assert tgi.authorization[f"Bearer {TOKEN}"] > 0  # ...yet it went on the wire


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"on_close": "stop"}, "on_close"),
        ({"protocol": "grpc"}, "protocol"),
        ({"create": {"name": "x"}}, "create must not hold"),
        ({"wait_timeout": 0}, "wait_timeout"),
        ({"wait_timout": 3}, "did you mean 'wait_timeout'"),
    ],
)
async def test_invalid_options(make_backend: MakeBackend, options: dict[str, object], match: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=match):
        await make_backend(**options)


@pytest.mark.asyncio
async def test_hub_calls_do_not_block_the_shared_loop(
    api: FakeEndpointsAPI, make_backend: MakeBackend
) -> None:
    endpoint = api.add("ep", state="pending")
    api.start_up(endpoint, [("initializing", 0.3)])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = ab.get_loop_manager().submit(ticker())
    try:
        await make_backend()
    finally:
        task.cancel()
    assert ticks >= 10  # the shared loop kept turning while huggingface_hub's calls ran in threads
