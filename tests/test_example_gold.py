"""The example gold file shipped with the package (verbatim_batch/examples/gold.jsonl, docs/extraction.md): every
span is its chunk's text at its offsets, every chunk is its bundled paper's text as `chunk` cuts it, the file is
package data, and `evaluate` reads it and scores it (predictions equal to the gold: every score 1). No Ray."""

from __future__ import annotations

import json
import re
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.tables import chunk_id
from verbatim_batch.corpus.chunker import ChunkerConfig, chunk_markdown
from verbatim_batch.quality.evaluate import load_gold

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "verbatim_batch" / "examples"
GOLD = EXAMPLES / "gold.jsonl"
ROWS = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
QUERIES = {q["query_id"]: q for q in map(json.loads, (EXAMPLES / "queries.jsonl").read_text().splitlines())}


def test_the_file_is_small_and_each_row_a_gold_pair():
    assert 8 <= len(ROWS) <= 16
    keys = [(r["query"], r["paper_id"], r["chunk_index"]) for r in ROWS]
    assert len(set(keys)) == len(keys), "a pair twice"
    for r in ROWS:
        assert r["query"] == QUERIES[r["query_id"]]["query"], "a query of the bundled query file"
        assert r["relevant"] is bool(r["gold_spans"]), "relevant exactly when the row has spans"
    assert sum(r["relevant"] for r in ROWS) >= 6 and sum(not r["relevant"] for r in ROWS) >= 2


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['query_id']}-{r['paper_id']}-{r['chunk_index']}")
def test_every_span_is_verbatim_in_its_chunk_and_its_paper(row):
    paper = (EXAMPLES / "corpus" / f"{row['paper_id']}.md").read_text(encoding="utf-8")
    config = ChunkerConfig()
    chunks = chunk_markdown(paper, config)
    chunk = chunks[row["chunk_index"]]
    assert chunk.text == row["chunk"] and paper[chunk.start:chunk.end] == row["chunk"]
    occurrence = Counter(c.text for c in chunks[:row["chunk_index"]])[chunk.text]
    assert row["chunk_id"] == chunk_id(row["paper_id"], chunk.text.encode("utf-8"), config.hash, occurrence)
    if row["relevant"]:  # the labelled chunk of the bundled query file
        assert row["chunk_id"] == QUERIES[row["query_id"]]["chunk_id"]
    for span in row["gold_spans"]:
        start, end, text = span["start"], span["end"], span["text"]
        assert 0 <= start < end <= len(row["chunk"])
        assert row["chunk"][start:end] == text, "the span is the chunk's text at its offsets"
        assert paper[chunk.start + start:chunk.start + end] == text, "and the paper's at the chunk's offset plus them"
        assert text == text.strip() and row["chunk"].count(text) == 1, "trimmed, and found once in its chunk"


def test_evaluate_reads_every_span_at_its_offsets():
    gold = load_gold(str(GOLD))
    assert [g["gold_spans"] for g in gold] == [[(s["start"], s["end"]) for s in r["gold_spans"]] for r in ROWS]
    assert all(g["gold_unaligned"] == 0 for g in gold)


def test_evaluate_scores_predictions_equal_to_the_gold_at_1(tmp_path, capsys):
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps({"query": r["query"], "paper_id": r["paper_id"],
                                               "chunk_index": r["chunk_index"], "spans": r["gold_spans"]}) + "\n"
                                   for r in ROWS), encoding="utf-8")
    assert main(["evaluate", "--gold", str(GOLD), "--predictions", str(predictions), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_rows"] == len(ROWS) and result["n_gold_spans"] == sum(len(r["gold_spans"]) for r in ROWS)
    assert result["word"]["micro_f1"] == 1.0 and all(v["f1"] == 1.0 for v in result["iou"].values())
    diag = result["diagnostics"]
    assert diag["relevant_rows"] == sum(r["relevant"] for r in ROWS)
    assert diag["offset_mismatch"] == diag["gold_unaligned"] == diag["unmatched_predictions"] == 0


def test_the_file_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch("examples/gold.jsonl", p) for p in patterns["verbatim_batch"])


def test_the_guide_shows_the_files_first_row():
    """docs/extraction.md quotes the first row (its chunk cut short): the quote is the file's."""
    page = (ROOT / "docs" / "extraction.md").read_text(encoding="utf-8")
    quoted = re.search(r"### An example gold file.*?```json\n(.*?)```", page, re.S).group(1)
    quoted = re.sub(r'"chunk": "[^"]*"', '"chunk": ""', quoted)
    assert json.loads(quoted) == {**ROWS[0], "chunk": ""}
