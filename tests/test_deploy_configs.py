"""cluster.yaml (Ray cluster launcher), configs/cluster-gpu.yaml and deploy/*.yaml: structure, entrypoints that
exist, and that they are safe to copy: token authentication on every node, no dashboard on all interfaces without
it (nor exposed outside the cluster), the storage role on the head and every worker type, run folders in an object
store or on a file system every node shares, never a folder each node makes itself. The checkers are tested on
broken copies too, so that a check that can never fail is caught. The scheduled night (deploy/nightly-cronjob.yaml):
the CronJob and RayJob fields it uses."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import yaml

from verbatim_batch.cli import build_parser, config, parse_args
from verbatim_batch.cli.options import command_flags
from verbatim_batch.core import storage
from verbatim_batch.core.runs import safe_run_id

ROOT = Path(__file__).resolve().parents[1]
ALL_INTERFACES = {"0.0.0.0", "::", "[::]"}
SHARED_MOUNT = re.compile(r"\bmount\s+-t\s+(?:nfs4?|efs|lustre)\b[^;&|)\n]*\s(/[\w./-]*\w)")
SHARED_VOLUMES = ("persistentVolumeClaim", "nfs", "csi")  # what every pod can mount alike (hostPath, emptyDir: not)


def _under(path: str, folders: set[str] | list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def config_problems(path: Path, command: str, shared: set[str]) -> list[str]:
    """Run locations in a config that are local folders not on a shared file system (each node would have its
    own)."""
    flags = command_flags(command)
    out = []
    for key, value in config.load_config(str(path), command).items():
        flag = flags.get(key)
        if flag is not None and flag.of.option.path and isinstance(value, str) and not storage.is_remote(value) \
                and not _under(value, shared):
            out.append(f"{path.name}: {command} {key} {value} is a folder of each node, not shared storage")
    return out


def launcher_problems(conf: dict) -> list[str]:
    """What makes a cluster-launcher config unsafe to copy."""
    out = []
    for name, node in conf["available_node_types"].items():
        arn = (node.get("node_config", {}).get("IamInstanceProfile") or {}).get("Arn", "")
        if "instance-profile/" not in arn:
            out.append(f"{name}: no storage role (IamInstanceProfile): it cannot read or write the runs' bucket")
    docker_auth = "RAY_AUTH_MODE=token" in " ".join(conf.get("docker", {}).get("run_options", []))
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in conf.get(key, []) if "ray start" in c]
        if not starts:
            out.append(f"{key}: no `ray start`")
        for command in starts:
            if not (docker_auth or "RAY_AUTH_MODE=token" in command):
                out.append(f"{key}: `{command}` starts Ray without token authentication")
            host = re.search(r"--dashboard-host[= ](\S+)", command)
            if "--head" in command and host and host.group(1) in ALL_INTERFACES:
                out.append(f"{key}: the dashboard (it accepts job submissions) listens on all interfaces; bind it to "
                           "127.0.0.1 or the head's private address and tunnel to it")
    if not any(dst.endswith(".ray/auth_token") for dst in conf.get("file_mounts", {})):
        out.append("file_mounts: no token file (~/.ray/auth_token) on the nodes")
    commands = [c for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                              "worker_setup_commands") for c in conf.get(key, [])]
    shared = {m.group(1) for c in commands for m in SHARED_MOUNT.finditer(c)}
    made = {p for c in commands for p in re.findall(r"mkdir\s+(?:-p\s+)?(/\S+)", c)}
    bound = {o.split()[1].split(":")[0] for o in conf.get("docker", {}).get("run_options", []) if o.startswith("-v ")}
    for folder in sorted((made | bound) - {f for f in made | bound if _under(f, shared)}):
        out.append(f"{folder} is a folder each node makes (or has) itself, not a shared file system: runs written "
                   "there scatter across nodes (mount an EFS/NFS export there on every node, or use s3://)")
    return out


def shared_mounts(conf: dict) -> set[str]:
    commands = [c for key in ("initialization_commands", "setup_commands") for c in conf.get(key, [])]
    return {m.group(1) for c in commands for m in SHARED_MOUNT.finditer(c)}


def rayjob_problems(job: dict) -> list[str]:
    """What makes a KubeRay RayJob unsafe to copy."""
    out = []
    cluster = job["spec"]["rayClusterSpec"]
    operator_auth = (cluster.get("authOptions") or {}).get("mode") == "token"
    head = cluster["headGroupSpec"]
    pods = [("head", head["template"]["spec"])] + [(g["groupName"], g["template"]["spec"])
                                                    for g in cluster["workerGroupSpecs"]]
    auth = operator_auth
    for name, pod in pods:
        env_auth = all(any(e.get("name") == "RAY_AUTH_MODE" and e.get("value") == "token" for e in c.get("env", []))
                       for c in pod["containers"])
        if not (operator_auth or env_auth):
            auth = False
            out.append(f"{name}: Ray without token authentication (authOptions: {{mode: token}})")
        if not pod.get("serviceAccountName"):
            out.append(f"{name}: no service account (the storage role): it cannot read or write the runs' bucket")
    host = head.get("rayStartParams", {}).get("dashboard-host", "0.0.0.0")  # KubeRay's default: all interfaces
    if host in ALL_INTERFACES and not auth:
        out.append("head: the dashboard listens on all interfaces without token authentication")
    if head.get("serviceType", "ClusterIP") in ("LoadBalancer", "NodePort"):
        out.append(f"head: serviceType {head['serviceType']} exposes the dashboard outside the Kubernetes cluster")
    for arg in shlex.split(job["spec"]["entrypoint"]):
        if not arg.startswith("/"):
            continue
        for name, pod in pods:
            volumes = {v["name"] for v in pod.get("volumes", []) if any(k in v for k in SHARED_VOLUMES)}
            mounts = [m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])
                      if m["name"] in volumes]
            if not _under(arg, mounts):
                out.append(f"{name}: {arg} is not on a volume every pod shares: a folder of each pod")
    return out


def pod_shared_mounts(job: dict) -> set[str]:
    """Paths on a shared volume in every pod of the RayJob."""
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    each = []
    for pod in pods:
        volumes = {v["name"] for v in pod.get("volumes", []) if any(k in v for k in SHARED_VOLUMES)}
        each.append({m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])
                     if m["name"] in volumes})
    return set.intersection(*each) if each else set()


def test_the_cluster_examples_are_safe_to_copy():
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert launcher_problems(launcher) == []
    assert config_problems(ROOT / "configs" / "cluster-gpu.yaml", "nightly", shared_mounts(launcher)) == []
    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            data = doc.get("data") if isinstance(doc.get("data"), dict) else {}
            jobs = [doc] if doc.get("kind") == "RayJob" else [
                yaml.safe_load(text.replace("@NIGHT@", "20261128")) for text in data.values()
                if isinstance(text, str) and "kind: RayJob" in text]
            for job in jobs:
                assert rayjob_problems(job) == [], path.name
                command = Path(shlex.split(job["spec"]["entrypoint"])[1]).stem
                assert config_problems(ROOT / "configs" / "cluster-gpu.yaml", command, pod_shared_mounts(job)) == []


def test_the_safety_checks_catch_an_unsafe_cluster(tmp_path):
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    open_dashboard = copy.deepcopy(launcher)
    open_dashboard["docker"]["run_options"] = ["--ulimit nofile=65536:65536"]
    open_dashboard["head_start_ray_commands"] = ["ray start --head --port=6379 --dashboard-host=0.0.0.0"]
    problems = " ".join(launcher_problems(open_dashboard))
    assert "without token authentication" in problems and "all interfaces" in problems
    per_node = copy.deepcopy(launcher)
    per_node["initialization_commands"] = ["sudo mkdir -p /mnt/shared"]
    per_node["docker"]["run_options"].append("-v /mnt/shared:/mnt/shared")
    assert any("/mnt/shared is a folder each node" in p for p in launcher_problems(per_node))
    per_node["initialization_commands"].append("mountpoint -q /mnt/shared || sudo mount -t nfs4 -o nfsvers=4.1 "
                                               "fs-1.efs.us-east-1.amazonaws.com:/ /mnt/shared")
    assert launcher_problems(per_node) == []  # the same folder, an NFS export on every node: shared
    no_role = copy.deepcopy(launcher)
    del no_role["available_node_types"]["head"]["node_config"]["IamInstanceProfile"]
    assert launcher_problems(no_role) == ["head: no storage role (IamInstanceProfile): it cannot read or write the "
                                          "runs' bucket"]
    conf = ROOT / "configs" / "cluster-gpu.yaml"
    assert config_problems(conf, "nightly", set()) == []
    broken = tmp_path / "cluster-gpu.yaml"
    broken.write_text(conf.read_text().replace("root: s3://my-bucket/verbatim/nightly", "root: /mnt/shared/nightly"))
    assert any("/mnt/shared/nightly is a folder of each node" in p for p in config_problems(broken, "nightly", set()))
    assert config_problems(broken, "nightly", {"/mnt/shared"}) == []

    job = yaml.safe_load((ROOT / "deploy" / "kuberay-rayjob.yaml").read_text())
    bad = copy.deepcopy(job)
    del bad["spec"]["rayClusterSpec"]["authOptions"]
    problems = " ".join(rayjob_problems(bad))
    assert "without token authentication" in problems and "all interfaces" in problems
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceType"] = "LoadBalancer"
    assert any("outside the Kubernetes cluster" in p for p in rayjob_problems(bad))
    bad = copy.deepcopy(job)
    del bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["serviceAccountName"]
    assert rayjob_problems(bad) == ["cpu: no service account (the storage role): it cannot read or write the runs' "
                                    "bucket"]
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["volumes"] = [
        {"name": "runs", "hostPath": {"path": "/mnt/shared"}}]
    assert any(p.startswith("cpu: /mnt/shared/runs/") and "a folder of each pod" in p for p in rayjob_problems(bad))


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


def test_nightly_cronjob_creates_a_dated_rayjob_that_resumes_and_passes_the_exit_code_on():
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy" / "nightly-cronjob.yaml").read_text())}
    cron = docs["CronJob"]
    assert cron["apiVersion"] == "batch/v1"
    spec = cron["spec"]
    assert len(spec["schedule"].split()) == 5 and spec["concurrencyPolicy"] == "Forbid"
    job = spec["jobTemplate"]["spec"]
    rule = job["podFailurePolicy"]["rules"][0]  # refused (exit 2): no rerun
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [2]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert rule["onExitCodes"]["containerName"] == container["name"]
    # the scheduler's account may create, watch and delete RayJobs
    binding, role = docs["RoleBinding"], docs["Role"]
    assert {"kind": "ServiceAccount", "name": pod["serviceAccountName"]} in binding["subjects"]
    assert docs["ServiceAccount"]["metadata"]["name"] == pod["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    rayjob_rule = next(r for r in role["rules"] if "rayjobs" in r["resources"])
    assert rayjob_rule["apiGroups"] == ["ray.io"] and {"get", "create", "delete"} <= set(rayjob_rule["verbs"])
    # the script: the template from the mounted ConfigMap, dated by the UTC night, the RayJob status fields it reads
    script = container["args"][0]
    volume = next(v for v in pod["volumes"] if v["name"] == container["volumeMounts"][0]["name"])
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert f"{container['volumeMounts'][0]['mountPath']}/rayjob.yaml" in script
    assert "NIGHT=$(date -u +%Y%m%d)" in script and 's/@NIGHT@/$NIGHT/g' in script
    assert spec.get("timeZone") in (None, "Etc/UTC", "UTC")
    for used in ("{.status.jobDeploymentStatus}", "{.status.jobStatus}", "{.status.message}", "Complete", "Failed",
                 "SUCCEEDED", "STOPPED", "exit 130", "failed with exit code"):
        assert used in script, used
    # the RayJob of one night
    night = "20261128"
    text = docs["ConfigMap"]["data"]["rayjob.yaml"]
    rayjob = yaml.safe_load(text.replace("@NIGHT@", night))
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["name"] == f"verbatim-nightly-{night}"
    assert "NAME=verbatim-nightly-$NIGHT" in script
    rj = rayjob["spec"]
    assert rj["shutdownAfterJobFinishes"] is True and rj["backoffLimit"] == 0
    assert rayjob_problems(rayjob) == []
    argv = shlex.split(rj["entrypoint"])
    assert argv[:2] == ["python", "jobs/nightly.py"] and (ROOT / argv[1]).is_file()
    run_id = argv[argv.index("--run-id") + 1]
    assert run_id == f"nightly-{night}" == safe_run_id(run_id)  # dated: tonight's rerun resumes this run
    argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
    args = parse_args(["nightly", *argv[2:]])  # the CLI takes it, with its config
    assert args.run_id == run_id and args.root.startswith("s3://")
