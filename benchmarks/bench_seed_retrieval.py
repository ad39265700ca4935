"""Retrieval per method on real text: the four seed papers and the hand-labelled queries of shared/devsets.

    .venv/bin/python benchmarks/bench_seed_retrieval.py [--work DIR] [--demo] [--json FILE]

The seed papers (shared/seeds/*.txt, copied to <stem>.md) -> chunk (defaults) -> embed (bundled MiniLM) -> index
(Flat + BM25), through the real jobs; then retrieval in this process (``retrieval.Retriever``, the retrieve
stage's own callable) under several settings, scored by ``retrieval_eval`` (trec_eval through pytrec_eval) on:

* seeds-dev.jsonl: 40 queries, each with one relevant chunk (written while reading it: lexical, BM25-friendly);
* seeds-dev-retrieved.jsonl: 27 queries with 65 relevant chunks, written before any retrieval (but judged only
  on the top 3 of the old hybrid, so unjudged chunks count as not relevant);
* with --demo, the bundled demo corpus and its 16 labelled queries (synthetic: a check, never the basis).

Two indexes of the same chunks, built in the same run: ``truncated`` (``max_windows=1``: each chunk embedded
from its first 256 tokens, as before issue 35) and ``windows`` (the default: a chunk longer than one window gets a
vector per window, scored by its best). For each: settings ``before`` (plain RRF: equal weights, rrf_k 60, 2k = 20
candidates per method, missing ranks add nothing), ``after`` (the defaults), and a grid of dense weight x rrf_k at
the default depth. Also the rank of the chunk that answers "annotator agreement Cohen's Kappa" (the issue-24
example) per method.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa  # noqa: E402

from verbatim_batch.core.tables import query_id_for  # noqa: E402
from verbatim_batch.quality.retrieval_eval import ChunkKeys, evaluate_run, read_qrels, run_from_table  # noqa: E402
from verbatim_batch.retrieval.embedder import EmbedderConfig  # noqa: E402
from verbatim_batch.retrieval.retriever import Retriever, RetrieverConfig  # noqa: E402
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_batch.stages.embed import EmbedJob, run_embed
from verbatim_batch.stages.index import IndexJob, run_index  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEVSETS = ("seeds-dev.jsonl", "seeds-dev-retrieved.jsonl")
KAPPA = ("annotator agreement Cohen's Kappa", "0.68 Cohens Kappa")  # query, text of the chunk that answers it
BEFORE = {"weights": {"dense": 1.0, "bm25": 1.0}, "rrf_k": 60, "depth": 20, "fill_missing": False}
POOLED = ROOT / "benchmarks" / "qrels" / "seeds-pool5.jsonl"  # judgments of the unjudged top-5 chunks
GRID_WEIGHTS = (0.1, 0.2, 0.3, 0.5, 1.0)
GRID_RRF_K = (5, 10, 20, 60)


def add_pooled(qrels: dict, name: str, path: Path) -> dict[str, int]:
    """``qrels[name + " +pooled"]``: the dev file's labels plus the pooled judgments of its queries' other
    chunks (``benchmarks/qrels/seeds-pool5.jsonl``; by chunk id: judgments of chunks today's chunker no longer
    makes are counted as unplaced)."""
    extra = {q: dict(docs) for q, docs in qrels[name].items()}
    placed = unplaced = 0
    for line in path.read_text().splitlines() if path.exists() else ():
        row = json.loads(line)
        if row["file"] != name:
            continue
        qid = query_id_for(row["query"])
        if qid not in extra:
            unplaced += 1
            continue
        extra[qid].setdefault(row["chunk_id"], int(row["relevant"]))
        placed += 1
    qrels[f"{name} +pooled"] = extra
    return {"placed": placed, "unplaced": unplaced}


def build(corpus: Path, work: Path, metadata: str | None = None, max_windows: int | None = None) -> tuple[str, str]:
    """chunk -> embed -> index into ``work`` (reused when already there); returns (chunks, index) run folders.
    ``max_windows``: the embedder's (None: its default); each setting has its own embed and index runs."""
    name = "" if max_windows is None else f"-w{max_windows}"
    chunks = work / "chunks"
    if not (chunks / "manifest.json").exists():
        run_chunk(ChunkJob(input=str(corpus), output=str(chunks), format="md", metadata=metadata, overwrite=True))
    index = work / f"index{name}"
    if not (index / "manifest.json").exists():
        embedder = EmbedderConfig() if max_windows is None else EmbedderConfig(max_windows=max_windows)
        emb, _ = run_embed(EmbedJob(chunks=str(chunks), output=str(work / f"emb{name}"), embedder=embedder,
                                    overwrite=True))
        run_index(IndexJob(embeddings=emb, chunks=str(chunks), output=str(index), overwrite=True))
    return str(chunks), str(index)


def score(retriever: Retriever, queries: pa.Table, qrels: dict, **settings) -> dict:
    retriever.config = dataclasses.replace(retriever.config, **settings)
    run = run_from_table(retriever(queries))
    out = {}
    for name, labels in qrels.items():
        methods = evaluate_run(run, labels, recall_at=(5, 10))
        out[name] = {m: {k: round(v, 4) for k, v in r.items() if k != "queries_without_rows"}
                     for m, r in methods.items()}
    return out


def kappa_ranks(retriever: Retriever, chunk_id: str, **settings) -> dict[str, int | None]:
    retriever.config = dataclasses.replace(retriever.config, **settings)
    table = retriever(pa.table({"query_id": ["kappa"], "query": [KAPPA[0]]})).to_pylist()
    return {m: next((r["rank"] for r in table if r["method"] == m and r["chunk_id"] == chunk_id), None)
            for m in ("dense", "bm25", "hybrid")}


def seeds(work: Path) -> dict:
    """Both indexes (truncated, windows) scored on the dev-set queries."""
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for f in sorted((SHARED / "seeds").glob("*.txt")):
        shutil.copy(f, corpus / f"{f.stem}.md")
    return {"truncated": seeds_index(corpus, work, 1), "windows": seeds_index(corpus, work, None)}


def seeds_index(corpus: Path, work: Path, max_windows: int | None) -> dict:
    chunks, index = build(corpus, work, max_windows=max_windows)
    keys = ChunkKeys(str(Path(chunks) / "chunks"))
    texts, qrels, counts_pooled = {}, {}, {}
    for name in DEVSETS:
        for line in (SHARED / "devsets" / name).read_text().splitlines():
            texts[query_id_for(json.loads(line)["query"])] = json.loads(line)["query"]
        qrels[name], counts = read_qrels(str(SHARED / "devsets" / name), chunks=keys)
        counts_pooled[name] = add_pooled(qrels, name, POOLED)
        assert counts["unplaced_gold_rows"] == 0, f"{name}: gold chunks not found in today's chunks: {counts}"
    queries = pa.table({"query_id": list(texts), "query": list(texts.values())})
    retriever = Retriever(RetrieverConfig(index_dir=index, k=10))
    from verbatim_batch.core.runs import read_table

    table = read_table(chunks, "chunks", ["chunk_id", "text"]).to_pylist()
    kappa_chunk = next(r["chunk_id"] for r in table if KAPPA[1] in r["text"])
    defaults = {f.name: f.default for f in dataclasses.fields(RetrieverConfig) if f.name in ("rrf_k", "depth",
                                                                                            "fill_missing")}
    defaults["weights"] = RetrieverConfig(index_dir=index).weights
    from verbatim_batch.core.runs import read_manifest

    pooled = {n: q for n, q in qrels.items() if n.endswith("+pooled")}
    qrels = {n: q for n, q in qrels.items() if not n.endswith("+pooled")}
    result = {"chunks": len(table), "queries": {n: len(q) for n, q in qrels.items()}, "pooled_judgments": counts_pooled,
              "index_counts": read_manifest(index)["counts"],
              "before": {"settings": BEFORE, "metrics": score(retriever, queries, qrels, **BEFORE),
                         "kappa_ranks": kappa_ranks(retriever, kappa_chunk, **BEFORE)},
              "after_pooled": {"settings": defaults, "metrics": score(retriever, queries, pooled, **defaults)},
              "after": {"settings": defaults, "metrics": score(retriever, queries, qrels, **defaults),
                        "kappa_ranks": kappa_ranks(retriever, kappa_chunk, **defaults)},
              "grid": []}
    for rrf_k in GRID_RRF_K:
        for w in GRID_WEIGHTS:
            s = {"weights": {"dense": w, "bm25": 1.0}, "rrf_k": rrf_k, "depth": defaults["depth"],
                 "fill_missing": True}
            m = score(retriever, queries, qrels, **s)
            p = score(retriever, queries, pooled, **s)
            result["grid"].append({"dense_weight": w, "rrf_k": rrf_k, **{n: m[n]["hybrid"] for n in m},
                                   **{n: p[n]["hybrid"] for n in p}})
    return result


def demo(work: Path) -> dict:
    from verbatim_batch.cli.commands import EXAMPLES

    corpus = Path(str(EXAMPLES / "corpus"))
    rows = [json.loads(line) for line in Path(str(EXAMPLES / "queries.jsonl")).read_text().splitlines()]
    queries = pa.table({"query_id": [r["query_id"] for r in rows], "query": [r["query"] for r in rows]})
    qrels = {"demo": {r["query_id"]: {r["chunk_id"]: 1} for r in rows}}
    out: dict = {"queries": len(rows)}
    for name, max_windows in (("truncated", 1), ("windows", None)):
        chunks, index = build(corpus, work, metadata=str(corpus / "metadata.jsonl"), max_windows=max_windows)
        retriever = Retriever(RetrieverConfig(index_dir=index, k=10))
        defaults = {"weights": RetrieverConfig(index_dir=index).weights, "rrf_k": RetrieverConfig.rrf_k,
                    "depth": RetrieverConfig.depth, "fill_missing": RetrieverConfig.fill_missing}
        out[name] = {"before": score(retriever, queries, qrels, **BEFORE)["demo"],
                     "after": score(retriever, queries, qrels, **defaults)["demo"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", help="folder for the runs (reused when there; default: a temporary folder)")
    ap.add_argument("--demo", action="store_true", help="also the bundled demo corpus (synthetic)")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-seed-retr-"))
    t0 = time.perf_counter()
    results = {"model": "all-MiniLM-L6-v2 (bundled; 256-token window)", "seeds": seeds(work / "seeds")}
    for res in results["seeds"].values():
        pooled = {}
        for method in ("dense", "bm25", "hybrid"):
            per = [(r["queries"], r) for r in (res["after"]["metrics"][f][method] for f in DEVSETS)]
            pooled[method] = {m: round(sum(q * r[m] for q, r in per) / sum(q for q, _ in per), 4)
                              for m in ("Recall@5", "MRR@10")}
        res["after"]["pooled"] = pooled
    if args.demo:
        results["demo"] = demo(work / "demo")
    results["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
