"""The guide's local-cluster example (docs/cluster.md, the bash block after ``<!-- cluster-example -->``; it was
the README's), run as written: it starts a Ray head of its own, submits jobs/chunk.py on the bundled corpus with
``ray job submit`` (token auth), waits for it and stops that head. It replaces tests/test_jobs.py, which
submitted the same job to a LocalRayCluster (the same work, run once: CI time).

The block runs in ``bash -e`` from the repository root with this environment's ``bin`` first on PATH, in a process
group of its own; whatever of that group is still alive at the end (a head left by a failed step) is killed by
its group id, so no other Ray on the machine is ever touched. HOME is a fresh folder, so the block also makes its
own token, as on a new machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PAGE = REPO / "docs" / "cluster.md"
BIN = Path(sys.executable).parent
TIMEOUT_S = 420  # one try; a head that died while starting (an overloaded machine) is given one more
FILES = re.compile(r"this example's files: (/tmp/vb-\w+)")


def _block() -> str:
    found = re.search(r"<!-- cluster-example -->\s*```bash\n(.*?)```", EXAMPLE_PAGE.read_text(), re.S)
    assert found, "docs/cluster.md has no cluster example"
    return found.group(1)


def _group_alive(pgid: int) -> list[str]:
    import psutil

    alive = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                alive.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}")
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return alive


def _run(block: str, env: dict[str, str]) -> tuple[int, str, list[str]]:
    """``(rc, output, processes of the block's group still alive once it ended)``; the group is then killed."""
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", block], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = -1
    left: list[str] = []
    for _ in range(40):  # the block's last line waits for `ray start`; its children may take a moment more
        left = _group_alive(proc.pid)
        if not left:
            break
        time.sleep(0.5)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return rc, out, left


def test_guide_cluster_example_runs_as_written(tmp_path):
    if (shutil.which("ray", path=str(BIN)) or shutil.which("ray")) is None:
        pytest.skip("the `ray` CLI is not installed")
    block = _block()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env |= {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    folders: list[str] = []
    try:
        for attempt in range(2):
            rc, out, left = _run(block, env)
            folders += FILES.findall(out)
            if rc == 0 or "submitted successfully" in out or attempt:
                break
            head_log = Path(folders[-1], "head.log") if folders else None
            print(f"the head did not start (rc {rc}), once more; its log ends:\n"  # for the CI log
                  f"{head_log.read_text()[-3000:] if head_log and head_log.exists() else out[-3000:]}")
        assert rc == 0, out[-6000:]
        assert "succeeded" in out, out[-6000:]
        assert not left, f"the example left its head running: {left}"
        run = Path(folders[-1]) / "chunks"
        n_md = len(list((REPO / "verbatim_batch/examples/corpus").glob("*.md")))
        assert pq.read_table(run / "papers").num_rows == n_md
        assert pq.read_table(run / "chunks").num_rows >= n_md and (run / "manifest.json").exists()
        assert (tmp_path / "home" / ".ray" / "auth_token").exists()  # the block made the token it used
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
