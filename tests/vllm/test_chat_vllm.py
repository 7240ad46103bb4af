"""Images and tools through the vllm adapter, token for token against vLLM's offline ``LLM.chat``.

One engine on the tiny VLM (`build_tiny_vlm`) serves the module; the reference runs ``LLM.chat`` on the same
weights and messages in a subprocess started beside it (two engines never share a process).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.testing.tiny_model import build_tiny_vlm

from ..chat_tools import add_tool
from ..processes import start_group, stop_group
from .conftest import ENGINE_OPTIONS, build_backend

MAX_TOKENS = 8
ADD = add_tool("a", "b")
ECHO = ab.Tool("echo", "Repeat a word.", {"type": "object", "properties": {"word": {"type": "string"}}})
# The schema vLLM's OpenAI server builds for tool_choice="required", written out by hand from its docs.
REQUIRED_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "anyOf": [
            {
                "properties": {"name": {"type": "string", "enum": [t.name]}, "parameters": t.parameters},
                "required": ["name", "parameters"],
            }
            for t in (ADD, ECHO)
        ],
    },
}
# What ChatPath reads the engine from (a backend's EngineRestarts): no engine, for checks that need none.
_NO_ENGINE = types.SimpleNamespace(engine=None)
HERMES_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
# Room for the whole call: under the regex the engine spells it mostly one character a token (69 characters;
# `<tool_call>` itself came as ten tokens, not as the added token), so 40 tokens cut it inside the arguments.
HERMES_MAX_TOKENS = 96
# The call as a regex matching only itself: braces are repetition counts (re.escape would also escape spaces).
HERMES_REGEX = re.sub(r"([{}\[\]().*+?^$|\\])", r"\\\1", HERMES_CALL)


def _image(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> dict[str, Any]:
    from PIL import Image

    return ab.image_part(Image.new("RGB", size, colour))


RED, BLUE = _image((200, 10, 10)), _image((10, 10, 200), (24, 32))
SECOND_TURN = [
    {"role": "user", "content": "add 1 and 2"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]
# name -> (messages, tools, tool_choice, structured output the reference is given)
CASES: dict[str, tuple[list[Any], tuple[ab.Tool, ...], str, dict[str, Any]]] = {
    "image": (
        [{"role": "user", "content": [RED, {"type": "text", "text": "What is this?"}]}],
        (),
        "auto",
        {},
    ),
    "two_images": (
        [{"role": "user", "content": [{"type": "text", "text": "Compare"}, RED, BLUE]}],
        (),
        "auto",
        {},
    ),
    "image_with_history": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [BLUE, {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": "blue"},
            {"role": "user", "content": "Sure?"},
        ],
        (),
        "auto",
        {},
    ),
    "tools_none": ([{"role": "user", "content": "add 1 and 2"}], (ADD, ECHO), "none", {}),
    "named": ([{"role": "user", "content": "add 1 and 2"}], (ADD, ECHO), "add", {"json": ADD.parameters}),
    "required": ([{"role": "user", "content": "say hi"}], (ADD, ECHO), "required", {"json": REQUIRED_SCHEMA}),
    "second_turn": (SECOND_TURN, (ADD,), "none", {}),
}
FORCED = ["named", "required"]  # compared on a backend without tool_parser (`no_parser_backend`)


def _as_served(tools: tuple[ab.Tool, ...]) -> list[dict[str, Any]] | None:
    """The tools as `vllm serve` hands them to the chat template: its pydantic tool model's ``model_dump()``
    (name, description, parameters; unset fields as null), which the adapter renders too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    return [ChatCompletionToolsParam.model_validate(t.to_openai()).model_dump() for t in tools] or None


@pytest.fixture(scope="module")
def vlm() -> str:
    return str(build_tiny_vlm())


@pytest.fixture(scope="module")
def _reference(vlm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    work = tmp_path_factory.mktemp("offline_chat")
    cases = [
        {
            "messages": messages,
            "tools": _as_served(tools),
            "max_tokens": MAX_TOKENS,
            **structured,
        }
        for messages, tools, _, structured in CASES.values()
    ]
    cases.append(
        {
            "messages": CASES["tools_none"][0],
            "tools": _as_served((ADD,)),
            "max_tokens": HERMES_MAX_TOKENS,
            "regex": HERMES_REGEX,
        }
    )
    # Issue 44 item 10's comparison: a named tool choice at 24 tokens, LLM.chat given the tools and not.
    for tools in (_as_served((ADD, ECHO)), None):
        cases.append(
            {"messages": CASES["named"][0], "tools": tools, "max_tokens": 24, "json": ADD.parameters}
        )
    (work / "cases.json").write_text(json.dumps(cases))
    out = work / "out.json"
    log = (work / "log.txt").open("wb")
    script = Path(__file__).with_name("_offline_chat_reference.py")
    argv = [sys.executable, str(script), vlm, json.dumps(ENGINE_OPTIONS), str(work / "cases.json"), str(out)]
    proc = start_group(argv, stdout=log, stderr=subprocess.STDOUT)
    yield proc, out
    stop_group(proc)
    log.close()


@pytest.fixture(scope="module")
def reference(_reference: tuple[Any, Path]) -> dict[str, dict[str, Any]]:
    proc, out = _reference
    assert proc.wait(timeout=300) == 0, f"offline LLM.chat failed; see {out.with_name('log.txt')}"
    rows = json.loads(out.read_text())
    return dict(zip([*CASES, "hermes", "named_24", "named_24_no_tools"], rows, strict=True))


@pytest.fixture(scope="module")
def vlm_backend(vlm: str, _reference: Any, _lm_eval_started: Any) -> Iterator[Any]:
    # Both reference processes first, so their engine start-ups overlap this one.
    backend = build_backend(vlm, tool_parser="hermes")
    yield backend
    backend.close()


@pytest.fixture
def no_parser_backend(vlm_backend: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``vlm_backend`` as a backend built without ``tool_parser`` renders and reads chats (its ChatPath).

    Without a parser a named or required choice is constrained by vLLM's JSON schema of the call, which the
    offline reference is given; with the hermes parser it is the server's structural tag
    (tests/parity/test_vllm_serve_tool_calls.py).
    """
    from asyncbackends.adapters.vllm._chat import ChatPath

    monkeypatch.setattr(vlm_backend, "_chat", ChatPath(vlm_backend._restarts, "vllm"))
    return vlm_backend


def _request(name: str, **overrides: Any) -> ab.GenerationRequest:
    messages, tools, choice, _ = CASES[name]
    params = ab.SamplingParams(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, **overrides})
    return ab.GenerationRequest(messages, params, tools=tools, tool_choice=choice)


def test_capabilities_claim_images_and_tools(vlm_backend: Any) -> None:
    assert vlm_backend.capabilities.images and vlm_backend.capabilities.tools


@pytest.mark.parametrize("name", [name for name in CASES if name not in FORCED])
def test_greedy_tokens_equal_offline_llm_chat(vlm_backend: Any, reference: dict[str, Any], name: str) -> None:
    (result,) = ab.run_batch(vlm_backend, [_request(name)])
    expected = reference[name]
    assert result.prompt_tokens == len(expected["prompt"])
    assert list(result.completions[0].token_ids) == expected["tokens"]


@pytest.mark.parametrize("name", FORCED)
def test_forced_choice_without_a_parser_equals_offline_llm_chat_given_the_json_schema(
    no_parser_backend: Any, reference: dict[str, Any], name: str
) -> None:
    (result,) = ab.run_batch(no_parser_backend, [_request(name)])
    expected = reference[name]
    assert result.prompt_tokens == len(expected["prompt"])
    assert list(result.completions[0].token_ids) == expected["tokens"]


def test_images_reach_the_model(reference: dict[str, Any]) -> None:
    # Guards the comparison above: an image changes the prompt (its patch tokens) and what follows.
    assert len(reference["two_images"]["prompt"]) > len(reference["image"]["prompt"])
    assert reference["image"]["tokens"] != reference["image_with_history"]["tokens"]


def test_named_tool_choice_without_a_parser_is_a_call_with_arguments_by_its_schema(
    no_parser_backend: Any, reference: dict[str, Any]
) -> None:
    import jsonschema

    vlm_backend = no_parser_backend
    (result,) = ab.run_batch(vlm_backend, [_request("named", max_tokens=40)])
    completion = result.completions[0]
    (call,) = completion.tool_calls
    assert call.name == "add" and call.id and completion.text == ""
    assert call.arguments == vlm_backend.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    if completion.finish_reason == "length":  # the random model may ramble inside the object until cut
        return
    assert completion.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.arguments), ADD.parameters)


def test_named_tool_choice_equals_llm_chat_given_the_tools_which_a_reference_without_them_does_not(
    no_parser_backend: Any, reference: dict[str, Any]
) -> None:
    # Issue 44 item 10: the adapter's tokens for tool_choice="add" differed from LLM.chat(...,
    # structured_outputs=json schema). The adapter renders the tools into the prompt, as vllm serve does; the
    # reference matches it only when LLM.chat is given tools= too. Without them the template renders no tools,
    # so the prompt (and from it the tokens) differ: the reference side differed, not the constraint.
    (result,) = ab.run_batch(no_parser_backend, [_request("named", max_tokens=24)])
    given, without = reference["named_24"], reference["named_24_no_tools"]
    assert result.prompt_tokens == len(given["prompt"])
    assert list(result.completions[0].token_ids) == given["tokens"]
    assert len(without["prompt"]) < len(given["prompt"])  # no tool definitions rendered


def test_required_tool_choice_without_a_parser_is_a_list_of_calls(no_parser_backend: Any) -> None:
    (result,) = ab.run_batch(no_parser_backend, [_request("required", max_tokens=60)])
    completion = result.completions[0]
    if completion.finish_reason == "length":
        assert completion.tool_calls == ()
        return
    assert completion.tool_calls and completion.finish_reason == "tool_calls"
    for call in completion.tool_calls:
        assert call.name in ("add", "echo") and call.id
        json.loads(call.arguments)


def test_auto_output_is_read_by_the_named_tool_parser(vlm_backend: Any, reference: dict[str, Any]) -> None:
    # The regex makes the model write a Hermes tool call, which the hermes parser must read back.
    params = ab.SamplingParams(max_tokens=HERMES_MAX_TOKENS, temperature=0.0, regex=HERMES_REGEX)
    request = ab.GenerationRequest(CASES["tools_none"][0], params, tools=(ADD,), tool_choice="auto")
    (result,) = ab.run_batch(vlm_backend, [request])
    completion = result.completions[0]
    assert reference["hermes"]["text"] == HERMES_CALL  # offline wrote the whole call: not cut by max_tokens
    assert list(completion.token_ids) == reference["hermes"]["tokens"]
    (call,) = completion.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 1, "b": 2})
    assert completion.finish_reason == "tool_calls" and completion.text == ""


def test_auto_output_the_parser_cannot_read_comes_back_as_text(vlm_backend: Any) -> None:
    params = ab.SamplingParams(max_tokens=40, temperature=0.0, regex='<tool_call>\\{"name": oops')
    request = ab.GenerationRequest(CASES["tools_none"][0], params, tools=(ADD,), tool_choice="auto")
    (result,) = ab.run_batch(vlm_backend, [request])
    completion = result.completions[0]
    assert completion.tool_calls == () and completion.text.startswith('<tool_call>{"name": oops')


def test_auto_tool_choice_decodes_special_tokens_as_vllms_server(vlm_backend: Any) -> None:
    # Hermes models mark <tool_call> special: vLLM's server keeps special tokens in the text the parser reads
    # (the parser's adjust_request), and only for "auto" with tools.
    from vllm import SamplingParams

    from asyncbackends.adapters.vllm._chat import ChatPath

    path = ChatPath(vlm_backend._restarts, "vllm", tool_parser="hermes")
    messages = CASES["tools_none"][0]
    auto = ab.GenerationRequest(messages, tools=(ADD,), tool_choice="auto")
    none = ab.GenerationRequest(messages, tools=(ADD,), tool_choice="none")
    assert SamplingParams().skip_special_tokens
    assert path.sampling(auto, SamplingParams()).skip_special_tokens is False
    assert path.sampling(none, SamplingParams()).skip_special_tokens is True


def test_remote_image_refused_without_the_option(vlm_backend: Any) -> None:
    part = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}
    request = ab.GenerationRequest([{"role": "user", "content": [part]}])
    with pytest.raises(ab.RequestRejectedError, match="allow_remote_images"):
        ab.run_batch(vlm_backend, [request], retry=ab.RetryPolicy(max_attempts=1))


def test_auto_tool_choice_without_a_parser_is_refused_naming_the_option() -> None:
    from asyncbackends.adapters.vllm._chat import ChatPath

    request = ab.GenerationRequest([{"role": "user", "content": "hi"}], tools=(ADD,))
    with pytest.raises(ab.RequestRejectedError, match="tool_parser"):
        ChatPath(_NO_ENGINE, "vllm").check(request)
    ChatPath(_NO_ENGINE, "vllm", tool_parser="hermes").check(request)  # accepted with one


def test_auto_after_a_forced_call_says_what_happened_and_what_to_pass() -> None:
    # inspect's use_tools(..., tool_choice=ToolFunction("add")) sends "auto" on the turn after the forced call.
    from asyncbackends.adapters.vllm._chat import ChatPath

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    second_turn = ab.GenerationRequest(
        [
            {"role": "user", "content": "1+2?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
        ],
        tools=(ADD,),
    )
    with pytest.raises(ab.RequestRejectedError) as refused:
        ChatPath(_NO_ENGINE, "vllm").check(second_turn)
    message = str(refused.value)
    assert "switch a forced tool choice" in message and "-M tool_parser=hermes" in message
    assert "or name a tool" not in message  # the advice the user had already followed


def test_unknown_tool_parser_refused_before_the_engine_starts(vlm: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match="hermes"):
        build_backend(vlm, tool_parser="hermez")


def test_image_on_a_text_only_model_refused_before_sending(vllm_backend: Any) -> None:
    assert not vllm_backend.capabilities.images
    request = ab.GenerationRequest([{"role": "user", "content": [RED]}])
    with pytest.raises(ab.RequestRejectedError, match="not a multimodal model"):
        ab.run_batch(vllm_backend, [request], retry=ab.RetryPolicy(max_attempts=1))


# -- lm-eval's multimodal requests, per sample against lm-eval's own vllm-vlm ------------------------------

LM_EVAL_GEN = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}
LM_EVAL_SAMPLES = [
    ([{"role": "user", "content": "<image>What colour is this?"}], [(200, 10, 10)]),
    ([{"role": "user", "content": "Compare <image> and <image>, please."}], [(10, 10, 200), (10, 200, 10)]),
    (
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "<image>Colour?"},
            {"role": "assistant", "content": "red"},
            {"role": "user", "content": "<image>Colour?"},
        ],
        [(200, 10, 10), (90, 90, 90)],
    ),
]


def _lm_eval_images(tmp: Path) -> list[list[str]]:
    from PIL import Image

    paths = []
    for index, (_, colours) in enumerate(LM_EVAL_SAMPLES):
        row = []
        for k, colour in enumerate(colours):
            path = tmp / f"{index}-{k}.png"
            Image.new("RGB", (40, 30), colour).save(path)
            row.append(str(path))
        paths.append(row)
    return paths


@pytest.fixture(scope="module")
def _lm_eval_started(
    vlm: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path, Any] | None]:
    """lm-eval's own ``vllm-vlm`` on the samples, in a subprocess; None where lm-eval is not installed."""
    if importlib.util.find_spec("lm_eval") is None:
        yield None
        return
    work = tmp_path_factory.mktemp("lm_eval_vlm")
    images = _lm_eval_images(work)
    samples = [
        {"history": history, "images": paths, "gen_kwargs": LM_EVAL_GEN}
        for (history, _), paths in zip(LM_EVAL_SAMPLES, images, strict=True)
    ]
    (work / "samples.json").write_text(json.dumps(samples))
    out = work / "out.json"
    log = (work / "log.txt").open("wb")
    options = dict(ENGINE_OPTIONS)
    script = Path(__file__).with_name("_lm_eval_vlm_reference.py")
    argv = [sys.executable, str(script), vlm, json.dumps(options), str(work / "samples.json"), str(out)]
    proc = start_group(argv, stdout=log, stderr=subprocess.STDOUT)
    yield proc, out, images
    stop_group(proc)
    log.close()


@pytest.fixture(scope="module")
def lm_eval_reference(_lm_eval_started: tuple[Any, Path, Any] | None) -> tuple[Any, Path, Any]:
    if _lm_eval_started is None:
        pytest.skip("lm-eval is not installed")
    return _lm_eval_started


def _instances(lm: Any, images: list[list[str]]) -> list[Any]:
    import copy

    from lm_eval.api.instance import Instance
    from PIL import Image

    instances = []
    for index, ((history, _), paths) in enumerate(zip(LM_EVAL_SAMPLES, images, strict=True)):
        context = lm.apply_chat_template(copy.deepcopy(history), add_generation_prompt=True)
        visual = [Image.open(path).convert("RGB") for path in paths]
        arguments = (context, dict(LM_EVAL_GEN), {"visual": visual})
        instances.append(Instance("generate_until", doc={}, arguments=arguments, idx=index))
    return instances


def test_lm_eval_multimodal_matches_its_vllm_vlm_per_sample(
    vlm_backend: Any, lm_eval_reference: tuple[Any, Path, Any]
) -> None:
    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    proc, out, images = lm_eval_reference
    lm = AsyncBackendsLM(vlm_backend, progress=False)
    assert lm.MULTIMODAL
    got = lm.generate_until(_instances(lm, images))
    assert proc.wait(timeout=300) == 0, f"lm-eval vllm-vlm failed; see {out.with_name('log.txt')}"
    want = json.loads(out.read_text())
    assert len(got) == len(want) == len(LM_EVAL_SAMPLES)
    assert got == want
    assert len(set(want)) > 1  # the samples differ, so equal lists are not one answer repeated


def test_lm_eval_images_refused_on_a_backend_without_them(vllm_backend: Any, tmp_path: Path) -> None:
    from asyncbackends.integrations.lm_eval import AsyncBackendsLM

    lm = AsyncBackendsLM(vllm_backend, progress=False)
    assert not lm.MULTIMODAL
    with pytest.raises(ab.InvalidRequestError, match="does not accept them"):
        lm.generate_until(_instances(lm, _lm_eval_images(tmp_path)))
