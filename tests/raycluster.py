"""A real Ray cluster of `ray start` processes on this machine, for job-submission tests.

Nodes join and clients talk through 127.0.0.1 (GCS address, dashboard, Jobs API), but Ray itself
turns ``--node-ip-address 127.0.0.1`` into the machine's routable IP and binds GCS, raylets and
agents on all interfaces; it has no loopback-only mode.

Each node is ``ray start --block`` in its own process group, so stopping the cluster
signals exactly those processes: unlike ``ray stop --force``, it never touches another
Ray instance on the machine (such as the test session's local Ray).

Each node also gets its own ``--temp-dir`` (sessions, sockets, logs, runtime_resources) under a short
folder in /tmp that ``stop`` removes. Two nodes on one machine must not share one: each node's
runtime-env agent owns ``runtime_resources/`` and re-extracts a job's working_dir there, deleting the
copy a job driver on the other node is running from. It also keeps the cluster out of /tmp/ray, where
``ray start --head`` would repoint ``session_latest`` and the "current cluster" address of other Rays.
Every node's dashboard agent gets a free HTTP port too (Ray's default, 52365, is fixed: whichever
Ray on the machine binds it first wins, and a head whose agent lost it answers job submissions with
"No available agent"); so does the head's Ray Client server (default 10001).
A node has the GPUs it declares (``add_worker(num_gpus=...)``, fake ones) and never the machine's own: a node
started with none sees ``CUDA_VISIBLE_DEVICES=""`` (Ray detects no GPU), one that declares ``n`` sees ``n`` ids of
``-1`` (Ray hands those to its GPU actors, and CUDA shows them no device). So on a machine with real GPUs the
cluster looks as it does on a CPU-only one, and the models run on CPU in float32 like everywhere else.
Set ``RAYCLUSTER_KEEP_TEMP=1`` to keep the nodes' Ray logs after ``stop``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
NAME_LABEL = "raycluster-node"  # every node carries its name here (see ``node_names``)

# Polls the state API from one process (a `ray list` CLI call costs seconds of CPU to start) until an
# actor whose class, repr or name contains one of argv[2] (comma-separated) is ALIVE; prints it as JSON.
_WATCH_ACTOR = """
import dataclasses, json, sys, time
from ray.util.state import list_actors
address, names = sys.argv[1], sys.argv[2].split(",")
while True:
    try:
        actors = list_actors(address=address, filters=[("state", "=", "ALIVE")], detail=True, limit=10000,
                             raise_on_missing_output=False)
    except Exception:
        actors = []
    for a in actors:
        a = a if isinstance(a, dict) else dataclasses.asdict(a)
        label = " ".join(str(a.get(k) or "") for k in ("class_name", "repr_name", "name"))
        if any(n in label for n in names):
            print(json.dumps(a, default=str), flush=True)
            sys.exit(0)
    time.sleep(0.5)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_cli() -> str | None:
    return shutil.which("ray", path=str(BIN)) or shutil.which("ray")


class LocalRayCluster:
    """``with LocalRayCluster(tmp) as c:`` starts a head (and optional workers); ``c.dashboard`` is its Jobs API."""

    def __init__(self, workdir: Path, head_cpus: int = 2) -> None:
        self.ray = ray_cli()
        if self.ray is None:
            raise RuntimeError("the `ray` CLI is not installed")
        self.workdir = Path(workdir)
        self.gcs_port, self.dash_port = free_port(), free_port()
        self.head_cpus = head_cpus
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []  # the node of each process in ``procs`` ("head", a worker's name)
        self.stopped: set[str] = set()  # nodes stopped on purpose (``stop_node``)
        # Short: Ray's unix socket paths under it must stay within 107 bytes.
        self.temp_root = Path(tempfile.mkdtemp(prefix="raycluster-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"  # jobs run this environment's python
        self.env["RAY_AUTH_MODE"] = self.env.get("RAY_AUTH_MODE", "token")
        # On SIGTERM a node drains first, for up to 30 s, until its raylet is idle; the head never is while
        # detached actors (job supervisor, Ray Data's stats actor) live on it. Nothing here needs a drain.
        self.env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dash_port}"

    def _start(self, args: list[str], name: str, num_gpus: int = 0) -> None:
        # The machine's own GPUs stay hidden (module docstring); a declared fake GPU gets an id CUDA cannot see.
        env = {**self.env, "CUDA_VISIBLE_DEVICES": ",".join(["-1"] * num_gpus)}
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - kept open for the process's life
        temp_dir = self.temp_root / f"n{len(self.procs)}"
        args = [*args, "--temp-dir", str(temp_dir), "--dashboard-agent-listen-port", str(free_port()),
                "--labels", f"{NAME_LABEL}={name}"]
        proc = subprocess.Popen([self.ray, "start", "--block", "--disable-usage-stats", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        self.names.append(name)

    def start_head(self) -> None:
        self._start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                     "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dash_port),
                     "--ray-client-server-port", str(free_port()), "--num-cpus", str(self.head_cpus)], "head")
        self._wait(lambda: self._http_ok(f"{self.dashboard}/api/version"), "the head's dashboard")
        self._wait(self._jobs_ready, "the head's job agent")

    def add_worker(self, num_cpus: int = 1, resources: str | None = None, name: str = "worker",
                   num_gpus: int | None = None) -> None:
        """Join a node to the head; ``num_gpus`` declares GPU slots (fake ones on a machine without GPUs)."""
        args = ["--address", self.gcs_address, "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus)]
        if num_gpus is not None:
            args += ["--num-gpus", str(num_gpus)]
        if resources:
            args += ["--resources", resources]
        if name in self.names:
            raise ValueError(f"there is a node called {name} already")
        self._start(args, name, num_gpus or 0)

    def stop_node(self, name: str, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Stop one node while the cluster goes on. SIGKILL (default) goes to the node's whole process group
        at once (``ray start``, raylet, agents, workers), as when a machine is lost: nothing drains or says
        goodbye, and the GCS finds the node dead by its missed health checks. SIGTERM goes to ``ray start``
        alone, which stops the node's processes in order (what ``ray stop`` on that machine does)."""
        proc = self.procs[self.names.index(name)]
        self.stopped.add(name)
        if proc.poll() is None and sig != signal.SIGKILL:
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)

    def node_names(self) -> dict[str, str]:
        """``{node_id: name}`` of every node the head knows, alive or dead ("head", a worker's name)."""
        return {n["node_id"]: n.get("labels", {}).get(NAME_LABEL, "") for n in self.state("nodes", detail=True)}

    def node_ids(self, state: str = "ALIVE") -> set[str]:
        """Ids of the nodes in ``state`` in the head's node table."""
        return {n["node_id"] for n in self.state("nodes", detail=True) if n.get("state") == state}

    def state(self, resource: str, *filters: str, detail: bool = False) -> list[dict]:
        """``ray list <resource> --format json`` from the head's state API (e.g. ``state("actors", "job_id=01")``)."""
        cmd = [self.ray, "list", resource, "--address", self.dashboard, "--format", "json", "--limit", "10000"]
        for f in filters:
            cmd += ["--filter", f]
        if detail:
            cmd.append("--detail")
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {(done.stdout + done.stderr)[-2000:]}")
        return json.loads(done.stdout)

    def wait_for_actor(self, *names: str, timeout: float = 300.0, job: subprocess.Popen | None = None) -> dict:
        """The first ALIVE actor whose class, repr or name contains one of ``names`` (its state-API record);
        fails when ``job`` (e.g. ``start_job``'s process) ends first or nothing shows up in ``timeout``."""
        watch = subprocess.Popen([sys.executable, "-c", _WATCH_ACTOR, self.dashboard, ",".join(names)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        deadline = time.monotonic() + timeout
        try:
            while watch.poll() is None:
                if job is not None and job.poll() is not None:
                    raise RuntimeError(f"the job ended (rc {job.returncode}) before an actor {names} was alive")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no actor {names} alive in {timeout:.0f}s")
                time.sleep(0.2)
            return json.loads(watch.stdout.read())
        finally:
            if watch.poll() is None:
                watch.kill()
            watch.wait()
            watch.stdout.close()

    def wait_for_nodes(self, n: int, timeout: float = 120.0) -> list[dict]:
        """Wait until ``n`` nodes are ALIVE in the head's node table; returns them."""
        alive: list[dict] = []

        def ready() -> bool:
            nonlocal alive
            try:
                alive = [node for node in self.state("nodes", detail=True) if node.get("state") == "ALIVE"]
            except (RuntimeError, ValueError, subprocess.TimeoutExpired):
                return False
            return len(alive) >= n

        self._wait(ready, f"{n} alive nodes", timeout)
        return alive

    def process_tree(self) -> dict[int, float]:
        """``{pid: create_time}`` of the node processes and everything they started so far (gcs, raylets,
        dashboard, workers, job drivers); take it just before ``stop`` and pass it to ``leftovers``."""
        import psutil

        tree: dict[int, float] = {}
        for proc in self.procs:
            try:
                procs = [psutil.Process(proc.pid)]
                procs += procs[0].children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    tree[p.pid] = p.create_time()
                except psutil.NoSuchProcess:
                    pass
        return tree

    def leftovers(self, tree: dict[int, float] | None = None, kill: bool = False) -> list[str]:
        """Live processes of this cluster: one of ``tree`` (same pid and start time), or any naming its
        GCS port; ``kill`` SIGKILLs them (after describing them)."""
        import psutil

        tree = tree or {}
        marks = (self.gcs_address, f"--gcs_server_port={self.gcs_port}")
        left = []
        for proc in psutil.process_iter(["pid", "cmdline", "status", "create_time"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = " ".join(proc.info["cmdline"] or [])
                if tree.get(proc.pid) == proc.info["create_time"] or any(m in cmdline for m in marks):
                    left.append(f"{proc.pid}: {cmdline[:200]}")
                    if kill:
                        proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return left

    def _http_ok(self, url: str) -> bool:
        """The server answers (an auth error counts: Ray 2.60 clusters require a token)."""
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def _jobs_ready(self) -> bool:
        """The Jobs API answers a listing (the job agent starts a little after the dashboard)."""
        done = subprocess.run([self.ray, "job", "list", "--address", self.dashboard], capture_output=True,
                              text=True, env=self.env, timeout=60)
        return done.returncode == 0

    def _wait(self, ready, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p, n in zip(self.procs, self.names, strict=True) if n not in self.stopped):
                raise RuntimeError(f"a ray process exited while waiting for {what}: see {self.workdir}/*.log")
            if ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{what} did not come up in {timeout:.0f}s: see {self.workdir}/*.log")

    def submit(self, *entrypoint: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        """``ray job submit --working-dir cwd -- entrypoint`` (waits for the job to finish)."""
        cmd = [self.ray, "job", "submit", "--address", self.dashboard, "--working-dir", str(cwd), "--", *entrypoint]
        for _ in range(10):
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=self.env)
            if "No available agent" not in done.stderr + done.stdout:
                return done
            time.sleep(3)  # the node's agent is still starting
        return done

    def start_job(self, *entrypoint: str, cwd: Path, submission_id: str, log: Path) -> subprocess.Popen:
        """``ray job submit --submission-id ... -- entrypoint`` in the background: the returned process tails
        the job's logs into ``log`` and exits when the job ends (1 when it FAILED; 0 when it SUCCEEDED or
        was STOPPED: ask ``job_status``). ``stop_job`` ends a job that should not go on."""
        cmd = [self.ray, "job", "submit", "--address", self.dashboard, "--working-dir", str(cwd),
               "--submission-id", submission_id, "--", *entrypoint]
        with open(log, "wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=self.env)

    def job_status(self, submission_id: str) -> str:
        jobs = self.state("jobs", f"submission_id={submission_id}")
        return jobs[0]["status"] if jobs else "UNKNOWN"

    def stop_job(self, submission_id: str) -> None:
        subprocess.run([self.ray, "job", "stop", "--address", self.dashboard, submission_id], capture_output=True,
                       env=self.env, timeout=120)

    def stop(self) -> None:
        """Stop the nodes one at a time, workers first: SIGTERM ``ray start`` itself, which stops the node's
        processes (gcs, raylet, agents, workers), then SIGKILL whatever is left of its process group, such
        as the dashboard's multiprocessing forkserver."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (dashboard forkserver, workers)
            except ProcessLookupError:
                pass
            proc.wait()
        if not os.environ.get("RAYCLUSTER_KEEP_TEMP"):
            shutil.rmtree(self.temp_root, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start_head()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
