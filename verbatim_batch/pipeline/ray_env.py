"""The Ray environment a stage runs in: joining or starting Ray, and sizing model actors."""

from __future__ import annotations

import os
from typing import Any

import ray


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``; ``auto`` finds one on this machine), else start a
    fresh local Ray that listens on loopback only (never silently joining whatever ``ray start`` left
    running here). On a cluster, Ray's own node address settings apply."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        init_local(num_cpus)


def init_local(num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """A local Ray whose servers all bind 127.0.0.1.

    Ray's C++ servers bind loopback only when the node's address is exactly 127.0.0.1, but ``ray.init``
    swaps a loopback ``_node_ip_address`` for the machine's routable address first (so that other nodes
    could reach it, which a local run never needs); that swap is switched off for the call. The socket
    table test (tests/test_exposure.py) checks the result on every Ray upgrade. A reaper process ends the
    local Ray's processes when this driver dies (``reaper``).
    """
    if num_cpus is not None and num_cpus < 1:
        raise ValueError(f"--num-cpus must be at least 1, got {num_cpus}")
    from ray._private import services

    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is not None:
        services.resolve_ip_for_localhost = lambda host: host
    try:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
                 _node_ip_address="127.0.0.1")
    finally:
        if resolve is not None:
            services.resolve_ip_for_localhost = resolve
    from .reaper import start

    start()  # the local Ray's processes do not outlive this driver, even after kill -9


def gpus() -> int:
    """GPUs in the cluster."""
    return int(ray.cluster_resources().get("GPU", 0))


def cpus() -> int:
    """CPUs in the cluster (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def model_actor_args(concurrency: int | None, batch_rows: int) -> dict[str, Any]:
    """``map_batches`` arguments for a model actor pool: one model per GPU when the cluster has GPUs, else
    CPU actors."""
    n = gpus()
    if n:
        return {"concurrency": concurrency or n, "num_gpus": 1, "batch_size": batch_rows}
    return {"concurrency": concurrency or 1, "num_cpus": 1, "batch_size": batch_rows}


def cpu_threads(threads: int | None) -> int | None:
    """Torch threads per model actor: as given, else none set on GPU clusters and every CPU on CPU ones."""
    return threads or (None if gpus() else cpus())
