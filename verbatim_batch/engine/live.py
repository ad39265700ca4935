"""Live counts from a stage's model actors to the driver's progress line, before any row is written.

A model stage writes a batch's rows only when the whole batch is done, so the actors also report, fire-and-forget,
to a small named actor of the driver's job (``LiveCounter``, no CPU): models loaded, and rows through them so far
(the model's ``live_fraction``). A lost report costs a stale line, never a row; no counter, no report.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

NAME = "verbatim-live-progress"  # in the driver's job namespace: one per driver, stages take turns
REPORT_EVERY_S = 2.0
_LOOKUP_EVERY_S = 30.0


class LiveCounter:
    """The driver's tally: ``loaded`` models and ``rows`` through a model, for the stage now running."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def add(self, key: str, n: int) -> None:
        self.counts[key] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)

    def reset(self) -> None:
        self.counts.clear()


def open_counter() -> Any | None:
    """The driver's counter, created (or found) and zeroed for a new stage; None without Ray."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        handle = ray.remote(num_cpus=0, max_restarts=0)(LiveCounter).options(
            name=NAME, get_if_exists=True).remote()
        ray.get(handle.reset.remote(), timeout=30)
        return handle
    except Exception:  # noqa: BLE001 - progress must never stop a run
        return None


def read(handle: Any | None) -> dict[str, int]:
    """The counter's figures now ({} when it cannot be read in a few seconds)."""
    if handle is None:
        return {}
    try:
        import ray

        return ray.get(handle.snapshot.remote(), timeout=5)
    except Exception:  # noqa: BLE001
        return {}


class Reporter:
    """A model actor's side: ``loaded()`` once, then per batch ``with reporter.batch(rows, model): ...``, reporting the
    model's ``live_fraction`` growth (as rows) every ``REPORT_EVERY_S`` and the rest at the end."""

    def __init__(self) -> None:
        self._handle: Any | None = None
        self._looked = float("-inf")

    def _counter(self) -> Any | None:
        if self._handle is None and time.monotonic() - self._looked > _LOOKUP_EVERY_S:
            self._looked = time.monotonic()
            try:
                import ray

                # never a Ray of its own: get_actor would start one in a process that has none
                self._handle = ray.get_actor(NAME) if ray.is_initialized() else None
            except Exception:  # noqa: BLE001 - no counter: nothing to report to
                self._handle = None
        return self._handle

    def add(self, key: str, n: int) -> None:
        if n <= 0:
            return
        handle = self._counter()
        if handle is not None:
            try:
                handle.add.remote(key, n)
            except Exception:  # noqa: BLE001 - the counter went away (the stage ended): drop the report
                self._handle = None

    def loaded(self) -> None:
        self.add("loaded", 1)

    def batch(self, rows: int, model: Any) -> _Batch:
        return _Batch(self, rows, model)


class _Batch:
    """One batch of ``rows``: the model's ``live_fraction`` (the share of its current call done) as rows, reported
    as it grows; the rest of the batch when the batch ends."""

    def __init__(self, reporter: Reporter, rows: int, model: Any) -> None:
        self.reporter, self.rows, self.model = reporter, rows, model
        self.reported = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _fraction(self) -> float | None:
        try:
            value = getattr(self.model, "live_fraction", None)
        except Exception:  # noqa: BLE001 - a model mid-update: no figure this time
            return None
        return float(value) if isinstance(value, (int, float)) else None

    def _report_growth(self) -> None:
        fraction = self._fraction()
        if fraction is None:
            return
        grown = min(self.rows, int(self.rows * min(1.0, fraction))) - self.reported
        if grown > 0:
            self.reported += grown
            self.reporter.add("rows", grown)

    def _run(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            self._report_growth()

    def __enter__(self) -> _Batch:
        if hasattr(self.model, "live_fraction"):
            self._thread = threading.Thread(target=self._run, name="live-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if exc_type is None:  # the batch is through the model: its rows, less what was reported already
            self.reporter.add("rows", self.rows - self.reported)
            self.reported = self.rows
