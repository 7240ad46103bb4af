"""The tiny vision-language model: a directory transformers and vLLM read as Idefics3, built with no download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncbackends.testing.tiny_model import build_tiny_vlm


@pytest.fixture(scope="module")
def vlm_dir() -> Path:
    return build_tiny_vlm()


@pytest.fixture(scope="module")
def processor(vlm_dir: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(vlm_dir)


def test_config_is_multimodal_idefics3(vlm_dir: Path) -> None:
    config = json.loads((vlm_dir / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    # head size 64 on both towers: what vLLM's CPU attention kernel accepts
    for tower in ("text_config", "vision_config"):
        part = config[tower]
        assert part["hidden_size"] // part["num_attention_heads"] == 64


def test_an_image_expands_to_its_patch_tokens(processor: Any) -> None:
    from PIL import Image

    image = Image.new("RGB", (40, 30), (200, 10, 10))
    out = processor(text="<image>hi", images=[image])  # no BOS added: the chat template writes it
    tokenizer = processor.tokenizer
    ids = out["input_ids"][0]
    assert ids.count(tokenizer.convert_tokens_to_ids("<image>")) == 4  # (32/8)^2 patches merged 2x2
    assert list(out["pixel_values"].shape[-2:]) == [32, 32]


def test_build_is_cached_and_reproducible(vlm_dir: Path, tmp_path: Path) -> None:
    assert build_tiny_vlm() == vlm_dir
    again = build_tiny_vlm(tmp_path / "vlm")
    assert (again / "model.safetensors").read_bytes() == (vlm_dir / "model.safetensors").read_bytes()


def test_template_renders_tools_and_tool_calls_hermes_style(processor: Any) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "sum?"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = processor.tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert json.dumps(tools[0]) in text
    assert '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' in text
    assert "<|user|>\n<image>\nsum?" in text
    assert text.endswith("<|tool|>\n3</s>\n<|assistant|>\n")
    # the tool-call markers are whole tokens, kept in decoded text (not special)
    start = processor.tokenizer.convert_tokens_to_ids("<tool_call>")
    assert processor.tokenizer.decode([start], skip_special_tokens=True) == "<tool_call>"
