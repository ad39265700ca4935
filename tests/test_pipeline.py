"""The chunk job end to end on a real local Ray: tables, quarantine, determinism, atomicity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.core.runs import MANIFEST_FILE, OutputExistsError, load_manifests, read_manifest, read_table
from verbatim_batch.core.tables import CHUNKS, PAPERS, QUARANTINE, SCHEMA_VERSION, schema_version_of
from verbatim_batch.corpus.chunker import ChunkerConfig
from verbatim_batch.quality.verify import verify_run
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_synth import corpus as synth

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def md_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    summary = synth.write_corpus(root / "md", n=40, seed=3, fmt="md")
    bad = synth.write_bad_inputs(root / "md" / "bad", seed=3, big_bytes=50 * 1024 * 1024)
    return root / "md", summary, bad


def _sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.sort_by([(k, "ascending") for k in keys])


def test_chunk_job_tables_quarantine_and_invariants(ray_local, md_corpus, tmp_path):
    corpus_dir, summary, bad = md_corpus
    out, manifest = run_chunk(
        ChunkJob(input=str(corpus_dir), output=str(tmp_path / "run"), metadata=str(corpus_dir / "metadata.jsonl"))
    )
    papers, chunks, quarantine = (read_table(out, t) for t in ("papers", "chunks", "quarantine"))

    # contracts: exact schemas, schema version in every file
    assert papers.schema.remove_metadata() == PAPERS.remove_metadata()
    assert chunks.schema.remove_metadata() == CHUNKS.remove_metadata()
    assert quarantine.schema.remove_metadata() == QUARANTINE.remove_metadata()
    for table in ("papers", "chunks", "quarantine"):
        for f in (Path(out) / table).glob("*.parquet"):
            assert schema_version_of(pq.read_schema(f)) == SCHEMA_VERSION

    # every input file is accounted for: a paper row or a quarantine row, never both, never neither
    n_files = len(list(corpus_dir.rglob("*.md")))
    assert papers.num_rows + quarantine.num_rows == n_files == manifest["counts"]["records_in"]
    reasons = dict(zip(quarantine["paper_id"].to_pylist(), quarantine["reason"].to_pylist(), strict=True))
    assert reasons[bad["empty"]] == "empty"
    assert reasons[bad["whitespace_only"]] == "empty"
    assert reasons[bad["invalid_utf8"]] == "invalid_utf8"
    assert reasons[bad["nul_bytes"]] == "nul_bytes"
    assert reasons[bad["binary_junk"]] in ("binary", "invalid_utf8", "nul_bytes")
    assert reasons[bad["huge_single_line"]] == "too_large"
    assert reasons[bad["duplicate_id"]] == "duplicate_id"
    assert all(quarantine["detail"].to_pylist())
    good_ids = set(papers["paper_id"].to_pylist())
    assert {bad["crlf"], bad["unclosed_fence"], bad["huge_table"], bad["duplicate_id"]} <= good_ids
    assert set(summary_ids(summary, corpus_dir)) <= good_ids  # every good synthetic paper made it
    assert papers["paper_id"].to_pylist().count(bad["duplicate_id"]) == 1

    # the duplicate kept is the first by path; the copy in dup/ is quarantined
    dup_row = [r for r in quarantine.to_pylist() if r["reason"] == "duplicate_id"][0]
    assert "/dup/" in dup_row["source"]

    # verbatim: every chunk is its paper's text at its offsets; coverage complete
    checked = verify_run(out)
    assert (checked["papers"], checked["chunks"], checked["errors"]) == (papers.num_rows, chunks.num_rows, [])
    assert checked["unchecked"] == {} and checked["checked"]["papers_text_sha256"] == papers.num_rows
    texts = dict(zip(papers["paper_id"].to_pylist(), papers["markdown"].to_pylist(), strict=True))
    for row in chunks.slice(0, 200).to_pylist():
        assert texts[row["paper_id"]][row["start"] : row["end"]] == row["text"]
    assert len(set(chunks["chunk_id"].to_pylist())) == chunks.num_rows

    # metadata join: titles come from metadata and lead every chunk's context
    meta = {json.loads(line)["paper_id"]: json.loads(line) for line in open(corpus_dir / "metadata.jsonl")}
    some = next(p for p in papers.to_pylist() if p["paper_id"] in meta)
    assert some["title"] == meta[some["paper_id"]]["title"]
    assert some["year"] == meta[some["paper_id"]]["year"]
    ctx = [c["context"] for c in chunks.to_pylist() if c["paper_id"] == some["paper_id"]]
    assert all(c.startswith(some["title"]) for c in ctx)

    # flags: the huge table stays whole and flagged; CRLF paper flagged
    huge = [c for c in chunks.to_pylist() if c["paper_id"] == bad["huge_table"] and "oversized_block" in c["flags"]]
    assert huge and all(len(c["text"]) > 5000 for c in huge)
    crlf = [p for p in papers.to_pylist() if p["paper_id"] == bad["crlf"]][0]
    assert "crlf" in crlf["flags"] and "\r\n" in crlf["markdown"]

    # manifest
    m = json.loads((Path(out) / MANIFEST_FILE).read_text())
    assert m["status"] == "committed" and m["schema_version"] == SCHEMA_VERSION
    assert m["tables"]["chunks"]["rows"] == chunks.num_rows
    assert m["counts"]["quarantine.duplicate_id"] == 1
    assert load_manifests([out]).num_rows == 1


def summary_ids(summary: dict, corpus_dir: Path) -> list[str]:
    return [Path(f).stem for f in summary["files"] if str(f).endswith(".md")]


def test_rerun_gives_identical_rows_and_files(ray_local, md_corpus, tmp_path):
    corpus_dir, _, _ = md_corpus
    outs = [run_chunk(ChunkJob(input=str(corpus_dir), output=str(tmp_path / f"r{k}")))[0] for k in (0, 1)]
    for table, keys in (("papers", ["paper_id"]), ("chunks", ["chunk_id"]), ("quarantine", ["source"])):
        a, b = (_sorted(read_table(o, table), keys) for o in outs)
        assert a.num_rows > 0 and a.equals(b), table
        assert sorted(p.name for p in (Path(outs[0]) / table).iterdir()) == sorted(
            p.name for p in (Path(outs[1]) / table).iterdir()
        )


def test_normalisation_is_opt_in_and_recorded(ray_local, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "p1.md").write_bytes(b"## T\r\n\r\nA &amp; B   spaced\r\n" * 40)
    plain, _ = run_chunk(ChunkJob(input=str(src), output=str(tmp_path / "plain")))
    norm, _ = run_chunk(
        ChunkJob(input=str(src), output=str(tmp_path / "norm"),
                 chunker=ChunkerConfig(normalization=("crlf", "html_unescape", "collapse_whitespace")))
    )
    p_plain, p_norm = read_table(plain, "papers").to_pylist()[0], read_table(norm, "papers").to_pylist()[0]
    assert p_plain["normalization"] == "none" and "&amp;" in p_plain["markdown"]
    assert p_norm["normalization"] == "crlf,html_unescape,collapse_whitespace"
    assert "A & B spaced" in p_norm["markdown"] and "\r" not in p_norm["markdown"]
    assert set(read_table(norm, "chunks")["normalization"].to_pylist()) == {p_norm["normalization"]}
    assert verify_run(norm)["errors"] == []


def test_parquet_and_jsonl_inputs_with_bad_records(ray_local, tmp_path):
    good = [synth.generate_paper(11, i, target_chars=6000) for i in range(6)]
    pq.write_table(
        pa.table({
            "anthology_id": [p.paper_id for p in good[:4]] + [good[0].paper_id, None],
            "markdown": [p.markdown for p in good[:4]] + ["a different copy " * 50, "no id " * 50],
        }),
        tmp_path / "part-0.parquet",
    )
    lines = [json.dumps({"anthology_id": p.paper_id, "markdown": p.markdown}) for p in good[4:]]
    lines += ['{"anthology_id": "broken", "markdown": ', json.dumps({"anthology_id": "num", "markdown": 42}),
              json.dumps({"anthology_id": "nomd"}), json.dumps(["not", "an", "object"])]
    (tmp_path / "part-1.jsonl").write_text("\n".join(lines) + "\n")

    out, m = run_chunk(ChunkJob(input=str(tmp_path / "part-0.parquet"), output=str(tmp_path / "pq")))
    bad = read_table(out, "quarantine").to_pylist()
    assert sorted(r["reason"] for r in bad) == ["duplicate_id", "missing_id"]
    assert [r["source"].endswith("#row=4") for r in bad if r["reason"] == "duplicate_id"] == [True]
    assert read_table(out, "papers").num_rows == 4 and m["counts"]["records_in"] == 6

    out, m = run_chunk(ChunkJob(input=str(tmp_path / "part-1.jsonl"), output=str(tmp_path / "js")))
    bad = {r["source"].rsplit("=", 1)[1]: r["reason"] for r in read_table(out, "quarantine").to_pylist()}
    assert bad == {"3": "invalid_record", "4": "invalid_record", "5": "missing_text", "6": "invalid_record"}
    assert sorted(read_table(out, "papers")["paper_id"].to_pylist()) == sorted(p.paper_id for p in good[4:])
    assert verify_run(out)["errors"] == []


def test_existing_output_is_refused_and_overwrite_replaces(ray_local, md_corpus, tmp_path):
    corpus_dir, _, _ = md_corpus
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(OutputExistsError):
        run_chunk(ChunkJob(input=str(corpus_dir), output=str(out)))
    with pytest.raises(OutputExistsError, match="not a run folder"):  # a user's folder: never replaced
        run_chunk(ChunkJob(input=str(corpus_dir), output=str(out), overwrite=True))
    assert (out / "keep.txt").read_text() == "user data"
    (out / "keep.txt").unlink()
    run_chunk(ChunkJob(input=str(corpus_dir), output=str(out), overwrite=True))  # an empty folder may go
    first = read_manifest(str(out))["run_id"]
    run_chunk(ChunkJob(input=str(corpus_dir), output=str(out), overwrite=True))  # and a run of ours
    assert (out / MANIFEST_FILE).exists() and read_manifest(str(out))["run_id"] != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # no staging or old copies left


def test_killed_run_leaves_no_output_and_next_run_cleans_up(md_corpus, tmp_path):
    """SIGKILL the chunk job mid-run: the output folder must not exist, half-written or not."""
    corpus_dir, _, _ = md_corpus
    out = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "jobs" / "chunk.py"), "--input", str(corpus_dir), "--output", str(out),
           "--num-cpus", "1"]
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not [p for p in tmp_path.iterdir() if ".staging-" in p.name]:
        time.sleep(0.05)
    time.sleep(2.0)  # let it get into Ray start-up / reading
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if ".staging-" in p.name]  # the only trace: hidden staging

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / MANIFEST_FILE).exists()
    assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]
    assert "committed to" in done.stdout


def test_cli_errors_are_clear(tmp_path, capsys):
    from verbatim_batch.cli import main

    assert main(["chunk", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]) == 2
    assert "input not found" in capsys.readouterr().err
    assert main(["chunk", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--min-chars", "9000"]) == 2
    assert "min_chars" in capsys.readouterr().err
