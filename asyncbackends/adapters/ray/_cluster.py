"""Joining or starting the Ray cluster, and reserving the replicas' resources, for the ``ray`` backend.

Blocking Ray calls (``ray.init``, ``ray.shutdown``, resource queries) run on one long-lived thread of their
own, never on the shared loop. Long-lived on purpose: Ray ties the processes a ``ray.init`` starts (GCS,
raylet) to the life of the *thread* that started them (Linux's parent-death signal), so a cluster started
from a short-lived thread dies with it a few seconds later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from ...errors import BackendUnavailableError, InvalidRequestError

__all__ = ["Cluster", "bundle_for", "connect", "reserve"]

T = TypeVar("T")
log = logging.getLogger("asyncbackends.adapters.ray")

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_ray_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncbackends-ray")


async def in_ray_thread(function: Callable[[], T]) -> T:
    """Run a blocking Ray call on the long-lived Ray thread and await it."""
    try:
        future = _ray_thread.submit(function)
    except RuntimeError:  # at interpreter exit the executor takes no more work: clean up here instead
        return function()
    return await asyncio.wrap_future(future)


class Cluster:
    """The cluster a backend uses, and whether the backend started it (then it also stops it).

    Args:
        started: This backend's ``ray.init`` started a new local cluster.
    """

    def __init__(self, started: bool) -> None:
        self.started = started

    async def shutdown(self) -> None:
        """Shut the cluster down if this backend started it; leave a joined one alone."""
        if self.started:
            self.started = False
            log.info("ray: shutting down the local cluster this backend started")
            await in_ray_thread(ray.shutdown)


async def connect(
    address: str | None, init_options: Mapping[str, Any], connect_timeout: float = 5.0
) -> Cluster:
    """Join a running cluster or start a local one, never waiting long for a cluster that is gone.

    ``address=None`` joins the cluster ``RAY_ADDRESS`` names, else the one Ray's address file
    (``ray_current_cluster`` in Ray's temp folder, written by ``ray start``) names, else starts a local
    cluster (with ``init_options``, for example ``num_cpus``). ``"auto"``, ``"HOST:PORT"`` and ``"ray://host:10001"``
    only join. A process that already called ``ray.init`` keeps its connection.

    Before joining, the cluster's address is given ``connect_timeout`` seconds to accept a connection (Ray's
    own ``ray.init`` waits for minutes on a dead one). An address file left by a dead cluster is not joined:
    the log says so, naming the address and the file, and a local cluster is started instead. Any other
    address that does not answer fails.

    Raises:
        BackendUnavailableError: The named cluster does not answer (the message names the address, and the
            address file or ``RAY_ADDRESS`` it came from).
    """
    if ray.is_initialized():
        return Cluster(started=False)
    options = dict(init_options)
    target, source = _target(address, options.get("_temp_dir"))
    if target is not None and not await _answers(target, connect_timeout):
        if source.startswith("Ray's address file"):
            log.warning(
                "ray: the cluster at %s named by %s does not answer within %g s (connect_timeout): a cluster "
                "that is gone left it behind. Starting a local Ray cluster instead",
                target,
                source,
                connect_timeout,
            )
            address, target = "local", None
        else:
            raise BackendUnavailableError(
                f"cannot reach the Ray cluster at {target} (from {source}) within {connect_timeout:g} s "
                "(connect_timeout): is it running? `ray status` on its head node tells",
                backend="ray",
            )
    if source and address != "local":
        # Resource sizes describe a cluster being started; Ray refuses them when joining one.
        options = {k: v for k, v in options.items() if k not in ("num_cpus", "num_gpus", "resources")}

    def init() -> bool:
        ray.init(address=address, **options)
        node = getattr(ray._private.worker, "_global_node", None)
        return bool(getattr(node, "head", False))

    try:
        started = await in_ray_thread(init)
    except ConnectionError as exc:
        where = target or address
        raise BackendUnavailableError(f"cannot reach the Ray cluster at {where!r}: {exc}") from exc
    if started:
        log.info("ray: started a local Ray cluster")
    else:
        log.info("ray: joined the Ray cluster at %s", target or "this machine")
    return Cluster(started=started)


def _target(address: str | None, temp_dir: str | None) -> tuple[str | None, str]:
    """The ``HOST:PORT`` that ``ray.init(address)`` would dial, and where it came from (for messages).

    ``None`` where nothing is dialled here: a local cluster is to be started, the address is a Ray Client
    one (``ray://``, checked by Ray itself), or ``"auto"`` finds no address file (Ray then looks for a
    running cluster among this machine's processes).
    """
    from ray._common.utils import get_ray_address_file
    from ray._private.utils import read_ray_address

    environment = os.environ.get("RAY_ADDRESS")
    if environment and address in (None, "auto"):  # as Ray reads it: an explicit address wins
        address, source = environment, "RAY_ADDRESS"
    elif address in (None, "auto"):
        found = read_ray_address(temp_dir)
        if not found:  # None: start a local cluster; "auto": Ray looks among this machine's processes
            return None, "" if address is None else "address='auto'"
        address, source = found, f"Ray's address file {get_ray_address_file(temp_dir)}"
    else:
        source = "address="
    if address in ("local", "auto") or address.startswith("ray://"):
        return None, source
    return address, source


async def _answers(target: str, timeout: float) -> bool:
    """Whether something accepts a TCP connection at ``HOST:PORT`` within ``timeout`` seconds."""
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True  # not ours to judge: Ray's own parser gives the error
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def bundle_for(actor_options: Mapping[str, Any]) -> dict[str, float]:
    """The placement-group bundle one replica needs: its CPUs, GPUs, memory and custom resources."""
    bundle: dict[str, float] = {"CPU": float(actor_options.get("num_cpus", 1))}
    if actor_options.get("num_gpus"):
        bundle["GPU"] = float(actor_options["num_gpus"])
    if actor_options.get("memory"):
        bundle["memory"] = float(actor_options["memory"])
    for name, amount in (actor_options.get("resources") or {}).items():
        bundle[name] = float(amount)
    return {k: v for k, v in bundle.items() if v > 0}


def _shortfall(need: Mapping[str, float], have: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    return {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) + 1e-9 < v}


def _describe(short: Mapping[str, tuple[float, float]]) -> str:
    return ", ".join(f"{k}: needs {need:g}, has {have:g}" for k, (need, have) in short.items())


async def reserve(
    replicas: int, bundle: Mapping[str, float], strategy: str, timeout: float
) -> PlacementGroup:
    """Reserve one bundle per replica in a placement group, or fail clearly within ``timeout`` seconds.

    Raises:
        InvalidRequestError: An unknown placement strategy.
        BackendUnavailableError: The cluster cannot hold the replicas within ``timeout`` (the message says
            what was asked, what the cluster has in total and what is free now).
    """
    if strategy not in _STRATEGIES:
        raise InvalidRequestError(f"placement_strategy must be one of {_STRATEGIES}, got {strategy!r}")
    need = {k: v * replicas for k, v in bundle.items()}
    total: dict[str, float] = await in_ray_thread(ray.cluster_resources)
    short = _shortfall(need, total)
    if short:
        # Not refused at once: an autoscaling cluster (KubeRay) adds nodes while we wait.
        log.warning(
            "ray: the cluster is short of what %d replicas need (%s); waiting up to %g s for it to grow",
            replicas,
            _describe(short),
            timeout,
        )
    bundles = [dict(bundle) for _ in range(replicas)]
    group: PlacementGroup = await in_ray_thread(lambda: placement_group(bundles, strategy=strategy))
    try:
        await asyncio.wait_for(group.ready(), timeout)
    except TimeoutError:
        available: dict[str, float] = await in_ray_thread(ray.available_resources)
        total = await in_ray_thread(ray.cluster_resources)
        await in_ray_thread(lambda: remove_placement_group(group))
        raise BackendUnavailableError(
            f"the Ray cluster could not place {replicas} replica(s) of {dict(bundle)} ({strategy}) within "
            f"{timeout:g} s (placement_timeout). In total: {_describe(_shortfall(need, total)) or 'enough'}; "
            f"free now: {_describe(_shortfall(need, available)) or 'enough'}. Ask for fewer replicas or "
            "resources, or add nodes",
            backend="ray",
            retryable=False,
        ) from None
    except BaseException:
        await in_ray_thread(lambda: remove_placement_group(group))
        raise
    log.info("ray: placement group ready: %d bundle(s) of %s (%s)", replicas, dict(bundle), strategy)
    return group


async def release(group: PlacementGroup | None) -> None:
    """Remove a placement group (freeing its reserved resources)."""
    if group is not None:
        await in_ray_thread(lambda: remove_placement_group(group))
