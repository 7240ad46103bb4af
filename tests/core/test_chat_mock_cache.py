"""The mock's images and tools, the cache key over images, tools and tool choice, tool calls through the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
from PIL import Image

import asyncbackends as ab

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 2},
        "days": {"type": "integer", "minimum": 3},
        "unit": {"enum": ["c", "f"]},
        "note": {"type": "string"},
    },
    "required": ["city", "days", "unit"],
}
WEATHER = ab.Tool("weather", "Forecast.", SCHEMA)
ADD = ab.Tool("add", "", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})


def _png(color: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), color).save(buffer, format="PNG")
    return buffer.getvalue()


def _ask(text: str, **kwargs: Any) -> ab.GenerationRequest:
    return ab.GenerationRequest([{"role": "user", "content": text}], **kwargs)


def test_mock_echo_names_each_image_by_its_content_hash(make_mock: Any) -> None:
    red, blue = _png("red"), _png("blue")
    request = ab.GenerationRequest(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "see "}, ab.image_part(red), ab.image_part(blue)],
            }
        ],
        ab.SamplingParams(max_tokens=200),
    )
    (result,) = ab.run_batch(make_mock(), [request])
    digest = [hashlib.sha256(png).hexdigest()[:16] for png in (red, blue)]
    assert result.text == f"user: see [image {digest[0]}][image {digest[1]}]"


def test_mock_forced_tool_choice_calls_with_the_smallest_valid_arguments(make_mock: Any) -> None:
    backend = make_mock()
    named = _ask(
        "plan a trip",
        tools=[ADD, WEATHER],
        tool_choice="weather",
        params=ab.SamplingParams(n=2, temperature=1),
    )
    required = _ask("plan a trip", tools=[ADD, WEATHER], tool_choice="required")
    results = ab.run_batch(backend, [named, required])
    for result, tool in zip(results, (WEATHER, ADD), strict=True):
        for completion in result.completions:
            (call,) = completion.tool_calls
            assert (
                call.name == tool.name and completion.finish_reason == "tool_calls" and completion.text == ""
            )
            arguments = json.loads(call.arguments)
            jsonschema.validate(arguments, tool.parameters)  # valid by an independent validator
            assert set(arguments) == set(tool.parameters["required"])  # and nothing optional
    assert json.loads(results[0].completions[0].tool_calls[0].arguments) == {
        "city": "aa",
        "days": 3,
        "unit": "c",
    }


def test_mock_auto_calls_a_tool_named_in_the_last_message_else_echoes(make_mock: Any) -> None:
    backend = make_mock()
    results = ab.run_batch(
        backend,
        [
            _ask("what is the weather?", tools=[ADD, WEATHER]),
            _ask("hello", tools=[ADD, WEATHER]),
            _ask("what is the weather?", tools=[WEATHER], tool_choice="none"),
        ],
    )
    assert [c.name for c in results[0].completions[0].tool_calls] == ["weather"]
    assert results[1].text == "user: hello" and results[1].completions[0].tool_calls == ()
    assert results[2].completions[0].tool_calls == () and results[2].text == "user: what is the weather?"


def test_cache_key_covers_images_by_content_tools_and_tool_choice(tmp_path: Path, make_mock: Any) -> None:
    cache = ab.ResponseCache(tmp_path / "c.sqlite")
    backend = make_mock()
    red = ab.image_part(_png("red"))
    url = red["image_url"]["url"]
    # The same bytes written with a data URL parameter: one image, one key.
    same = {"type": "image_url", "image_url": {"url": url.replace(";base64,", ";charset=x;base64,")}}
    blue = ab.image_part(_png("blue"))

    def key(request: ab.GenerationRequest) -> str:
        return cache.key(backend, request)

    def with_image(part: dict[str, Any]) -> ab.GenerationRequest:
        return ab.GenerationRequest([{"role": "user", "content": [part]}])

    assert key(with_image(red)) == key(with_image(same)) != key(with_image(blue))
    base = _ask("trip", tools=[WEATHER])
    assert key(base) != key(_ask("trip", tools=[WEATHER, ADD])) != key(_ask("trip"))
    assert key(base) != key(_ask("trip", tools=[WEATHER], tool_choice="weather"))
    assert key(base) != key(_ask("trip", tools=[ab.Tool("weather", "Other.", SCHEMA)]))
    # A text request's key is unchanged by the tool fields it does not use.
    text = ab.GenerationRequest("hi")
    payload = json.dumps(
        [
            {"name": "mock", "model": "mock-echo"},
            {"prompt": "hi", "params": _params(text), "type": "GenerationRequest"},
        ],
        sort_keys=True,
        default=str,
    )
    assert key(text) == hashlib.sha256(payload.encode()).hexdigest()
    cache.close()


def _params(request: ab.GenerationRequest) -> dict[str, Any]:
    return dataclasses.asdict(request.params)


def test_tool_calls_round_trip_through_the_cache(tmp_path: Path, make_mock: Any) -> None:
    path = tmp_path / "c.sqlite"
    request = _ask("plan", tools=[WEATHER], tool_choice="weather")
    first = ab.run_batch(make_mock(), [request], cache=path)
    resumed = make_mock()
    again = ab.run_batch(resumed, [request], cache=path)
    assert again == first and again[0].completions[0].tool_calls[0].name == "weather"
    assert sum(resumed.attempts.values()) == 0  # served from the cache


def test_a_rate_limit_charges_an_image_a_fixed_estimate_not_its_data_url() -> None:
    from asyncbackends._limits import estimated_tokens

    params = ab.SamplingParams(max_tokens=10)
    small = ab.image_part(_png("red"))
    large = {"type": "image_url", "image_url": {"url": "https://example.com/" + "x" * 100_000}}
    for part in (small, large):
        request = ab.GenerationRequest(
            [{"role": "user", "content": [{"type": "text", "text": "abcd"}, part]}], params
        )
        assert estimated_tokens(request) == 1 + 256 + 10
