"""cluster.yaml (Ray cluster launcher) and the KubeRay RayJob: structure, and entrypoints that exist."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from verbatim_batch import config
from verbatim_batch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_launcher_config():
    conf = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type", "setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands", "file_mounts"):
        assert key in conf, key
    nodes = conf["available_node_types"]
    assert conf["head_node_type"] in nodes and nodes[conf["head_node_type"]]["resources"].get("CPU") == 0
    gpu = {name: n for name, n in nodes.items() if n["resources"].get("GPU")}
    kinds = {k for n in gpu.values() for k in n["resources"] if k.startswith("accelerator_type:")}
    assert {"accelerator_type:L4", "accelerator_type:L40S", "accelerator_type:H100"} <= kinds
    for name, node in nodes.items():
        assert 0 <= node["min_workers"] <= node["max_workers"], name
        assert "InstanceType" in node["node_config"], name
        if name != conf["head_node_type"]:  # workers write Parquet parts to the bucket themselves
            assert "instance-profile/" in node["node_config"]["IamInstanceProfile"]["Arn"], name
    assert sum(n["max_workers"] for n in nodes.values()) <= conf["max_workers"] + nodes["head"]["max_workers"]
    assert any("[gpu" in c for c in conf["setup_commands"])
    assert any("llm" in c for n in gpu.values() for c in n.get("worker_setup_commands", []))
    assert "." in conf["file_mounts"].values()  # the project travels with the cluster


def test_kuberay_rayjob_manifest():
    job = yaml.safe_load((ROOT / "deploy" / "kuberay-rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    groups = cluster["workerGroupSpecs"]
    assert any("nvidia.com/gpu" in c["resources"]["limits"] for g in groups
               for c in g["template"]["spec"]["containers"])
    for g in groups:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "python" and (ROOT / argv[1]).is_file()  # the job script exists
    command = Path(argv[1]).stem
    conf = argv[argv.index("--config") + 1]
    assert (ROOT / conf).is_file()
    config.apply(build_parser(), command, str(ROOT / conf))  # its config validates for that command


def test_every_job_script_maps_to_a_cli_command():
    commands = set(config.subparsers(build_parser()))
    scripts = sorted((ROOT / "jobs").glob("*.py"))
    assert {"chunk", "embed", "index", "retrieve", "extract", "evaluate", "querygen", "silver", "nightly"} <= {
        s.stem for s in scripts}
    for script in scripts:
        text = script.read_text()
        assert f'main(["{script.stem}", *sys.argv[1:]])' in text, script.name
        assert script.stem in commands
