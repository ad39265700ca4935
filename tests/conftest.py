"""Shared fixtures: one real local Ray instance for the whole test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# On a loaded machine the GCS can answer late; by default a driver (this pytest process) exits when it cannot
# reach the GCS for 60 s, which would end the whole session. Waited out longer, a slow GCS fails one test.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")


def _ensure_local_ray():
    import ray

    from verbatim_batch.pipeline.ray_env import init_ray

    if not ray.is_initialized():
        os.environ.pop("RAY_ADDRESS", None)
        # a local Ray (RAY_ADDRESS unset), retried with backoff when a loaded machine is slow to start it
        init_ray(num_cpus=2, log_to_driver=False)
    return ray


@pytest.fixture(scope="session")
def _ray_session():
    """A real local Ray (2 CPUs, like CI), shared by all pipeline tests, shut down at the end."""
    ray = _ensure_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """The session's local Ray, started again if a module before this one shut it down (the multi-node tests
    stop it so that their clusters get the CPUs), so no module depends on the order the modules run in."""
    return _ensure_local_ray()


@pytest.fixture(scope="session")
def nightly_baseline(tmp_path_factory):
    """One uninterrupted `verbatim-batch nightly` (run id r1) over six bundled papers and four queries, made
    once per session: the reference that killed, resumed, cluster and object-store runs of the same night
    must equal. Tests that change the corpus copy it first (``corpus`` is shared)."""
    from helpers import PAPERS, make_corpus, nightly

    tmp = tmp_path_factory.mktemp("baseline")
    corpus = make_corpus(tmp / "corpus", PAPERS[:6])
    root = tmp / "baseline"
    nightly(root, corpus, "r1")
    return {"tmp": tmp, "corpus": corpus, "root": root}
