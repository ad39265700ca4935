"""jobs/*.py submitted with `ray job submit --working-dir .` to a real Ray head on loopback."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from raycluster import LocalRayCluster, ray_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cluster(tmp_path):
    if ray_cli() is None:
        pytest.skip("the `ray` CLI is not installed")
    import ray

    # A second Ray instance on the machine (the session's local Ray) keeps the new head's job agent
    # from registering ("No available agent"); pipeline code starts a local Ray again when needed.
    if ray.is_initialized():
        ray.shutdown()
    with LocalRayCluster(tmp_path) as c:
        yield c


def test_chunk_job_via_ray_job_submit(cluster, tmp_path):
    out = tmp_path / "run"
    done = cluster.submit("python", "jobs/chunk.py", "--input", "verbatim_batch/examples/corpus",
                          "--output", str(out), "--metadata", "verbatim_batch/examples/corpus/metadata.jsonl",
                          cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "succeeded" in done.stdout + done.stderr
    chunks = pq.read_table(out / "chunks")
    n_md = len(list((REPO / "verbatim_batch/examples/corpus").glob("*.md")))
    assert pq.read_table(out / "papers").num_rows == n_md
    assert chunks.num_rows >= n_md and (out / "manifest.json").exists()
