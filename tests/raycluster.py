"""A real Ray cluster of `ray start` processes on loopback, for job-submission tests.

Each node is ``ray start --block`` in its own process group, so stopping the cluster
signals exactly those processes: unlike ``ray stop --force``, it never touches another
Ray instance on the machine (such as the test session's local Ray).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


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
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"  # jobs run this environment's python
        self.env["RAY_AUTH_MODE"] = self.env.get("RAY_AUTH_MODE", "token")

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dash_port}"

    def _start(self, args: list[str], name: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - kept open for the process's life
        proc = subprocess.Popen([self.ray, "start", "--block", "--disable-usage-stats", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append(proc)

    def start_head(self) -> None:
        self._start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                     "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dash_port),
                     "--num-cpus", str(self.head_cpus)], "head")
        self._wait(lambda: self._http_ok(f"{self.dashboard}/api/version"), "the head's dashboard")
        self._wait(self._jobs_ready, "the head's job agent")

    def add_worker(self, num_cpus: int = 1, resources: str | None = None, name: str = "worker") -> None:
        args = ["--address", self.gcs_address, "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus)]
        if resources:
            args += ["--resources", resources]
        self._start(args, name)

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
            if any(p.poll() is not None for p in self.procs):
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

    def stop(self) -> None:
        """SIGTERM each node's process group (workers first), then SIGKILL what is left."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (raylet, workers)
            except ProcessLookupError:
                pass

    def __enter__(self) -> LocalRayCluster:
        try:
            self.start_head()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
