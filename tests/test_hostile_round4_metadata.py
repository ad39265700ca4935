"""Hostile input, round 4 (issue 34, item 4): metadata values, and reports bounded whatever the fields hold.

Metadata: two rows for one id (the first row wins; the manifest counts and names the id), wrong-typed fields
(``NaN``, a number where text belongs) ignored with a count, and fields over their size (a 5 MB title) ignored
with a count. Reports: a retrieve and an extract report over papers with 5 MB titles and 1 MB queries stay
within their bounds (each field cut, each section and page bounded, ``report.json`` bounded), written in a
subprocess under a memory cap, so a regression fails the test instead of taking the machine.

Only the chunk-run test starts Ray (the session's local Ray).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.corpus.metadata import MAX_FIELD_CHARS, load_metadata, metadata_stats

BIG = 5 << 20  # a 5 MB title


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_duplicate_ids_wrong_types_and_huge_fields_are_counted_and_ignored(tmp_path):
    meta = write_jsonl(tmp_path / "meta.jsonl", [
        {"paper_id": "a", "title": "First title", "year": 2020},
        {"paper_id": "a", "title": "Second title", "year": 2021},  # the second row of an id: left out
        {"paper_id": "a", "title": "Third title"},
        {"paper_id": "b", "title": math.nan, "venue": 7, "year": math.nan, "authors": 3.5},  # wrong types
        {"paper_id": "c", "title": "t" * BIG, "authors": ["x"] * 5_000, "url": "u" * 10_000},  # over size
        {"paper_id": "d", "title": 12345, "language": "en"},
        {"paper_id": None, "title": "no id"},
        {"paper_id": "b", "title": "b again"},
    ])
    got = load_metadata(meta)
    assert got["a"] == ("First title", None, 2020, None, None, None)
    assert got["b"] == (None, None, None, None, None, None)  # never 'nan', never '7'
    assert got["c"] == (None, None, None, None, None, None)
    assert got["d"] == (None, None, None, None, None, "en")
    stats = metadata_stats(meta)
    assert stats == {"rows": 8, "rows_skipped": 1, "duplicate_ids": 2, "duplicate_rows": 3, "duplicates": ["a", "b"],
                     "fields_wrong_type": 5, "fields_too_long": 3, }
    # Parquet: a float NaN title and a title just over its size
    table = pa.table({"paper_id": ["x", "y", "x"], "title": [math.nan, 1.0, 2.0]})
    pq.write_table(table, tmp_path / "meta.parquet")
    assert load_metadata(str(tmp_path / "meta.parquet"))["x"][0] is None
    pq.write_table(pa.table({"paper_id": ["x"], "title": ["t" * (MAX_FIELD_CHARS["title"] + 1)]}),
                   tmp_path / "long.parquet")
    assert load_metadata(str(tmp_path / "long.parquet"))["x"][0] is None
    assert metadata_stats(str(tmp_path / "long.parquet"))["fields_too_long"] == 1


def test_a_huge_title_never_reaches_the_papers_or_chunks(tmp_path):
    from verbatim_batch.core.tables import RAW_RECORDS
    from verbatim_batch.corpus.chunker import ChunkerConfig
    from verbatim_batch.corpus.ingest import IngestStage

    meta = write_jsonl(tmp_path / "meta.jsonl", [{"paper_id": "p", "title": "t" * BIG, "authors": "A and B"}])
    stage = IngestStage(chunker=ChunkerConfig(min_chars=0), metadata_uri=meta)
    text = b"# Real heading\n\n## Intro\n\nSome text about things. It works.\n"
    row = {"paper_id": "p", "source": "p.md", "raw": text, "n_bytes": len(text), "error": None}
    raw = pa.Table.from_pylist([row], schema=RAW_RECORDS)
    out = stage(raw)
    paper = out["papers"].to_pylist()[0]
    assert paper["title"] == "Real heading" and paper["authors"] == ["A", "B"]
    assert max(len(c) for c in out["chunks"]["context"].to_pylist()) < 1_000


def test_chunk_manifest_counts_and_names_duplicate_metadata(ray_local, tmp_path):
    from verbatim_batch.corpus.chunker import ChunkerConfig
    from verbatim_batch.stages.chunk import ChunkJob, run_chunk

    corpus = tmp_path / "c"
    corpus.mkdir()
    for k in ("a", "b"):
        (corpus / f"{k}.md").write_text(f"# Paper {k}\n\n## Intro\n\nText of {k}. It works.\n")
    meta = write_jsonl(tmp_path / "meta.jsonl", [
        {"paper_id": "a", "title": "A one"}, {"paper_id": "a", "title": "A two"},
        {"paper_id": "b", "title": math.nan}, {"paper_id": "b", "title": "t" * BIG}])
    out, manifest = run_chunk(ChunkJob(input=str(corpus), output=str(tmp_path / "run"), metadata=meta,
                                       chunker=ChunkerConfig(min_chars=0)))
    counts = manifest["counts"]
    assert counts["metadata_duplicate_ids"] == 2 and counts["metadata_duplicate_rows"] == 2
    assert counts["metadata_fields_wrong_type"] == 1
    written = json.loads((Path(out) / "manifest.json").read_text())
    assert written["metadata"]["duplicate_ids"] == ["a", "b"] and "first row" in written["metadata"]["rule"]
    titles = dict(zip(*pq.read_table(Path(out) / "papers", columns=["paper_id", "title"]).to_pydict().values(),
                      strict=True))
    assert titles == {"a": "A one", "b": "Paper b"}  # the first row's title; a NaN title never becomes 'nan'


# --- reports: bounded whatever the fields hold ------------------------------------------------------------------


def _fake_runs(root: Path, n_queries: int = 20, hits: int = 10) -> tuple[Path, Path]:
    """A chunk run whose papers carry 5 MB titles (as a run written before the caps would), a retrieve run of
    ``n_queries`` 1 MB queries with ``hits`` hits per method over it, and an extract run over its chunks."""
    chunks_run = root / "chunks-run"
    (chunks_run / "papers").mkdir(parents=True)
    (chunks_run / "chunks").mkdir()
    papers = [f"p{i}" for i in range(4)]
    pq.write_table(pa.table({"paper_id": papers, "title": [f"{p} " + "t" * BIG for p in papers]}),
                   chunks_run / "papers" / "part-0.parquet", compression="zstd")
    chunk_text = "A chunk of text. " * 3_000  # 51k characters
    cids = [f"c{i}" for i in range(8)]
    pq.write_table(pa.table({"chunk_id": cids, "paper_id": [papers[i % 4] for i in range(8)],
                             "chunk_index": pa.array(range(8), pa.int32()), "start": pa.array([0] * 8, pa.int32()),
                             "text": [chunk_text] * 8}), chunks_run / "chunks" / "part-0.parquet", compression="zstd")
    (chunks_run / "manifest.json").write_text(json.dumps({"run_id": "c1", "command": "chunk", "config": "{}"}))
    retrieval = root / "retrieve-run"
    (retrieval / "retrieval").mkdir(parents=True)
    rows = [{"query_id": f"q{q}", "query": f"q{q} " + "w" * (1 << 20), "method": m, "rank": r + 1,
             "chunk_id": cids[(q + r) % 8], "paper_id": papers[(q + r) % 4], "score": 1.0 / (r + 1)}
            for q in range(n_queries) for m in ("dense", "bm25") for r in range(hits)]
    pq.write_table(pa.Table.from_pylist(rows), retrieval / "retrieval" / "part-0.parquet", compression="zstd")
    (retrieval / "manifest.json").write_text(json.dumps({
        "run_id": "r1", "command": "retrieve", "config": json.dumps({"chunks": str(chunks_run)}),
        "tables": {"retrieval": {"rows": len(rows), "files": 1}}, "counts": {"queries": n_queries},
        "timings_s": {"total": 1.0}}))
    extract = root / "extract-run"
    (extract / "pairs").mkdir(parents=True)
    (extract / "spans").mkdir()
    pairs = [{"pair_id": f"x{q}-{c}", "query_id": f"q{q}", "query": f"q{q} " + "w" * (1 << 20), "paper_id":
              papers[c % 4], "chunk_id": cids[c], "chunk_index": c, "rank": c + 1, "n_spans": 1, "relevance": 1.0,
              "n_violations": 0, "error": None if c else "http_500: " + "e" * 300}
             for q in range(n_queries) for c in range(8)]
    pq.write_table(pa.Table.from_pylist(pairs), extract / "pairs" / "part-0.parquet", compression="zstd")
    spans = [{"pair_id": p["pair_id"], "start": 0, "end": len(chunk_text), "score": 0.9, "align": "exact"}
             for p in pairs]  # a span that is the whole chunk
    pq.write_table(pa.Table.from_pylist(spans), extract / "spans" / "part-0.parquet", compression="zstd")
    (extract / "manifest.json").write_text(json.dumps({
        "run_id": "e1", "command": "extract", "config": json.dumps({"chunks": str(chunks_run)}),
        "tables": {"pairs": {"rows": len(pairs), "files": 1}, "spans": {"rows": len(spans), "files": 1}},
        "counts": {"pairs": len(pairs)}, "timings_s": {"total": 1.0}}))
    return retrieval, extract


CAPPED = textwrap.dedent("""
    import resource, sys
    cap = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from verbatim_batch.report.build import write_report
    write_report(sys.argv[1])
""")


@pytest.mark.parametrize("kind", ["retrieve", "extract"])
def test_reports_are_bounded_whatever_the_fields_hold(tmp_path, kind):
    from verbatim_batch.report.html import PAGE_BYTES

    retrieval, extract = _fake_runs(tmp_path)
    run = retrieval if kind == "retrieve" else extract
    cap = 3 << 30  # the fields shown whole would be several GB
    done = subprocess.run([sys.executable, "-c", CAPPED, str(run), str(cap)], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert done.returncode == 0, done.stderr[-3000:]
    page = (run / "report.html").stat().st_size
    data = (run / "report.json").stat().st_size
    assert page <= PAGE_BYTES + (64 << 10) and data <= PAGE_BYTES, (page, data)
    html = (run / "report.html").read_text(encoding="utf-8")
    assert "more characters)" in html and "t" * 1_000 not in html and "w" * 1_000 not in html
    assert "p1" in html and "q3" in html  # the sections are there, cut
