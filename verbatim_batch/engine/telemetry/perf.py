"""A run's performance report: per stage, wall time, CPU-seconds of every process, rows/s and tokens/s, model actors'
idle share, peak memory, and GPU-seconds and utilisation where the machine has an NVIDIA GPU.

One ``Sampler`` thread per process, shared by every stage, reads this driver's process tree every ``INTERVAL_S``
(with ``--address``, the driver alone, as ``scope`` says); each stage opens a ``Window`` on it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

INTERVAL_S = 2.0
RESCAN_EVERY = 5  # samples between two walks of the process tree (new processes are found then, whole CPU time)


def _kind(proc: Any) -> str:
    """A process's kind: ``driver``, ``ray workers`` (tasks and actors, not told apart), ``ray system`` (GCS, raylet,
    agents) or ``other`` (the reaper, a model server)."""
    if proc.pid == os.getpid():
        return "driver"
    try:
        cmd = proc.cmdline()
    except Exception:  # noqa: BLE001 - gone, or not ours to read
        return "other"
    title = " ".join(cmd[:3])
    if title.startswith("ray::") or "default_worker.py" in title:
        return "ray workers"
    if any(part in title for part in ("gcs_server", "raylet", "/ray/", "ray/_private", "ray/dashboard")):
        return "ray system"
    return "other"


class _Gpus:
    """NVIDIA GPUs through pynvml, or the reason there are none to sample."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.reason = ""
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            if not self.handles:
                self.reason = "no NVIDIA GPU on this node"
        except ImportError:
            self.reason = "pynvml is not installed (pip install nvidia-ml-py on GPU nodes)"
        except Exception as exc:  # noqa: BLE001 - no driver, no device
            self.reason = f"no NVIDIA GPU on this node ({type(exc).__name__})"

    def utilisation(self) -> list[float]:
        out = []
        for h in self.handles:
            try:
                out.append(float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            except Exception:  # noqa: BLE001 - a device that stops answering counts as idle
                out.append(0.0)
        return out


class Window:
    """One stage's share of the sampler: from ``open`` to ``close``."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.t0 = time.perf_counter()
        self.cpu0 = dict(sampler.cpu)
        self.peak_rss = 0
        self.gpu_seconds = 0.0
        self.gpu_samples: list[float] = []

    def close(self) -> dict[str, Any]:
        """The window's figures: wall, CPU-seconds by process kind, peak memory, GPU use."""
        s = self.sampler
        by_kind: dict[str, float] = defaultdict(float)
        with s.lock:
            s._sample_locked(rescan=True)
            s.windows.discard(self)
            for pid, cpu in s.cpu.items():
                by_kind[s.kinds.get(pid, "other")] += max(0.0, cpu - self.cpu0.get(pid, 0.0))
            processes = len(s.cpu)
        shown = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
        out: dict[str, Any] = {
            "wall_s": round(time.perf_counter() - self.t0, 3),
            "cpu_s": round(sum(by_kind.values()), 3),
            "cpu_s_by_process": {k: round(v, 3) for k, v in shown.items()},
            "processes": processes,
            "peak_rss_bytes": int(self.peak_rss),
            "scope": s.scope,
        }
        if s.gpus.handles:
            n = len(s.gpus.handles)
            out["gpu"] = {"devices": n, "gpu_seconds": round(self.gpu_seconds, 3),
                          "utilisation_mean": round(sum(self.gpu_samples) / len(self.gpu_samples), 1)
                          if self.gpu_samples else 0.0}
        else:
            out["gpu"] = {"skipped": s.gpus.reason}
        return out


class Sampler:
    """The process tree's CPU time, memory and GPU use, sampled every ``INTERVAL_S`` while a window is open."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.me = psutil.Process()
        self.cpu: dict[int, float] = {}  # pid -> latest user+system CPU-seconds
        self.kinds: dict[int, str] = {}
        self.windows: set[Window] = set()
        self.gpus = _Gpus()
        self.lock = threading.Lock()
        self.last = time.perf_counter()
        self.thread: threading.Thread | None = None
        self.procs: list[Any] = []
        self.n = 0

    @property
    def scope(self) -> str:
        import sys

        ray = sys.modules.get("ray")
        joined = bool(ray and ray.is_initialized() and not _local_ray())
        return "driver (workers run on the cluster)" if joined else "driver and its local Ray"

    def open(self) -> Window:
        with self.lock:
            self._sample_locked(rescan=True)
            w = Window(self)
            self.windows.add(w)
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="verbatim-perf", daemon=True)
            self.thread.start()
        return w

    def _loop(self) -> None:
        while self.windows:
            time.sleep(INTERVAL_S)
            self.sample()

    def sample(self) -> None:
        with self.lock:
            self._sample_locked()

    def _sample_locked(self, rescan: bool = False) -> None:
        ps = self.psutil
        if rescan or self.n % RESCAN_EVERY == 0 or not self.procs:  # walking the tree reads every process of the host
            try:
                self.procs = [self.me, *self.me.children(recursive=True)]
            except ps.Error:
                self.procs = [self.me]
        self.n += 1
        rss = 0
        for p in self.procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss += p.memory_info().rss
                if p.pid not in self.kinds:
                    self.kinds[p.pid] = _kind(p)
                self.cpu[p.pid] = t.user + t.system
            except ps.Error:
                continue
        now = time.perf_counter()
        dt, self.last = now - self.last, now
        util = self.gpus.utilisation() if self.gpus.handles else []
        for w in list(self.windows):
            w.peak_rss = max(w.peak_rss, rss)
            if util:
                w.gpu_samples.append(sum(util) / len(util))
                w.gpu_seconds += sum(u / 100.0 for u in util) * dt


def _local_ray() -> bool:
    from verbatim_batch.engine import ray_env

    return ray_env.started_locally()


_SAMPLER: Sampler | None = None


def open_window() -> Window | None:
    """A window on this process's sampler (started on first use); None where psutil cannot read the tree."""
    global _SAMPLER
    try:
        if _SAMPLER is None:
            _SAMPLER = Sampler()
        return _SAMPLER.open()
    except Exception:  # noqa: BLE001 - the report is an account, never a reason to fail a run
        return None


def discard(window: Window | None) -> None:
    """Stop sampling for ``window`` (a run that ended without its report: refused, failed)."""
    if window is not None:
        with window.sampler.lock:
            window.sampler.windows.discard(window)


def performance(window: Window | None, counts: Mapping[str, Any], rows: Mapping[str, int],
                wall_work_s: float | None) -> dict[str, Any]:
    """A stage's performance block: the window's figures, rows/s and tokens/s over ``wall_work_s`` (the whole stage when
    None), and the model actors' idle share (time between batches over time alive, after loading)."""
    out: dict[str, Any] = window.close() if window is not None else {"skipped": "psutil could not read processes"}
    wall = wall_work_s if wall_work_s else out.get("wall_s") or 0.0
    written = rows.get("written", 0)
    out["rows_per_s"] = round(written / wall, 3) if wall and written else 0.0
    tokens = int(counts.get("tokens", 0) or 0)
    out["tokens_per_s"] = round(tokens / wall, 1) if wall and tokens else 0.0
    busy, wait = counts.get("time_ms.actor_busy", 0), counts.get("time_ms.actor_wait", 0)
    if busy or wait:
        out["actor_idle_share"] = round(wait / (busy + wait), 4)
        out["actor_load_s"] = round(counts.get("time_ms.actor_load", 0) / 1000, 3)
    return out
