"""SIGTERM and Ctrl-C while Ray starts (issue 54, item 5): the documented code and the one line.

``ray.init`` puts a SIGTERM handler of its own in place first thing (exit status 15, no line); a SIGTERM during a
local Ray's start-up of several seconds ended a command so. Real parts: the CLI in its own process, the local Ray
it starts, a real signal sent at a moment of Ray's start-up told by the processes Ray has started so far (its GCS,
its raylet, its first worker), and the Ray processes checked gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

CORPUS = Path(__file__).parent.parent / "verbatim_batch" / "examples" / "corpus"
MOMENTS = {"gcs": "gcs_server", "raylet": "raylet", "worker": "default_worker.py"}
LINES = {signal.SIGTERM: ("terminated (SIGTERM); committed work is kept", 143),
         signal.SIGINT: ("interrupted; committed work is kept", 130)}


def _default_signals() -> None:
    """In the child: SIGINT and SIGTERM at their defaults, as under a terminal or a pod."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _started(proc: psutil.Process, name: str) -> list[psutil.Process]:
    """``proc``'s descendants whose command line names ``name``."""
    found = []
    for child in proc.children(recursive=True):
        try:
            if any(name in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def papers(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("signals") / "papers"
    folder.mkdir()
    name = sorted(p.name for p in CORPUS.glob("*.md"))[0]
    (folder / name).write_bytes((CORPUS / name).read_bytes())
    return folder


@pytest.mark.parametrize("sig, moment", [(signal.SIGTERM, "gcs"), (signal.SIGTERM, "raylet"),
                                         (signal.SIGTERM, "worker"), (signal.SIGINT, "gcs")],
                         ids=["sigterm-gcs", "sigterm-raylet", "sigterm-worker", "sigint-gcs"])
def test_a_signal_while_ray_starts_ends_with_the_code_and_one_line(papers, tmp_path, sig, moment):
    """``chunk`` starting its local Ray; the signal sent once Ray's ``moment`` process is there (SIGTERM to the
    driver, as ``kill`` does; SIGINT to its process group, as a terminal's Ctrl-C does): the documented code, the
    command's one line last, no traceback, nothing committed, and none of the Ray processes left."""
    out = tmp_path / "chunks"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    proc = subprocess.Popen([sys.executable, "-m", "verbatim_batch.cli", "chunk", "--input", str(papers),
                             "--output", str(out), "--num-cpus", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env | {"HF_HUB_OFFLINE": "1"},
                            start_new_session=True, preexec_fn=_default_signals)
    driver = psutil.Process(proc.pid)
    ray_procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 600
        while not _started(driver, MOMENTS[moment]):
            assert proc.poll() is None, f"the command ended before Ray's {moment} started: {proc.stderr.read()}"
            assert time.monotonic() < deadline, f"Ray's {moment} not started within 600 s"
            time.sleep(0.02)
        ray_procs = driver.children(recursive=True)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    line, code = LINES[sig]
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"verbatim-batch chunk: {line}"), err[-3000:]
    assert not (out / "manifest.json").exists()
    _, alive = psutil.wait_procs(ray_procs, timeout=120)
    assert not alive, [p.pid for p in alive]


# A process whose import of the CLI sends it a signal half-way, while ``verbatim_batch.cli.options`` (and so the
# stage registry) is being imported: the moment a signal used to end the command silently (SIGTERM) or with a
# KeyboardInterrupt traceback (SIGINT). The signal is real; only its moment is chosen by an import hook.
_MID_IMPORT = """
import importlib.abc, os, signal, sys

class Fire(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "verbatim_batch.cli.options":
            os.kill(os.getpid(), {signum})
        return None

sys.meta_path.insert(0, Fire())
from verbatim_batch.cli import main
sys.exit(main(["--help"]))
"""


@pytest.mark.parametrize("signum, code, says", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_the_cli_loads_ends_with_the_line_and_the_code(signum, code, says):
    done = subprocess.run([sys.executable, "-c", _MID_IMPORT.format(signum=int(signum))], capture_output=True,
                          text=True, timeout=300, preexec_fn=_default_signals)
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == f"verbatim-batch: {says} while starting; nothing was run", done.stderr[-2000:]
    assert "usage:" not in done.stdout  # it stopped there: --help never ran
