"""Extract's pairs from a retrieval run planned in Ray tasks (``pipeline.pair_plan``, issue 20 item 4) equal the
driver-built ``build_pairs`` row for row, errors included; the driver's work holds no text; carry picks the same
pairs; a query's pairs stay in one block for the LLM; and a whole extract writes the same tables either way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from verbatim_batch.core import storage
from verbatim_batch.core.runs import build_manifest, read_table, write_manifest
from verbatim_batch.core.tables import CHUNKS, PAIRS, RETRIEVAL
from verbatim_batch.engine import pair_plan
from verbatim_batch.engine.stage import StageContext
from verbatim_batch.stages import extract as ex

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = ["Training data came from {} sources; we report accuracy on the held-out split.",
         "The model reaches 91.{}% F1 — über the baseline, with a 中文 tokenizer.",
         "We annotate {} documents and measure inter-annotator agreement (kappa 0.8)."]


def _chunks(ids: list[int]) -> pa.Table:
    texts = [TEXTS[i % 3].format(i) for i in ids]
    n = len(ids)
    return pa.table({
        "chunk_id": [f"c{i}" for i in ids], "paper_id": [f"p{i % 4}" for i in ids],
        "chunk_index": [i // 4 for i in ids], "start": [100 * (i // 4) for i in ids],
        "end": [100 * (i // 4) + len(t) for i, t in zip(ids, texts, strict=True)],
        "byte_start": [0] * n, "byte_end": [0] * n, "text": texts, "context": [""] * n, "heading_path": [[]] * n,
        "n_chars": [len(t) for t in texts], "flags": [[]] * n, "paper_sha256": ["0" * 64] * n,
        "normalization": ["nfc"] * n, "chunker_config_hash": ["t"] * n}, schema=CHUNKS)


def _retrieval(rows: list[tuple[str, int, str, str]]) -> pa.Table:
    q, r, c, m = (list(x) for x in zip(*rows, strict=True))
    return pa.table({"query_id": q, "rank": r, "chunk_id": c, "paper_id": [f"p{len(x) % 4}" for x in c],
                     "score": [1.0] * len(q), "dense_rank": r, "bm25_rank": [None] * len(q), "method": m},
                    schema=RETRIEVAL)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A chunk run (2 files), a query file and a retrieval run (3 files; one query's rows split over two
    files) with a query missing from the query file and a chunk missing from the chunk table."""
    root = tmp_path_factory.mktemp("pairplan")
    storage.write_parquet(_chunks(list(range(0, 15))), str(root / "chunks" / "chunks" / "part-0.parquet"))
    storage.write_parquet(_chunks(list(range(15, 30))), str(root / "chunks" / "chunks" / "part-1.parquet"))
    write_manifest(str(root / "chunks"), build_manifest(run_id="c", command="chunk", config={}, inputs=[],
                                                        tables={}, counts={}, timings_s={}))
    queries = root / "queries.jsonl"
    queries.write_text("".join(json.dumps({"query_id": f"q{i}", "query": f"what about training data {i}?"}) + "\n"
                               for i in range(8)), encoding="utf-8")

    def rows(qid: str, chunks: list[str], first: int = 1) -> list[tuple]:
        out = [(qid, first + k, c, "hybrid") for k, c in enumerate(chunks)]
        return out + [(qid, first + k, c, "dense") for k, c in enumerate(reversed(chunks))]

    files = [
        rows("q0", ["c1", "c2", "c3", "c16", "c17", "c20", "c21"]) + rows("q1", ["c2", "c29", "c0"]),
        rows("q2", ["c5", "c6", "c7", "c8", "c9"]) + rows("q3", ["c-gone", "c10"]) + rows("q4", ["c11", "c12"]),
        rows("q4", ["c13", "c14", "c15"], first=3) + rows("q-unknown", ["c1", "c-gone"]) + rows("q5", ["c22"]),
    ]
    for i, f in enumerate(files):
        storage.write_parquet(_retrieval(f), str(root / "retrieval" / "retrieval" / f"part-{i}.parquet"))
    write_manifest(str(root / "retrieval"), build_manifest(
        run_id="r", command="retrieve", config={"queries": str(queries), "chunks": str(root / "chunks")}, inputs=[],
        tables={}, counts={}, timings_s={}))
    return root


def _job(runs: Path, out: str = "x", **kw) -> ex.ExtractJob:
    from verbatim_batch.extract.semantic import SemanticConfig

    return ex.ExtractJob(output=str(runs / out), extractor=SemanticConfig(), retrieval=str(runs / "retrieval"),
                         method="hybrid", top_k=5, batch_rows=4, **kw)


def _planned(job: ex.ExtractJob) -> tuple[ex.ExtractStage, object, object]:
    stage = ex.ExtractStage(job)
    plan = stage.plan()
    ctx = StageContext(job=job, run_id="t", staging=job.output, config=plan.config, started=0.0)
    return stage, plan, stage.work(plan, ctx)


def _by_pair(table: pa.Table) -> pa.Table:
    return table.sort_by("pair_id")


def test_planned_pairs_equal_the_driver_built_ones_and_the_driver_holds_no_text(ray_local, runs):
    import ray

    job = _job(runs)
    want = ex.build_pairs(job)
    errors = [e for e in want["input_error"].to_pylist() if e]
    assert {e.split(":")[0] for e in errors} == {"query_not_found", "chunk_not_found"} and want.num_rows == 23
    _, _, work = _planned(job)
    planner = work.data
    assert isinstance(planner, pair_plan.PairPlanner) and work.n_in == want.num_rows
    assert isinstance(work.keys, pa.ChunkedArray)
    assert sorted(work.keys.to_pylist()) == sorted(want["pair_id"].to_pylist())
    # the driver holds refs, never a table (no chunk text, no query text)
    refs = [planner.queries, *[r for piece in planner.pieces for r in piece], *planner.chunks()]
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert not [v for v in vars(planner).values() if isinstance(v, pa.Table)]
    got = pa.concat_tables(ray.get(planner.dataset(pa.array([], pa.string()), False, job.batch_rows)
                                   .to_arrow_refs()))
    assert got.schema == want.schema and _by_pair(got).equals(_by_pair(want))
    assert _by_pair(planner.table()).equals(_by_pair(want))
    skip = want["pair_id"].combine_chunks()[:10]
    todo = pa.concat_tables(ray.get(planner.dataset(skip, True, job.batch_rows).to_arrow_refs()))
    assert _by_pair(todo).equals(_by_pair(want.filter(pc.invert(pc.is_in(want["pair_id"], value_set=skip)))))


def test_in_process_planning_without_ray_gives_the_same_rows(ray_local, runs, monkeypatch):
    monkeypatch.setattr(pair_plan, "_ray_up", lambda: False)
    job = _job(runs)
    planner = pair_plan.PairPlanner(str(runs / "retrieval" / "retrieval"), str(runs / "queries.jsonl"),
                                    str(runs / "chunks" / "chunks"), "hybrid", 5, lambda: None)
    assert _by_pair(planner.table()).equals(_by_pair(ex.build_pairs(job)))


def test_llm_blocks_keep_each_query_whole_and_in_rank_order(ray_local, runs):
    import ray

    job = _job(runs)
    _, _, work = _planned(job)
    blocks = ray.get(work.data.dataset(pa.array([], pa.string()), True, 4).to_arrow_refs())
    seen: dict[str, int] = {}
    for i, block in enumerate(blocks):
        rows = list(zip(block["query_id"].to_pylist(), block["rank"].to_pylist(), strict=True))
        assert rows == sorted(rows)
        for q in dict.fromkeys(block["query_id"].to_pylist()):
            assert seen.setdefault(q, i) == i, f"query {q} split over blocks"
    assert "q4" in seen  # its rows came from two retrieval files


def test_an_io_actor_does_a_planner_block_as_its_query_blocks(runs):
    """A planner block holds many queries; the LLM's actor does it as the ``query_blocks`` of ``batch_rows``
    that the pairs of before came in, one call each (own retries, own error rows)."""
    pairs = ex.build_pairs(_job(runs))
    actor = object.__new__(ex.ExtractActor)
    actor.query_block_rows = 4
    calls: list[list[str]] = []
    actor._call = lambda block: calls.append(block["query_id"].to_pylist()) or block.select(["pair_id"])
    out = actor(pairs)
    assert out["pair_id"].to_pylist() == pairs["pair_id"].to_pylist()
    assert calls == [b["query_id"].to_pylist() for b in pair_plan.query_blocks(pairs, 4)] and len(calls) > 1


def test_carry_check_picks_the_same_pairs(ray_local, runs):
    job = _job(runs)
    stage, plan, work = _planned(job)
    pairs = ex.build_pairs(job)
    hashes = ex._input_hashes(pairs)
    n = pairs.num_rows
    # previous: a pair with another hash, one with another rank, one failed; the rest unchanged
    hashes[0] = "other"
    ranks = pairs["rank"].to_pylist()
    ranks[1] = 9
    errors = [None] * n
    errors[2] = "stage_failed: boom"
    prev = runs / "previous"
    table = pa.table({
        "run_id": ["p"] * n, "pair_id": pairs["pair_id"], "query_id": pairs["query_id"], "query": [None] * n,
        "paper_id": pairs["paper_id"], "chunk_id": pairs["chunk_id"], "chunk_index": [0] * n, "rank": ranks,
        "relevant": [None] * n, "n_spans": [0] * n, "relevance": [None] * n, "latency_ms": [None] * n,
        "error": errors, "n_violations": [0] * n, "extractor": ["semantic"] * n, "model_id": [None] * n,
        "model_revision": [None] * n, "config_hash": ["x"] * n, "extra": [None] * n, "input_hash": hashes},
        schema=PAIRS)
    storage.write_parquet(table, str(prev / "pairs" / "part-0.parquet"))
    config = {k: plan.config[k] for k in ("extractor_hash", "model_revision") if k in plan.config}
    write_manifest(str(prev), build_manifest(run_id="p", command="extract", config=config, inputs=[], tables={},
                                             counts={}, timings_s={}))
    want = ex.unchanged_pairs(str(prev), pairs, plan.config)
    got = stage.unchanged(plan, work, str(prev), str(runs / "x"))
    assert isinstance(got, pa.Array) and sorted(got.to_pylist()) == sorted(want) and len(want) == n - 3


def test_extract_from_planned_pairs_sees_the_driver_built_inputs(ray_local, runs):
    """A whole extract from the retrieval run: its pairs table holds, pair for pair, what ``build_pairs`` gives
    (ids, rank, chunk index, input hash, the error rows), and every span is its chunk's text."""
    job = _job(runs, "new")
    out, manifest = ex.run_extract(job)
    want = ex.build_pairs(job)
    want = want.append_column("input_hash", pa.array(ex._input_hashes(want), pa.string())).sort_by("pair_id")
    got = read_table(out, "pairs").sort_by("pair_id")
    for column in ("pair_id", "query_id", "query", "chunk_id", "paper_id", "chunk_index", "rank", "input_hash"):
        assert got[column].to_pylist() == want[column].to_pylist(), column
    errors = [e.split(":")[0] if e else None for e in got["error"].to_pylist()]
    assert errors == [e.split(":")[0] if e else None for e in want["input_error"].to_pylist()]
    assert manifest["counts"]["rows_in"] == manifest["counts"]["rows_new"] == want.num_rows == 23
    texts = dict(zip(want["chunk_id"].to_pylist(), want["chunk"].to_pylist(), strict=True))
    spans = read_table(out, "spans").to_pylist()
    assert spans and all(texts[s["chunk_id"]][s["start"]:s["end"]] == s["text"] for s in spans)


def test_vllm_extract_forms_requests_in_tasks_from_planned_blocks(ray_local, runs, monkeypatch):
    """``--backend vllm`` from a retrieval run: requests are formed from the planner's blocks in Ray tasks (the
    driver never gathers the pairs: ``PairPlanner.table`` is made to fail), each request holds one query's
    pairs, and every pair ends in the tables, invalid ones as error rows.

    Test double: the vLLM engine stage (``extract.vllm.vllm_dataset``, which needs vLLM, not installed in
    this venv) is replaced by a map that answers each request the way ``ray.data.llm`` hands rows back
    (our postprocess's columns): the first 40 characters of each document as its span. The real engine runs
    this same path in tests/test_vllm.py (``pytest -m vllm``)."""
    from verbatim_batch.engine import vllm
    from verbatim_batch.extract.llm import LLMConfig

    def no_gather(self, skip=None):
        raise AssertionError("the vLLM path gathered every pair on the driver")

    bounds = []

    def engine(requests, config, helper_cpus_each=None, restarts=None):
        bounds.append(restarts)

        def answer(block: pa.Table) -> pa.Table:
            texts = []
            for chunks, members in zip(block["chunks"].to_pylist(), block["pairs_json"].to_pylist(), strict=True):
                if len({m["query_id"] for m in json.loads(members)}) != 1:
                    raise AssertionError("a request mixes queries")
                texts.append(json.dumps({f"doc_{i}": [c[:40]] for i, c in enumerate(chunks)}))
            return pa.table({vllm.ID_COLUMN: block[vllm.ID_COLUMN], "pairs_json": block["pairs_json"],
                             "generated_text": texts, "time_taken_llm": [0.1] * block.num_rows,
                             "__inference_error__": [""] * block.num_rows})

        return requests.map_batches(answer, batch_format="pyarrow", batch_size=None)

    monkeypatch.setattr(pair_plan.PairPlanner, "table", no_gather)
    monkeypatch.setattr(vllm, "vllm_dataset", engine)
    job = _job(runs, "vllm-planned")
    job = ex.ExtractJob(**{**job.__dict__, "extractor": LLMConfig(model="org/model", backend="vllm",
                                                                  docs_per_request=2)})
    out, manifest = ex.run_extract(job)
    assert bounds == [job.worker_restarts]  # the engine's actors get the job's bound (extract.vllm.bound_processor)
    want = ex.build_pairs(job).sort_by("pair_id")
    got = read_table(out, "pairs").sort_by("pair_id")
    assert got["pair_id"].to_pylist() == want["pair_id"].to_pylist() and got.num_rows == 23
    errors = [e.split(":")[0] if e else None for e in got["error"].to_pylist()]
    assert errors == [e.split(":")[0] if e else None for e in want["input_error"].to_pylist()]
    texts = dict(zip(want["chunk_id"].to_pylist(), want["chunk"].to_pylist(), strict=True))
    spans = read_table(out, "spans").to_pylist()
    assert len(spans) == errors.count(None)  # one span per valid pair, each its chunk's text
    assert all(texts[s["chunk_id"]][s["start"]:s["end"]] == s["text"] for s in spans)
