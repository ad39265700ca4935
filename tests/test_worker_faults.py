"""Workers lost past their bound: the stage stops within seconds with one line and exit 3, resumable (issue 44).

Real parts: a real local Ray started by the command, the real embed stage, its worker killed with SIGKILL at each
batch (``VERBATIM_BATCH_FAULT``, what the kernel's OOM killer does) or by Ray's own memory monitor (its threshold
set below what the machine uses: ``RAY_memory_usage_threshold``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verbatim_batch.engine.worker_faults import EXIT_CODE

CORPUS = Path(__file__).parent.parent / "verbatim_batch" / "examples" / "corpus"


@pytest.fixture(scope="module")
def chunks(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("faults")
    papers = tmp / "papers"
    papers.mkdir()
    name = sorted(p.name for p in CORPUS.glob("*.md"))[0]
    (papers / name).write_bytes((CORPUS / name).read_bytes())
    out = tmp / "chunks"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    done = subprocess.run([sys.executable, "-m", "verbatim_batch.cli", "chunk", "--input", str(papers), "--output",
                           str(out), "--num-cpus", "2"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(out)


def _embed(chunks: str, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    return subprocess.run([sys.executable, "-m", "verbatim_batch.cli", "embed", "--chunks", chunks, "--output",
                           str(out), "--num-cpus", "2", "--batch-rows", "8", *extra],
                          env=base | {"HF_HUB_OFFLINE": "1"} | (env or {}), capture_output=True, text=True)


def _default_signals() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, as under a terminal or a pod (CI may start the suite
    with them ignored, which a child would inherit and keep)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _embed_frozen_mid_batch(chunks: str, out: Path, run_id: str) -> subprocess.Popen:
    """An embed command whose model actor has stopped itself (SIGSTOP) at its first batch: a fault can then land
    mid-batch. Returns the running command (its stderr piped)."""
    import time

    import psutil

    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    proc = subprocess.Popen([sys.executable, "-m", "verbatim_batch.cli", "embed", "--chunks", chunks, "--output",
                             str(out), "--num-cpus", "2", "--run-id", run_id],
                            env=base | {"HF_HUB_OFFLINE": "1", "VERBATIM_BATCH_FAULT": "embed.batch;action=stop"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
        if any(p.status() == psutil.STATUS_STOPPED for p in psutil.Process(proc.pid).children(recursive=True)):
            return proc
    if proc.poll() is None:
        proc.kill()
    raise AssertionError(f"the embed actor never reached its first batch: {proc.communicate()[1][-3000:]}")


def _our_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines and lines[-1].startswith("verbatim-batch embed: error: stage embed stopped: "), done.stderr[-3000:]
    return lines[-1]


def test_a_worker_killed_at_every_batch_stops_the_stage_and_the_run_resumes(chunks, tmp_path):
    """Ray Data alone restarts such a worker forever; here the second restart is refused, the line names the
    worker, the bound and the way on, the run's staging stays, and the same run id then commits."""
    out = tmp_path / "emb"
    done = _embed(chunks, out, "--worker-restarts", "1", "--run-id", "e1",
                  env={"VERBATIM_BATCH_FAULT": "embed.batch"})
    assert done.returncode == EXIT_CODE, done.stderr[-3000:]
    line = _our_line(done)
    assert "EmbedActor" in line and "died more often than --worker-restarts 1 allows" in line, line
    assert "--batch-rows (now 8; --embed-batch-rows in run and nightly)" in line, line
    assert "rerun with the same --run-id to resume" in line
    assert not (out / "manifest.json").exists()
    assert not list(out.parent.glob("*.lock")) and not (out.parent / "emb.lock").exists()
    again = _embed(chunks, out, "--run-id", "e1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "manifest.json").is_file()


def test_a_lost_raylet_ends_the_stage_with_a_line_of_ours_and_the_run_resumes(chunks, tmp_path):
    """The local Ray's raylet SIGKILLed while the embed actor works (frozen by the fault, so the kill lands mid
    batch): Ray's "Raylet is terminated" used to be the last word (exit 1); now one line names the lost node,
    exit 3, and the same run id commits."""
    import signal

    import psutil

    out = tmp_path / "emb"
    proc = _embed_frozen_mid_batch(chunks, out, "n1")
    try:
        raylet = next(p for p in psutil.Process(proc.pid).children(recursive=True) if "raylet" in p.name())
        raylet.send_signal(signal.SIGKILL)
        err = proc.communicate(timeout=600)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_CODE, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err, err[-3000:]
    assert line.startswith("verbatim-batch embed: error: stage embed stopped: it lost this machine's Ray node"), line
    again = _embed(chunks, out, "--run-id", "n1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "manifest.json").is_file()


def test_a_worker_out_of_memory_ends_with_the_figures_and_the_option_to_lower(chunks, tmp_path):
    """Ray's memory monitor kills the embed worker each time it takes memory past Ray's threshold (set 15% above
    what the machine uses now): "infinite oom retries" before; now the stage stops past the bound, with the
    node's use against the threshold and the option that makes a batch smaller."""
    import psutil

    mem = psutil.virtual_memory()
    threshold = min(0.9, (mem.total - mem.available) / mem.total + 0.15)
    hog_mb = int(mem.total * min(0.95, threshold + 0.2) / 2**20)  # past the threshold, whatever else runs
    done = _embed(chunks, tmp_path / "emb", "--worker-restarts", "1",
                  env={"VERBATIM_BATCH_FAULT": f"embed.batch;action=hog;mb={hog_mb}",
                       "RAY_memory_usage_threshold": f"{threshold:.3f}", "RAY_memory_monitor_refresh_ms": "100"})
    assert done.returncode == EXIT_CODE, done.stderr[-3000:]
    line = _our_line(done)
    assert "killed for memory by Ray's memory monitor more often than --worker-restarts 1 allows" in line, line
    assert "against Ray's threshold of" in line, line
    assert "lower --batch-rows (now 8; --embed-batch-rows in run and nightly)" in line, line
    assert not (tmp_path / "emb").exists()  # no run id: nothing to resume, nothing left


def test_the_line_names_the_stage_s_worker_and_the_figures():
    """Ray's memory-monitor message, as Ray 2.60 words it: the stage's own worker is named (not Ray Data's
    bookkeeping actor killed with it), with the node's use against the threshold and what the worker held."""
    from verbatim_batch.engine.worker_faults import _memory_detail, _worker_name

    text = (
        "Memory on the node was 1.18GB used / 23.54GB limit\n"
        "OOM kill reason: Memory usage 1268473856B exceeded threshold of 1263803264B (5.0% of 25276063744B limit)\n"
        "Selected to kill: (Actor(4bd3): job ID=01000000, lease ID=06, task name=ActorLocationTracker:"
        "ActorLocationTracker.__init__, required resources={}, pid=4293, actual memory used=0.05GB, worker ID=5a)\n"
        "Selected to kill: (Task: job ID=01000000, lease ID=07, task name=MapWorker(MapBatches(EmbedActor))."
        "__init__, required resources={CPU: 1}, pid=4323, actual memory used=1.04GB, worker ID=81)\n]")
    assert _worker_name(text) == "MapWorker(MapBatches(EmbedActor))"
    assert _memory_detail(text) == ("the node used 1.27 GB against Ray's threshold of 1.26 GB (+0.00 GB); "
                                    "the worker held 1.04 GB")
    assert _worker_name("no figures at all") == "a worker" and _memory_detail("nothing") == ""


def test_sigterm_mid_stage_ends_with_one_line_143_and_leaves_no_lock(chunks, tmp_path):
    """SIGTERM to the driver (``kill``, a pod's shutdown, a scheduler's timeout) while the embed actor works:
    Python's default would end it at once, leaving its lock; now one line, exit 143, the lock released and the
    named run's staging kept for the rerun, which commits."""
    import signal


    out = tmp_path / "emb"
    proc = _embed_frozen_mid_batch(chunks, out, "t1")
    try:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=600)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("verbatim-batch embed: terminated (SIGTERM); committed work is kept")
    assert not list(tmp_path.glob(".*.lock")), list(tmp_path.iterdir())
    assert list(tmp_path.glob(".emb.staging-t1"))  # a named run's staging: resumable
    again = _embed(chunks, out, "--run-id", "t1")
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.parametrize("error, says", [
    (MemoryError(), "out of memory in this process (MemoryError)"),
    (RuntimeError("can't start new thread"), "cannot start a thread (a process or thread limit"),
])
def test_machine_limits_in_the_driver_end_with_one_line_and_exit_2(monkeypatch, capsys, error, says):
    """A MemoryError or a thread limit in the driver: one line and exit 2, not a traceback; the error path itself
    needs nothing that could fail again."""
    from verbatim_batch.cli import main
    from verbatim_batch.cli.commands import OWN_HANDLERS

    def fail(args):
        raise error

    monkeypatch.setitem(OWN_HANDLERS, "report", fail)
    assert main(["report", "somewhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("verbatim-batch report: error: ") and says in err, err
