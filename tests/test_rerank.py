"""The optional rerank stage: a tiny random cross-encoder built from a config (no hub), the batch callable without
Ray, the stage through the CLI on a real local Ray, and extract / evaluate-retrieval reading its run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_cross_encoder

from verbatim_batch.core.runs import build_manifest, read_manifest, read_table
from verbatim_batch.core.tables import RERANKED, RETRIEVAL

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PAPERS = {
    "P1": ["We train the tagger on 12k sentences from the news domain.",
           "Results improve by 3.1 points over the baseline on every test set.",
           "Table 2 lists the scores per domain, and the ablation removes the CRF layer."],
    "P2": ["Annotators reached a substantial agreement of 0.68 Cohen's Kappa.",
           "The corpus has 4,000 questions about 200 papers.",
           "Retrieval uses BM25 and a dense encoder fused by reciprocal ranks."],
}
QUERIES = {"qa": "how much did results improve", "qb": "annotator agreement kappa", "qc": "which retrieval model"}


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Path:
    return make_cross_encoder(tmp_path_factory.mktemp("ce") / "m")


def _candidates() -> pa.Table:
    rows = []
    for qid, query in QUERIES.items():
        for rank, (pid, i) in enumerate([("P1", 1), ("P2", 0), ("P2", 2), ("P1", 0)], 1):
            rows.append({"query_id": qid, "query": query, "chunk_id": f"{pid}-{i}", "paper_id": pid,
                         "chunk": PAPERS[pid][i], "first_method": "hybrid", "first_rank": rank,
                         "first_score": 1.0 / rank, "dense_rank": rank, "bm25_rank": None})
    return pa.Table.from_pylist(rows)


# --- the batch callable (no Ray) ---------------------------------------------------------------------------


def test_scores_do_not_depend_on_batching_and_rows_are_ranked_per_query(cross_encoder):
    from verbatim_batch.retrieval.reranker import Reranker, RerankerConfig

    cands = _candidates()
    small = Reranker(RerankerConfig(model=str(cross_encoder), token_budget=64, max_batch_rows=2))
    large = Reranker(RerankerConfig(model=str(cross_encoder), token_budget=100_000))
    queries, chunks = cands["query"].to_pylist(), cands["chunk"].to_pylist()
    a, b = small.score(queries, chunks), large.score(queries, chunks)
    assert small.stats["forwards"] > large.stats["forwards"] == 1
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert len(set(np.round(a, 4))) > 6  # the random model tells pairs apart
    assert small.describe()["model_revision"].startswith("sha256:")
    assert RerankerConfig(model="m", token_budget=1).hash == RerankerConfig(model="m").hash  # runtime field

    out = large(cands.append_column("extra", pa.array([0] * cands.num_rows)))
    assert out.schema.equals(RERANKED)
    rows = out.to_pylist()
    for qid in QUERIES:
        mine = [r for r in rows if r["query_id"] == qid]
        assert [r["rank"] for r in mine] == [1, 2, 3, 4]
        assert all(mine[i]["score"] >= mine[i + 1]["score"] for i in range(3))
        assert {r["first_rank"] for r in mine} == {1, 2, 3, 4} and {r["method"] for r in mine} == {"rerank"}
    # a candidate whose chunk is missing keeps its place after the scored ones
    broken = cands.set_column(cands.schema.get_field_index("chunk"), "chunk",
                              pa.array([None] + cands["chunk"].to_pylist()[1:], pa.string()))
    first = [r for r in large(broken).to_pylist() if r["query_id"] == "qa"]
    assert first[-1]["first_rank"] == 1 and first[-1]["score"] == -np.inf


def test_only_safetensors_and_no_remote_code(cross_encoder, tmp_path):
    import torch

    from verbatim_batch.retrieval.reranker import Reranker, RerankerConfig

    pickled = tmp_path / "pickled"
    shutil.copytree(cross_encoder, pickled)
    for f in pickled.glob("*.safetensors"):
        f.unlink()
    torch.save({}, pickled / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickle checkpoints are never loaded"):
        Reranker(RerankerConfig(model=str(pickled)))
    assert RerankerConfig(model="m").trust_remote_code is False
    with pytest.raises(ValueError, match="1 or 2 output labels"):
        Reranker(RerankerConfig(model=str(make_cross_encoder(tmp_path / "three", num_labels=3))))


def test_chain_runs_rerank_between_retrieve_and_extract(monkeypatch, tmp_path):
    """With a reranker the chain runs the rerank stage after retrieval and extract reads its run (no Ray: the
    stage runners are stand-ins that record their jobs)."""
    from verbatim_batch.stages import chains

    jobs = {}

    def fake(name):
        def run(job):
            jobs[name] = job
            return job.output, {"counts": {}, "tables": {}}
        return run

    for name in ("chunk", "embed", "index", "retrieve", "rerank", "extract"):
        monkeypatch.setitem(chains.RUNNERS, name, fake(name))
    chain = chains.Chain(input="corpus", queries="q.jsonl", stages={"rerank": {"model": "m", "top_k": 7}})
    results, _ = chains.run_chain(chain, str(tmp_path / "out"))
    assert list(results) == ["chunks", "embeddings", "index", "retrieval", "reranked", "spans"]
    assert jobs["rerank"].retrieval == str(tmp_path / "out" / "retrieval") and jobs["rerank"].top_k == 7
    assert jobs["extract"].retrieval == str(tmp_path / "out" / "reranked") and jobs["extract"].method is None
    chains.run_chain(chains.Chain(input="corpus", queries="q.jsonl"), str(tmp_path / "plain"))
    assert jobs["extract"].retrieval == str(tmp_path / "plain" / "retrieval")


# --- the stage on a real local Ray ----------------------------------------------------------------------


def _commit(run_dir: Path, command: str, config: dict, tables: dict[str, pa.Table]) -> str:
    run_dir.mkdir(parents=True)
    for name, table in tables.items():
        (run_dir / name).mkdir(parents=True)
        pq.write_table(table, run_dir / name / "part-0.parquet")
    (run_dir / "manifest.json").write_text(json.dumps(build_manifest(
        run_id=f"{command}-test", command=command, config=config, inputs=[], tables={}, counts={}, timings_s={})))
    return str(run_dir)


@pytest.fixture(scope="module")
def retrieval_run(tmp_path_factory) -> str:
    """A committed chunk run, index manifest and retrieval run, written directly (the stages that make them are
    tested elsewhere)."""
    root = tmp_path_factory.mktemp("rr")
    chunk_rows = [{"chunk_id": f"{pid}-{i}", "paper_id": pid, "chunk_index": i, "start": 100 * i, "text": text}
                  for pid, texts in PAPERS.items() for i, text in enumerate(texts)]
    chunks = _commit(root / "chunks", "chunk", {}, {"chunks": pa.Table.from_pylist(chunk_rows)})
    index = _commit(root / "index", "index", {"chunks": chunks}, {})
    qfile = root / "queries.jsonl"
    qfile.write_text("".join(json.dumps({"query_id": q, "query": t}) + "\n" for q, t in QUERIES.items()))
    rows = []
    ids = [r["chunk_id"] for r in chunk_rows]
    for n, qid in enumerate(QUERIES):
        order = ids[n:] + ids[:n]
        for method in ("hybrid", "bm25"):
            for rank, cid in enumerate(order[:5], 1):
                rows.append({"query_id": qid, "rank": rank, "chunk_id": cid, "paper_id": cid.split("-")[0],
                             "score": 1.0 / rank, "dense_rank": rank, "bm25_rank": None, "method": method})
    return _commit(root / "retrieval", "retrieve", {"queries": str(qfile), "index": index, "key": "k1"},
                   {"retrieval": pa.Table.from_pylist(rows, schema=RETRIEVAL)})


def test_rerank_stage_through_the_cli_then_extract_and_evaluate_read_it(ray_local, cross_encoder, retrieval_run,
                                                                      tmp_path, capsys):
    from verbatim_batch.cli import main
    from verbatim_batch.extract.semantic import SemanticConfig
    from verbatim_batch.stages.extract import ExtractJob, build_pairs, pair_method

    out = tmp_path / "reranked"
    argv = ["rerank", "--retrieval", retrieval_run, "--model", str(cross_encoder), "--top-k", "3",
            "--batch-rows", "4", "--max-length", "64", "--run-id", "rr1"]
    assert main([*argv, "--output", str(out)]) == 0
    table = read_table(str(out), "retrieval")
    assert table.schema.remove_metadata().equals(RERANKED.remove_metadata())
    rows = table.to_pylist()
    source = read_table(retrieval_run, "retrieval").to_pylist()
    for qid in QUERIES:
        mine = sorted((r for r in rows if r["query_id"] == qid), key=lambda r: r["rank"])
        top3 = {r["chunk_id"] for r in source if r["query_id"] == qid and r["method"] == "hybrid" and r["rank"] <= 3}
        assert {r["chunk_id"] for r in mine} == top3 and [r["rank"] for r in mine] == [1, 2, 3]
        assert all(a["score"] >= b["score"] for a, b in zip(mine, mine[1:], strict=False))
        assert {r["first_method"] for r in mine} == {"hybrid"}
    manifest = read_manifest(str(out))
    counts = manifest["counts"]
    assert counts["queries"] == 3 and counts["candidates"] == 9 and counts["rows_new"] == 3
    assert counts["tokens"] > 0 and counts["candidates_without_chunk"] == 0
    config = json.loads(manifest["config"])
    assert config["model_revision"].startswith("sha256:") and config["queries"].endswith("queries.jsonl")

    # the same run id again: the committed run is left as is; a new run with --previous carries every query
    assert main([*argv, "--output", str(out)]) == 0
    assert read_manifest(str(out))["run_id"] == manifest["run_id"]
    again = tmp_path / "again"
    assert main([*argv[:-2], "--output", str(again), "--previous", str(out)]) == 0
    assert read_manifest(str(again))["counts"]["rows_carried"] == 3

    # extract takes the rerank run as its retrieval input: its rows, in reranked order
    job = ExtractJob(extractor=SemanticConfig(), retrieval=str(out), output=str(tmp_path / "x"), top_k=2)
    assert pair_method(job) == "rerank"
    pairs = build_pairs(job).to_pylist()
    best = {r["query_id"]: r["chunk_id"] for r in rows if r["rank"] == 1}
    assert {p["query_id"]: p["chunk_id"] for p in pairs if p["rank"] == 1} == best and len(pairs) == 6

    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in best.items()))
    capsys.readouterr()
    assert main(["evaluate-retrieval", "--retrieval", str(out), "--qrels", str(qrels), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["methods"]["rerank"]["MRR@10"] == 1.0
