"""Shared fixtures: one real local Ray instance for the whole test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# On a loaded machine the GCS can answer late; by default a driver (this pytest process) exits when it cannot
# reach the GCS for 60 s, which would end the whole session. Waited out longer, a slow GCS fails one test.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray (2 CPUs, like CI), shared by all pipeline tests."""
    import ray

    from verbatim_batch.pipeline.ray_env import init_local

    os.environ.pop("RAY_ADDRESS", None)
    init_local(num_cpus=2, log_to_driver=False)  # retried with backoff when a loaded machine is slow to start it
    yield ray
    ray.shutdown()
