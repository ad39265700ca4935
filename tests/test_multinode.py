"""The demo pipeline as a Ray job on a real two-node cluster whose second node declares a (fake) GPU.

Both nodes are ``ray start`` processes on this machine, joined through 127.0.0.1 (tests/raycluster.py).
The worker node declares ``--num-gpus 1`` and an accelerator resource, so the pipeline takes its GPU
path: one model actor per GPU with ``num_gpus=1`` for embed, retrieve and extract, and the index build
as a ``num_gpus=1`` task.
No CUDA is needed: the models fall back to CPU inside those actors (a machine's real GPUs stay hidden from the
cluster, tests/raycluster.py, so the float32 CPU outputs the digests hold come out everywhere). The head's state
API then shows where each actor and task ran and what it asked for.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from chain_digest import assert_demo_digests
from raycluster import LocalRayCluster, ray_cli

from verbatim_batch.core.runs import read_manifest, read_table

REPO = Path(__file__).resolve().parents[1]
ACCELERATOR = "accelerator_type:L4"
RUNS = {"chunks": "chunk", "embeddings": "embed", "index": "index", "retrieval": "retrieve", "spans": "extract"}
MODEL_ACTORS = ("EmbedActor", "RetrieveActor", "ExtractActor")

pytestmark = pytest.mark.slow


@pytest.fixture()
def gpu_cluster(tmp_path):
    """Head (2 CPUs) + worker (1 CPU, 1 fake GPU); stopped, and checked to leave no process, even on failure."""
    if ray_cli() is None:
        pytest.skip("the `ray` CLI is not installed")
    import ray

    # The session's local Ray (tests/conftest.py) would compete with the cluster for the machine's CPUs;
    # pipeline tests start a local Ray again when they need one.
    if ray.is_initialized():
        ray.shutdown()
    logs = tmp_path / "ray-logs"
    logs.mkdir()
    cluster = LocalRayCluster(logs, head_cpus=2)
    tree: dict[int, float] = {}
    try:
        cluster.start_head()
        cluster.add_worker(num_cpus=1, num_gpus=1, resources=json.dumps({ACCELERATOR: 1}), name="gpu-worker")
        cluster.wait_for_nodes(2)
        yield cluster
    finally:
        tree = cluster.process_tree()
        cluster.stop()
    deadline = time.monotonic() + 30  # anything outside the nodes' process groups goes with its raylet
    while (left := cluster.leftovers(tree)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes of the test cluster outlived stop() (now killed): {cluster.leftovers(tree, kill=True)}"


def test_demo_job_on_two_nodes_uses_the_gpu_node(gpu_cluster, tmp_path):
    nodes = gpu_cluster.state("nodes", detail=True)
    gpu_nodes = [n for n in nodes if n["resources_total"].get("GPU")]
    assert len(nodes) == 2 and len(gpu_nodes) == 1, nodes
    gpu_node = gpu_nodes[0]
    assert gpu_node["resources_total"]["GPU"] == 1 and gpu_node["resources_total"][ACCELERATOR] == 1
    assert not gpu_node["is_head_node"]

    out = tmp_path / "demo"
    done = gpu_cluster.submit("python", "jobs/demo.py", "--output", str(out), cwd=REPO)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    submission = re.search(r"(raysubmit_\w+)", log)
    assert submission, log[-3000:]
    jobs = gpu_cluster.state("jobs", f"submission_id={submission.group(1)}")
    assert [j["status"] for j in jobs] == ["SUCCEEDED"], jobs
    job_id = jobs[0]["job_id"]

    _check_outputs(out)

    # Every model actor asked for one GPU and ran on the GPU node (the head has none to give).
    actors = gpu_cluster.state("actors", f"job_id={job_id}", detail=True)
    for name in MODEL_ACTORS:
        mine = [a for a in actors if name in _actor_name(a)]
        assert mine, (name, [_actor_name(a) for a in actors])
        for a in mine:
            assert a["required_resources"].get("GPU") == 1, a
            assert a["node_id"] == gpu_node["node_id"], a
    # The index build is one task that asked for the GPU too.
    tasks = _wait_for_tasks(gpu_cluster, job_id, "build_index_files")
    for t in tasks:
        assert t["required_resources"].get("GPU") == 1, t
        assert t["node_id"] == gpu_node["node_id"] and t["state"] == "FINISHED", t


def _actor_name(actor: dict) -> str:
    return f"{actor.get('class_name', '')} {actor.get('repr_name', '')} {actor.get('name', '')}"


def _wait_for_tasks(cluster: LocalRayCluster, job_id: str, name: str, timeout: float = 30.0) -> list[dict]:
    """The job's finished tasks called ``name`` (task events reach the head asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = [t for t in cluster.state("tasks", f"job_id={job_id}", detail=True) if t["name"].endswith(name)]
        if (tasks and all(t["state"] == "FINISHED" for t in tasks)) or time.monotonic() > deadline:
            assert tasks, f"no {name} task of job {job_id} in the state API"
            return tasks
        time.sleep(1)


def _check_outputs(out: Path) -> None:
    assert_demo_digests(str(out))  # every table as the pre-refactor code wrote it (float columns within a tolerance)
    for run, command in RUNS.items():
        manifest = read_manifest(str(out / run))
        assert manifest["command"] == command and manifest["status"] == "committed", manifest
        assert not list(out.glob(f".{run}.*")), f"{run}: staging folders left behind"
    assert read_table(str(out / "embeddings"), "embeddings").num_rows == read_table(str(out / "chunks"), "chunks",
                                                                                   ["chunk_id"]).num_rows
    assert (out / "index" / "ids.parquet").is_file() and (out / "index" / "dense").exists()
    assert read_table(str(out / "retrieval"), "retrieval").num_rows > 0

    spans = read_table(str(out / "spans"), "spans").to_pylist()
    assert spans, "the demo extracted no spans"
    assert read_manifest(str(out / "spans"))["tables"]["spans"]["rows"] == len(spans)
    chunks = {c["chunk_id"]: c for c in pq.read_table(out / "chunks" / "chunks",
                                                      columns=["chunk_id", "paper_id", "start", "text"]).to_pylist()}
    papers = {p["paper_id"]: p["markdown"] for p in pq.read_table(out / "chunks" / "papers",
                                                                  columns=["paper_id", "markdown"]).to_pylist()}
    for s in spans:
        chunk = chunks[s["chunk_id"]]
        assert chunk["paper_id"] == s["paper_id"]
        assert 0 <= s["start"] < s["end"] <= len(chunk["text"]), s
        assert chunk["text"][s["start"]:s["end"]] == s["text"], s
        assert (s["paper_start"], s["paper_end"]) == (chunk["start"] + s["start"], chunk["start"] + s["end"]), s
        assert papers[s["paper_id"]][s["paper_start"]:s["paper_end"]] == s["text"], s
