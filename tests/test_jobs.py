"""jobs/chunk.py submitted with `ray job submit --working-dir .` to a real Ray head on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def ray_head(tmp_path):
    ray = shutil.which("ray", path=str(BIN)) or shutil.which("ray")
    if ray is None:
        pytest.skip("the `ray` CLI is not installed")
    gcs, dash = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is this environment's
    start = [
        ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
        "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--num-cpus", "2",
        "--disable-usage-stats",
    ]
    try:
        subprocess.run(start, check=True, capture_output=True, env=env, timeout=120)
        yield ray, f"http://127.0.0.1:{dash}", env
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_chunk_job_via_ray_job_submit(ray_head, tmp_path):
    ray, address, env = ray_head
    out = tmp_path / "run"
    cmd = [
        ray, "job", "submit", "--address", address, "--working-dir", str(REPO), "--",
        "python", "jobs/chunk.py", "--input", "verbatim_batch/examples/corpus", "--output", str(out),
        "--metadata", "verbatim_batch/examples/corpus/metadata.jsonl",
    ]
    # Ray 2.60 clusters require a token; the client reads it from ~/.ray when asked to.
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**env, "RAY_AUTH_MODE": "token"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "succeeded" in done.stdout + done.stderr
    chunks = pq.read_table(out / "chunks")
    n_md = len(list((REPO / "verbatim_batch/examples/corpus").glob("*.md")))
    assert pq.read_table(out / "papers").num_rows == n_md
    assert chunks.num_rows >= n_md and (out / "manifest.json").exists()
