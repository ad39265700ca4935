"""Stage progress (engine/progress.py): rows done / rows to do, rows/s and an ETA from the sink's write records,
as log lines or a bar; Ray Data's own 0/? progress and its false "will hang" warning are off in stage drivers.
No Ray needed: the records are written by hand, as the sink writes them."""

from __future__ import annotations

import io
import re
import time

from verbatim_batch.core.runs import record_write
from verbatim_batch.engine.progress import Progress, duration, status


def test_status_line_and_durations():
    assert status(250, 1000, 10.0, eta="30s") == "250/1,000 rows (25.0%) in 10s, 25.0 rows/s, ETA 30s"
    assert status(250, 1000, 10.0) == "250/1,000 rows (25.0%) in 10s, 25.0 rows/s, ETA settling"  # not settled
    assert status(0, 1000, 10.0) == "0/1,000 rows: starting (workers start, models load) for 10s"
    assert [duration(s) for s in (4.2, 185, 7620)] == ["4s", "3m05s", "2h07m"]


def test_progress_counts_this_runs_writes_in_lines(tmp_path):
    staging = str(tmp_path)
    record_write(staging, "part-carried-1", {"keys": ["a", "b"]})  # carried before the stage starts: not counted
    out = io.StringIO()
    line = re.compile(r"\[extract\] 3/10 rows \(30\.0%\) in \w+, \d+\.\d rows/s, ETA \w+")
    with Progress("extract", staging, 10, stream=out, how="log", every=0.5):
        for i in range(3):
            record_write(staging, f"part-{i}", {"keys": [f"k{i}", f"k{i}"]})  # a key repeated (retrieve): once
        deadline = time.monotonic() + 20  # a loaded machine may run the reporter's thread late
        while not line.search(out.getvalue()) and time.monotonic() < deadline:
            time.sleep(0.1)
    lines = out.getvalue().splitlines()
    assert any(line.fullmatch(x) for x in lines), lines
    assert re.fullmatch(r"\[extract\] done: 3/10 rows in \w+ \(\d+\.\d rows/s\)", lines[-1]), lines


def test_progress_by_records_and_bar(tmp_path):
    staging = str(tmp_path)
    record_write(staging, "part-old", {"keys": ["p1", "p2"]})  # a resumed run's write: off the total
    out = io.StringIO()
    with Progress("chunk", staging, 6, unique=False, stream=out, how="bar"):
        record_write(staging, "part-new", {"keys": ["None", "None"]})  # two quarantine rows without an id
        deadline = time.monotonic() + 20
        while "\r[chunk] |############............| 2/4 rows (50.0%)" not in out.getvalue() \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    text = out.getvalue()
    assert "\r[chunk] |############............| 2/4 rows (50.0%)" in text, text
    assert re.search(r"\[chunk\] done: 2/4 rows in \w+ \(\d+\.\d rows/s\)\n$", text), text


def test_off_and_nothing_to_do_write_nothing(tmp_path):
    for kwargs in ({"how": "off"}, {"how": "log", "total": 0}):
        out = io.StringIO()
        total = kwargs.pop("total", 5)
        with Progress("embed", str(tmp_path), total, stream=out, every=0.5, **kwargs):
            time.sleep(0.6)
        assert out.getvalue() == ""


def test_stage_drivers_turn_ray_data_noise_off():
    from ray.data import DataContext
    from ray.util.debug import log_once

    from verbatim_batch.engine.ray_env import quiet_ray_data

    quiet_ray_data()
    assert DataContext.get_current().enable_progress_bars is False
    assert not log_once("cpu_warning")  # "The Dataset job will hang unless more CPUs are freed up": consumed


def test_before_the_first_write_the_line_says_what_the_models_do():
    """Issue 43: "0/361 rows: starting" for minutes. With the model actors' live reports the line moves: models
    loaded, then rows through the model with a rate and an ETA, capped at the rows to do."""
    assert "starting (workers start, models load)" in status(0, 361, 30.0, {})
    assert status(0, 361, 30.0, {"loaded": 1}) == "0/361 rows: 1 model loaded, first batch running for 30s"
    assert status(0, 361, 60.0, {"loaded": 2, "rows": 120}, "2m00s") == (
        "0/361 rows written; 120 through the model (33.2%) in 1m00s, 2.0 rows/s, ETA 2m00s")
    assert "361 through the model (100.0%)" in status(0, 361, 60.0, {"rows": 500})  # retried rows: capped
    assert status(10, 100, 10.0, {"rows": 50}).startswith("10/100 rows (10.0%)")  # written rows lead once any


class _Model:
    """A model that has done ``live_fraction`` of its current call."""

    live_fraction = 0.0


def test_a_batch_reports_the_models_rows_as_they_grow_then_the_rest(monkeypatch):
    """A model actor's batch: the growth of its model's ``live_fraction``, as rows of the batch, is reported while
    it runs, and at the end the rest of the batch, never more than the batch; a failed attempt reports nothing
    more at its end."""
    from verbatim_batch.engine import live

    monkeypatch.setattr(live, "REPORT_EVERY_S", 0.05)
    reporter = live.Reporter()
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(reporter, "_counter", lambda: object())
    monkeypatch.setattr(reporter, "add", lambda key, n: sent.append((key, n)) if n > 0 else None)
    model = _Model()
    with reporter.batch(10, model):
        model.live_fraction = 0.45  # 4 of the batch's 10 rows (windows of a chunk count as parts of it)
        deadline = time.monotonic() + 30
        while sum(n for _, n in sent) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(n for _, n in sent) == 4  # reported while the batch runs
    assert sum(n for _, n in sent) == 10 and {k for k, _ in sent} == {"rows"}
    sent.clear()
    try:
        model.live_fraction = 0.0  # a new call
        with reporter.batch(10, model):
            model.live_fraction = 0.3
            raise RuntimeError("attempt failed")
    except RuntimeError:
        pass
    assert sum(n for _, n in sent) <= 3  # only what the model did before the failure


def test_without_a_ray_the_reporter_reports_nothing_and_starts_no_ray():
    """In a process without Ray (a clean interpreter: this one may hold the session's), a model's reports go
    nowhere and never start a Ray (``ray.get_actor`` would)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from verbatim_batch.engine import live\n"
        "class M:\n    live_fraction = 0.5\n"
        "r = live.Reporter()\nr.loaded()\n"
        "with r.batch(5, M()):\n    pass\n"
        "ray = sys.modules.get('ray')\n"
        "assert r._handle is None and (ray is None or not ray.is_initialized()), 'a Ray was started'\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def _seconds(text: str) -> int:
    """``duration``'s text back to seconds (``3m05s`` -> 185)."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert parts and text, text
    h, m, s = (int(x or 0) for x in parts.groups())
    return 3600 * h + 60 * m + s


def test_an_eta_is_shown_only_once_the_rate_has_settled():
    """Issue 53: an early ETA said 56 minutes for a 2-minute stage (the rate over the first rows, start-up in it).
    On a fake clock: a minute of start-up, the first 20 rows at 62 s (a rate over the stage so far: 0.3 rows/s,
    about 50 minutes for the 1,000), then 20 rows every 2 s (10 rows/s: the truth). No ETA is shown until the rate
    since the first rows has held ``SETTLE_S`` over ``SETTLE_STEPS`` advances; then it is the truth's, and stays."""
    from verbatim_batch.engine.progress import SETTLE_S, SETTLE_STEPS, Eta

    progress = Progress("embed", "/nonexistent", 1000, how="off")
    progress.t0 = 0.0
    lines = [progress._status(0, t, {}) for t in (5.0, 30.0, 60.0)]  # start-up: no rows, no ETA
    assert all("ETA" not in x and "starting" in x for x in lines), lines
    first = progress._status(20, 62.0, {})
    assert first.endswith("ETA settling"), first
    shown: list[tuple[float, int, int]] = []
    done, now = 20, 62.0
    while done < 1000:
        done, now = done + 20, now + 2.0
        eta = progress._status(done, now, {}).rsplit("ETA ", 1)[1]
        if eta != "settling":
            shown.append((now, done, _seconds(eta)))
        elif shown:
            raise AssertionError(f"an ETA shown at {shown[0][0]} s went back to settling at {now} s")
    first_shown, rows_then, _ = shown[0]
    assert first_shown - 62.0 >= SETTLE_S and (rows_then - 20) // 20 >= SETTLE_STEPS, shown[0]
    for at, rows, eta in shown:  # the truth: 10 rows/s from here
        truth = (1000 - rows) / 10
        assert abs(eta - truth) <= max(2.0, 0.1 * truth), (at, rows, eta, truth)

    # rows through the model before any is written have their own ETA, settled the same way
    eta = Eta()
    for t, rows in ((40.0, 50), (41.0, 60), (42.0, 70)):
        eta.observe(rows, t)
    assert eta.left(1000, 42.0) is None  # two advances, but 2 s: not settled
    for t, rows in ((50.0, 150), (60.0, 250)):
        eta.observe(rows, t)
    assert _seconds(eta.left(1000, 60.0)) == 75  # (1000 - 250) rows at 10 rows/s since the first rows
