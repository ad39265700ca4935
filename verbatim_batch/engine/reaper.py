"""Ends a local Ray's processes when the driver that started it dies, however it dies (on ``kill -9`` the
dashboard and runtime-env agents stay): a plain script in its own session that notes the driver's descendants every
half second and, once the driver is gone, kills those still alive (by pid and start time, never a reused pid).

    python verbatim_batch/engine/reaper.py DRIVER_PID
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

INTERVAL_S = 0.5  # how often the driver's liveness is checked (cheap)
REFRESH_S = 5.0  # how often its process tree is walked (reads /proc: costs CPU in proportion to wall time)


def start(driver_pid: int | None = None, timeout_s: float = 30.0) -> subprocess.Popen:
    """Start the reaper for ``driver_pid`` (default: this process) in its own session; returns once it watches."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(driver_pid or os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    import select

    if select.select([proc.stdout], [], [], timeout_s)[0]:
        proc.stdout.readline()
    proc.stdout.close()
    return proc


def _descendants(proc: psutil.Process) -> dict[int, float]:
    try:
        return {p.pid: p.create_time() for p in proc.children(recursive=True) if p.pid != os.getpid()}
    except psutil.Error:
        return {}


def watch(driver_pid: int) -> int:
    """Watch ``driver_pid``; after it dies, kill what it left; returns how many processes were killed."""
    try:
        driver = psutil.Process(driver_pid)
        started = driver.create_time()
    except psutil.Error:
        print("gone", flush=True)
        return 0
    seen: dict[int, float] = _descendants(driver)
    print("watching", flush=True)
    walked = time.monotonic()
    while True:
        try:
            alive = driver.is_running() and driver.create_time() == started and driver.status() != "zombie"
        except psutil.Error:
            alive = False
        if not alive:
            break
        if time.monotonic() - walked >= REFRESH_S:
            seen.update(_descendants(driver))
            seen = {pid: t for pid, t in seen.items() if psutil.pid_exists(pid)}
            walked = time.monotonic()
        time.sleep(INTERVAL_S)
    for pid, created in list(seen.items()):  # what the driver's children started since the last walk
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                seen.update(_descendants(proc))
    killed = 0
    for pid, created in seen.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.kill()
                killed += 1
    return killed


if __name__ == "__main__":
    watch(int(sys.argv[1]))
