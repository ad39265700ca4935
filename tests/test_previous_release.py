"""A nightly root written by the previous release takes this tree's next night (issue 44, item 5).

Real parts: release 4bc016d's code, taken from this repository's history with `git archive` (the same
dependencies: only the package differs), runs one night in a process of its own; this tree then runs the next
night on the same root, verifies both nights and publishes the old one. The test skips where the history is not
there (a shallow clone, an sdist). It runs whole chains, so it is in the e2e tier (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verbatim_batch.core.runs import read_manifest, read_table

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "verbatim_batch" / "examples"
PREVIOUS = "4bc016d944a12f1e841705e6cec696408c0a5be3"  # the release before the operating issues (39-44)


def _previous_release(dest: Path) -> Path:
    """The previous release's package, extracted from git; skips where the history is not available."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the previous release comes from this repository's history")
    have = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                          capture_output=True)
    if have.returncode != 0:
        pytest.skip(f"release {PREVIOUS[:7]} is not in this clone's history (a shallow clone?)")
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "verbatim_batch", "verbatim_synth"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _cli(cwd: Path, *argv: str, package: Path | None = None) -> subprocess.CompletedProcess:
    """One command in a process of its own, run from ``cwd`` (not the repository: ``python -c`` puts the working
    directory first on the path). With ``package`` (a folder holding ``verbatim_batch``), that one is imported
    (checked), in the driver and in Ray's workers alike (PYTHONPATH)."""
    check = f"assert verbatim_batch.__file__.startswith({str(package)!r}), verbatim_batch.__file__; " \
        if package else ""
    code = f"import sys, verbatim_batch; {check}from verbatim_batch.cli import main; sys.exit(main())"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT", "VERBATIM_BATCH_DRIVER_PID", "PYTHONPATH")}
    env |= {"HF_HUB_OFFLINE": "1"} | ({"PYTHONPATH": str(package)} if package else {})
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1200)


def _night(cwd: Path, run_id: str, package: Path | None = None) -> subprocess.CompletedProcess:
    done = _cli(cwd, "nightly", "--input", "corpus", "--metadata", "corpus/metadata.jsonl", "--queries",
                "queries.jsonl", "--root", "root", "--run-id", run_id, "--num-cpus", "2", "--extract-batch-rows",
                "16", "--embed-batch-rows", "64", package=package)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done


def test_a_root_of_the_previous_release_takes_the_next_night_verifies_and_publishes(tmp_path):
    old = _previous_release(tmp_path / "previous")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for paper in sorted(EXAMPLES.joinpath("corpus").glob("*.md"))[:3]:
        shutil.copy(paper, corpus / paper.name)
    shutil.copy(EXAMPLES / "corpus" / "metadata.jsonl", corpus / "metadata.jsonl")
    queries = (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")

    _night(tmp_path, "n1", package=old)  # the previous release's night
    runs = tmp_path / "root" / "runs"
    assert "resources" not in read_manifest(str(runs / "n1" / "embeddings")).get("runtime", {})  # written by it

    done = _night(tmp_path, "n2")  # this tree's night on the same root
    said = done.stdout + done.stderr
    assert "papers: 3 unchanged, 0 changed, 0 added, 0 removed" in said, said[-3000:]
    chunks = read_manifest(str(runs / "n2" / "chunks"))["counts"]
    assert (chunks["rows_carried"], chunks["rows_new"], chunks["papers_chunked"]) == (3, 0, 0), chunks
    before, after = (read_table(str(runs / r / "chunks"), "chunks").sort_by("chunk_id") for r in ("n1", "n2"))
    for column in ("chunk_id", "paper_id", "text", "start", "end"):  # ids and offsets unchanged
        assert before[column].equals(after[column]), column

    for target in ("root", "root/runs/n1", "root/runs/n2"):  # every span is its chunk's text at its offsets
        checked = _cli(tmp_path, "verify", target)
        assert checked.returncode == 0, (target, (checked.stdout + checked.stderr)[-3000:])
    pytest.importorskip("pyiceberg", reason="the iceberg extra is not installed: publishing is not checked")
    published = _cli(tmp_path, "publish", "root/runs/n1", "--warehouse", "lake")  # an old night, as a table
    assert published.returncode == 0, published.stderr[-3000:]
    assert "night n1 published" in published.stdout + published.stderr
