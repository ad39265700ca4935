"""The retrieve stage: an index run + a query file -> top-k chunks per query (dense, BM25, hybrid)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import group, option, settings
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.runs import jsonable, manifest_config
from verbatim_batch.core.tables import RETRIEVAL, query_id_for, stable_hash
from verbatim_batch.engine.batches import drop_keys
from verbatim_batch.engine.resources import Cluster, Resources, ray_args
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    Command,
    Outcome,
    Plan,
    RunOptions,
    StageContext,
    TableStage,
    Work,
    bound_settings,
)
from verbatim_batch.retrieval.retriever import RetrieverConfig

if TYPE_CHECKING:
    import ray  # imported where a stage runs: the CLI parses its options without importing Ray


class RetrieveActor:
    """Query rows -> ``RETRIEVAL`` rows. ``with_text``: each row also carries its ``query`` and its ``chunk``
    text (from the index's chunk run), what ``api.extract`` takes, so retrieve -> extract needs no join."""

    def __init__(self, config, with_text: bool = False) -> None:
        from verbatim_batch.retrieval.retriever import Retriever

        self.retriever = Retriever(config)
        self.chunks_dir = None
        if with_text:
            from verbatim_batch.core.runs import committed_table_dir

            self.chunks_dir = committed_table_dir(manifest_config(config.index_dir)["chunks"], "chunks")

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = self.retriever(batch)
        if self.chunks_dir is None:
            return out
        from verbatim_batch.extract.pairs import chunk_lookup

        queries = [q or "" for q in batch["query"].to_pylist()]
        given = batch["query_id"].to_pylist() if "query_id" in batch.column_names else [None] * len(queries)
        text = {qid or query_id_for(q): q for qid, q in zip(given, queries, strict=True)}
        chunks = chunk_lookup(self.chunks_dir, out["chunk_id"].to_pylist())
        out = out.append_column("query", pa.array([text.get(q) for q in out["query_id"].to_pylist()], pa.string()))
        return out.append_column("chunk", pa.array([chunks[c]["text"] if c in chunks else None
                                                    for c in out["chunk_id"].to_pylist()], pa.string()))


def retrieve_dataset(queries: ray.data.Dataset, config, res: Resources,
                     cluster: Cluster | None = None, with_text: bool = False) -> ray.data.Dataset:
    """Query rows -> ``RETRIEVAL`` rows on retriever actors (the job's and ``api.retrieve``'s path; ``with_text``:
    with the query and chunk text too)."""
    kwargs = {"config": config} | ({"with_text": True} if with_text else {})
    return queries.map_batches(RetrieveActor, **ray_args(res, RetrieveActor, cluster, batch_format="pyarrow",
                                                         fn_constructor_kwargs=kwargs))


@dataclass
class RetrieveJob(RunOptions):
    index: str = option(help="an index run folder from `verbatim-batch index`", path=True)
    queries: str = option(help="query file (JSONL, Parquet or CSV) with query (and query_id)", path=True)
    retriever: Any = group(RetrieverConfig)  # its index_dir is the job's index
    batch_rows: int = option(256, "queries per actor call", low=1, high=limits.BATCH, runtime=True)
    concurrency: int | None = option(None, "retriever actors", low=1,
                                     high=limits.WORKERS, default_help="one per GPU, else 1", runtime=True)


def retrieval_key(index: str, queries: pa.Table, cfg) -> str:
    """Same key, same retrieval table: the index's fingerprint, the queries, the retriever settings."""
    chosen = {k: v for k, v in jsonable(settings(cfg)).items() if k != "index_dir"}  # the index: by fingerprint
    return stable_hash(manifest_config(index).get("fingerprint") or index, json.dumps(chosen, sort_keys=True),
                       *queries["query_id"].to_pylist(), *queries["query"].to_pylist())


def retrieval_table_counts(name: str, table: pa.Table) -> dict[str, int]:
    return dict(Counter(f"rows.{m}" for m in table["method"].to_pylist()))


@dataclass(frozen=True)
class RetrieveFacts:
    config: Any  # RetrieverConfig
    queries: pa.Table
    rejected: int


class RetrieveStage(TableStage):
    command = "retrieve"
    reads = {"index": ("ids",)}
    outcomes = {"rejected": ("rejected_empty_query",)}
    tables = {"retrieval": RETRIEVAL}
    key_column = "query_id"
    table_counts = staticmethod(retrieval_table_counts)
    resources = Resources(cpus=1, gpus=1, batch_rows=RetrieveJob.batch_rows)  # one per GPU, else CPU actors

    def plan(self) -> Plan:
        from verbatim_batch.retrieval.retriever import RetrieverConfig

        job: RetrieveJob = self.job
        cfg = job.retriever or RetrieverConfig(index_dir=job.index)
        cfg = dataclasses.replace(cfg, index_dir=storage.normalize(job.index))
        queries, rejected = read_queries(job.queries)  # the key covers the queries: a small file
        key = retrieval_key(job.index, queries, cfg)
        config = bound_settings(job, retriever=settings(cfg), key=key)
        return Plan(config=config, inputs=(job.index, job.queries), facts=RetrieveFacts(cfg, queries, rejected))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        ids = plan.facts.queries["query_id"]
        return Work(keys=ids, n_in=len(ids))

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> pa.Array | list[str]:
        """Every query when index, queries and settings are those of ``previous`` (its table is the answer)."""
        return work.keys if manifest_config(previous).get("key") == plan.config["key"] else []

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> ray.data.Dataset:
        queries = plan.facts.queries
        todo = drop_keys(queries, "query_id", skip)
        res = ctx.resources
        rows = res.batch_rows
        blocks = [todo.slice(i, rows) for i in range(0, todo.num_rows, rows)]
        import ray

        return retrieve_dataset(ray.data.from_arrow(blocks), plan.facts.config, res)

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> dict[str, int]:
        return {"queries": work.n_in, "rejected_empty_query": plan.facts.rejected,
                "reused": int(len(outcome.carried) > 0 and len(outcome.carried) == work.n_in)}


def run_retrieve(job: RetrieveJob) -> tuple[str, dict[str, Any]]:
    """Top-k chunks per query for dense, BM25 and hybrid search (with ``previous``: carried when unchanged)."""
    return run_stage(RetrieveStage(job))


COMMAND = Command("retrieve", "top-k chunks per query: dense, BM25 and hybrid", RetrieveJob, run_retrieve,
                  stage=RetrieveStage, folder="retrieval", omit=("batch_retries",))
