"""What the ``vllm`` adapter checks before importing vLLM, the import itself, and its engine defaults.

Importing vLLM takes 10 s or more (torch, transformers, its kernels; over a minute on a busy machine), so a
misspelt option or a model directory that does not exist is found first, without it: option names are read
from the source of vLLM's ``EngineArgs`` (parsed, not imported), and a path that is clearly local is
looked for on disk instead of being sent to the Hugging Face Hub as a repo id.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import socket
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..._install import pip_install
from ..._registry import check_options
from ...errors import BackendNotFoundError, BackendUnavailableError, InvalidRequestError

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "FINGERPRINT_OPTIONS",
    "INSTALL_HINT",
    "check_before_import",
    "engine_defaults",
    "import_vllm",
]

CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache a CPU engine gets when nothing says otherwise: 1 GiB, as ``VLLM_CPU_KVCACHE_SPACE=1``."""

# Engine options that change outputs: they go into the response cache's fingerprint.
FINGERPRINT_OPTIONS = (
    "tokenizer",
    "revision",
    "tokenizer_revision",
    "code_revision",
    "quantization",
    "load_format",
    "hf_overrides",
    "kv_cache_dtype",
    "seed",
    "enable_lora",
    "max_lora_rank",
    "generation_config",
    "override_generation_config",
)
"""Engine options that change outputs: they go into the response cache's fingerprint."""

INSTALL_HINT = pip_install("vllm")

_HUB_PROBE_TIMEOUT = 5.0
"""Seconds the hub may take to accept a connection before a repo id that is not cached is refused."""


def check_before_import(backend: str, model: Any, options: Mapping[str, Any]) -> None:
    """Refuse what is wrong without importing vLLM: vLLM missing, unknown option names, a missing model path.

    Raises:
        BackendNotFoundError: vLLM is not installed (with the pip command).
        InvalidRequestError: An option that is not an engine argument (the closest names given), or a local
            model path that does not exist.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        message = f"backend {backend!r} needs 'vllm', which is not installed: {INSTALL_HINT}"
        raise BackendNotFoundError(message)
    locations = list(spec.submodule_search_locations or [])
    names = _engine_arg_names(locations[0]) if locations else None
    if names is not None:  # else the check after the import decides
        check_options(backend, options, names - {"model"})
    _check_model(model)


@functools.cache
def _engine_arg_names(package_dir: str) -> frozenset[str] | None:
    """The fields of ``AsyncEngineArgs`` read from vLLM's source; ``None`` where its layout is unfamiliar."""
    try:
        tree = ast.parse(Path(package_dir, "engine", "arg_utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    expected_bases = {"EngineArgs": [], "AsyncEngineArgs": ["EngineArgs"]}
    names: set[str] = set()
    for name, bases in expected_bases.items():
        node = classes.get(name)
        if node is None or [ast.unparse(base) for base in node.bases] != bases:
            return None  # fields may come from elsewhere: do not guess
        for statement in node.body:
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and "ClassVar" not in ast.unparse(statement.annotation)
            ):
                names.add(statement.target.id)
    # Far fewer names than any vLLM has means fields are declared some other way now.
    return frozenset(names) if len(names) >= 50 else None


def _check_model(model: Any) -> None:
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequestError(f"model must be a model directory or a Hugging Face repo id, got {model!r}")
    path = Path(model).expanduser()
    if path.exists():
        return  # what the directory holds is vLLM's to judge
    # A repo id is "name" or "org/name"; anything else that is not on disk is a local path that is missing.
    local = path.is_absolute() or model.startswith((".", "~")) or model.count("/") > 1 or "\\" in model
    if local:
        raise InvalidRequestError(
            f"model directory not found: {model!r} (a Hugging Face repo id looks like 'org/name')"
        )
    _check_hub_reachable(model)


def _check_hub_reachable(repo_id: str) -> None:
    """Refuse at once a repo id that is not cached while the hub cannot be reached.

    Otherwise vLLM's start-up spends tens of seconds retrying the hub (37-50 s seen on a machine with no
    network) before failing with the same cause.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return  # offline mode reads the cache without asking the hub: vLLM says what is missing at once
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - vLLM depends on it
        return
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT).close()
    except OSError as exc:
        raise BackendUnavailableError(
            f"model {repo_id!r} is not a local directory nor in the Hugging Face cache, and {endpoint} "
            f"cannot be reached ({exc.strerror or exc}): give a model directory, or download the model where "
            "the hub can be reached",
            backend="vllm",
        ) from exc


def engine_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults under the caller's options: the offline ``LLM`` class's, and working ones on a CPU.

    ``disable_log_stats`` is true, as with ``LLM``. On a CPU, vLLM reserves ``gpu_memory_utilization``
    (0.92 by default) of the RAM, which fails at start on any machine doing something else: unless the
    caller chose (``gpu_memory_utilization``, ``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE``), the
    KV cache gets a fixed `CPU_KV_CACHE_BYTES` instead.
    """
    defaults: dict[str, Any] = {"disable_log_stats": True}
    chose_memory = {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(options)
    if not chose_memory and not os.environ.get("VLLM_CPU_KVCACHE_SPACE") and _on_cpu():
        defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return defaults


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _device_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def import_vllm(namespace: dict[str, Any]) -> None:
    """Import vLLM and bind the names the adapter uses in ``namespace`` (its module's globals)."""
    from ..._engine_logs import route_vllm_logs_to_stderr

    route_vllm_logs_to_stderr()  # read by vLLM as it is imported: stdout is the caller's
    # vLLM and torch emit DeprecationWarnings at import time that callers cannot act on; under ``-W error``
    # (pytest's filterwarnings=error) they would make the adapter unusable.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import vllm
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.outputs import RequestOutput
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        from ._chat import ChatPath, check_tool_parser
        from ._compat import GracefulHTTPError, VLLMClientError, VLLMError
        from ._engine_calls import EngineCalls
        from ._engine_lifecycle import start_engine, stop_engine
        from ._reasoning import REFUSALS, ReasoningPath, check_reasoning_parser
        from ._requests import (
            completions,
            engine_capabilities,
            engine_input,
            prompt_ids,
            vllm_sampling,
        )
        from ._scoring_path import EngineScoring, scoring_mode
    namespace.update(
        vllm=vllm,
        VLLMSamplingParams=SamplingParams,
        AsyncEngineArgs=AsyncEngineArgs,
        RequestOutput=RequestOutput,
        AsyncLLM=AsyncLLM,
        EngineDeadError=EngineDeadError,
        ChatPath=ChatPath,
        EngineCalls=EngineCalls,
        check_tool_parser=check_tool_parser,
        ReasoningPath=ReasoningPath,
        REFUSALS=REFUSALS,
        check_reasoning_parser=check_reasoning_parser,
        GracefulHTTPError=GracefulHTTPError,
        VLLMClientError=VLLMClientError,
        VLLMError=VLLMError,
        start_engine=start_engine,
        stop_engine=stop_engine,
        engine_capabilities=engine_capabilities,
        completions=completions,
        engine_input=engine_input,
        translate_prompt=prompt_ids,
        EngineScoring=EngineScoring,
        scoring_mode=scoring_mode,
        vllm_sampling=vllm_sampling,
    )
