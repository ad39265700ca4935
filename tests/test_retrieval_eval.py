"""evaluate-retrieval: run and qrels readers, and metrics that reproduce published figures (no Ray)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.runs import build_manifest
from verbatim_batch.core.tables import RETRIEVAL, query_id_for
from verbatim_batch.quality.retrieval_eval import ChunkKeys, evaluate_run, read_qrels, read_run, run_from_table

# The worked example of pytrec_eval's README (github.com/cvangysel/pytrec_eval): trec_eval gives
# q1 ndcg 0.5, map 1/3 and q2 ndcg 0.6934264036172708, map 0.5833.
README_QREL = {"q1": {"d1": 0, "d2": 1, "d3": 0}, "q2": {"d2": 1, "d3": 1}}
README_RUN = {"q1": {"d1": 1.0, "d2": 0.0, "d3": 1.5}, "q2": {"d1": 1.5, "d2": 0.2, "d3": 0.5}}


def _trec_files(tmp_path):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 {d} {r}\n" for q, docs in README_QREL.items() for d, r in docs.items()))
    run = tmp_path / "run.txt"
    lines = []
    for q, docs in README_RUN.items():
        for rank, (d, s) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), 1):
            lines.append(f"{q} Q0 {d} {rank} {s} readme\n")
    run.write_text("".join(lines))
    return str(run), str(qrels)


def test_published_pytrec_eval_example_through_the_command(tmp_path, capsys):
    run, qrels = _trec_files(tmp_path)
    assert main(["evaluate-retrieval", "--retrieval", run, "--qrels", qrels, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    m = result["methods"]["readme"]
    # nDCG@10 equals the README's uncut ndcg here (3 documents per query)
    assert m["nDCG@10"] == pytest.approx((0.5 + 0.6934264036172708) / 2, abs=1e-12)
    # reciprocal rank: q1's relevant d2 is third (scores 1.5, 1.0, 0.0), q2's first relevant d3 second
    assert m["MRR@10"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert m["Recall@5"] == 1.0 and m["queries"] == 2 and result["labelled_queries"] == 2
    per_query = evaluate_run(read_run(run), read_qrels(qrels)[0], per_query=True)["readme"]["per_query"]
    assert per_query["q1"]["nDCG@10"] == pytest.approx(0.5) and per_query["q2"]["nDCG@10"] == pytest.approx(
        0.6934264036172708, abs=1e-15)


def test_qrels_formats_agree(tmp_path):
    _, trec = _trec_files(tmp_path)
    tsv = tmp_path / "qrels.tsv"
    tsv.write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{r}\n" for q, docs in README_QREL.items() for d, r in docs.items()))
    jsonl = tmp_path / "qrels.jsonl"
    jsonl.write_text("".join(json.dumps({"query-id": q, "corpus-id": d, "score": r}) + "\n"
                             for q, docs in README_QREL.items() for d, r in docs.items()))
    for path in (trec, tsv, jsonl):
        assert read_qrels(str(path))[0] == README_QREL, path
    bad = tmp_path / "bad.tsv"
    bad.write_text("q1\td1\thigh\n")
    with pytest.raises(ValueError, match="relevance must be a number"):
        read_qrels(str(bad))


def test_run_folder_ranks_papers_gold_rows_and_missing_queries(tmp_path):
    """A run folder is scored in its rank order (not by score); gold rows (devsets format) find their chunk by
    paper and text; at paper level a paper counts at its best chunk; a labelled query without rows scores 0."""
    chunks = pa.table({"chunk_id": ["c1", "c2", "c3"], "paper_id": ["P", "P", "Q"], "chunk_index": [0, 1, 0],
                       "text": ["alpha text", "beta text", "gamma text"]})
    (tmp_path / "chunks").mkdir()
    pq.write_table(chunks, tmp_path / "chunks" / "part-0.parquet")
    rows = [  # scores deliberately disagree with ranks: ranks decide
        ("qa", 1, "c2", "P", 0.1, "hybrid"), ("qa", 2, "c1", "P", 0.9, "hybrid"), ("qa", 3, "c3", "Q", 0.5, "hybrid"),
    ]
    table = pa.Table.from_pylist([dict(zip(("query_id", "rank", "chunk_id", "paper_id", "score", "method"), r,
                                           strict=True)) | {"dense_rank": None, "bm25_rank": None} for r in rows],
                                 schema=RETRIEVAL)
    run_dir = tmp_path / "run"
    (run_dir / "retrieval").mkdir(parents=True)
    pq.write_table(table, run_dir / "retrieval" / "part-0.parquet")
    (run_dir / "manifest.json").write_text(json.dumps(build_manifest(
        run_id="r", command="retrieve", config={}, inputs=[], tables={}, counts={}, timings_s={})))
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in [
        {"query": "question a", "paper_id": "P", "chunk_index": 7, "chunk": "alpha text", "relevant": True,
         "gold_spans": ["alpha"]},  # its index drifted: found by text
        {"query": "question a", "paper_id": "Q", "chunk_index": 0, "chunk": "gamma text", "relevant": False,
         "gold_spans": []},
        {"query": "question b", "paper_id": "Q", "chunk_index": 0, "chunk": "gamma text", "relevant": True,
         "gold_spans": ["gamma"]},
        {"query": "question c", "paper_id": "P", "chunk_index": 9, "chunk": "text no chunk has", "relevant": True,
         "gold_spans": ["text"]},
    ]))
    keys = ChunkKeys(str(tmp_path / "chunks"))
    qrels, counts = read_qrels(str(gold), chunks=keys, query_ids={"question a": "qa"})
    assert qrels == {"qa": {"c1": 1, "c3": 0}, query_id_for("question b"): {"c3": 1}}
    assert counts == {"judgments": 3, "unplaced_gold_rows": 1}
    result = evaluate_run(read_run(str(run_dir)), qrels, recall_at=(1, 2))["hybrid"]
    assert result["queries"] == 2 and result["queries_without_rows"] == 1  # question b has no rows: 0
    assert result["MRR@10"] == pytest.approx((1 / 2 + 0) / 2) and result["Recall@1"] == 0.0
    assert result["Recall@2"] == pytest.approx(0.5)
    papers = run_from_table(table, level="paper")["hybrid"]["qa"]
    assert papers == {"P": -1.0, "Q": -3.0}
    paper_qrels, _ = read_qrels(str(gold), level="paper", query_ids={"question a": "qa"})
    assert paper_qrels["qa"] == {"P": 1, "Q": 0}
    assert evaluate_run({"hybrid": {"qa": papers}}, {"qa": paper_qrels["qa"]})["hybrid"]["MRR@10"] == 1.0
    with pytest.raises(ValueError, match="needs the chunk table"):
        read_qrels(str(gold))


def test_cli_defaults_are_the_retriever_defaults():
    """The hybrid defaults are declared once (retrieval.py) and the CLI's are the same."""
    from verbatim_batch.cli import parse_args
    from verbatim_batch.cli.commands import job_of
    from verbatim_batch.retrieval.retriever import DEFAULT_DEPTH, DEFAULT_RRF_K, DEFAULT_WEIGHTS, RetrieverConfig

    job = job_of(parse_args(["retrieve", "--index", "i", "--queries", "q", "--output", "o"]))
    default = RetrieverConfig()
    assert job.retriever == default
    assert (default.weights, default.rrf_k, default.depth) == (DEFAULT_WEIGHTS, DEFAULT_RRF_K, DEFAULT_DEPTH)
