"""Progress a person can read: rows done of the rows to do, rows/s and an ETA, for every keyed stage.

Ray Data's own counts per operator (``0/?`` until the end for a few large blocks), so a stage job turns it off and
``Progress``, a driver thread, polls the sink's write records (``_writes/part-*.json``): it counts exactly the rows
whose files are written. A bar on a terminal, else a line every ``VERBATIM_PROGRESS_INTERVAL`` seconds (5) when
something changed; the ETA waits for a settled rate (``Eta``: one with start-up in it said 56 minutes of a 2-minute
stage). ``VERBATIM_PROGRESS``: ``auto`` (default), ``bar``, ``log``, ``off`` or ``ray`` (Ray Data's own).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any, TextIO

from verbatim_batch.core import storage
from verbatim_batch.core.runs import WRITES_DIR
from verbatim_batch.engine import live

MODES = ("auto", "bar", "log", "off", "ray")
HEARTBEAT = 6  # intervals without a change before a log line says so anyway
BAR_WIDTH = 24
SETTLE_S = 15.0  # an ETA is shown once the rate since the first rows has held this long ...
SETTLE_STEPS = 2  # ... over at least this many advances of the count past the first rows
SETTLING = "settling"


def mode() -> str:
    value = os.environ.get("VERBATIM_PROGRESS", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"VERBATIM_PROGRESS must be one of {', '.join(MODES)}, got {value!r}")
    return value


def interval_s() -> float:
    return max(0.5, float(os.environ.get("VERBATIM_PROGRESS_INTERVAL", "5")))


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Eta:
    """The time left of a count, from its rate since the first rows were seen (start-up and model loading left out):
    ``left`` is None until that rate has held ``SETTLE_S`` seconds over ``SETTLE_STEPS`` advances, then stays shown."""

    def __init__(self) -> None:
        self.first: tuple[int, float] | None = None  # (count, time) of the first rows seen
        self.last = 0
        self.steps = 0

    def observe(self, count: int, now: float) -> None:
        if count <= 0:
            return
        if self.first is None:
            self.first, self.last = (count, now), count
        elif count > self.last:
            self.steps, self.last = self.steps + 1, count

    def left(self, total: int, now: float) -> str | None:
        """``duration`` of the time left to ``total``, or None while the rate has not settled."""
        if self.first is None or self.steps < SETTLE_STEPS:
            return None
        count, since = self.first
        span = now - since
        if span < SETTLE_S or self.last <= count:
            return None
        return duration(max(0, total - self.last) * span / (self.last - count))


def status(done: int, total: int, elapsed: float, live: dict[str, int] | None = None,
           eta: str | None = None) -> str:
    """``1,234/5,000 rows (24.7%) in 30s, 41.2 rows/s, ETA 1m31s`` (``eta`` from ``Eta.left``, ``settling`` when None).
    Before the first write, ``live`` (the model actors' ``loaded`` and ``rows``, ``engine.live``) says what the time is
    spent on, and ``eta`` is that of the rows through the model."""
    live = live or {}
    through = min(total, live.get("rows", 0))
    eta = eta or SETTLING
    if not done:  # nothing written yet: say what that time is spent on
        if through:
            rate = through / elapsed if elapsed > 0 else 0.0
            return (f"0/{total:,} rows written; {through:,} through the model ({100 * through / total:.1f}%) in "
                    f"{duration(elapsed)}, {rate:.1f} rows/s, ETA {eta}")
        if live.get("loaded"):
            return (f"0/{total:,} rows: {live['loaded']} model{'s' if live['loaded'] > 1 else ''} loaded, first "
                    f"batch running for {duration(elapsed)}")
        return f"0/{total:,} rows: starting (workers start, models load) for {duration(elapsed)}"
    rate = done / elapsed if elapsed > 0 else 0.0
    share = f" ({100 * done / total:.1f}%)" if total else ""
    return f"{done:,}/{total:,} rows{share} in {duration(elapsed)}, {rate:.1f} rows/s, ETA {eta}"


class Progress:
    """``with Progress("extract", staging, total, unique=True): <write the stage's rows>``: ``total`` rows to do;
    ``unique``: a write's keys are input keys, counted once each, else records (chunk), those present at start
    counted."""

    def __init__(self, what: str, staging: str, total: int, *, unique: bool = True, stream: TextIO | None = None,
                 how: str | None = None, every: float | None = None) -> None:
        self.what, self.folder, self.total, self.unique = what, storage.join(staging, WRITES_DIR), total, unique
        self.stream = stream or sys.stderr
        how = how or mode()
        if how == "auto":
            how = "bar" if getattr(self.stream, "isatty", lambda: False)() else "log"
        self.how = how if how in ("bar", "log") else "off"
        self.every = every or interval_s()
        self.seen: set[str] = set()
        self.done = 0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: Any | None = None  # the model actors' live counter (``live``), while this stage runs
        self._eta_written, self._eta_model = Eta(), Eta()  # rows written; rows through the model before any is

    def poll(self) -> int:
        """Rows done: read the write records that appeared since the last poll."""
        for name in storage.listdir(self.folder):
            if not name.endswith(".json") or name in self.seen:
                continue
            try:
                record = json.loads(storage.read_text(storage.join(self.folder, name)))
                keys = record.get("keys", [])
                n = len(set(keys)) if self.unique else len(keys)
                if record.get("keys_file"):  # a carried file's keys, beside the record (only their number)
                    n += storage.parquet_file(storage.join(self.folder, record["keys_file"])).metadata.num_rows
            except (OSError, ValueError):
                continue  # gone or not readable yet: next poll
            self.seen.add(name)
            self.done += n
        return self.done

    def start(self) -> Progress:
        already = self.poll()  # a resumed run's writes and carried files: not this run's work
        self.done = 0
        if not self.unique:
            self.total = max(0, self.total - already)
        self.t0 = time.monotonic()
        if self.how != "off" and self.total:
            self._live = live.open_counter()
            self._thread = threading.Thread(target=self._run, name=f"progress-{self.what}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        last_line, last_done = 0.0, None
        tick = 1.0 if self.how == "bar" else min(2.0, self.every)
        while not self._stop.wait(tick):
            try:
                done = self.poll()
            except Exception:  # noqa: BLE001 - progress must never break a run (a flaky store: next poll)
                continue
            now = time.monotonic()
            if self.how == "bar":
                self._write("\r" + self._bar(done, now), end="")
            elif now - last_line >= self.every:
                figures = live.read(self._live) if not done else {}  # the model's count until rows are written
                moved = (done, figures.get("rows", 0), figures.get("loaded", 0))
                if moved != last_done or now - last_line >= HEARTBEAT * self.every:
                    self._write(f"[{self.what}] {self._status(done, now, figures)}")
                    last_line, last_done = now, moved

    def _status(self, done: int, now: float, figures: dict[str, int]) -> str:
        """The status line at ``now``, each count's ETA fed and asked (``Eta``)."""
        self._eta_written.observe(done, now)
        through = min(self.total, figures.get("rows", 0))
        self._eta_model.observe(through, now)
        eta = self._eta_written.left(self.total, now) if done else self._eta_model.left(self.total, now)
        return status(done, self.total, now - self.t0, figures, eta)

    def _bar(self, done: int, now: float) -> str:
        filled = int(BAR_WIDTH * min(done, self.total) / self.total) if self.total else BAR_WIDTH
        figures = live.read(self._live) if not done else {}
        line = self._status(done, now, figures)
        return f"[{self.what}] |{'#' * filled}{'.' * (BAR_WIDTH - filled)}| {line}  "

    def _write(self, text: str, end: str = "\n") -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text + end)
            self.stream.flush()

    def stop(self, failed: bool = False) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        try:
            done = self.poll()
        except Exception:  # noqa: BLE001
            done = self.done
        now = time.monotonic()
        elapsed = now - self.t0
        rate = done / elapsed if elapsed > 0 else 0.0
        end = "stopped at" if failed else "done:"
        if self.how == "bar":
            self._write("\r" + self._bar(done, now))
        self._write(f"[{self.what}] {end} {done:,}/{self.total:,} rows in {duration(elapsed)} ({rate:.1f} rows/s)")

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(failed=exc_type is not None)
