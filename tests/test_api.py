"""The public Python API (verbatim_batch.api): stages as functions over ray.data.Dataset, on a real local Ray,
including the README's example, run as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import ray

from verbatim_batch import api
from verbatim_batch.chunking import ChunkerConfig
from verbatim_batch.tables import embeddings_schema

os.environ.setdefault("HF_HUB_OFFLINE", "1")
README = Path(__file__).resolve().parents[1] / "README.md"

PAPER = ("# A Study\n\n## Method\n\nWe train the tagger on 5,000 annotated pairs for three epochs.\n\n"
         "## Results\n\nThe tagger reaches 71.2 F1 on the held-out set, 4 points above the baseline.\n")


def test_readme_example_runs_as_written(ray_local):
    block = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no API example"
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102 - our own README
    rows = scope["rows"]
    assert rows and all(r["chunk"][s["start"]:s["end"]] == s["text"] for r in rows for s in r["spans"])


def test_chunk_embed_extract_over_datasets(ray_local):
    papers = ray.data.from_items([{"paper_id": "P1", "markdown": PAPER}, {"paper_id": "P2", "markdown": ""},
                                  {"paper_id": "P3", "markdown": None}])
    chunks = api.chunk(papers, ChunkerConfig(min_chars=10, max_chars=200)).take_all()
    assert {c["paper_id"] for c in chunks} == {"P1"}  # empty and missing papers give no chunks
    assert all(PAPER[c["start"]:c["end"]] == c["text"] for c in chunks)
    vectors = api.embed(ray.data.from_items(chunks)).take_all()
    # exactly the documented columns: no internal retry or per-batch figure columns leak into users' rows
    assert all(set(v) == set(embeddings_schema(384).names) for v in vectors), set(vectors[0])
    assert sorted(v["chunk_id"] for v in vectors) == sorted(c["chunk_id"] for c in chunks)
    assert all(len(v["vector"]) == 384 for v in vectors)
    pairs = ray.data.from_items([{"query": "how many annotated training pairs", "chunk": c["text"], "mine": i}
                                 for i, c in enumerate(chunks)] + [{"query": "", "chunk": "x", "mine": -1}])
    out = sorted(api.extract(pairs).take_all(), key=lambda r: r["mine"])
    assert all(set(r) == {"query", "chunk", "mine", "spans", "relevance", "error"} for r in out), set(out[0])
    assert [r["mine"] for r in out] == [-1, *range(len(chunks))]  # every row back, extra columns kept
    assert out[0]["error"] == "empty_query" and out[0]["spans"] == []
    for r in out[1:]:
        assert r["error"] is None
        assert all(r["chunk"][s["start"]:s["end"]] == s["text"] for s in r["spans"])
    assert any("5,000 annotated pairs" in s["text"] for r in out for s in r["spans"])
