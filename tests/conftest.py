"""Shared fixtures: one real local Ray instance for the whole test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray (2 CPUs, like CI), shared by all pipeline tests."""
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
