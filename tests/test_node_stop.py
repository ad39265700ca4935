"""A node of the cluster lost in the middle of a nightly run: the run, resumed with the same run id, ends
with exactly the tables of an uninterrupted run.

The cluster is a head with no CPUs (it runs the job driver, like a KubeRay head with ``num-cpus: 0``) and
two 2-CPU workers. The nightly is submitted as a Ray job; once its embed stage has started and a model
actor is alive, the worker that hosts the actor is SIGKILLed with all its processes, as when a machine is
lost. Ray may then finish the run inside the job on the other worker (lost tasks retried, the actor
restarted, lost objects rebuilt), or the job fails or stalls and is stopped; either way the same nightly
is submitted again with the same run id, which skips what is committed and finishes the rest. Its tables
must equal those of an uninterrupted run (made once per session in a local Ray, tests/conftest.py): no row
lost, none written twice.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import assert_same_run
from raycluster import LocalRayCluster, ray_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RUN = "r1"
WORKERS = ("worker-1", "worker-2")
MODEL_ACTORS = ("EmbedActor", "RetrieveActor", "ExtractActor")
RECOVERY_S = 240  # the interrupted job gets this long after the node is stopped to end by itself


@pytest.fixture()
def cluster(tmp_path):
    """Head (0 CPUs) + two workers (2 CPUs each); stopped, and checked to leave no process, even on failure."""
    if ray_cli() is None:
        pytest.skip("the `ray` CLI is not installed")
    import ray

    if ray.is_initialized():  # the session's local Ray would compete with the cluster for the CPUs
        ray.shutdown()
    logs = tmp_path / "ray-logs"
    logs.mkdir()
    cluster = LocalRayCluster(logs, head_cpus=0)
    # A lost node is declared dead after 3 missed health checks 1 s apart (default: 5, 3 s apart).
    cluster.env |= {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    tree: dict[int, float] = {}
    try:
        cluster.start_head()
        for name in WORKERS:
            cluster.add_worker(num_cpus=2, name=name)
        cluster.wait_for_nodes(1 + len(WORKERS))
        yield cluster
    finally:
        tree = cluster.process_tree()
        cluster.stop()
    deadline = time.monotonic() + 30  # anything outside the nodes' process groups goes with its raylet
    while (left := cluster.leftovers(tree)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes of the test cluster outlived stop() (now killed): {cluster.leftovers(tree, kill=True)}"


def nightly_job(corpus: Path, root: Path) -> list[str]:
    return ["python", "jobs/nightly.py", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
            "--queries", str(corpus.parent / "queries.jsonl"), "--root", str(root), "--run-id", RUN,
            "--extract-batch-rows", "16", "--embed-batch-rows", "64"]


def _tail(log: Path, n: int = 6000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


def test_node_lost_mid_run_resumes_to_identical_tables(nightly_baseline, cluster, tmp_path):
    baseline = nightly_baseline  # the uninterrupted run (conftest), made before the cluster starts
    corpus = baseline["corpus"]
    t0 = time.monotonic()
    times: dict[str, float] = {}

    def mark(what: str) -> None:
        times[what] = round(time.monotonic() - t0, 1)

    root = tmp_path / "root"
    run_dir = root / "runs" / RUN
    workers = cluster.node_ids() - {n["node_id"] for n in cluster.state("nodes", detail=True) if n["is_head_node"]}
    log1 = tmp_path / "job1.log"
    job = cluster.start_job(*nightly_job(corpus, root), cwd=REPO, submission_id="nightly-1", log=log1)
    try:
        # The first model actor alive is the embed stage's (chunks are committed by then); its node goes.
        actor = cluster.wait_for_actor(*MODEL_ACTORS, timeout=600, job=job)
        mark("model actor alive")
        assert actor["node_id"] in workers, actor  # the head has no CPU to give
        lost = cluster.node_names()[actor["node_id"]]
        cluster.stop_node(lost)
        mark("node stopped")
        stopped_at = sorted(p.name for p in run_dir.iterdir())
        assert "manifest.json" not in stopped_at, f"the run was committed before the node was stopped: {stopped_at}"
        assert not (run_dir / "spans" / "manifest.json").exists(), stopped_at
        try:
            job.wait(timeout=RECOVERY_S)
        except subprocess.TimeoutExpired:
            cluster.stop_job("nightly-1")
            job.wait(timeout=120)
        first = cluster.job_status("nightly-1")
        mark("first job ended")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert first in ("SUCCEEDED", "FAILED", "STOPPED"), first
    assert (run_dir / "manifest.json").exists() == (first == "SUCCEEDED"), (first, _tail(log1))
    assert actor["node_id"] in cluster.node_ids("DEAD") and len(cluster.node_ids()) == len(WORKERS)

    # The same nightly again, same run id, on what is left of the cluster.
    again = cluster.submit(*nightly_job(corpus, root), cwd=REPO, timeout=600)
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    assert f"nightly run {RUN} committed" in again.stdout, again.stdout[-3000:]
    mark("rerun ended")

    assert_same_run(root, baseline["root"], RUN)
    assert not list(run_dir.glob(".*.staging-*")), "staging folders left behind"
    counts = json.loads((run_dir / "manifest.json").read_text())["counts"]
    print(f"\n{lost} stopped with {actor['class_name']} alive on it, run folder {stopped_at}; first job {first}; "
          f"counts {counts}; cluster run {times}")
