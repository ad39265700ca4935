"""The retrieve stage: an index run + a query file -> top-k chunks per query (dense, BM25, hybrid)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from .. import storage
from ..records import iter_records
from ..runs import jsonable, manifest_config, read_manifest
from ..tables import QUERIES, RETRIEVAL, query_id_for, stable_hash
from .ray_env import model_actor_args
from .runner import RunOptions, Stage, StageContext, StageResult, run_stage
from .sink import as_table, table_entries


class RetrieveActor:
    def __init__(self, config) -> None:
        from ..retrieval import Retriever

        self.retriever = Retriever(config)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.retriever(batch)


@dataclass
class RetrieveJob(RunOptions):
    index: str
    queries: str  # JSONL/Parquet/CSV with query (and query_id)
    retriever: Any = None  # RetrieverConfig fields other than index_dir
    batch_rows: int = 256
    concurrency: int | None = None


def read_queries(path: str) -> tuple[pa.Table, int]:
    """``(query_id, query)`` rows of a query file (``QUERIES``), and how many rows were rejected (a malformed
    line, an empty or non-string query)."""
    if not storage.exists(path):
        raise FileNotFoundError(f"query file not found: {path}")
    ids, texts, rejected, columns = [], [], 0, set()
    for rec in iter_records(path):
        columns.update(rec)
        q = rec.get("query")
        if "__error__" in rec or not isinstance(q, str) or not q.strip():
            rejected += 1
            continue
        qid = rec.get("query_id")
        ids.append(str(qid) if qid is not None else query_id_for(q))
        texts.append(q)
    if "query" not in columns and (ids or rejected):
        raise ValueError(f"{path}: a query table needs a 'query' column, found {sorted(columns - {'__line__'})}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate query_id values")
    return pa.table({"query_id": pa.array(ids, pa.string()), "query": pa.array(texts, pa.string())},
                    schema=QUERIES), rejected


def retrieval_key(index: str, queries: pa.Table, cfg) -> str:
    """Same key, same retrieval table: the index's fingerprint, the queries, the retriever settings."""
    settings = {k: v for k, v in jsonable(dataclasses.asdict(cfg)).items() if k not in ("index_dir", "device")}
    return stable_hash(manifest_config(index).get("fingerprint") or index, json.dumps(settings, sort_keys=True),
                       *queries["query_id"].to_pylist(), *queries["query"].to_pylist())


class RetrieveStage(Stage):
    command = "retrieve"
    resumable = True

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        from ..retrieval import RetrieverConfig

        job: RetrieveJob = self.job
        cfg = job.retriever or RetrieverConfig(index_dir=job.index)
        self.cfg = dataclasses.replace(cfg, index_dir=storage.normalize(job.index))
        read_manifest(job.index)
        self.queries, self.rejected = read_queries(job.queries)
        self.key = retrieval_key(job.index, self.queries, self.cfg)
        config = {"index": job.index, "queries": job.queries, "retriever": jsonable(dataclasses.asdict(self.cfg)),
                  "key": self.key}
        return config, [job.index, job.queries]

    def execute(self, ctx: StageContext) -> StageResult:
        job: RetrieveJob = self.job
        reused = bool(job.previous) and manifest_config(job.previous).get("key") == self.key
        sink = ctx.sink(as_table("retrieval"), {"retrieval": RETRIEVAL}, key_columns={"retrieval": "query_id"})
        if reused:  # same index, queries and settings: the previous table is the answer
            ctx.carry({"retrieval": RETRIEVAL}, "query_id", self.queries["query_id"].to_pylist(),
                      record_keys="query_id")
        else:
            todo = self.queries.filter(pc.invert(pc.is_in(self.queries["query_id"],
                                                          value_set=pa.array(sorted(ctx.done), pa.string()))))
            if todo.num_rows:
                ctx.ray()
                rows = job.batch_rows
                blocks = [todo.slice(i, rows) for i in range(0, todo.num_rows, rows)]
                ds = ray.data.from_arrow(blocks).map_batches(
                    RetrieveActor, fn_constructor_kwargs={"config": self.cfg}, batch_format="pyarrow",
                    **model_actor_args(job.concurrency, rows))
                ds.write_datasink(sink)
        result = sink.finish()
        counts = {"queries": self.queries.num_rows, "rejected_empty_query": self.rejected, "reused": int(reused),
                  **result.counts} | ({"resumed_queries": len(ctx.done)} if ctx.done else {})
        return StageResult(tables=table_entries(result, ["retrieval"]), counts=counts)


def run_retrieve(job: RetrieveJob) -> tuple[str, dict[str, Any]]:
    """Top-k chunks per query for dense, BM25 and hybrid search.

    With ``previous``, a run whose key (index fingerprint, queries, settings) matches is carried as is.
    """
    return run_stage(RetrieveStage(job))
