"""Kill-and-resume: a nightly run killed with SIGKILL at several points, rerun with the same run id,
ends with exactly the tables of an uninterrupted run; worker crashes and transient errors are absorbed.

Faults are injected with VERBATIM_BATCH_FAULT (see verbatim_batch/core/faults.py): the process that reaches
the named point (or, with target=driver, the driver) is sent SIGKILL, as the OOM killer would.
"""

from __future__ import annotations

import json
import signal

import pytest
from helpers import assert_same_run, nightly

from verbatim_batch.core.runs import read_manifest

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def baseline(nightly_baseline, tmp_path_factory):
    """The session's uninterrupted night (conftest), and a folder of this module's own for the runs it kills."""
    return nightly_baseline | {"tmp": tmp_path_factory.mktemp("resume")}


# Kill points in pipeline order. Each run of the chain is killed at the next point, so every rerun
# resumes from what the killed ones left behind (staging folders, completed writes, committed stages).
KILL_POINTS = [
    ("reading", "chunk.read#1;target=driver"),  # a read task kills the driver while papers are read
    ("chunk-write", "sink.write#2@{marker};target=driver"),  # a write task has some tables on disk, not its record
    ("embed-commit", "commit#2"),  # the driver dies committing the embeddings stage (chunks committed)
    ("mid-extract", "extract.batch#2@{marker};target=driver"),  # the second extraction batch is being computed
    ("extract-write", "sink.recorded:spans#1@{marker};target=driver"),  # one extract write done, the stage not
    ("final-commit", "commit#2"),  # every stage committed (spans here: #1), the run's own manifest not yet
    ("after-commit", "nightly.committed"),  # the run committed, `current` not moved yet
]


def test_killed_run_resumes_to_identical_tables(baseline):
    """SIGKILL at seven points, one after another, each rerun with the same run id; then identical tables."""
    tmp = baseline["tmp"] / "killed"
    tmp.mkdir()
    root = tmp / "root"
    for i, (point, spec) in enumerate(KILL_POINTS):
        spec = spec.format(marker=tmp / f"fired-{i}")
        killed = nightly(root, baseline["corpus"], "r1", env={"VERBATIM_BATCH_FAULT": spec}, check=False)
        log = (killed.stdout + killed.stderr)[-3000:]
        assert killed.returncode == -signal.SIGKILL, f"not killed at {point}: {log}"
        assert (root / "runs" / "r1" / "manifest.json").exists() == (point == "after-commit"), point
        assert not (root / "current").exists(), point
    spans = read_manifest(str(root / "runs" / "r1" / "spans"))["counts"]  # committed before the last kill
    # 20 pairs in blocks of 16 and 4: whichever write finished first (before the kill) is kept, not redone.
    assert spans["rows_resumed"] in (4, 16, 20), "the extract write done before the kill was redone"
    assert spans["rows_new"] == spans["pairs"] - spans["rows_resumed"]
    resumed = nightly(root, baseline["corpus"], "r1")
    assert "committed" in resumed.stdout
    assert_same_run(root, baseline["root"])
    assert not list((root / "runs" / "r1").glob(".*staging*")), "staging folders left behind"


def test_actor_crash_and_transient_error_are_absorbed(baseline):
    """An extraction actor killed mid-run is restarted by Ray; a batch that raises once is retried;
    the run completes in one go with the same tables, and the retry is in the manifest."""
    tmp = baseline["tmp"] / "absorbed"
    tmp.mkdir()
    root = tmp / "root"
    faults = f"extract.batch#2@{tmp / 'fired'}|embed.batch@{tmp / 'raised'};action=raise"  # both in one run
    done = nightly(root, baseline["corpus"], "r1", env={"VERBATIM_BATCH_FAULT": faults})
    assert (tmp / "fired").exists(), "the actor kill never fired"
    assert (tmp / "raised").exists(), "the transient error never fired"
    assert "committed" in done.stdout
    counts = json.loads((root / "runs" / "r1" / "manifest.json").read_text())["counts"]
    assert counts["embeddings.stage_retries"] == 1
    assert_same_run(root, baseline["root"])


def test_rerun_of_a_committed_run_changes_nothing(baseline):
    root = baseline["root"]
    before = {p: p.stat().st_mtime_ns for p in (root / "runs" / "r1").rglob("*.parquet")}
    again = nightly(root, baseline["corpus"], "r1")
    assert "committed" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (root / "runs" / "r1").rglob("*.parquet")} == before
