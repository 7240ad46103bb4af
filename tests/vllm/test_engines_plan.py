"""The plan behind ``create_backend("vllm", engines=N)``: options, devices, memory split, which engines start
at once, the auto rule.

No engine starts here: `start_engines` runs the one-engine build (`_build`) of a `VLLMBackend` subclass, which
starts nothing, so what each engine would be started with (its options and environment) is read directly.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends.adapters.vllm import VLLMBackend
from asyncbackends.adapters.vllm import _checks as _vllm_checks
from asyncbackends.adapters.vllm._engine_plan import (
    auto_engines,
    check_engines,
    estimate_parameters,
    plan_engines,
    start_waves,
    visible_devices,
)
from asyncbackends.adapters.vllm._engine_pool import VLLMEnginesBackend
from asyncbackends.adapters.vllm._engine_start import start_engines
from asyncbackends.adapters.vllm._options import DEFAULT_OPTIONS
from asyncbackends.errors import InvalidRequestError

GIB = 1 << 30

# Llama-3.2-1B's shape with the benchmark's 32000-token vocabulary, and Llama-3.1-8B's (issue 29's models).
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 32000,
    "tie_word_embeddings": True,
}
LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize("engines", [0, -1, "many", 1.5, True, None, "2"])
def test_a_bad_engine_count_is_refused_before_vllm_loads(engines: Any) -> None:
    with pytest.raises(InvalidRequestError, match="engines must be an int >= 1 or 'auto'"):
        ab.create_backend("vllm", model="/nonexistent/model", engines=engines)


def test_routing_needs_several_engines_and_a_known_name() -> None:
    with pytest.raises(InvalidRequestError, match="routing= needs engines > 1"):
        ab.create_backend("vllm", model="/nonexistent/model", routing="affinity")
    with pytest.raises(InvalidRequestError, match="routing must be one of"):
        ab.create_backend("vllm", model="/nonexistent/model", engines=2, routing="round_robin")
    assert check_engines("auto", "affinity", {}) == "auto"


def test_engines_with_parallel_engines_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size"):
        check_engines(2, None, {"tensor_parallel_size": 2})
    assert check_engines(1, None, {"tensor_parallel_size": 2}) == 1


def test_engines_place_themselves_so_vllms_device_ids_is_refused_with_several() -> None:
    with pytest.raises(
        InvalidRequestError, match="choose the GPUs with CUDA_VISIBLE_DEVICES, not device_ids"
    ):
        check_engines("auto", None, {"device_ids": [1]})
    assert check_engines(1, None, {"device_ids": [1]}) == 1  # one engine: vLLM's own option, untouched


@pytest.mark.parametrize("name", ["mock", "openai"])
def test_engines_on_another_backend_is_an_unknown_option(name: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"unknown option.*'engines'"):
        ab.create_backend(name, model="m", engines=2)


def test_gpu_memory_utilization_is_the_total_of_one_gpus_engines() -> None:
    plans = plan_engines(4, {"gpu_memory_utilization": 0.8}, environ={}, on_cpu=False, devices=["0"])
    assert [p.label for p in plans] == ["engine-0", "engine-1", "engine-2", "engine-3"]
    assert [p.options["gpu_memory_utilization"] for p in plans] == [pytest.approx(0.2)] * 4
    assert all(p.env == {} and p.device is None for p in plans)  # one GPU: its environment untouched


def test_vllms_default_utilization_is_split_when_none_is_given() -> None:
    plans = plan_engines(2, {}, environ={}, on_cpu=False, devices=["0"])
    assert [p.options["gpu_memory_utilization"] for p in plans] == [pytest.approx(0.46)] * 2
    assert "kv_cache_memory_bytes" not in plans[0].options


def test_kv_cache_bytes_are_split_and_on_a_gpu_each_engine_asks_its_share_of_the_memory() -> None:
    plans = plan_engines(3, {"kv_cache_memory_bytes": 3 * GIB}, environ={}, on_cpu=False, devices=["0"])
    assert [p.options["kv_cache_memory_bytes"] for p in plans] == [GIB] * 3
    # vLLM checks each engine's start against free memory >= gpu_memory_utilization x total (0.92 unset),
    # KV size given or not: left at 0.92, the second engine on the GPU would be refused.
    assert [p.options["gpu_memory_utilization"] for p in plans] == [pytest.approx(0.92 / 3)] * 3
    on_cpu = plan_engines(3, {"kv_cache_memory_bytes": 3 * GIB}, environ={}, on_cpu=True)
    assert all("gpu_memory_utilization" not in p.options for p in on_cpu)  # no such check on a CPU


def test_engines_go_round_robin_over_the_visible_gpus_each_splitting_its_own_memory() -> None:
    devices = visible_devices({"CUDA_VISIBLE_DEVICES": "2, 5,7"}, device_count=8)
    assert devices == ["2", "5", "7"]
    plans = plan_engines(5, {"gpu_memory_utilization": 0.9}, environ={}, on_cpu=False, devices=devices)
    assert [p.device for p in plans] == ["2", "5", "7", "2", "5"]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["2", "5", "7", "2", "5"]
    # Devices 2 and 5 hold two engines each, device 7 one.
    got = [p.options["gpu_memory_utilization"] for p in plans]
    assert got == [pytest.approx(x) for x in (0.45, 0.45, 0.9, 0.45, 0.45)]
    assert visible_devices({}, device_count=2) == ["0", "1"]


def _labels(waves: list[list[Any]]) -> list[list[str]]:
    return [[plan.label.removeprefix("engine-") for plan in wave] for wave in waves]


def test_on_a_gpu_engines_start_one_after_another_whatever_their_devices_or_memory() -> None:
    # vLLM's start-up sets OMP_NUM_THREADS around each GPU engine-core launch with no lock, forks the engine
    # core, and profiles the GPU's memory: overlapping starts in one process are not safe there.
    sized = {"enforce_eager": True, "kv_cache_memory_bytes": 4 * GIB}
    for devices in (["0"], ["0", "1"]):
        plans = plan_engines(3, sized, environ={}, on_cpu=False, devices=devices)
        assert _labels(start_waves(plans, on_cpu=False)) == [["0"], ["1"], ["2"]]


def test_on_a_cpu_engines_start_together_a_compiling_engine_0_alone_first() -> None:
    environ = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    eager = plan_engines(3, {"enforce_eager": True}, environ=environ, on_cpu=True)
    assert _labels(start_waves(eager, on_cpu=True)) == [["0", "1", "2"]]
    compiling = plan_engines(
        3, {}, environ=environ, on_cpu=True
    )  # it fills the compile cache the others read
    assert _labels(start_waves(compiling, on_cpu=True)) == [["0"], ["1", "2"]]
    assert _labels(start_waves(compiling[:1], on_cpu=True)) == [["0"]]
    assert start_waves([], on_cpu=True) == []


def test_the_cpu_kv_cache_space_is_the_total_and_hidden_from_each_engines_start() -> None:
    environ = {"VLLM_CPU_KVCACHE_SPACE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    plans = plan_engines(4, {"gpu_memory_utilization": 0.1}, environ=environ, on_cpu=True, devices=["0", "1"])
    assert [p.options["kv_cache_memory_bytes"] for p in plans] == [GIB // 2] * 4
    assert [p.options["gpu_memory_utilization"] for p in plans] == [pytest.approx(0.025)] * 4
    assert all(p.env == {"VLLM_CPU_KVCACHE_SPACE": None} and p.device is None for p in plans)


def test_parameter_estimates_match_the_published_sizes() -> None:
    # Llama-3.2-1B has 1.24e9 parameters with its 128256-token vocabulary; Llama-3.1-8B 8.03e9.
    assert estimate_parameters({**LLAMA_1B, "vocab_size": 128256}) == pytest.approx(1.236e9, rel=0.01)
    assert estimate_parameters(LLAMA_8B) == pytest.approx(8.03e9, rel=0.01)
    assert estimate_parameters({"text_config": LLAMA_8B}) == estimate_parameters(LLAMA_8B)
    assert estimate_parameters({"hidden_size": 8}) is None


def test_the_auto_rule() -> None:
    assert auto_engines(LLAMA_1B, on_cpu=False, gpus=1) == 6  # 6 measured 2.82-2.90x, 8 2.83x
    assert auto_engines(LLAMA_1B, on_cpu=False, gpus=2) == 12
    assert auto_engines(LLAMA_8B, on_cpu=False, gpus=1) == 1  # 2 engines measured 0.90x
    assert auto_engines(LLAMA_8B, on_cpu=False, gpus=4) == 4
    assert auto_engines(LLAMA_1B, on_cpu=True, gpus=0) == 1
    assert auto_engines(None, on_cpu=False, gpus=1) == 1  # size unknown: never risk being slower


class _Built:
    """Stands for one started engine: records what it was built with."""

    def __init__(self, options: dict[str, Any], env: Any) -> None:
        self.options, self.env, self.closed = options, env, False
        self.model = "tiny"
        self.capabilities = ab.Capabilities(max_concurrency=8)
        self.fingerprint = {"name": "vllm", "model": "tiny"}

    async def generate(self, request: Any) -> Any:
        raise NotImplementedError

    async def loglikelihood(self, request: Any) -> Any:
        raise NotImplementedError

    async def check_ready(self) -> None:
        return None

    async def aclose(self) -> None:
        self.closed = True


class _Adapter(VLLMBackend):
    """`VLLMBackend` whose one-engine build starts nothing."""

    built: list[_Built]

    groups: list[object | None]

    labels: list[str | None]

    @classmethod
    async def _build(
        cls,
        model: str,
        engine_args: dict[str, Any],
        *,
        env: Any,
        start_group: object | None = None,
        **own: Any,
    ) -> _Built:
        cls.labels.append(own.get("label"))  # the restart log's name for the engine
        await cls.starting(own.get("label"))
        cls.built.append(cls.engine(engine_args, env))
        cls.groups.append(start_group)
        return cls.built[-1]

    @classmethod
    async def starting(cls, label: str | None) -> None:
        """What a start does before its engine exists (a test's subclass may fail or hold it here)."""

    @classmethod
    def engine(cls, options: dict[str, Any], env: Any) -> _Built:
        return _Built(options, env)


def _create(
    monkeypatch: pytest.MonkeyPatch,
    engines: int | str,
    routing: str | None,
    *,
    cpu: bool = False,
    **args: Any,
) -> Any:
    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: cpu)
    monkeypatch.setattr(_vllm_checks, "_device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    _Adapter.built, _Adapter.groups, _Adapter.labels = [], [], []
    return asyncio.run(
        start_engines(_Adapter._build, "/models/x", engines, routing, dict(args), DEFAULT_OPTIONS)
    )


def test_the_engines_start_each_engine_from_its_plan_behind_one_routed_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = _create(monkeypatch, 4, "affinity", gpu_memory_utilization=0.8)
    try:
        assert isinstance(backend, VLLMEnginesBackend)
        assert backend.name == "vllm" and backend.routing == "affinity"
        assert [s.label for s in backend.replica_stats()] == ["engine-0", "engine-1", "engine-2", "engine-3"]
        assert backend.engines == _Adapter.built
        assert _Adapter.labels == ["vllm engine-0", "vllm engine-1", "vllm engine-2", "vllm engine-3"]
        assert [b.env["CUDA_VISIBLE_DEVICES"] for b in _Adapter.built] == ["3", "4", "3", "4"]
        assert [b.options["gpu_memory_utilization"] for b in _Adapter.built] == [pytest.approx(0.4)] * 4
        assert all(b.options["disable_log_stats"] for b in _Adapter.built)  # the adapter's defaults kept
        assert backend.fingerprint == {"name": "vllm", "model": "tiny"}  # one engine's: one cache for any N
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,4"
    finally:
        backend.close()
    assert all(b.closed for b in _Adapter.built)


def test_a_waves_engines_start_as_one_group_and_the_backend_keeps_the_plans_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_gpus = _create(monkeypatch, 3, None, enforce_eager=True)
    try:
        assert _Adapter.groups == [None] * 3  # one at a time: a start alone shares the gate with nobody
    finally:
        on_gpus.close()
    backend = _create(monkeypatch, 3, None, cpu=True, enforce_eager=True)
    try:
        group = _Adapter.groups[0]
        assert group is not None and _Adapter.groups == [group] * 3
        assert backend.engines == _Adapter.built
        assert [s.label for s in backend.replica_stats()] == ["engine-0", "engine-1", "engine-2"]
    finally:
        backend.close()


def test_auto_on_a_model_of_unknown_size_builds_the_plain_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _create(monkeypatch, "auto", "affinity", gpu_memory_utilization=0.8)
    assert built is _Adapter.built[0] and len(_Adapter.built) == 1
    assert built.options == {"gpu_memory_utilization": 0.8} and built.env is None  # untouched


def test_auto_on_a_small_model_builds_six_engines_a_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_1B))
    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: False)
    monkeypatch.setattr(_vllm_checks, "_device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _Adapter.built, _Adapter.groups, _Adapter.labels = [], [], []
    backend = asyncio.run(start_engines(_Adapter._build, str(tmp_path), "auto", None, {}, DEFAULT_OPTIONS))
    try:
        assert len(backend.engines) == 6
        assert [b.options["gpu_memory_utilization"] for b in _Adapter.built] == [pytest.approx(0.92 / 6)] * 6
    finally:
        backend.close()


def test_a_failed_engine_start_closes_the_engines_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Failing(_Adapter):
        @classmethod
        async def _build(
            cls,
            model: str,
            engine_args: dict[str, Any],
            *,
            env: Any,
            start_group: object | None = None,
            **own: Any,
        ) -> _Built:
            if len(cls.built) == 2:
                raise ab.BackendBrokenError("no memory left", backend="vllm")
            return await super()._build(model, engine_args, env=env, start_group=start_group, **own)

    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: True)
    # Compiling on a CPU: engine-0 alone, then engines 1 and 2 together; engine 2 fails, engine 1 started.
    _Failing.built, _Failing.groups, _Failing.labels = [], [], []
    with pytest.raises(ab.BackendBrokenError, match="no memory left"):
        asyncio.run(start_engines(_Failing._build, "/models/x", 3, None, {}, DEFAULT_OPTIONS))
    assert len(_Failing.built) == 2 and all(b.closed for b in _Failing.built)
    assert _Failing.groups[0] is None and _Failing.groups[1] is not None


def test_a_start_given_up_closes_the_engines_of_its_wave_already_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class _OneHangs(_Adapter):
        calls = 0
        others_up: asyncio.Event  # engines 0 and 2 built, engine 1 still starting
        given_up: asyncio.Event  # engine 1's start was cancelled

        @classmethod
        async def _build(
            cls,
            model: str,
            engine_args: dict[str, Any],
            *,
            env: Any,
            start_group: object | None = None,
            **own: Any,
        ) -> _Built:
            cls.calls += 1
            if cls.calls == 2:  # engine-1 never comes up
                try:
                    await asyncio.Event().wait()
                finally:
                    cls.given_up.set()
            built = await super()._build(model, engine_args, env=env, start_group=start_group, **own)
            if len(cls.built) == 2:
                cls.others_up.set()
            return built

    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: True)
    _OneHangs.built, _OneHangs.groups, _OneHangs.labels = [], [], []

    async def give_up() -> None:
        _OneHangs.others_up, _OneHangs.given_up = asyncio.Event(), asyncio.Event()
        task = asyncio.ensure_future(
            start_engines(_OneHangs._build, "/models/x", 3, None, {"enforce_eager": True}, DEFAULT_OPTIONS)
        )
        await _OneHangs.others_up.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _OneHangs.given_up.wait()

    asyncio.run(give_up())
    assert len(_OneHangs.built) == 2 and all(b.closed for b in _OneHangs.built)


def test_a_start_given_up_raises_only_once_every_start_of_its_wave_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A start that takes a few loop turns to wind down once cancelled (as one stopping an engine would) has
    # ended by the time the caller sees its CancelledError: nothing of the start runs on behind the caller.
    class _SlowToEnd(_Adapter):
        started: asyncio.Event
        ended = False

        @classmethod
        async def starting(cls, label: str | None) -> None:
            if label == "vllm engine-1":
                try:
                    cls.started.set()
                    await asyncio.Event().wait()  # never comes up
                finally:
                    for _ in range(20):  # winding down: loop turns, no clock
                        await asyncio.sleep(0)
                    cls.ended = True

    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: True)
    _SlowToEnd.built, _SlowToEnd.groups, _SlowToEnd.labels = [], [], []

    async def give_up() -> bool:
        _SlowToEnd.started = asyncio.Event()
        task = asyncio.ensure_future(
            start_engines(_SlowToEnd._build, "/models/x", 2, None, {"enforce_eager": True}, DEFAULT_OPTIONS)
        )
        await _SlowToEnd.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return _SlowToEnd.ended  # read at once, when the error arrived

    assert asyncio.run(give_up()), "the caller got its CancelledError while a start was still ending"
    assert all(b.closed for b in _SlowToEnd.built)


class _SlowClose(_Built):
    """A started engine whose stop hangs (``slow``) or fails (``fails``); ``closing`` notes each stop begun."""

    closing: list[_SlowClose]
    began: asyncio.Event

    def __init__(self, options: dict[str, Any], env: Any, how: str) -> None:
        super().__init__(options, env)
        self.how = how

    async def aclose(self) -> None:
        self.closing.append(self)
        self.began.set()
        if self.how == "fails":
            raise RuntimeError("the engine failed to stop")
        await asyncio.Event().wait()  # a slow stop


class _ThirdFails(_Adapter):
    """Engines 0 and 1 start (their stops behave as ``stops`` says), engine 2 fails to start."""

    stops: tuple[str, str]

    @classmethod
    async def starting(cls, label: str | None) -> None:
        if label == "vllm engine-2":
            raise ab.BackendBrokenError("no memory left", backend="vllm")

    @classmethod
    def engine(cls, options: dict[str, Any], env: Any) -> _Built:
        return _SlowClose(options, env, cls.stops[len(cls.built)])


def _start_third_fails(monkeypatch: pytest.MonkeyPatch, stops: tuple[str, str]) -> asyncio.Task[Any]:
    monkeypatch.setattr(_vllm_checks, "_on_cpu", lambda: True)
    _ThirdFails.built, _ThirdFails.groups, _ThirdFails.labels = [], [], []
    _ThirdFails.stops, _SlowClose.closing, _SlowClose.began = stops, [], asyncio.Event()
    return asyncio.ensure_future(
        start_engines(_ThirdFails._build, "/models/x", 3, None, {"enforce_eager": True}, DEFAULT_OPTIONS)
    )


def test_a_caller_giving_up_on_a_slow_stop_of_a_failed_start_leaves_no_engine_unclosed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Closed one after another, a cancel landing in the first (slow) stop left the second engine running.
    async def give_up_while_closing() -> None:
        task = _start_third_fails(monkeypatch, ("slow", "slow"))
        await _SlowClose.began.wait()  # the first stop is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(give_up_while_closing())
    assert _SlowClose.closing == _ThirdFails.built and len(_ThirdFails.built) == 2


def test_an_engine_that_fails_to_stop_neither_hides_the_start_error_nor_keeps_the_others_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def start() -> None:
        task = _start_third_fails(monkeypatch, ("fails", "fails"))
        with pytest.raises(ab.BackendBrokenError, match="no memory left") as raised:
            await task
        assert [n for n in raised.value.__notes__ if "failed to close" in n and "failed to stop" in n] == [
            "an engine started meanwhile failed to close: RuntimeError('the engine failed to stop')"
        ] * 2

    asyncio.run(start())
    assert _SlowClose.closing == _ThirdFails.built and len(_ThirdFails.built) == 2
