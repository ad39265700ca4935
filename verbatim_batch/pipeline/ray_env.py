"""The Ray environment a stage runs in: joining or starting Ray, and sizing model actors."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import ray

LOCAL_START_ATTEMPTS = 3  # a local Ray that fails to start (a loaded machine) is retried with backoff


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``; ``auto`` finds one on this machine), else start a
    fresh local Ray that listens on loopback only (never silently joining whatever ``ray start`` left
    running here). On a cluster, Ray's own node address settings apply."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, TimeoutError) as exc:
            raise ConnectionError(f"cannot join the Ray cluster at {address}: {str(exc).splitlines()[0][:200]}") \
                from None
    else:
        init_local(num_cpus)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A cluster address with nothing listening is refused within ``timeout_s`` (``ray.init`` would retry
    for minutes): one line, naming where the address came from."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        where = "--address" if address != os.environ.get("RAY_ADDRESS") else "RAY_ADDRESS"
        raise ConnectionError(f"no Ray cluster answers at {address} (from {where}): {exc.strerror or exc}; "
                              "start one, or unset it to run on a local Ray") from None


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
        for attempt in range(LOCAL_START_ATTEMPTS):
            try:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
                         _node_ip_address="127.0.0.1")
                break
            except Exception as exc:  # noqa: BLE001 - e.g. "node timed out during startup" on a loaded machine
                ray.shutdown()
                if attempt + 1 == LOCAL_START_ATTEMPTS:
                    raise ConnectionError(f"a local Ray did not start after {LOCAL_START_ATTEMPTS} attempts: "
                                          f"{str(exc).splitlines()[0][:200]}") from None
                time.sleep(2.0 * 2**attempt)
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


def actor_pool(n_cpus: int, concurrency: int, cpus_per_actor: float) -> tuple[int, float]:
    """``(actors, CPUs per actor)`` for a CPU actor pool that always leaves one CPU to the tasks that read and
    write around it (a pool holding every CPU waits forever for its input). On a one-CPU machine the actors
    claim no CPU; where the asked-for pool does not fit, it gets fewer actors, then less CPU each."""
    spare = max(0, n_cpus - 1)
    if not spare:
        return 1, 0.0
    actors = min(concurrency, max(1, int(spare // cpus_per_actor))) if cpus_per_actor > 0 else concurrency
    return actors, min(cpus_per_actor, spare / actors)


def model_actor_args(concurrency: int | None, batch_rows: int) -> dict[str, Any]:
    """``map_batches`` arguments for a model actor pool: one model per GPU when the cluster has GPUs, else
    CPU actors sized by ``actor_pool``."""
    n = gpus()
    if n:
        return {"concurrency": concurrency or n, "num_gpus": 1, "batch_size": batch_rows}
    return cpu_actor_args(concurrency or 1, 1.0) | {"batch_size": batch_rows}


def cpu_actor_args(concurrency: int, cpus_per_actor: float) -> dict[str, Any]:
    """``concurrency`` and ``num_cpus`` of a CPU actor pool on this cluster (``actor_pool``)."""
    actors, per_actor = actor_pool(cpus(), concurrency, cpus_per_actor)
    return {"concurrency": actors, "num_cpus": per_actor}


def cpu_threads(threads: int | None) -> int | None:
    """Torch threads per model actor: as given, else none set on GPU clusters and every CPU on CPU ones."""
    return threads or (None if gpus() else cpus())
