"""Run folders and concurrency (issue 22): what the tool may delete and what it never touches, symlinked
outputs, a second writer on one output, a Ray address with nothing behind it, file names that are not UTF-8,
and runs of the wrong kind. Real files, real processes; no Ray is started here (the Ray case runs the CLI in
a subprocess that must give up within its bound)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verbatim_batch.cli import main
from verbatim_batch.core import storage
from verbatim_batch.core.runs import (
    RUNS_DIR,
    OutputBusyError,
    OutputExistsError,
    build_manifest,
    prune_runs,
    staged,
    write_manifest,
)

REPO = Path(__file__).resolve().parents[1]


def fake_run(path: Path, run_id: str, command: str = "chunk", created: str | None = None) -> Path:
    """A committed run folder as the tool writes it (a manifest of ours, one table)."""
    (path / "papers").mkdir(parents=True)
    (path / "papers" / "part-0.parquet").write_bytes(b"PAR1")
    manifest = build_manifest(run_id=run_id, command=command, config={}, inputs=[], tables={}, counts={},
                              timings_s={})
    if created:
        manifest["created_at"] = created
    write_manifest(str(path), manifest)
    return path


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_retention_deletes_only_runs_this_tool_wrote(tmp_path):
    root = tmp_path / "root"
    runs = root / RUNS_DIR
    for i in range(3):
        fake_run(runs / f"n{i}", f"n{i}", created=f"2030-11-0{i + 1}T00:00:00+00:00")  # after the unfinished one
    (runs / "my-notes").mkdir()
    (runs / "my-notes" / "notes.txt").write_text("mine")
    elsewhere = fake_run(tmp_path / "elsewhere", "other", created="2026-10-01T00:00:00+00:00")
    os.symlink(elsewhere, runs / "linked")
    (runs / "unfinished-of-ours").mkdir()
    (runs / "unfinished-of-ours" / "_run.json").write_text(json.dumps({"run_id": "unfinished-of-ours"}))
    removed = prune_runs(str(root), keep=1)
    assert removed == ["n0", "n1", "unfinished-of-ours"]
    assert (runs / "my-notes" / "notes.txt").read_text() == "mine"
    assert (runs / "linked").is_symlink() and (elsewhere / "manifest.json").is_file()
    assert (runs / "n2" / "manifest.json").is_file()


def test_a_symlinked_output_is_refused_and_what_it_points_to_is_untouched(tmp_path, capsys):
    other = fake_run(tmp_path / "other-run", "r0")
    before = sorted(p.relative_to(other) for p in other.rglob("*"))
    link = tmp_path / "latest"
    os.symlink(other, link)
    with pytest.raises(OutputExistsError, match="symbolic link"):
        with staged(str(link), overwrite=True):
            pass
    rc = main(["chunk", "--input", str(REPO / "verbatim_batch" / "examples" / "corpus"), "--output", str(link),
               "--overwrite"])
    assert rc == 2 and "symbolic link" in one_line(capsys.readouterr().err)
    assert sorted(p.relative_to(other) for p in other.rglob("*")) == before
    assert sorted(os.listdir(tmp_path)) == ["latest", "other-run"], "stray folders beside the output"
    storage.rmtree(str(link))  # deleting a symlink removes the link, never what it points to
    assert not link.exists() and (other / "manifest.json").is_file()


HOLDER = """
import sys, time
from verbatim_batch.core.runs import acquire_lock
acquire_lock(sys.argv[1], "first")
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_writer_fails_at_once_and_a_dead_writers_lock_is_taken_over(tmp_path):
    out = tmp_path / "spans"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        staging = tmp_path / ".spans.staging-first"
        staging.mkdir()  # the first writer's work in progress
        t0 = time.monotonic()
        with pytest.raises(OutputBusyError, match=r"being written by another run \(run first, pid"):
            with staged(str(out), run_id="second"):
                pass
        assert time.monotonic() - t0 < 5 and staging.is_dir(), "the loser touched the winner's staging folder"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with staged(str(out), run_id="third") as run:  # the holder is gone: its lock is stale
        assert Path(run.staging).is_dir()
    assert not (tmp_path / ".spans.lock").exists(), "the lock outlived its run"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_with_nothing_behind_it_is_one_line_within_a_bound(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_ADDRESS": f"127.0.0.1:{_free_port()}"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "verbatim_batch.cli", "chunk", "--input",
                           str(REPO / "verbatim_batch" / "examples" / "corpus"), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    line = one_line(done.stderr)
    assert "no Ray cluster answers" in line and "RAY_ADDRESS" in line
    assert time.monotonic() - t0 < 90
    assert not (tmp_path / "out").exists()


def test_a_file_name_that_is_not_utf8_is_one_quarantine_row(tmp_path):
    from verbatim_batch.corpus import readers as corpus

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "good.md").write_text("# A paper\n\nSome text.\n")
    with open(os.fsencode(folder) + b"/caf\xe9.md", "wb") as fh:
        fh.write(b"# Another\n\nText.\n")
    os.mkdir(os.fsencode(folder) + b"/sub\xff")
    _, files = corpus.list_sources(str(folder), "md")
    problems = {f.path: f.problem for f in files}
    assert problems[str(folder / "good.md")] is None
    bad = {p: why for p, why in problems.items() if why}
    assert sorted(bad) == [str(folder / "caf\\xe9.md"), str(folder / "sub\\xff")]
    assert all(why.startswith("undecodable_name:") for why in bad.values())
    assert all(p.encode("utf-8") for p in problems)  # every source is a value a table can hold


def test_runs_of_the_wrong_kind_are_one_line_and_exit_2(tmp_path, capsys):
    index = str(fake_run(tmp_path / "index", "i1", command="index"))
    chunks = str(fake_run(tmp_path / "chunks", "c1", command="chunk"))
    embed = str(fake_run(tmp_path / "embed", "e1", command="embed"))
    cases = [
        # an input is checked by the tables it holds (Stage.reads), whichever command wrote it
        (["embed", "--chunks", index], "--chunks expects a committed run holding chunks; "),
        (["extract", "--retrieval", chunks], "--retrieval expects a committed run holding retrieval; "),
        (["retrieve", "--index", embed, "--queries", str(REPO / "verbatim_batch" / "examples" / "queries.jsonl")],
         "--index expects a committed run holding ids; "),
        (["index", "--embeddings", chunks, "--chunks", chunks], "--embeddings expects a committed run holding "
         "embeddings; "),
    ]
    for argv, message in cases:
        rc = main([*argv, "--output", str(tmp_path / "out")])
        line = one_line(capsys.readouterr().err)
        assert rc == 2 and message in line, (argv, line)
    assert not (tmp_path / "out").exists()
