"""The held-out gold file (benchmarks/gold/seeds-heldout.jsonl, issue 42): well formed, every span an exact substring of
its chunk where ``evaluate`` places it, and the issue's three questions in it."""

from __future__ import annotations

import json
from pathlib import Path

from verbatim_batch.quality.evaluate import load_gold

GOLD = Path(__file__).resolve().parents[1] / "benchmarks" / "gold" / "seeds-heldout.jsonl"
FIELDS = {"query", "paper_id", "chunk_index", "chunk", "relevant", "gold_spans", "rank"}


def test_heldout_gold_is_verbatim_and_well_formed():
    raw = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = load_gold(GOLD)
    assert len(raw) == len(rows) >= 60
    keys = set()
    for r, g in zip(raw, rows, strict=True):
        assert set(r) == FIELDS, r.keys()
        key = (r["query"], r["paper_id"], r["chunk_index"])
        assert key not in keys
        keys.add(key)
        assert r["relevant"] == bool(r["gold_spans"])
        assert g["gold_unaligned"] == 0 and len(g["gold_spans"]) == len(r["gold_spans"])
        for text, (start, end) in zip(r["gold_spans"], g["gold_spans"], strict=True):
            assert r["chunk"].count(text) == 1, text  # one place, so the offsets are that place
            assert r["chunk"][start:end] == text == text.strip() != ""
    queries = {r["query"] for r in raw}
    assert {"What Word-F1 does the student model reach?", "Which LLM produced the silver data?",
            "Which embedding model is used for dense retrieval?"} <= queries
    irrelevant = [r for r in raw if not r["relevant"]]
    assert len(irrelevant) >= 20 and any(all(not x["relevant"] for x in raw if x["query"] == q) for q in queries)
    for q in queries:  # rows of a query: its retrieved chunks, ranks 1..k in order
        assert [r["rank"] for r in raw if r["query"] == q] == list(range(1, 1 + sum(r["query"] == q for r in raw)))


QUESTIONS = GOLD.with_name("seeds-dev-questions.tsv")
DEVSETS = Path(__file__).resolve().parents[2] / "shared" / "devsets"


def test_dev_queries_asked_as_questions_are_one_each_and_apart_from_the_heldout():
    """benchmarks/gold/seeds-dev-questions.tsv: each dev file's keyword query once, with the same need asked as a
    question (what bench_defaults_cv.py tunes and reports on); none of them a held-out question."""
    lines = [line.split("\t") for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(len(parts) == 2 for parts in lines)
    asked = dict(lines)
    assert len(asked) == len(lines) >= 100  # one question per query
    assert all(q.endswith("?") and q[0].isupper() and q != k for k, q in asked.items())
    heldout = {json.loads(line)["query"] for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()}
    assert not heldout & set(asked.values())
    files = sorted(DEVSETS.glob("seeds-dev*.jsonl"))
    if files:  # the dev files (beside the repository, not in it): exactly their queries
        dev = {json.loads(line)["query"] for f in files for line in f.read_text(encoding="utf-8").splitlines()
               if line.strip()}
        assert set(asked) == dev
