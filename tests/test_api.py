"""The public Python API (verbatim_batch.api): stages as functions over ray.data.Dataset, on a real local Ray,
including the guide's example (docs/api.md), run as written."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from verbatim_batch import api
from verbatim_batch.core.tables import CHUNKS, RETRIEVAL, embeddings_schema
from verbatim_batch.corpus.chunker import ChunkerConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
EXAMPLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"

PAPER = ("# A Study\n\n## Method\n\nWe train the tagger on 5,000 annotated pairs for three epochs.\n\n"
         "## Results\n\nThe tagger reaches 71.2 F1 on the held-out set, 4 points above the baseline.\n")


def test_guide_api_example_runs_as_written(ray_local):
    """The API example of the guide (docs/api.md, after ``<!-- api-example -->``; it was the README's)."""
    block = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", EXAMPLE_PAGE.read_text(), re.S)
    assert block, "docs/api.md has no API example"
    scope: dict = {}
    exec(compile(block.group(1), "docs/api.md", "exec"), scope)  # noqa: S102 - our own guide
    rows = scope["rows"]
    spans = [(r["chunk"], s) for r in rows for s in r["spans"]]
    assert spans, f"the guide's example finds no span: {rows}"  # it shows one; an empty list would prove nothing
    assert all(chunk[s["start"]:s["end"]] == s["text"] for chunk, s in spans)


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


COMPOSE_TIMEOUT_S = 240  # a pipeline whose actors hold every CPU makes no progress at all: it never ends
QUERIES = ("how many annotated pairs is the tagger trained on", "what F1 does the tagger reach")


def test_processors_compose_in_a_pipeline_on_two_cpus_without_materialize(ray_local, tmp_path):
    """read -> (map) -> chunk -> flat_map(pairs) -> extract -> write, lazily, on the 2-CPU session Ray: chunking
    runs as tasks and the extractor's actor claims no CPU, so the read always has a CPU (with an actor pool
    per processor holding one each, this made no progress for 16 minutes: ``3/2 CPU``). The map is the chunk
    processor's ``preprocess`` hook; ``postprocess`` adds a column."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"paper{i}.md").write_text(PAPER.replace("A Study", f"Study {i}"))
    out = tmp_path / "out"

    def pipeline() -> None:
        papers = ray.data.read_binary_files(str(corpus), include_paths=True)
        chunks = api.chunk(papers, api.ChunkerConfig(min_chars=10, max_chars=200),
                           preprocess=lambda r: {"paper_id": Path(r["path"]).stem, "markdown": r["bytes"].decode()})
        pairs = chunks.flat_map(lambda c: [{"query": q, "chunk": c["text"], "chunk_id": c["chunk_id"]}
                                           for q in QUERIES])
        spans = api.extract(pairs, api.SemanticConfig(), batch_rows=4,
                            postprocess=lambda r: {**r, "n_spans": len(r["spans"])})
        spans.write_parquet(str(out))

    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _catch(pipeline, errors), daemon=True)
    thread.start()
    thread.join(COMPOSE_TIMEOUT_S)
    assert not thread.is_alive(), f"the composed pipeline made no end in {COMPOSE_TIMEOUT_S} s (stalled?)"
    assert not errors, errors
    rows = pq.read_table(out).to_pylist()
    n_chunks = len({r["chunk_id"] for r in rows})
    assert n_chunks >= 3 and len(rows) == n_chunks * len(QUERIES)
    assert all(set(r) == {"query", "chunk", "chunk_id", "spans", "relevance", "error", "n_spans"} for r in rows)
    assert all(r["error"] is None and r["n_spans"] == len(r["spans"]) for r in rows)
    found = [(r["chunk"], s) for r in rows for s in r["spans"]]
    assert found and all(chunk[s["start"]:s["end"]] == s["text"] for chunk, s in found)


def _catch(fn, errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        errors.append(exc)


def test_retrieve_over_an_index_folder_and_build_processor(ray_local, tmp_path):
    """api.retrieve over an index run folder (BM25 only, so no model: cheap), rows of tables.RETRIEVAL exactly;
    build_processor picks the processor from the config; a folder that is not an index run is refused."""
    from verbatim_batch.retrieval.index import Bm25Index

    texts = {"c1": "the tagger is trained on annotated pairs", "c2": "results on the held-out set",
             "c3": "a baseline without pairs"}
    index = tmp_path / "index"
    Bm25Index.build(list(texts.values())).save(index / "bm25")
    pq.write_table(pa.table({"chunk_id": list(texts), "paper_id": ["P1", "P1", "P2"]}), index / "ids.parquet")
    from verbatim_batch.core.runs import build_manifest

    manifest = build_manifest(run_id="index-test", command="index", config={}, inputs=[],
                              tables={"ids": {"rows": 3, "files": 1}}, counts={}, timings_s={})
    (index / "manifest.json").write_text(json.dumps(manifest))
    queries = ray.data.from_items([{"query_id": "q1", "query": "annotated training pairs"},
                                   {"query": "held-out results"}])
    config = api.RetrieverConfig(index_dir=str(index), methods=("bm25",), k=2)
    processor = api.build_processor(config, postprocess=lambda r: {**r, "hook": 1})
    assert isinstance(processor, api.Processor) and processor.name == "retrieve"
    rows = sorted(api.retrieve(queries, config).take_all(), key=lambda r: (r["query_id"], r["rank"]))
    assert all(set(r) == set(RETRIEVAL.names) for r in rows), set(rows[0])
    top = {r["query_id"]: r["chunk_id"] for r in rows if r["rank"] == 1}
    assert top["q1"] == "c1" and "c2" in top.values() and {r["method"] for r in rows} == {"bm25"}
    assert len({r["query_id"] for r in rows}) == 2  # a query without an id gets the one the jobs would give it
    assert all(r["hook"] == 1 for r in processor(queries).take_all())
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text(json.dumps({"run_id": "x", "command": "embed"}))
    with pytest.raises(ValueError, match="holding ids; .* is a embed run"):
        api.retrieve(queries, str(tmp_path / "other"))
    with pytest.raises(TypeError, match="no processor"):
        api.build_processor(object())
    assert api.build_processor(api.ChunkerConfig()).name == "chunk"
    assert set(CHUNKS.names) == set(api.chunk(ray.data.from_items([{"paper_id": "P", "markdown": PAPER}]))
                                    .take(1)[0])
