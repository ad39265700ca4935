"""Run reports: report.json figures, and report.html rendered in a real headless Chromium; on one small chain
(chunk -> embed -> index -> retrieve -> extract, built once): the retrieval and extract pages, every table
loading in pyarrow, pandas, duckdb and HF datasets, span runs re-checked by verify, and titles from text."""

from __future__ import annotations

import html
import json
import os
import re

import pytest
from helpers import CHROMIUM, MARK, render

from verbatim_batch.cli import main
from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.report.html import highlight, in_context, windows


def test_highlight_escapes_text_and_marks_spans():
    chunk = "a <b> & c d e"
    out = highlight(chunk, [{"start": 2, "end": 5, "score": 0.5, "align": None},
                            {"start": 4, "end": 9, "score": 0.9, "align": "exact"}])
    assert out.startswith("a <mark") and "&lt;b&gt;" in out and "<b>" not in out
    assert out.count("<mark") == 2 and 'title="score 0.90 · exact"' in out


def test_windows_show_context_not_whole_chunks():
    chunk = " ".join(f"w{i:03d}" for i in range(400))  # 2,000 characters
    spans = [{"start": 1000, "end": 1009, "score": 0.9}, {"start": 1100, "end": 1104, "score": 0.5},
             {"start": 1900, "end": 1904, "score": 0.7}]
    got = windows(chunk, [(s["start"], s["end"]) for s in spans], context=50)
    assert len(got) == 2  # the first two spans share a window
    assert all(lo <= s["start"] and s["end"] <= hi for s in spans for lo, hi in got if lo <= s["start"] < hi)
    assert sum(hi - lo for lo, hi in got) < 400 and all(chunk[lo] != " " for lo, _ in got)
    page = in_context(chunk, spans, context=50)
    assert page.count('<div class="ctx">') == 2 and page.count("<mark") == 3 and page.count("…") == 4
    assert len(html.unescape(re.sub("<[^>]+>", "", page))) < 500


# --- one small chain: chunk -> embed -> index -> retrieve -> extract -------------------------------------------

PAPER_A = """Title: Span Extraction for Careful Readers

URL Source: https://example.org/paper-a

Markdown Content:
Ada Lovelace 1, Charles Babbage 2

###### Abstract

Readers of research papers want evidence they can quote word for word. We extract verbatim spans from
retrieved passages and keep only text that appears in the source.

## 1 Introduction

""" + " ".join(["Question answering over papers often paraphrases the source, which readers cannot check."] * 6) + """
The verbatim gate rejects every span whose text is not found at its offsets in the chunk.

## 2 Method

""" + " ".join(["A token classifier marks the evidence tokens, and adjacent tokens merge into spans."] * 6) + "\n"

PAPER_B = """Evidence Retrieval Without Headings

Grace Hopper, Navy Research

""" + " ".join(["This paper has no markdown headings at all, only paragraphs of plain text."] * 6) + """

""" + " ".join(["Dense retrieval embeds every chunk once and answers each query by nearest neighbours."] * 6) + """
Sparse retrieval with BM25 remains a strong baseline for exact sentences.
"""

PAPER_C = """# Dense and Sparse Retrieval Compared

## Abstract

We compare dense and sparse retrieval on scientific questions.

## 1 Introduction

""" + " ".join(["Hybrid retrieval fuses the ranks of the dense and the sparse retrievers."] * 7) + """
Reciprocal rank fusion needs no score calibration between the two methods.

## References

""" + " ".join(["A. Author. 2020. A paper about retrieval. In Proceedings of a conference."] * 7) + "\n"

QUERIES = [
    {"query_id": "q-gate",
     "query": "The verbatim gate rejects every span whose text is not found at its offsets in the chunk."},
    {"query_id": "q-bm25", "query": "Sparse retrieval with BM25 remains a strong baseline for exact sentences."},
    {"query_id": "q-rrf", "query": "Reciprocal rank fusion needs no score calibration between the two methods."},
]


@pytest.fixture(scope="module")
def chain(ray_local, tmp_path_factory):
    from verbatim_batch.stages.chains import Chain, run_chain

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("chain")
    corpus = root / "corpus"
    corpus.mkdir()
    for name, text in (("paper-a", PAPER_A), ("paper-b", PAPER_B), ("paper-c", PAPER_C)):
        (corpus / f"{name}.md").write_text(text, encoding="utf-8")
    queries = root / "queries.jsonl"
    queries.write_text("\n".join(json.dumps(q) for q in QUERIES) + "\n")
    chain = Chain(input=str(corpus), queries=str(queries), format="md", stages={"extract": {"top_k": 2}})
    results, _ = run_chain(chain, str(root / "out"))
    return {name: path for name, (path, _) in results.items()}


def test_report_json_is_written_at_commit(chain):
    out = chain["spans"]
    manifest = read_manifest(out)
    with open(f"{out}/report.json", encoding="utf-8") as fh:
        report = json.load(fh)
    pairs = read_table(out, "pairs").to_pylist()
    assert report["run_id"] == manifest["run_id"] and report["command"] == "extract"
    assert report["tables"] == {"spans": manifest["tables"]["spans"]["rows"], "pairs": len(pairs), "rejects": 0}
    assert report["errors_by_reason"] == {}
    ok = [p["n_spans"] for p in pairs if not p["error"]]
    assert report["abstention_rate"] == sum(1 for n in ok if n == 0) / len(ok)
    assert report["spans_per_pair"]["max"] == max(ok) and report["verbatim_violations"] == 0
    assert report["throughput"]["pairs_per_s"] > 0 and "total" in report["timings_s"]
    # where the time went: Ray start-up apart, model / gate / write summed over actors, pairs/s without start-up
    spent = report["time_breakdown"]
    assert {"read_pairs_s", "ray_start_s", "extract_and_write_wall_s", "model_s_summed_over_actors",
            "gate_s_summed_over_actors", "write_s_summed_over_actors"} <= set(spent), spent
    assert spent["model_s_summed_over_actors"] > 0
    assert spent["pairs_per_s_excluding_ray_start"] == pytest.approx(
        manifest["counts"]["rows_new"] / spent["extract_and_write_wall_s"])
    assert spent["extract_and_write_wall_s"] + spent["ray_start_s"] <= manifest["timings_s"]["total"]
    with open(f"{out}/report.html", encoding="utf-8") as fh:
        assert "Where the extract time went" in fh.read()


def _tables(run_dir: str) -> dict[str, str]:
    """table -> its folder, or its single file (the index's ids.parquet)."""
    out = {}
    for name in read_manifest(run_dir)["tables"]:
        folder = os.path.join(run_dir, name)
        out[name] = folder if os.path.isdir(folder) else folder + ".parquet"
    return out


def test_every_table_loads_in_pyarrow_pandas_duckdb_and_datasets(chain, tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    import pandas as pd
    import pyarrow.parquet as pq

    seen_empty = []
    for stage, run_dir in chain.items():
        manifest = read_manifest(run_dir)
        for name, path in _tables(run_dir).items():
            rows = manifest["tables"][name]["rows"]
            files = [os.path.join(path, f) for f in os.listdir(path)] if os.path.isdir(path) else [path]
            arrow = pq.read_table(path)
            assert arrow.num_rows == rows, (stage, name)
            assert len(pd.read_parquet(path)) == rows
            glob = os.path.join(path, "*.parquet") if os.path.isdir(path) else path
            assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall() == [(rows,)]
            source = {"data_dir": path} if os.path.isdir(path) else {"data_files": path}
            streamed = datasets.load_dataset("parquet", streaming=True, cache_dir=str(tmp_path / "hf"), **source)
            assert list(streamed["train"].features) == arrow.column_names
            if rows:
                loaded = datasets.load_dataset("parquet", cache_dir=str(tmp_path / "hf"), **source)["train"]
                assert loaded.num_rows == rows and loaded.column_names == arrow.column_names
                continue
            # An empty table: one file with the schema and no row group, read as zero rows by all four; HF
            # datasets streams it (no "BatchSize must be greater than 0"); a non-streaming load of any empty
            # split is refused by datasets itself, whatever the file (huggingface/datasets#8401).
            seen_empty.append(f"{stage}/{name}")
            assert [pq.ParquetFile(f).metadata.num_row_groups for f in files] == [0]
            assert list(streamed["train"]) == []
            try:
                loaded = datasets.load_dataset("parquet", cache_dir=str(tmp_path / "hf"), **source)["train"]
                assert loaded.num_rows == 0
            except ValueError as exc:
                assert "corresponds to no data" in str(exc)
    assert {"chunks/quarantine", "spans/rejects"} <= set(seen_empty)


def test_cli_prints_the_real_path_of_each_table(chain, capsys):
    from verbatim_batch.report.summary import print_run

    for run_dir in chain.values():
        print_run(run_dir, read_manifest(run_dir))
    printed = re.findall(r"rows  (\S+)", capsys.readouterr().out)
    assert len(printed) == sum(len(read_manifest(r)["tables"]) for r in chain.values())
    assert all(os.path.exists(p) for p in printed) and any(p.endswith("ids.parquet") for p in printed)


def test_titles_come_from_text_never_from_a_section_heading(chain):
    papers = {r["paper_id"]: r["title"] for r in read_table(chain["chunks"], "papers").to_pylist()}
    assert papers == {"paper-a": "Span Extraction for Careful Readers",
                      "paper-b": "Evidence Retrieval Without Headings",
                      "paper-c": "Dense and Sparse Retrieval Compared"}
    for c in read_table(chain["chunks"], "chunks").to_pylist():
        assert c["context"].startswith(papers[c["paper_id"]]) and not c["context"].startswith("Abstract")


def test_every_stage_reports_where_its_time_went(chain):
    for stage, run_dir in chain.items():
        with open(f"{run_dir}/report.json", encoding="utf-8") as fh:
            spent = json.load(fh)["time_breakdown"]
        assert spent["total_s"] > 0 or stage == "index", (stage, spent)
        with open(f"{run_dir}/report.html", encoding="utf-8") as fh:
            assert "time went" in fh.read()
    with open(f"{chain['embeddings']}/report.json", encoding="utf-8") as fh:
        spent = json.load(fh)["time_breakdown"]
    assert {"forward_s_summed_over_actors", "tokenize_s_summed_over_actors", "embed_and_write_wall_s",
            "chunks_per_s_excluding_ray_start"} <= set(spent), spent
    with open(f"{chain['index']}/report.json", encoding="utf-8") as fh:
        assert "bm25_build_s" in json.load(fh)["time_breakdown"]


def test_retrieval_report_lists_each_query_with_its_hits_per_method(chain):
    with open(f"{chain['retrieval']}/report.json", encoding="utf-8") as fh:
        figures = json.load(fh)["retrieval"]
    assert figures["queries"] == len(QUERIES) and figures["methods"] == ["dense", "bm25", "hybrid"]
    with open(f"{chain['retrieval']}/report.html", encoding="utf-8") as fh:
        page = fh.read()
    hits = read_table(chain["retrieval"], "retrieval").to_pylist()
    sections = re.findall(r'<section class="query" data-query-id="([^"]+)"><h3>(.*?)</h3>(.*?)</section>', page, re.S)
    assert {(q, html.unescape(t)) for q, t, _ in sections} == {(q["query_id"], q["query"]) for q in QUERIES}
    for qid, _, body in sections:
        for method in ("dense", "bm25", "hybrid"):
            table = re.search(rf'<table class="hits" data-method="{method}">(.*?)</table>', body, re.S).group(1)
            shown = re.findall(r'<td class="cid">([0-9a-f]+)</td><td class="snippet">([^<]+)</td>', table)
            want = sorted((h["rank"], h["chunk_id"]) for h in hits if h["query_id"] == qid and h["method"] == method)
            assert [c for c, _ in shown] == [c for _, c in want][:10] and all(s.strip() for _, s in shown)
    # the BM25 top hit of an exact sentence is the chunk that holds it
    bm25 = {h["query_id"]: h["chunk_id"] for h in hits if h["method"] == "bm25" and h["rank"] == 1}
    chunks = {c["chunk_id"]: c["text"] for c in read_table(chain["chunks"], "chunks").to_pylist()}
    assert all(q["query"] in chunks[bm25[q["query_id"]]] for q in QUERIES)


def test_extract_report_groups_spans_by_query_in_context(chain):
    out = chain["spans"]
    pairs = read_table(out, "pairs").to_pylist()
    spans = read_table(out, "spans").to_pylist()
    chunks = {c["chunk_id"]: c["text"] for c in read_table(chain["chunks"], "chunks").to_pylist()}
    assert spans, "the offline extractor finds the quoted sentences"
    with open(f"{out}/report.html", encoding="utf-8") as fh:
        page = fh.read()
    sections = re.findall(r'<section class="query" data-query-id="([^"]+)">(.*?)</section>', page, re.S)
    assert sorted(q for q, _ in sections) == sorted({p["query_id"] for p in pairs})
    assert [q for q, _ in sections] == [q["query_id"] for q in QUERIES]  # as given, not alphabetical
    # the evidence leads: the first heading after the title is the spans', the timings come after them
    assert re.findall(r"<h[12]>([^<]*)", page)[1].startswith("Spans")
    assert page.index('class="query"') < page.index("Where the extract time went")
    assert re.search(r"<h1>verbatim-batch extract · [^<]+</h1>", page)
    chunk_of = {p["pair_id"]: chunks[p["chunk_id"]] for p in pairs}
    for _, body in sections:
        for pair_id, inner in re.findall(r'<div class="pair" data-pair="([^"]+)">(.*?)</div></div>', body, re.S):
            chunk = chunk_of[pair_id]
            for start, end, _, text in MARK.findall(inner):
                assert chunk[int(start):int(end)] == html.unescape(text)
            shown = html.unescape(re.sub(r"<[^>]+>", "", "".join(re.findall(r'<div class="ctx">(.*?)</div>', inner,
                                                                            re.S))))
            assert len(shown) <= len(chunk) + 4  # windows of the chunk, never more than it
    with open(f"{out}/report.json", encoding="utf-8") as fh:
        figures = json.load(fh)["extract"]
    assert figures["queries"] == len(QUERIES) and figures["spans"] == len(spans)
    assert sum(figures["span_score_histogram"]["counts"]) == len(spans)
    assert sum(figures["span_length_histogram"]["counts"]) == len(spans)


def test_verify_checks_span_runs(chain, tmp_path, capsys):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from verbatim_batch.quality.verify import verify_run

    out = chain["spans"]
    n = read_manifest(out)["tables"]["spans"]["rows"]
    result = verify_run(out)
    assert result["errors"] == [] and result["spans"] == n and result["pairs"] == len(read_table(out, "pairs"))
    assert result["checked"]["spans_against_chunk_text"] == n
    assert result["checked"]["spans_against_paper_text"] == n and result["unchecked"] == {}
    assert main(["verify", out]) == 0
    capsys.readouterr()
    # a span whose text was edited, and one whose paper offsets moved: both found, exit 1
    bad = tmp_path / "spans"
    shutil.copytree(out, bad)
    (f,) = [p for p in (bad / "spans").iterdir() if p.suffix == ".parquet"]
    table = pq.read_table(f)
    rows = table.to_pylist()
    rows[0]["text"] = rows[0]["text"][:-1] + "#"
    rows[-1]["paper_start"] += 1
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), f)
    result = verify_run(str(bad))
    assert any("not the chunk's text" in e for e in result["errors"]), result
    assert any("paper offsets" in e for e in result["errors"]), result
    assert main(["verify", str(bad)]) == 1


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_chain_reports_render_in_chromium(chain, tmp_path):
    dom = render(f"{chain['retrieval']}/report.html", tmp_path)
    assert re.search(r"<h1>verbatim-batch retrieve · retrieve-[^<]+</h1>", dom), dom[:500]
    assert dom.count('<section class="query"') == len(QUERIES) and dom.count('class="hits"') == 3 * len(QUERIES)
    assert main(["report", chain["spans"], "--samples", "1"]) == 0
    dom = render(f"{chain['spans']}/report.html", tmp_path)
    assert re.search(r"<h1>verbatim-batch extract · extract-[^<]+</h1>", dom), dom[:500]
    sections = re.findall(r'<section class="query".*?</section>', dom, re.S)
    assert len(sections) == len(QUERIES) and all(sec.count('class="pair"') <= 1 for sec in sections)
    chunks = [c["text"] for c in read_table(chain["chunks"], "chunks").to_pylist()]
    marks = MARK.findall(dom)
    assert marks, dom[:2000]
    for start, end, title, inner in marks:
        assert title.startswith("score ")
        assert any(c[int(start):int(end)] == html.unescape(inner) for c in chunks)  # in place, verbatim
    assert not re.search(r"<script|<link|<img|(?:src|href)=", dom)  # nothing to fetch at view time
    assert re.search(r'<svg class="plot"[^>]*aria-label="Span scores".*?<rect class="bar"', dom, re.S)
    assert re.search(r'<svg class="plot"[^>]*aria-label="Span lengths"', dom)
    dom = render(f"{chain['embeddings']}/report.html", tmp_path)
    assert "Where the embed time went" in dom and "Summed over actors" in dom


def test_check_spans_against_pair_chunks_and_papers():
    from verbatim_batch.quality.verify import check_spans

    chunk = {"text": "alpha beta gamma", "start": 100}
    paper = "x" * 100 + "alpha beta gamma"
    good = {"pair_id": "p1", "chunk_id": None, "paper_id": "P", "start": 6, "end": 10, "paper_start": 106,
            "paper_end": 110, "text": "beta"}
    no_offsets = good | {"paper_start": None, "paper_end": None}
    problems, counts = check_spans([good, no_offsets], {"p1": chunk}, {"P": paper})
    assert problems == [] and counts == {"spans_against_chunk_text": 2, "spans_against_paper_text": 1}
    bad = [good | {"text": "bet"}, good | {"end": 99}, good | {"paper_start": 105}, good | {"pair_id": "p2"}]
    problems, counts = check_spans(bad, {"p1": chunk}, {"P": None})
    assert len(problems) == 3 and "not the chunk's text" in problems[0] and "outside" in problems[1]
    assert "paper offsets" in problems[2]
    assert counts["spans_without_chunk_text"] == 1 and counts["spans_without_paper_text"] == 3
