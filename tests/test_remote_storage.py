"""Run folders on an object store: every job writes to s3:// as it does to a local folder.

The store is moto's S3 server on loopback (tests/s3server.py), reached through pyarrow's real S3 client,
from this process and from the Ray workers of each `verbatim-batch nightly` process.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import EXAMPLES, PAPERS, assert_tables_match, nightly
from s3server import environment, s3_server

from verbatim_batch.core import faults, storage
from verbatim_batch.core.faults import InjectedFault
from verbatim_batch.core.runs import (
    RUNS_DIR,
    OutputExistsError,
    build_manifest,
    committed_run,
    completed_keys,
    current_run,
    current_table,
    publish,
    read_manifest,
    record_write,
    staged,
)
from verbatim_batch.engine.runner import write_report
from verbatim_batch.quality.verify import verify_run

BUCKET = "verbatim-test"


@pytest.fixture(scope="module")
def s3():
    with s3_server(BUCKET) as env, environment(env):
        yield env


@pytest.fixture(params=["local", "s3", "fsspec-memory"])
def where(request, tmp_path, s3, monkeypatch):
    """A fresh folder location: a local path, an s3:// prefix (pyarrow's S3 client), or a memory:// one
    (a file system pyarrow does not know, reached through fsspec)."""
    monkeypatch.setenv("VERBATIM_BATCH_CACHE", str(tmp_path / "cache"))
    name = request.node.name.replace("[", "-").strip("]")
    return {"local": str(tmp_path / "store"), "s3": f"s3://{BUCKET}/{name}",
            "fsspec-memory": f"memory://{BUCKET}/{name}"}[request.param]


def _manifest(run_id: str) -> dict:
    return build_manifest(run_id=run_id, command="test", config={}, inputs=[], tables={"t": {"rows": 3, "files": 1}},
                          counts={}, timings_s={})


def test_file_operations(where):
    table = pa.table({"x": [1, 2, 3], "s": ["a", "é", "😀"]})
    storage.write_parquet(table, storage.join(where, "t", "part-0.parquet"))
    storage.write_text(storage.join(where, "notes", "a.json"), '{"k": "v"}')
    assert storage.read_parquet(storage.join(where, "t")).equals(table)
    assert storage.read_text(storage.join(where, "notes", "a.json")) == '{"k": "v"}'
    assert storage.listdir(where) == ["notes", "t"]
    assert storage.walk_files(where) == ["notes/a.json", "t/part-0.parquet"]
    assert storage.isdir(storage.join(where, "t")) and storage.isfile(storage.join(where, "notes", "a.json"))
    assert not storage.exists(storage.join(where, "nothing")) and storage.listdir(storage.join(where, "nothing")) == []
    with pytest.raises(FileNotFoundError):
        storage.read_text(storage.join(where, "nothing.json"))
    storage.rmtree(storage.join(where, "notes"))
    assert storage.walk_files(where) == ["t/part-0.parquet"]
    local = storage.local_copy(where, "v1")
    assert (Path(local) / "t" / "part-0.parquet").exists()
    assert storage.local_copy(where, "v1") == local


def test_download_cache_keeps_the_folders_used_last(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("VERBATIM_BATCH_CACHE", str(tmp_path / "cache"))
    loc = f"s3://{BUCKET}/cache-test"
    storage.write_text(storage.join(loc, "dense", "index.faiss"), "v1")
    first = storage.local_copy(loc, "run-1", keep=2)
    storage.write_text(storage.join(loc, "dense", "index.faiss"), "v2")  # (runs never change; versions do)
    second = storage.local_copy(loc, "run-2", keep=2)
    assert (Path(first) / "dense" / "index.faiss").read_text() == "v1"
    assert (Path(second) / "dense" / "index.faiss").read_text() == "v2"
    assert storage.local_copy(loc, "run-1", keep=2) == first  # cached: not downloaded again
    third = storage.local_copy(loc, "run-3", keep=2)
    assert sorted(Path(tmp_path / "cache" / "remote").iterdir()) == sorted([Path(first), Path(third)])
    assert Path(third).is_dir() and not Path(second).exists()  # run-2 was the least recently used


def test_object_store_copy_puts_the_manifest_last(s3, tmp_path, monkeypatch):
    src = f"s3://{BUCKET}/copy-order/src"
    names = ["a/part-0.parquet", "b/part-0.parquet", "manifest.json", "report.json", "t/part-0.parquet"]
    for name in names:
        storage.write_text(storage.join(src, name), name)
    monkeypatch.setattr(faults, "_hits", faults.Counter())
    monkeypatch.setenv("VERBATIM_BATCH_FAULT", "storage.copy#5;action=raise")  # before the last file
    with pytest.raises(InjectedFault):
        storage.move_dir(src, f"s3://{BUCKET}/copy-order/dst")
    assert storage.walk_files(f"s3://{BUCKET}/copy-order/dst") == [n for n in names if n != "manifest.json"]
    assert storage.walk_files(src) == names, "a move cut short must leave its source whole"


def test_delete_removes_the_manifest_first(where, monkeypatch):
    run = storage.join(where, "runs", "old")
    for name in ("chunks/part-0.parquet", "manifest.json", "papers/part-0.parquet"):
        storage.write_text(storage.join(run, name), name)
    monkeypatch.setattr(faults, "_hits", faults.Counter())
    monkeypatch.setenv("VERBATIM_BATCH_FAULT", "storage.rmtree;action=raise")
    with pytest.raises(InjectedFault):  # a prune or overwrite killed part-way
        storage.rmtree(run)
    assert storage.walk_files(run) == ["chunks/part-0.parquet", "papers/part-0.parquet"]
    with pytest.raises(FileNotFoundError):
        read_manifest(run)  # what is left is not a run
    monkeypatch.delenv("VERBATIM_BATCH_FAULT")
    storage.rmtree(run)
    storage.write_text(storage.join(where, "a-file"), "x")
    storage.rmtree(storage.join(where, "a-file"))  # a file goes too
    assert storage.walk_files(where) == []


def test_completed_writes_resume_and_stay_out_of_the_run(where):
    """Write records in ``_writes/`` mark finished parts; a part without one (a write killed part-way) is
    removed on resume; the committed run holds tables and manifest only."""
    out = storage.join(where, "embeddings")
    with staged(out, run_id="r1", resume=True) as run:
        storage.write_parquet(pa.table({"k": ["a", "b"]}), storage.join(run.staging, "t", "part-1.parquet"))
        record_write(run.staging, "part-1", {"rows": {"t": 2}, "files": {"t": "t/part-1.parquet"}, "keys": ["a", "b"]})
        storage.write_parquet(pa.table({"k": ["c"]}), storage.join(run.staging, "t", "part-2.parquet"))  # no record
    with staged(out, run_id="r1", resume=True) as run:
        assert sorted(completed_keys(run.staging).to_pylist()) == ["a", "b"]
        assert storage.walk_files(run.staging) == ["_run.json", "_writes/part-1.json", "t/part-1.parquet"]
        run.commit(_manifest("r1"), on_commit=write_report)  # as the runner commits: with the report
    assert storage.walk_files(out) == ["manifest.json", "report.html", "report.json", "t/part-1.parquet"]
    assert storage.listdir(where) == ["embeddings"]


def test_keys_keep_hash_and_question_marks_and_run_ids_refuse_them(where):
    name = storage.join(where, "odd#name?.json")
    storage.write_text(name, "x")
    assert storage.read_text(name) == "x" and storage.listdir(where) == ["odd#name?.json"]
    for bad in ("night#1", "a?b", "50%", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            staged(storage.join(where, "out"), run_id=bad).__enter__()


def test_large_files_are_streamed_not_copied_server_side(s3, monkeypatch):
    """S3's one-request copy stops at 5 GiB; bigger files go through a streamed multipart upload."""
    monkeypatch.setattr(storage, "SERVER_COPY_MAX_BYTES", 1000)
    monkeypatch.setattr(storage, "STREAM_CHUNK_BYTES", 4096)
    data = np.random.default_rng(0).bytes(50_000)
    src = f"s3://{BUCKET}/big/src"
    storage.write_bytes(storage.join(src, "dense", "index.faiss"), data)
    storage.write_text(storage.join(src, "manifest.json"), "{}")
    storage.copytree(src, f"s3://{BUCKET}/big/dst")
    assert storage.read_bytes(f"s3://{BUCKET}/big/dst/dense/index.faiss") == data
    assert storage.read_text(f"s3://{BUCKET}/big/dst/manifest.json") == "{}"
    with pytest.raises(FileNotFoundError):
        storage.copytree(f"s3://{BUCKET}/big/nothing", f"s3://{BUCKET}/big/dst2")
    with pytest.raises(FileNotFoundError):
        storage.local_copy(f"s3://{BUCKET}/big/nothing", "v1")


def test_publish_moves_current_forward_only(where):
    """A run killed after its commit moves `current` when rerun, unless a newer run is current already."""
    root = storage.join(where, "nightly")
    for run_id, created in (("old", "2026-11-20T00:00:00+00:00"), ("new", "2026-11-21T00:00:00+00:00")):
        manifest = _manifest(run_id) | {"created_at": created}
        storage.write_text(storage.join(root, RUNS_DIR, run_id, "manifest.json"), json.dumps(manifest))
    assert publish(root, "old", keep_runs=7) == [] and current_run(root) == "old"
    publish(root, "new", keep_runs=7)
    assert current_run(root) == "new"
    publish(root, "old", keep_runs=7)  # an older run's rerun does not move current back
    assert current_run(root) == "new"
    assert publish(root, "new", keep_runs=1) == ["old"] and storage.listdir(storage.join(root, RUNS_DIR)) == ["new"]


def test_verify_checks_the_tables_of_any_run(where):
    """A run of another command (not chunk, not extract): its tables against its manifest, on every store."""
    with staged(storage.join(where, "notchunks")) as run:
        storage.write_parquet(pa.table({"x": [1]}), storage.join(run.staging, "t", "part-0.parquet"))
        out = run.commit(_manifest("r1"))
    assert verify_run(out)["errors"] == ["t/: 1 rows, the manifest says 3"]


def test_commit_to_s3_cut_short_is_not_a_run_and_resumes(s3, monkeypatch):
    out = f"s3://{BUCKET}/runs-commit/chunks"
    with staged(out, run_id="r1", resume=True) as run:
        storage.write_parquet(pa.table({"x": [1, 2, 3]}), storage.join(run.staging, "t", "part-0.parquet"))
        monkeypatch.setattr(faults, "_hits", faults.Counter())
        monkeypatch.setenv("VERBATIM_BATCH_FAULT", "storage.copy#2;action=raise")
        with pytest.raises(InjectedFault):
            run.commit(_manifest("r1"))
    monkeypatch.delenv("VERBATIM_BATCH_FAULT")
    assert storage.exists(out) and committed_run(out, "r1") is None  # some files copied, no manifest: not a run
    with staged(out, run_id="r1", resume=True) as run:  # the partial output goes, the staging folder stays
        assert storage.isdir(run.staging) and not storage.exists(out)
        assert storage.read_parquet(storage.join(run.staging, "t"))["x"].to_pylist() == [1, 2, 3]
        run.commit(_manifest("r1"))  # a bare RunDir commit: tables and manifest only
    assert read_manifest(out)["run_id"] == "r1"
    assert sorted(storage.walk_files(out)) == ["manifest.json", "t/part-0.parquet"]
    assert storage.listdir(f"s3://{BUCKET}/runs-commit") == ["chunks"], "staging folder left behind"


def test_overwrite_replaces_a_committed_run(where):
    out = storage.join(where, "extract")
    for value in (1, 2):
        with staged(out, overwrite=value == 2) as run:
            storage.write_parquet(pa.table({"x": [value]}), storage.join(run.staging, "t", "part-0.parquet"))
            run.commit(_manifest(f"r{value}"))
    assert read_manifest(out)["run_id"] == "r2"
    assert storage.read_parquet(storage.join(out, "t"))["x"].to_pylist() == [2]
    assert storage.listdir(where) == ["extract"], "staging or old folders left behind"
    with pytest.raises(OutputExistsError):
        staged(out).__enter__()


# --- nightly runs on S3, end to end ------------------------------------------------------------

TABLES = [("chunks", "papers"), ("chunks", "chunks"), ("chunks", "quarantine"), ("embeddings", "embeddings"),
          ("index", "ids.parquet"), ("retrieval", "retrieval"), ("spans", "spans"), ("spans", "pairs"),
          ("spans", "rejects")]


def assert_same_tables(root: str, base: str, run_id: str, drop: frozenset[str] = frozenset()) -> None:
    for stage, table in TABLES:
        got = storage.read_parquet(storage.join(root, RUNS_DIR, run_id, stage, table))
        want = storage.read_parquet(storage.join(base, RUNS_DIR, run_id, stage, table))
        if table == "embeddings":
            got, want = got.sort_by("chunk_id"), want.sort_by("chunk_id")
            np.testing.assert_allclose(np.stack(got["vector"].to_numpy(zero_copy_only=False)),
                                       np.stack(want["vector"].to_numpy(zero_copy_only=False)), atol=1e-5)
            got, want = got.drop_columns(["vector"]), want.drop_columns(["vector"])
        assert_tables_match(got, want, f"{stage}/{table}", drop=drop)


@pytest.mark.slow
def test_nightly_on_s3(s3, nightly_baseline, tmp_path):
    """Night 1 on s3:// killed (SIGKILL) while committing a stage and resumed equals the same night on a
    local disk (the session's baseline, tests/conftest.py); the next night, after an edit, updates the index
    it downloads from S3 (an unchanged night is tested on a local disk, tests/test_nightly.py). Readers load
    the current spans through CURRENT."""
    corpus = tmp_path / "corpus"  # a copy: this test edits it
    shutil.copytree(nightly_baseline["corpus"], corpus)
    shutil.copy(nightly_baseline["corpus"].parent / "queries.jsonl", tmp_path / "queries.jsonl")
    local, first = nightly_baseline["root"], "r1"
    root = f"s3://{BUCKET}/nightly"

    # Killed while a stage's commit copies its files into place (the driver's 9th copied file).
    fault = f"storage.copy#9@{tmp_path / 'fired'};target=driver"
    killed = nightly(root, corpus, first, env=s3 | {"VERBATIM_BATCH_FAULT": fault}, check=False)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    run_dir = storage.join(root, RUNS_DIR, first)
    half = [s for s in storage.listdir(run_dir) if not s.startswith(".") and storage.isdir(storage.join(run_dir, s))
            and not storage.exists(storage.join(run_dir, s, "manifest.json"))]
    assert len(half) == 1, f"expected one stage cut short in its commit, found {half}"
    assert current_run(root) is None and not storage.exists(storage.join(run_dir, "manifest.json"))
    resumed = nightly(root, corpus, first, env=s3)
    assert "committed" in resumed.stdout
    assert_same_tables(root, str(local), first, drop=frozenset({"source"}))  # the corpus copy's own path
    assert current_run(root) == first
    assert [n for n in storage.listdir(run_dir) if n.startswith(".")] == [], "staging folders left behind"
    assert '<div class="pair"' in storage.read_text(storage.join(run_dir, "report.html"))

    edited = corpus / PAPERS[1]
    edited.write_text(edited.read_text(encoding="utf-8") + "\n\n## Addendum\n\nA late result on the test split.\n",
                      encoding="utf-8")
    shutil.copy(EXAMPLES / "corpus" / PAPERS[6], corpus / PAPERS[6])
    nightly(root, corpus, "s2", "--index-max-drift", "0.9", env=s3)
    manifest = read_manifest(storage.join(root, RUNS_DIR, "s2"))
    assert manifest["index_update"]["action"] == "added"
    assert manifest["counts"]["chunks.papers_chunked"] == 2 and current_run(root) == "s2"
    spans = current_table(root, "spans")
    papers = {r["paper_id"]: r["markdown"] for r in current_table(root, "papers").to_pylist()}
    assert spans.num_rows > 0
    for row in spans.to_pylist():
        assert papers[row["paper_id"]][row["paper_start"]:row["paper_end"]] == row["text"]
    assert json.loads(manifest["config"])["base"] == first
    checked = verify_run(storage.join(root, RUNS_DIR, "s2", "chunks"))
    assert checked["errors"] == [] and checked["papers"] == 7


def test_evaluate_reads_gold_and_a_span_run_from_any_store(where, tmp_path):
    """`evaluate` on files in a store gives what it gives on the same files on a local disk."""
    from helpers import GOLD, SPAN_ROWS

    from verbatim_batch.core.tables import SPANS, to_table
    from verbatim_batch.quality.evaluate import evaluate_files

    gold = "".join(json.dumps(r) + "\n" for r in GOLD)
    spans = to_table(SPAN_ROWS, SPANS)
    for base in (str(tmp_path / "local-copy"), where):
        storage.write_text(storage.join(base, "gold.jsonl"), gold)
        storage.write_parquet(spans, storage.join(base, "run", "spans", "part-0.parquet"))
    want = evaluate_files(str(tmp_path / "local-copy" / "gold.jsonl"), str(tmp_path / "local-copy" / "run"))
    got = evaluate_files(storage.join(where, "gold.jsonl"), storage.join(where, "run"))
    assert got == want and want["diagnostics"]["gold_rows"] == 3


def test_two_writers_starting_together_on_any_store_one_wins(where):
    """Eight writers race for one output's lock (threads: one pid, so none is taken for a dead holder): on a
    local disk the create is atomic; on an object store each writer reads its lock back after a settle time,
    and only the token found then wins. Exactly one takes it; the others get OutputBusyError."""
    import threading

    from verbatim_batch.core.runs.folder import OutputBusyError, acquire_lock, release_lock

    out = storage.join(where, "contended")
    barrier = threading.Barrier(8)
    won: list[str] = []
    busy: list[str] = []

    def writer(k: int) -> None:
        barrier.wait()
        try:
            won.append(acquire_lock(out, f"w{k}"))
        except OutputBusyError as exc:
            busy.append(str(exc))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1 and len(busy) == 7, (won, busy)
    release_lock(won[0])
    release_lock(acquire_lock(out, "after"))  # free again once released
