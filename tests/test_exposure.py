"""A local job listens on loopback only, and its local Ray does not outlive a driver killed with kill -9.

The job is the real CLI (`verbatim-batch chunk` on the bundled corpus) in its own process. A fault point
freezes its driver (SIGSTOP) while a read task runs, so the whole local Ray is up; the test then reads the
OS's socket table (psutil) for every process under the driver, kills the driver with SIGKILL, and waits for
all of them to be gone.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "verbatim_batch" / "examples" / "corpus"


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_local_job_listens_on_loopback_only_and_dies_with_its_driver(tmp_path):
    marker = tmp_path / "stopped"
    env = {**os.environ, "VERBATIM_BATCH_FAULT": f"chunk.read#1@{marker};target=driver;action=stop"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-m", "verbatim_batch.cli", "chunk", "--input", str(CORPUS),
                               "--output", str(tmp_path / "out"), "--num-cpus", "2"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tree: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 180
        while not (marker.exists() and psutil.Process(driver.pid).status() == psutil.STATUS_STOPPED):
            assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the job never reached its first read"
            time.sleep(0.5)
        procs = [p for p in psutil.Process(driver.pid).children(recursive=True)]
        tree = {p.pid: p.create_time() for p in procs}
        listening = []
        for p in [psutil.Process(driver.pid), *procs]:
            try:
                listening += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN]
            except psutil.NoSuchProcess:
                continue
        names = {n for n, _, _ in listening}
        assert {"gcs_server", "raylet"} <= names, listening  # the socket table was read, and Ray is up
        exposed = [entry for entry in listening if not _loopback(entry[1])]
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [pid for pid, created in tree.items() if psutil.pid_exists(pid) and _same(pid, created)]
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"processes of the killed driver's Ray still alive: {_names(left)}"


def _same(pid: int, created: float) -> bool:
    try:
        return psutil.Process(pid).create_time() == created and psutil.Process(pid).status() != "zombie"
    except psutil.Error:
        return False


def _names(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid} {psutil.Process(pid).name()}")
        except psutil.Error:
            pass
    return out
