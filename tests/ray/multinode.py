"""`LocalCluster`: a Ray cluster of several nodes on this machine, started and ended by the test itself.

Each node is one ``ray start --block`` process in a process group of its own (loopback only, every port
chosen free), so a node is ended, or killed mid-run to play a lost machine, by its process group id: the
raylet, its agents and the actor processes it started go together. Ray's temp folder is a private one
(``RAY_TMPDIR``), so the machine's ``/tmp/ray`` and its address file are never touched, and at the end no
process naming that folder may be left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .conftest import ROOT, session_processes

RAY = str(Path(sys.executable).with_name("ray"))
# A lost node is noticed by the head's health checks: 3 misses 0.5 s apart, not Ray's default 30 s.
FAST_HEALTH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_raylet_start_wait_time_s": "120",
    "RAY_agent_register_timeout_ms": "120000",
}


# `ray start`'s default worker ports: a component given one of them is refused as a clash (a host whose
# ephemeral range covers them would hand them out).
WORKER_PORTS = range(10002, 20000)
# What a node's output says when a port it was given was taken (by Ray's own pick, or another process).
PORT_CLASH = ("used by other components", "address already in use")  # matched in lower case


def free_ports(count: int, taken: set[int]) -> list[int]:
    """``count`` distinct free ports, none in ``taken`` (which gains them).

    The sockets stay bound until all are chosen: a port released and asked for again may come back, and two
    components of one node given the same port make ``ray start`` refuse to run (seen in CI).
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in taken and port not in WORKER_PORTS:
                ports.append(port)
                taken.add(port)
    finally:
        for sock in held:
            sock.close()
    return ports


class LocalCluster:
    """A head node and worker nodes on loopback, each named by a custom resource (``node_a``, ...).

    Args:
        object_store_mb: Each node's object store (Ray's minimum is about 75 MB).
    """

    def __init__(self, object_store_mb: int = 80) -> None:
        # Short: Ray's sockets live under it, and a Unix socket path is limited to about 107 characters.
        self.tmp = Path(tempfile.mkdtemp(prefix="abrn", dir="/tmp"))
        self.object_store = str(object_store_mb * 1024**2)
        self.ports: set[int] = set()  # every port handed to a node of this cluster: none given twice
        self.port = free_ports(1, self.ports)[0]
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
        self.env.update(
            RAY_TMPDIR=str(self.tmp),
            RAY_AUTH_MODE="disabled",
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONPATH=str(ROOT),  # actors import this checkout's asyncbackends and tests
            VLLM_CPU_KVCACHE_SPACE="1",
            RAY_worker_niceness="0",  # as in conftest.ray_cluster: actors not starved beside busy processes
            **FAST_HEALTH,
        )

    def add_node(self, name: str, num_cpus: int, attempts: int = 3) -> None:
        """Start node ``name`` (the head if it is the first) and wait until the cluster counts it.

        A node that exits because a port it was given was taken meanwhile is started again on fresh ports, up
        to ``attempts`` times: a free port is only free until someone binds it.
        """
        self.killed.discard(name)  # a node killed earlier may be started again under its name
        for attempt in range(1, attempts + 1):
            if attempt > 1 and self._is_head(name):  # the head again: its own port may be the clash
                self.port = free_ports(1, self.ports)[0]
                self.address = f"127.0.0.1:{self.port}"
            self._start_node(name, num_cpus)
            try:
                self.wait_for(lambda alive: name in alive, f"node {name} to join")
                return
            except NodeExited as exited:
                clash = exited.name == name and any(c in exited.output.lower() for c in PORT_CLASH)
                if not clash or attempt == attempts:
                    raise

    def _is_head(self, name: str) -> bool:
        """Whether node ``name`` is (or, the first started, will be) the head."""
        return not self.nodes or next(iter(self.nodes)) == name

    def _start_node(self, name: str, num_cpus: int) -> None:
        head = self._is_head(name)
        previous = self.nodes.get(name)
        if previous is not None:  # what is left of an earlier start under this name (an agent, a worker)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(previous.pid, signal.SIGKILL)
            previous.wait(timeout=30)
        ports = iter(free_ports(9, self.ports))
        command = [
            RAY,
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            f"--resources={json.dumps({name: 1})}",
            f"--object-store-memory={self.object_store}",
            f"--node-manager-port={next(ports)}",
            f"--object-manager-port={next(ports)}",
            f"--dashboard-agent-listen-port={next(ports)}",
            f"--dashboard-agent-grpc-port={next(ports)}",
            f"--runtime-env-agent-port={next(ports)}",
            f"--metrics-export-port={next(ports)}",
            "--disable-usage-stats",
        ]
        if head:
            command += ["--head", f"--port={self.port}", "--include-dashboard=false"]
            command += ["--dashboard-host=127.0.0.1", f"--dashboard-port={next(ports)}"]
            command += [f"--ray-client-server-port={next(ports)}"]
        else:
            command += [f"--address={self.address}"]
        log = (self.tmp / f"{name}.out").open("ab")  # appended: an earlier start's output stays readable
        self.nodes[name] = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def alive(self) -> set[str]:
        """The names of the nodes the head counts alive (its own node table)."""
        from ray._raylet import GcsClient
        from ray.core.generated import gcs_pb2

        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
        try:  # the head's port first: a GCS client dialling nothing logs warnings while it retries
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return set()
        try:
            nodes = GcsClient(address=self.address).get_all_node_info(timeout=10)
        except Exception:  # the head not up yet
            return set()
        return {
            k for n in nodes.values() if n.state == alive for k in n.resources_total if k.startswith("node_")
        }

    def wait_for(self, condition: Callable[[set[str]], bool], what: str, timeout: float = 180.0) -> None:
        """Poll the head's node table until ``condition(alive names)`` holds (the nodes' own state)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.nodes.items():
                if process.poll() is not None and name not in self.killed:
                    raise NodeExited(name, (self.tmp / f"{name}.out").read_text(errors="replace")[-3000:])
            if condition(self.alive()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"waiting for {what}; alive: {sorted(self.alive())}")

    def ensure(self, name: str, num_cpus: int) -> None:
        """Start node ``name`` again if a test killed it or it ended (tests may run alone or in any order)."""
        if name in self.killed or self.nodes[name].poll() is not None:
            self.add_node(name, num_cpus)

    def pgid(self, name: str) -> int:
        """The process group of node ``name`` (its ``ray start`` process leads it)."""
        return self.nodes[name].pid

    def kill(self, name: str) -> None:
        """End node ``name`` at once, as a machine lost: SIGKILL to its whole process group."""
        self.killed.add(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid(name), signal.SIGKILL)
        self.nodes[name].wait(timeout=30)

    def stop(self, name: str) -> None:
        """End node ``name`` cleanly (SIGTERM: ``ray start --block`` stops its processes) and wait for it."""
        self.killed.add(name)
        _terminate(self.nodes[name])

    def close(self) -> list[str]:
        """End every node (workers first, the head last) and return what is left running (nothing)."""
        for name in reversed(list(self.nodes)):
            process = self.nodes[name]
            if process.poll() is None:
                _terminate(process)
            # Anything of the node's group still running (a worker that outlived its raylet): ended too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (left := session_processes(str(self.tmp))) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not left:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return left


class NodeExited(RuntimeError):
    """A node's ``ray start`` process ended while it was expected to run; the message holds its output."""

    def __init__(self, name: str, output: str) -> None:
        super().__init__(f"node {name} exited:\n{output}")
        self.name, self.output = name, output


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a node's process group (`ray start --block` stops its processes), SIGKILL if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
