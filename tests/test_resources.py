"""Resources declared on the stage (``pipeline.resources``): each stage's declaration, ``with_`` overrides, the one
function that turns a declaration into Ray arguments for the cluster at hand, and no deprecated Ray argument in
any run (a real stage on the session Ray, Ray Data's logger captured)."""

from __future__ import annotations

import ast
import json
import logging
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.engine.model_actor import ModelActor, stage_failed
from verbatim_batch.engine.resources import Cluster, Resources, ray_args

PACKAGE = Path(__file__).resolve().parents[1] / "verbatim_batch"
MODEL = Resources(cpus=1, gpus=1, batch_rows=64)
IO = Resources(cpus=0.5, actors=2, batch_rows=64, whole_blocks=True)


class _Model(ModelActor):
    pass


class _Plain:
    pass


def _task(batch):
    return batch


def _pool(args: dict) -> tuple[int, int]:
    strategy = args["compute"]
    return strategy.min_size, strategy.max_size


def test_with_overrides_only_what_is_given():
    res = MODEL.with_(actors=None, batch_rows=8, threads=None)
    assert res == Resources(cpus=1, gpus=1, batch_rows=8) and MODEL.batch_rows == 64  # a copy; None keeps

    class Job:
        batch_rows, concurrency, threads = 16, 3, 2

    assert MODEL.with_job(Job()) == Resources(cpus=1, gpus=1, actors=3, batch_rows=16, threads=2)
    assert MODEL.with_job(object()) == MODEL  # a job without those options (e.g. index) changes nothing
    with pytest.raises(ValueError, match="actors"):
        Resources(actors=0)
    with pytest.raises(ValueError, match="cpus"):
        Resources(cpus=-1)


def test_a_model_stage_on_gpu_cpu_and_inside_a_users_pipeline():
    gpu = ray_args(MODEL, _Model, Cluster(cpus=8, gpus=2), batch_format="pyarrow",
                   fn_constructor_kwargs={"config": "c"})
    assert _pool(gpu) == (2, 2) and gpu["num_gpus"] == 1 and "num_cpus" not in gpu  # one model per GPU
    assert gpu["batch_size"] == 64 and gpu["batch_format"] == "pyarrow" and "concurrency" not in gpu
    assert gpu["fn_constructor_kwargs"] == {"config": "c", "threads": None}  # torch's own threads on a GPU
    assert _pool(ray_args(MODEL.with_(actors=3), _Model, Cluster(8, 2))) == (3, 3)  # --concurrency

    cpu = ray_args(MODEL, _Model, Cluster(cpus=4, gpus=0))
    assert _pool(cpu) == (1, 1) and cpu["num_cpus"] == 1.0 and "num_gpus" not in cpu
    assert cpu["fn_constructor_kwargs"] == {"threads": 4}  # every CPU
    assert ray_args(MODEL.with_(threads=2), _Model, Cluster(4, 0))["fn_constructor_kwargs"] == {"threads": 2}
    small = ray_args(MODEL.with_(actors=4), _Model, Cluster(cpus=2, gpus=0))  # one CPU left to reads and writes
    assert _pool(small) == (1, 1) and small["num_cpus"] == 1.0
    one = ray_args(MODEL, _Model, Cluster(cpus=1, gpus=0))
    assert _pool(one) == (1, 1) and one["num_cpus"] == 0.0

    inside = ray_args(MODEL, _Model, Cluster(cpus=2, gpus=0, user_pipeline=True))  # api: claims no CPU
    assert _pool(inside) == (1, 1) and inside["num_cpus"] == 0 and inside["fn_constructor_kwargs"] == {"threads": 2}
    inside_gpu = ray_args(MODEL, _Model, Cluster(cpus=8, gpus=2, user_pipeline=True))
    assert _pool(inside_gpu) == (2, 2) and inside_gpu["num_cpus"] == 0 and inside_gpu["num_gpus"] == 1


def test_io_actors_tasks_and_ray_tasks():
    io = ray_args(IO, _Model, Cluster(cpus=4, gpus=1), fn_constructor_kwargs={"config": "c"})
    assert _pool(io) == (2, 2) and io["num_cpus"] == 0.5 and "num_gpus" not in io and io["batch_size"] is None
    assert io["fn_constructor_kwargs"] == {"config": "c"}  # an I/O stage's actors set no torch threads
    assert _pool(ray_args(IO.with_(actors=8), _Plain, Cluster(cpus=3, gpus=0))) == (4, 4)  # 2 spare CPUs / 0.5
    inside = ray_args(IO, _Plain, Cluster(cpus=2, gpus=0, user_pipeline=True))
    assert _pool(inside) == (2, 2) and inside["num_cpus"] == 0

    tasks = ray_args(Resources(cpus=1, batch_rows=10), _task, Cluster(2, 0))
    assert tasks == {"batch_size": 10, "num_cpus": 1, "max_retries": 3}  # bounded: Ray Data's default is -1
    capped = ray_args(Resources(actors=3), _task, Cluster(2, 0))
    assert capped["compute"].size == 3 and capped["batch_size"] is None

    assert ray_args(Resources(cpus=1), num_returns=2) == {"num_returns": 2, "num_cpus": 1, "max_retries": 3}
    assert ray_args(Resources(cpus=1, gpus=1), cluster=Cluster(4, 1)) == {"num_cpus": 1, "num_gpus": 1,
                                                                          "max_retries": 3}
    assert ray_args(Resources(cpus=1, gpus=1), cluster=Cluster(4, 0)) == {"num_cpus": 1, "max_retries": 3}
    assert ray_args(Resources(cpus=1), max_retries=2)["max_retries"] == 2  # a call's own bound wins


def test_every_pool_and_task_is_bounded_by_the_jobs_worker_restarts():
    """Ray Data restarts a lost actor and retries a lost task forever by default (-1); every stage's are bounded
    by ``--worker-restarts`` (issue 44), whatever the cluster."""
    from verbatim_batch.stages.embed import EmbedJob

    res = MODEL.with_job(EmbedJob(chunks="c", output="o", worker_restarts=5))
    for cluster in (Cluster(4, 0), Cluster(8, 2), Cluster(2, 0, user_pipeline=True)):
        pool = ray_args(res, _Model, cluster)
        assert pool["max_restarts"] == 5 and pool["max_task_retries"] == 5
        assert ray_args(res, _task, cluster)["max_retries"] == 5
    assert ray_args(MODEL, _Model, Cluster(4, 0))["max_restarts"] == EmbedJob.worker_restarts == 3
    with pytest.raises(ValueError, match="restarts"):
        Resources(restarts=-1)


def test_every_stage_declares_its_resources_with_the_jobs_defaults():
    from verbatim_batch.stages.embed import EmbedJob, EmbedStage
    from verbatim_batch.stages.extract import PLACEMENT_RESOURCES, ExtractJob, ExtractStage
    from verbatim_batch.stages.index import IndexStage
    from verbatim_batch.stages.querygen import QueryGenJob, QueryGenStage
    from verbatim_batch.stages.rerank import RerankJob, RerankStage
    from verbatim_batch.stages.retrieve import RetrieveJob, RetrieveStage

    assert EmbedStage.resources.gpus == 1 and EmbedStage.resources.batch_rows == EmbedJob.batch_rows
    assert RetrieveStage.resources.batch_rows == RetrieveJob.batch_rows
    assert RerankStage.resources.whole_blocks and RerankStage.resources.batch_rows == RerankJob.batch_rows
    assert QueryGenStage.resources.actors == 2 and QueryGenStage.resources.batch_rows == QueryGenJob.batch_rows
    assert IndexStage.resources == Resources(cpus=1, gpus=1)
    assert ExtractStage.resources is PLACEMENT_RESOURCES and set(PLACEMENT_RESOURCES) == {"model", "io", "vllm"}
    assert all(r.batch_rows == ExtractJob.batch_rows for r in PLACEMENT_RESOURCES.values())


def test_model_actor_base_retries_then_error_rows_or_raise():
    calls = []

    class Flaky(ModelActor):
        what = "test"

        def load(self, config):
            return config

        def run(self, batch):
            calls.append(batch.num_rows)
            raise RuntimeError("boom")

    class WithRows(Flaky):
        def failed_rows(self, batch, error):
            return pa.table({"error": [error] * batch.num_rows})

    batch = pa.table({"x": [1, 2]})
    with pytest.raises(RuntimeError, match="boom"):
        Flaky("cfg", retries=0)(batch)
    out = WithRows("cfg", retries=1)(batch)  # one retry (with backoff), then error rows
    assert out["error"].to_pylist() == ["stage_failed: RuntimeError: boom"] * 2 and out["_retries"][0].as_py() == 1
    assert calls == [2, 2, 2]
    assert stage_failed(ValueError("x" * 600)).startswith("stage_failed: ValueError: x") and len(
        stage_failed(ValueError("x" * 600))) == 500


def test_no_map_call_in_the_package_passes_deprecated_concurrency():
    """Ray 2.51 deprecated ``concurrency=`` on ``map_batches``/``map``/``flat_map``/``filter`` (``compute=``
    instead); writes keep theirs (``write_datasink(concurrency=)`` is current)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("map_batches", "map", "flat_map", "filter")
                    and any(k.arg == "concurrency" for k in node.keywords)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, found


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# Ray 2.60 deprecates ``map_batches(**ray_remote_args)`` but has no named parameter for the restart bounds every
# stage sets (``max_restarts``, ``max_task_retries``, ``max_retries``: issue 44); the package filters that one.
BOUNDS_ONLY = "`ray_remote_args` is deprecated"


def _deprecations(messages: list[str], caught: list[warnings.WarningMessage]) -> list[str]:
    return [m for m in messages + [str(w.message) for w in caught]
            if "deprecat" in m.lower() and not m.startswith(BOUNDS_ONLY)]


def test_a_stage_run_logs_no_ray_deprecation_warning(ray_local, tmp_path):
    """A retrieve job (an actor pool of the job's own pipeline), ``api.retrieve`` (actors inside a user's
    pipeline) and capped tasks run on the session Ray with Ray's loggers and Python's warnings captured: no
    deprecation. The same capture does see the warning an old-style ``concurrency=`` call logs."""
    import ray

    from verbatim_batch import api
    from verbatim_batch.core.runs import read_table
    from verbatim_batch.core.tables import query_id_for
    from verbatim_batch.engine.batches import strip_internal_batch
    from verbatim_batch.retrieval.index import Bm25Index
    from verbatim_batch.retrieval.retriever import RetrieverConfig
    from verbatim_batch.stages.retrieve import RetrieveJob, run_retrieve

    texts = {"c1": "the tagger is trained on annotated pairs", "c2": "results on the held-out set",
             "c3": "a baseline without pairs"}
    index = tmp_path / "index"
    Bm25Index.build(list(texts.values())).save(index / "bm25")
    pq.write_table(pa.table({"chunk_id": list(texts), "paper_id": ["P1", "P1", "P2"]}), index / "ids.parquet")
    (index / "manifest.json").write_text(json.dumps({"run_id": "index-test", "command": "index", "config": "{}"}))
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"query_id": "q1", "query": "annotated training pairs"}\n{"query": "held-out results"}\n')
    config = RetrieverConfig(index_dir=str(index), methods=("bm25",), k=2)

    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data", "ray.data._internal.util")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_retrieve(RetrieveJob(index=str(index), queries=str(queries), retriever=config,
                                     output=str(tmp_path / "retrieval"), batch_rows=1, concurrency=2))
            rows = api.retrieve(ray.data.from_items([{"query": "annotated pairs"}]), config).take_all()
            capped = ray.data.range(4).map_batches(strip_internal_batch, **ray_args(
                Resources(actors=2), strip_internal_batch, batch_format="pyarrow")).take_all()
            assert not _deprecations(handler.messages, caught), _deprecations(handler.messages, caught)
            ray.data.range(2).map_batches(strip_internal_batch, batch_format="pyarrow", concurrency=1)  # control
            assert _deprecations(handler.messages, caught), "the capture misses Ray Data's deprecation warning"
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert set(read_table(str(tmp_path / "retrieval"), "retrieval")["query_id"].to_pylist()) == {
        "q1", query_id_for("held-out results")}
    assert rows and {r["method"] for r in rows} == {"bm25"} and len(capped) == 4


def test_api_highlighter_runs_the_jobs_split_and_gives_the_in_process_rows(ray_local, tmp_path):
    """``api.extract`` with a highlighter runs the job's tokenize -> forward actors -> spans split (its plan
    shows the three), and gives each of the caller's rows, its own columns kept, the spans, relevance and
    error the in-process extractor gives (what ``api.extract`` computed before it shared the job's path)."""
    import ray
    from helpers import CHUNK, make_token_classifier

    from verbatim_batch import api
    from verbatim_batch.core.tables import group_by
    from verbatim_batch.extract.gate import PairExtractor
    from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig
    from verbatim_batch.extract.pairs import pairs_from_records

    config = HighlighterConfig(model=str(make_token_classifier(tmp_path / "m")), max_length=64, stride=16,
                               max_query_tokens=16, token_budget=512, threshold=0.5)
    items = [{"query": q, "chunk": c, "mine": i, "spans": "dropped"} for i, (q, c) in enumerate(
        [("what improved", CHUNK), ("table", CHUNK[:120]), ("", "x y z"), ("word " * 40, CHUNK), ("crf", "CRF.")])]
    ds = api.extract(ray.data.from_items(items), config, batch_rows=16)
    got = sorted(ds.take_all(), key=lambda r: r["mine"])
    plan = ds.stats()
    assert all(name in plan for name in ("_highlight_tokenize", "HighlightForwardActor", "_highlight_spans")), plan

    out = PairExtractor(Highlighter(config), "api")(pairs_from_records(
        [{k: r[k] for k in ("query", "chunk")} for r in items]))
    by_pair = group_by(out["spans"].select(["pair_id", "start", "end", "text", "score"]).to_pylist())
    want = [(p["relevance"], p["error"], sorted(by_pair.get(p["pair_id"], []), key=lambda s: s["start"]))
            for p in out["pairs"].to_pylist()]
    assert [list(r) for r in got] == [["query", "chunk", "mine", "spans", "relevance", "error"]] * len(items)
    assert [r["mine"] for r in got] == list(range(len(items)))
    assert got[2]["error"] == "empty_query" and got[3]["error"].startswith("query_too_long")
    assert any(r["spans"] for r in got)
    for row, (relevance, error, spans) in zip(got, want, strict=True):
        assert row["error"] == error
        assert (row["relevance"] is None) == (relevance is None)
        if relevance is not None:
            assert row["relevance"] == pytest.approx(relevance, abs=1e-5)
        assert [(s["start"], s["end"], s["text"]) for s in row["spans"]] == [
            (s["start"], s["end"], s["text"]) for s in spans]
        assert [s["score"] for s in row["spans"]] == pytest.approx([s["score"] for s in spans], abs=1e-5)
