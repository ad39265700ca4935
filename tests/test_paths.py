"""Paths are resolved once, where a command reads its options: manifests hold absolute locations, so a run made
from one folder is evaluated and extracted from any other with the same results; a path that cannot be found
stops with one line and exit 2, never a score of 0."""

from __future__ import annotations

import json
import shutil
from importlib import resources

import pyarrow.parquet as pq
import pytest

from verbatim_batch.cli import main
from verbatim_batch.core.runs import manifest_config

EXAMPLES = resources.files("verbatim_batch") / "examples"


def _workspace(folder, n_papers: int = 3):
    """A corpus folder, its queries and TREC qrels (the queries' labelled chunks), under ``folder``."""
    names = sorted(p.name for p in (EXAMPLES / "corpus").iterdir() if p.name.endswith(".md"))[:n_papers]
    ids = {n.removesuffix(".md") for n in names}
    (folder / "corpus").mkdir(parents=True)
    for name in names:
        shutil.copyfile(EXAMPLES / "corpus" / name, folder / "corpus" / name)
    rows = [json.loads(line) for line in (EXAMPLES / "queries.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["paper_id"] in ids]
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "qrels.txt").write_text("".join(f"{r['query_id']} 0 {r['chunk_id']} 1\n" for r in rows))
    return len(rows)


@pytest.fixture(scope="module")
def chain(ray_local, tmp_path_factory):
    """A `run` chain made from folder a/ with relative paths; b/ is another working directory."""
    root = tmp_path_factory.mktemp("paths")
    a, b = root / "a", root / "b"
    assert _workspace(a) > 0
    b.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.chdir(a)
        assert main(["run", "--input", "corpus", "--queries", "queries.jsonl", "--output", "chain",
                     "--embed-batch-rows", "64", "--extract-batch-rows", "16"]) == 0
    return a, b


def test_runs_made_in_one_folder_give_the_same_results_from_another(chain, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a, b = chain
    monkeypatch.chdir(a)
    config = manifest_config(str(a / "chain" / "retrieval"))
    assert config["queries"] == str(a / "queries.jsonl") and config["index"] == str(a / "chain" / "index")
    assert json.loads((a / "chain" / "manifest.json").read_text())["config"].count(str(a / "corpus")) == 1
    capsys.readouterr()

    def evaluate(*argv: str) -> dict:
        assert main(["evaluate-retrieval", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    here = evaluate("--retrieval", "chain/retrieval", "--qrels", "qrels.txt")
    assert here["methods"]["hybrid"]["Recall@10"] > 0
    monkeypatch.chdir(b)
    assert evaluate("--retrieval", "../a/chain/retrieval", "--qrels", "../a/qrels.txt") == here

    assert main(["extract", "--retrieval", "../a/chain/retrieval", "--output", "spans"]) == 0
    monkeypatch.chdir(a)
    assert main(["extract", "--retrieval", "chain/retrieval", "--output", "spans"]) == 0
    cols = ["pair_id", "start", "end", "text"]
    there = pq.read_table(b / "spans" / "spans", columns=cols).sort_by("pair_id").to_pylist()
    assert there == pq.read_table(a / "spans" / "spans", columns=cols).sort_by("pair_id").to_pylist() and there

    # verify takes the chain folder and checks every stage in it; a folder that is no run is one line, exit 2
    capsys.readouterr()
    code = main(["verify", "chain"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result["errors"]
    assert set(result["stages"]) == {"chunks", "embeddings", "index", "retrieval", "spans"} and not result["errors"]
    assert result["stages"]["spans"]["checked"]["spans_against_chunk_text"] == result["stages"]["spans"]["spans"]
    assert main(["verify", str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a committed run" in err and err.count("\n") == 0

    # labels that match no query of the run: one line and exit 2, not a table of zeros
    (b / "other.txt").write_text("q-unknown 0 some-chunk 1\n")
    capsys.readouterr()
    assert main(["evaluate-retrieval", "--retrieval", "chain/retrieval", "--qrels", str(b / "other.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "none of the 1 labelled queries" in err and err.count("\n") == 0
    assert main(["evaluate-retrieval", "--retrieval", "chain/retrieval", "--qrels", "qrels.txt",
                 "--queries", "missing.jsonl"]) == 2
    assert f"queries not found: {a / 'missing.jsonl'} (from --queries)" in capsys.readouterr().err


def test_evaluate_takes_gold_rows_that_name_their_chunk(chain, monkeypatch, capsys):
    """Gold rows with paper_id + chunk_index (or chunk_id) and no chunk text: looked up in --chunks."""
    a, _ = chain
    monkeypatch.chdir(a)
    chunks = pq.read_table(a / "chain" / "chunks" / "chunks", columns=["chunk_id", "text"]).to_pylist()
    text = {r["chunk_id"]: r["text"] for r in chunks}
    pairs = pq.read_table(a / "chain" / "spans" / "pairs",
                          columns=["query", "paper_id", "chunk_id", "chunk_index", "n_spans"])
    rows = pairs.sort_by([("n_spans", "descending"), ("chunk_id", "ascending")]).to_pylist()[:3]  # with spans first
    gold = [{"query": r["query"], "paper_id": r["paper_id"], "chunk_index": r["chunk_index"], "relevant": True,
             "gold_spans": [text[r["chunk_id"]][:40]]} for r in rows[:2]]
    gold.append({"query": rows[2]["query"], "paper_id": rows[2]["paper_id"], "chunk_id": rows[2]["chunk_id"],
                 "relevant": False, "gold_spans": []})
    (a / "gold.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gold))
    capsys.readouterr()
    code = main(["evaluate", "--gold", "gold.jsonl", "--chunks", "chain/chunks", "--predictions", "chain/spans",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["diagnostics"]["gold_rows"] == 3, result["diagnostics"]
    # the same rows need the chunk text without --chunks; a row whose chunk is not in the run is named
    assert main(["evaluate", "--gold", "gold.jsonl", "--predictions", "chain/spans"]) == 2
    assert "but has no 'chunk' text: pass --chunks RUN" in capsys.readouterr().err
    (a / "bad.jsonl").write_text(json.dumps(gold[0] | {"chunk_index": 999}) + "\n")
    assert main(["evaluate", "--gold", "bad.jsonl", "--chunks", "chain/chunks", "--predictions", "chain/spans"]) == 2
    assert "chunk_index 999 is not in the chunk run" in capsys.readouterr().err
    # evaluate-retrieval places the same rows by paper_id + chunk_index through the run's chunk table
    code = main(["evaluate-retrieval", "--retrieval", "chain/retrieval", "--qrels", "gold.jsonl", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["judgments"] == 3


def test_api_retrieve_with_text_feeds_extract_without_joins(chain):
    """api.retrieve(with_text=True) rows carry the query and the chunk text: straight into api.extract."""
    import ray

    from verbatim_batch import api

    a, _ = chain
    queries = [json.loads(line) for line in (a / "queries.jsonl").read_text().splitlines()][:2]
    hits = api.retrieve(ray.data.from_items([{"query": q["query"]} for q in queries]), str(a / "chain" / "index"),
                        with_text=True).filter(lambda r: r["method"] == "hybrid" and r["rank"] <= 2)
    spans = api.extract(hits).take_all()
    chunks = {r["chunk_id"]: r["text"] for r in pq.read_table(a / "chain" / "chunks" / "chunks").to_pylist()}
    assert len(spans) == 2 * len(queries)
    assert {r["query"] for r in spans} == {q["query"] for q in queries}
    for r in spans:
        assert r["chunk"] == chunks[r["chunk_id"]] and r["error"] is None
        assert all(r["chunk"][s["start"]:s["end"]] == s["text"] for s in r["spans"])
