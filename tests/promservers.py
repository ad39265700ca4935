"""Debian's Prometheus and Pushgateway, real servers on loopback, for the metrics tests.

Each server is one process in its own session (its own process group), started on a free port with its storage
in a folder of the test's, and stopped by its pid (SIGTERM, then SIGKILL): nothing else on the machine is
touched. ``PROMETHEUS`` / ``PUSHGATEWAY`` / ``PROMTOOL`` are the binaries (None where not installed: the tests
skip, saying why). ``MetricsRayHead`` is a Ray head (tests/raycluster.py) with no dashboard and a fixed metrics
export port, for Prometheus to scrape.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from raycluster import LocalRayCluster, free_port

PROMETHEUS = shutil.which("prometheus")
PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")  # Debian's name, upstream's
PROMTOOL = shutil.which("promtool")
REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
APT = "apt-get install prometheus prometheus-pushgateway"


def scaled(seconds: float) -> float:
    """A time limit, longer on a loaded machine (up to 8x): limits only catch a hung server or run."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 1.0
    return seconds * min(8.0, max(1.0, load))


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(ready, what: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None,
               interval: float = 0.5):
    """Poll ``ready()`` until it returns something truthy (returned); fails when ``proc`` ends first or after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: the process exited ({proc.returncode}) first:\n{tail}")
        try:
            got = ready()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


class _Server:
    """One server process on 127.0.0.1:port; ``with`` starts it and waits until it answers /-/ready."""

    name = "server"

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.folder / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.folder)
        wait_until(lambda: http_get(f"{self.url}/-/ready", timeout=5)[0] == 200, f"{self.name} at {self.url}",
                   scaled(60), self.proc, self.log)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only what it started
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Pushgateway(_Server):
    name = "pushgateway"

    def command(self) -> list[str]:
        # Its own persistence file: Debian's build defaults to /var/lib/prometheus/pushgateway.data, shared by
        # every gateway on the machine, and a new one would start with what others pushed.
        return [PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{self.port}",
                f"--persistence.file={self.folder / 'pushgateway.data'}"]


class Prometheus(_Server):
    """Prometheus with ``config`` (a dict, written as prometheus.yml in its folder); storage in its folder."""

    name = "prometheus"

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        super().__init__(folder)
        self.config_path = self.folder / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def command(self) -> list[str]:
        return [PROMETHEUS, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]

    def api(self, path: str, **params: Any) -> Any:
        """``/api/v1/<path>``'s data; raises on an error answer."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=60)
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise AssertionError(f"{path} {params}: {status} {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        return self.api("query", query=expr, time=at)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def targets_up(self) -> dict[str, str]:
        """``{scrape job: health}`` of the active targets."""
        return {t["labels"].get("job", ""): t["health"] for t in self.api("targets")["activeTargets"]}


def prometheus_config(pushgateway: str | None = None, ray_sd_file: Path | None = None, interval: str = "1s",
                      rules: bool = True) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml, as a user would adapt it: this test's Pushgateway and Ray service
    discovery file, a short scrape and rule interval, the rule file by its absolute path."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(DEPLOY / "prometheus" / "alerts.yml")] if rules else []
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] == "pushgateway" and pushgateway:
            job["static_configs"] = [{"targets": [urllib.parse.urlsplit(pushgateway).netloc]}]
            jobs.append(job)
        elif job["job_name"] == "ray" and ray_sd_file:
            job["file_sd_configs"] = [{"files": [str(ray_sd_file)], "refresh_interval": "1s"}]
            jobs.append(job)
    config["scrape_configs"] = jobs
    return config


class MetricsRayHead(LocalRayCluster):
    """A Ray head without the dashboard, its metrics served on ``metrics_port``; ``write_sd_file`` writes the
    service discovery file Ray's dashboard would (``prom_metrics_service_discovery.json``'s format)."""

    def __init__(self, workdir: Path, head_cpus: int = 2) -> None:
        super().__init__(workdir, head_cpus=head_cpus)
        self.metrics_port = free_port()
        # On a loaded machine the dashboard agent can take longer to report its ports than the raylet waits
        # by default (the raylet then exits at start-up).
        self.env.setdefault("RAY_agent_register_timeout_ms", "600000")

    def start_head(self) -> None:
        # Without the dashboard Ray still starts a small head process on the dashboard port (8265 unless told,
        # with no retry): a free one, so that two Rays on the machine do not fight over it.
        self._start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                     "--include-dashboard=false", "--dashboard-port", str(self.dash_port),
                     "--metrics-export-port", str(self.metrics_port),
                     "--ray-client-server-port", str(free_port()), "--num-cpus", str(self.head_cpus)], "head")
        metrics = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self._wait(lambda: self._http_ok(metrics), "the head's metrics export port", scaled(180))

    def write_sd_file(self, path: Path) -> Path:
        path.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": [f"127.0.0.1:{self.metrics_port}"]}]),
                        encoding="utf-8")
        return path
