"""Retrieval recall@k per method on a labelled set the project generates.

    .venv/bin/python benchmarks/bench_retrieval.py --papers 100 --queries 100

Synthetic papers -> chunk -> embed (bundled MiniLM) -> index (Flat + BM25) -> retrieve, all
through the real Ray jobs; queries are drawn from known chunks (labelled.py) in two styles:
whole sentences and keyword queries (4-7 content words of a sentence).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from verbatim_batch.core.runs import read_table  # noqa: E402
from verbatim_batch.retrieval.retriever import recall_at  # noqa: E402
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_batch.stages.embed import EmbedJob, run_embed
from verbatim_batch.stages.index import IndexJob, run_index
from verbatim_batch.stages.retrieve import RetrieveJob, run_retrieve
from verbatim_synth import corpus as synth  # noqa: E402
from verbatim_synth.labelled import make_labelled_queries  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--papers", type=int, default=100)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-retr-"))
    t0 = time.perf_counter()
    synth.write_corpus(root / "corpus", n=args.papers, seed=args.seed, fmt="md")
    chunks, _ = run_chunk(ChunkJob(input=str(root / "corpus"), output=str(root / "chunks"),
                                   metadata=str(root / "corpus" / "metadata.jsonl")))
    emb, emb_m = run_embed(EmbedJob(chunks=chunks, output=str(root / "emb")))
    index, _ = run_index(IndexJob(embeddings=emb, chunks=chunks, output=str(root / "index")))
    table = read_table(chunks, "chunks")
    results = {"papers": args.papers, "chunks": table.num_rows, "truncated_chunks": emb_m["counts"]["truncated"],
               "model": "all-MiniLM-L6-v2 (256-token window)", "recall": {}}
    for style in ("sentence", "keywords"):
        q = make_labelled_queries(table, args.queries, seed=args.seed, style=style)
        qfile = root / f"q-{style}.jsonl"
        qfile.write_text("\n".join(json.dumps(r) for r in q.to_pylist()) + "\n")
        out, _ = run_retrieve(RetrieveJob(index=index, queries=str(qfile), output=str(root / f"r-{style}")))
        labels = dict(zip(q["query_id"].to_pylist(), q["chunk_id"].to_pylist(), strict=True))
        ret = read_table(out, "retrieval")
        results["recall"][style] = {
            "queries": q.num_rows,
            "recall@5": recall_at(ret, labels, 5),
            "recall@10": recall_at(ret, labels, 10),
        }
    results["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
