"""The Ray environment a stage runs in: joining or starting Ray, and sizing model actors."""

from __future__ import annotations

import os
from typing import Any

import ray


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``; ``auto`` finds one on this machine), else start a
    fresh local Ray (never silently joining whatever ``ray start`` left running here)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)


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
