"""Hostile input, round 4 (issue 34, items 2 and 6): run folders are input, and nights overlap.

Run folders may be damaged (a flipped byte, a cut file), edited or forged (a manifest, ``files.json`` or write
record naming paths outside the run, a symbolic link, a pipe where a Parquet file was): ``verify`` reports each
as a finding (exit 1, one line each, never a traceback) and never reads outside the run; a stage that carries
from such a run does again what it cannot read, with a count. Two nights on one root: the second stops at once
with one line; retention never removes a night in progress or the base it reads.

Most tests run without Ray (the runner with a stage of its own, synthetic run folders, the locks and retention
as functions); the chunk-run tests use the session's local Ray (``ray_local``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.core import storage
from verbatim_batch.core.runs import (
    RUNS_DIR,
    acquire_lock,
    completed_keys,
    current_run,
    prune_runs,
    read_files_index,
    read_manifest,
    read_readable,
    read_writes,
    release_lock,
)
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Plan, RunOptions, StageContext, TableStage, Work
from verbatim_batch.quality.verify import verify_run

ROWS = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.int64())])
VALUES = {f"k{i}": i for i in range(6)}


# --- a stage of its own, run in the driver (no Ray) ----------------------------------------------------------


@dataclass(kw_only=True)
class RowsJob(RunOptions):
    input: str  # JSON {key: value}
    strict_previous: bool = False  # read the previous run whole (a damaged file then stops the read)


class RowsStage(TableStage):
    command = "rows"
    tables = {"rows": ROWS}
    key_column = "key"
    needs_ray = False

    def plan(self) -> Plan:
        return Plan(config={"input": self.job.input}, inputs=(self.job.input,))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        values = json.loads(Path(self.job.input).read_text(encoding="utf-8"))
        return Work(keys=pa.array(sorted(values), pa.string()), n_in=len(values), data=values)

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> list[str]:
        folder = os.path.join(previous, "rows")
        old = pq.read_table(folder) if self.job.strict_previous else read_readable(folder)[0]
        return [r["key"] for r in (old.to_pylist() if old is not None else []) if work.data.get(r["key"]) == r["value"]]

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext):
        skipped = set(skip.to_pylist())
        keys = [k for k in work.keys.to_pylist() if k not in skipped]
        for i in range(0, len(keys), 2):  # files of two rows
            yield pa.table({"key": keys[i:i + 2], "value": [work.data[k] for k in keys[i:i + 2]]}, schema=ROWS)


def rows_run(tmp_path: Path, name: str, previous: str | None = None, strict: bool = False) -> tuple[str, dict]:
    src = tmp_path / "in.json"
    src.write_text(json.dumps(VALUES), encoding="utf-8")
    return run_stage(RowsStage(RowsJob(input=str(src), output=str(tmp_path / name), previous=previous,
                                       strict_previous=strict)))


def values_of(run: str) -> dict[str, int]:
    return {r["key"]: r["value"] for r in pq.read_table(os.path.join(run, "rows")).to_pylist()}


def broken(path: Path) -> int:
    """Flip one byte of a Parquet file where it makes the data unreadable (a decompression or decoding
    error, as a disk or a copy can make), and return where: the first such byte after the magic number."""
    data = path.read_bytes()
    for pos in range(4, len(data) - 8):
        changed = bytearray(data)
        changed[pos] ^= 0xFF
        path.write_bytes(bytes(changed))
        try:
            pq.read_table(path)
        except (OSError, pa.ArrowException):
            return pos
    raise AssertionError(f"no single flipped byte breaks {path}")


def one_line_findings(errors: list[str]) -> None:
    assert errors, "no finding"
    for e in errors:
        assert "\n" not in e and "Traceback" not in e and len(e) < 600, e


# --- 2. carrying from a damaged previous run ------------------------------------------------------------------


def test_an_unreadable_previous_file_is_not_carried_and_its_rows_are_done_again(tmp_path):
    prev, _ = rows_run(tmp_path, "night1")
    victim = sorted(Path(prev, "rows").glob("*.parquet"))[0]
    broken(victim)
    out, manifest = rows_run(tmp_path, "night2", previous=prev)
    counts = manifest["counts"]
    assert values_of(out) == VALUES
    assert counts["carried_files.unreadable"] == 1 and counts["rows_carried"] == 4 and counts["rows_new"] == 2
    assert verify_run(out)["errors"] == []


def test_a_previous_run_the_stage_cannot_read_carries_nothing(tmp_path):
    prev, _ = rows_run(tmp_path, "night1")
    broken(sorted(Path(prev, "rows").glob("*.parquet"))[1])
    out, manifest = rows_run(tmp_path, "night2", previous=prev, strict=True)  # its own read of it fails
    counts = manifest["counts"]
    assert values_of(out) == VALUES and counts["rows_carried"] == 0 and counts["rows_new"] == 6
    assert counts["carried_files.previous_unreadable"] == 1


def test_a_pipe_or_link_in_a_previous_run_is_never_opened(tmp_path):
    prev, _ = rows_run(tmp_path, "night1")
    files = sorted(Path(prev, "rows").glob("*.parquet"))
    files[0].unlink()
    os.mkfifo(files[0])  # reading it would block forever
    outside = tmp_path / "outside.parquet"
    pq.write_table(pa.table({"key": ["k2", "k3"], "value": [200, 300]}, schema=ROWS), outside)
    files[1].unlink()
    files[1].symlink_to(outside)
    t0 = time.monotonic()
    out, manifest = rows_run(tmp_path, "night2", previous=prev)
    assert time.monotonic() - t0 < 60
    assert values_of(out) == VALUES, "rows of a file outside the previous run were carried"
    assert manifest["counts"]["carried_files.unreadable"] == 2


def test_forged_files_json_entries_are_left_out_and_trust_nothing(tmp_path):
    prev, _ = rows_run(tmp_path, "night1")
    index = json.loads(Path(prev, "files.json").read_text())
    name = sorted(index["rows"])[0]
    index["rows"]["../../../outside.parquet"] = index["rows"][name]
    index["rows"][name] = dict(index["rows"][name], rows="many")
    index["../elsewhere"] = {}
    Path(prev, "files.json").write_text(json.dumps(index))
    got, problems = read_files_index(prev)
    assert set(got) == {"rows"} and name not in got["rows"] and len(problems) == 3
    out, manifest = rows_run(tmp_path, "night2", previous=prev)
    assert values_of(out) == VALUES and manifest["counts"]["rows_carried"] == 4  # the forged entry's file: redone
    for text in ("{not json", "[" * 100_000, "[]"):
        Path(prev, "files.json").write_text(text)
        assert read_files_index(prev)[0] == {}
        out, manifest = rows_run(tmp_path, f"night-{len(text)}", previous=prev)
        assert values_of(out) == VALUES and manifest["counts"]["rows_carried"] == 0


def test_forged_write_records_never_reach_outside_the_staging_folder(tmp_path):
    staging = tmp_path / "run" / ".out.staging-x"
    (staging / "_writes").mkdir(parents=True)
    (staging / "rows").mkdir()
    victim = tmp_path / "victim.parquet"
    victim.write_bytes(b"a user's file")
    stats = {"table": "rows", "rows": 1, "bytes": 10, "digest": "blake2b:" + "0" * 32, "counts": {}}
    forged = [
        {"stats": {"../../victim.parquet": stats}, "keys": ["k0"]},
        {"stats": {}, "replaces": ["../../../victim.parquet"], "keys": []},
        {"stats": {}, "keys_file": "../../victim.parquet"},
        {"stats": {"rows/part-a.parquet": dict(stats, rows=-1)}, "keys": ["k1"]},
        ["not", "a", "record"],
    ]
    for i, rec in enumerate(forged):
        (staging / "_writes" / f"part-{i}.json").write_text(json.dumps(rec))
    (staging / "_writes" / "part-deep.json").write_text("[" * 100_000)
    assert read_writes(str(staging)) == []
    assert completed_keys(str(staging)).to_pylist() == [] and victim.read_bytes() == b"a user's file"
    # a record whose keys file cannot be read: the record goes (its write is done again), nothing else
    pq.write_table(pa.table({"key": ["k9"], "value": [9]}, schema=ROWS), staging / "rows" / "part-b.parquet")
    (staging / "_writes" / "part-b.keys.parquet").write_bytes(b"PAR1 not parquet PAR1")
    (staging / "_writes" / "part-b.json").write_text(json.dumps(
        {"stats": {"rows/part-b.parquet": stats}, "keys_file": "part-b.keys.parquet"}))
    assert completed_keys(str(staging)).to_pylist() == []
    assert not (staging / "_writes" / "part-b.json").exists() and not (staging / "rows" / "part-b.parquet").exists()


# --- 2. verify on damaged, edited and forged runs (no Ray: a run of the stage above) ---------------------------


def test_verify_reports_every_damaged_byte_as_a_finding(tmp_path, capsys):
    from verbatim_batch.cli import main

    run, _ = rows_run(tmp_path, "run")
    assert verify_run(run)["errors"] == []
    victim = sorted(Path(run, "rows").glob("*.parquet"))[0]
    original = victim.read_bytes()
    for pos in range(0, len(original), max(1, len(original) // 40)):
        changed = bytearray(original)
        changed[pos] ^= 0xFF
        victim.write_bytes(bytes(changed))
        result = verify_run(run)
        one_line_findings(result["errors"])
        assert any(victim.name in e for e in result["errors"]), (pos, result["errors"])
    victim.write_bytes(original[: len(original) // 2])  # cut short
    assert main(["verify", run]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and any("unreadable" in e for e in json.loads(out)["errors"])


def test_verify_never_reads_outside_the_run_whatever_the_manifest_says(tmp_path, monkeypatch):
    run, _ = rows_run(tmp_path, "run")
    outside, _ = rows_run(tmp_path, "outside-X")
    manifest = json.loads(Path(run, "manifest.json").read_text())
    manifest["tables"]["../outside-X/rows"] = {"rows": 6, "files": 3}
    manifest["tables"][str(Path(outside, "rows"))] = {"rows": 6, "files": 3}
    Path(run, "manifest.json").write_text(json.dumps(manifest))
    (Path(run) / "linked").symlink_to(Path(outside, "rows"))  # a table folder that is a link
    manifest["tables"]["linked"] = {"rows": 6, "files": 3}
    Path(run, "manifest.json").write_text(json.dumps(manifest))
    first = sorted(Path(run, "rows").glob("*.parquet"))[0]
    first.unlink()
    first.symlink_to(sorted(Path(outside, "rows").glob("*.parquet"))[0])  # a file that is a link
    os.mkfifo(Path(run, "rows", "part-zz.parquet"))  # a pipe: never opened

    seen: list[str] = []
    original = storage.resolve

    def watched(loc: str):
        seen.append(storage.normalize(loc))
        return original(loc)

    monkeypatch.setattr(storage, "resolve", watched)
    t0 = time.monotonic()
    result = verify_run(run)
    assert time.monotonic() - t0 < 30
    one_line_findings(result["errors"])
    said = " | ".join(result["errors"])
    assert "not a table name" in said and "linked/: a link" in said and "part-zz.parquet: not a plain file" in said
    assert f"{first.name}: not a plain file" in said
    opened = [p for p in seen if not p.startswith(run + os.sep) and p != run]
    assert opened == [], opened
    # a composite whose stages name folders outside it, or a stage that is a link
    comp = tmp_path / "nightlike"
    comp.mkdir()
    (comp / "spans").symlink_to(outside)
    (comp / "manifest.json").write_text(json.dumps({"run_id": "n1", "command": "nightly", "stages": [
        "../outside-X", "/etc", "spans", "missing"]}))
    seen.clear()
    result = verify_run(str(comp))
    assert result["n_errors"] == 4 and result["stages"] == {}
    assert [p for p in seen if not p.startswith(str(comp))] == []


def test_verify_reports_a_forged_manifest_and_report_refuses_it(tmp_path, capsys):
    from verbatim_batch.cli import main

    run, _ = rows_run(tmp_path, "run")
    manifest = json.loads(Path(run, "manifest.json").read_text())
    manifest["tables"]["rows"] = {"rows": "six", "files": 3}
    manifest["created_at"] = "yesterday"
    Path(run, "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", run]) == 1
    out, err = capsys.readouterr()
    errors = json.loads(out)["errors"]
    one_line_findings(errors)
    assert any("rows and files are not counts" in e for e in errors) and any("created_at" in e for e in errors)
    assert main(["report", run]) == 2
    err = capsys.readouterr().err.strip()
    assert "damaged or forged" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="damaged or forged"):
        read_manifest(run)
    Path(run, "manifest.json").write_text(" " * (65 << 20))  # over the bound: never parsed
    with pytest.raises(ValueError, match="MiB"):
        read_manifest(run)


def test_verify_of_a_damaged_extract_run_and_the_sources_its_config_names(tmp_path, capsys):
    """A synthetic extract run (spans and pairs tables, a manifest) whose config names a pipe as its pairs file
    and a folder that is not a chunk run: neither is opened; a damaged spans file is a finding."""
    from verbatim_batch.cli import main

    run = tmp_path / "spans-run"
    (run / "spans").mkdir(parents=True)
    (run / "pairs").mkdir()
    spans = pa.table({"pair_id": ["p1"], "chunk_id": ["c1"], "paper_id": ["a"], "start": [0], "end": [4],
                      "paper_start": [None], "paper_end": [None], "text": ["Some"]},
                     schema=pa.schema([("pair_id", pa.string()), ("chunk_id", pa.string()), ("paper_id", pa.string()),
                                       ("start", pa.int32()), ("end", pa.int32()), ("paper_start", pa.int32()),
                                       ("paper_end", pa.int32()), ("text", pa.string())]))
    pq.write_table(spans, run / "spans" / "part-a.parquet", compression="zstd")
    pq.write_table(spans, run / "spans" / "part-b.parquet", compression="zstd")
    pq.write_table(pa.table({"pair_id": ["p1"], "n_spans": [2]}), run / "pairs" / "part-a.parquet")
    os.mkfifo(tmp_path / "pairs.jsonl")
    (tmp_path / "notachunkrun" / "chunks").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "run_id": "e1", "command": "extract", "tables": {"spans": {"rows": 2, "files": 2},
                                                         "pairs": {"rows": 1, "files": 1}},
        "config": json.dumps({"pairs": str(tmp_path / "pairs.jsonl"), "chunks": str(tmp_path / "notachunkrun")})}))
    assert verify_run(str(run))["errors"] == []
    broken(run / "spans" / "part-b.parquet")
    t0 = time.monotonic()
    assert main(["verify", str(run)]) == 1
    assert time.monotonic() - t0 < 30
    out, err = capsys.readouterr()
    result = json.loads(out)
    one_line_findings(result["errors"])
    assert any("spans/part-b.parquet: unreadable" in e for e in result["errors"]) and "Traceback" not in err


# --- 2. chunk runs: verify and chunk --previous on a flipped byte (the session's local Ray) -------------------


PAPER = "# {t}\n\n## Introduction\n\nWe study {t} on real data. It works.\n\n## Method\n\nDetails of {t} here.\n"


@pytest.fixture(scope="module")
def chunk_run(ray_local, tmp_path_factory):
    from verbatim_batch.corpus.chunker import ChunkerConfig
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    root = tmp_path_factory.mktemp("round4-chunks")
    (root / "c").mkdir()
    for k in range(4):
        (root / "c" / f"p{k}.md").write_text(PAPER.format(t=f"paper {k}"))
    out, _ = run_chunk(ChunkJob(input=str(root / "c"), output=str(root / "run"), chunker=ChunkerConfig(min_chars=0)))
    return root, Path(out)


@pytest.mark.parametrize("table", ["papers", "chunks"])
def test_verify_and_chunk_previous_with_a_flipped_byte(chunk_run, tmp_path, capsys, table):
    from verbatim_batch.cli import main
    from verbatim_batch.corpus.chunker import ChunkerConfig
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    root, run = chunk_run
    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    broken(sorted((damaged / table).glob("*.parquet"))[0])
    assert main(["verify", str(damaged), "--num-cpus", "1"]) == 1  # was: OSError: ZSTD decompression failed
    out, err = capsys.readouterr()
    errors = json.loads(out)["errors"]
    one_line_findings(errors)
    assert any(f"{table}/part-" in e and "unreadable" in e for e in errors) and "Traceback" not in err
    new, manifest = run_chunk(ChunkJob(input=str(root / "c"), output=str(tmp_path / "new"), previous=str(damaged),
                                       chunker=ChunkerConfig(min_chars=0)))  # was: rc 1 with the same error
    counts = manifest["counts"]
    assert counts["papers"] == 4 and counts["papers_unchanged"] == 0 and counts["previous_papers_rejected"] == 4
    assert verify_run(new)["errors"] == []


# --- 6. overlapping nights on one root --------------------------------------------------------------------------


def _committed(runs: Path, run_id: str, created: str) -> None:
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / "manifest.json").write_text(json.dumps({
        "run_id": run_id, "command": "nightly", "schema_version": "1", "created_at": created, "tables": {},
        "config": "{}"}))


def test_a_second_nightly_on_a_root_stops_at_once_with_one_line(tmp_path, capsys):
    from verbatim_batch.cli import main

    root = tmp_path / "root"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text(PAPER.format(t="a"))
    (tmp_path / "q.jsonl").write_text(json.dumps({"query": "what"}) + "\n")
    lock = acquire_lock(str(root / RUNS_DIR), "night-1", info={"base": None})  # a night going on (this process)
    try:
        t0 = time.monotonic()
        rc = main(["nightly", "--input", str(corpus), "--queries", str(tmp_path / "q.jsonl"), "--root", str(root),
                   "--run-id", "night-2"])
        assert rc == 2 and time.monotonic() - t0 < 20
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "another nightly is running" in err and "night-1" in err
        assert sorted(os.listdir(root)) == [".runs.lock"], "the second night wrote something"
    finally:
        release_lock(lock)
    assert sorted(os.listdir(root)) == []


def test_retention_keeps_a_night_in_progress_and_the_base_it_reads(tmp_path):
    root = tmp_path / "root"
    runs = root / RUNS_DIR
    for i, run_id in enumerate(("r1", "r2", "r3")):
        _committed(runs, run_id, f"2026-01-0{i + 1}T00:00:00+00:00")
    (root / "CURRENT").write_text("r3\n")
    (runs / "n-live").mkdir()
    (runs / "n-live" / "_run.json").write_text(json.dumps({"run_id": "n-live", "settings_hash": "x"}))
    os.utime(runs / "n-live" / "_run.json", (0, 0))  # started before the newest commit
    night = acquire_lock(str(root / RUNS_DIR), "n-live", info={"base": "r1"})
    own = acquire_lock(str(runs / "n-live"), "n-live")
    try:
        assert prune_runs(str(root), keep=1, protect=("r3",)) == ["r2"]  # r1: the live night's base
        assert sorted(os.listdir(runs)) == [".n-live.lock", "n-live", "r1", "r3"]
    finally:
        release_lock(own)
        release_lock(night)
    assert prune_runs(str(root), keep=1, protect=("r3",)) == ["n-live", "r1"]  # the night is over


def test_a_forged_current_pointer_or_manifest_under_runs_is_never_followed_or_pruned(tmp_path):
    root = tmp_path / "root"
    runs = root / RUNS_DIR
    _committed(runs, "r1", "2026-01-01T00:00:00+00:00")
    _committed(runs, "r2", "2026-01-02T00:00:00+00:00")
    (runs / "odd").mkdir()
    (runs / "odd" / "manifest.json").write_text(json.dumps({
        "run_id": "odd", "command": "nightly", "schema_version": "1", "created_at": "not a time"}))
    for text in ("../../etc\n", "r1/../../x", "x" * 10_000, ""):
        (root / "CURRENT").write_text(text)
        assert current_run(str(root)) is None
    assert prune_runs(str(root), keep=1) == ["r1"] and sorted(os.listdir(runs)) == ["odd", "r2"]
