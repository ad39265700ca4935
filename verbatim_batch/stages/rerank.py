"""The rerank stage (optional): a retrieval run -> its queries' top candidates reordered by a cross-encoder.

Its table is named ``retrieval`` (``tables.RERANKED``, method ``rerank``) and its manifest records the queries,
index and chunk run it used, so ``extract`` and ``evaluate-retrieval`` read it like a retrieval run. One model per
GPU, else CPU actors; a query's candidates always travel in one batch. Keyed by query id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits
from verbatim_batch.core.options import group, option
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.runs import committed_table_dir, manifest_config, read_table
from verbatim_batch.core.tables import RERANKED, stable_hash
from verbatim_batch.engine.batches import drop_keys
from verbatim_batch.engine.model_actor import ModelActor
from verbatim_batch.engine.resources import Resources, ray_args
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    Command,
    Outcome,
    Plan,
    RunOptions,
    StageContext,
    StageResult,
    TableStage,
    Work,
    bound_settings,
)
from verbatim_batch.retrieval.reranker import RerankerConfig

if TYPE_CHECKING:
    import ray  # imported where a stage runs: the CLI parses its options without importing Ray


class RerankActor(ModelActor):
    """One cross-encoder per actor (per GPU); batches of whole queries' candidates in, ranked rows out. A batch
    that still fails after its retries fails the job."""

    what = "rerank"

    def load(self, config):
        from verbatim_batch.retrieval.reranker import Reranker

        return Reranker(config)

    def run(self, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        return self.model(batch), {}

    def counts(self, before, after, wall_s: float) -> dict[str, int]:
        delta = {k: int(after[k] - before[k]) for k in ("tokens", "padded_tokens", "truncated")}
        return delta | {f"time_ms.{k[:-3]}": int(after[k] - before[k]) for k in ("tokenize_ms", "forward_ms")}


@dataclass
class RerankJob(RunOptions):
    """Settings of the rerank job."""

    retrieval: str = option(help="a committed retrieval run", path=True)
    reranker: Any = group(RerankerConfig, required=True)
    method: str = option("hybrid", "retrieval method whose lists are reranked")
    top_k: int = option(20, "candidates per query the cross-encoder scores", low=1, high=limits.PER_QUERY)
    chunks: str | None = option(None, "the chunk run", path=True, default_help="found through the run's manifests")
    queries: str | None = option(None, "the retrieval run's query file", path=True, default_help="from its manifest")
    batch_rows: int = option(256, "candidates per actor call (whole queries)", low=1, high=limits.BATCH, runtime=True)
    concurrency: int | None = option(None, "model actors", low=1,
                                     high=limits.WORKERS, default_help="one per GPU, else 1", runtime=True)
    threads: int | None = option(None, "torch threads per CPU actor", low=1,
                                 high=limits.THREADS, default_help="all CPUs", runtime=True)


@dataclass(frozen=True)
class RerankFacts:
    queries: str
    chunks: str


class RerankStage(TableStage):
    command = "rerank"
    reads = {"retrieval": ("retrieval",), "chunks": ("chunks",)}
    tables = {"retrieval": RERANKED}
    key_column = "query_id"
    # one cross-encoder per GPU, else CPU actors; each call one block of whole queries (about batch_rows rows)
    resources = Resources(cpus=1, gpus=1, batch_rows=RerankJob.batch_rows, whole_blocks=True)

    def plan(self) -> Plan:
        from verbatim_batch.retrieval.reranker import weights_fingerprint

        job: RerankJob = self.job
        source = manifest_config(job.retrieval)
        queries = job.queries or source["queries"]
        chunks = job.chunks or manifest_config(source["index"])["chunks"]
        cfg = job.reranker
        revision = weights_fingerprint(cfg)
        key = stable_hash(source.get("key") or job.retrieval, job.method, str(job.top_k), cfg.hash, revision)
        config = bound_settings(job, queries=queries, index=source.get("index"), chunks=chunks,
                                reranker_hash=cfg.hash, model_revision=revision, key=key)
        return Plan(config=config, inputs=(job.retrieval, queries, chunks), facts=RerankFacts(queries, chunks))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        cands = candidates(self.job, plan.facts.queries, plan.facts.chunks)
        ids = pa.array(sorted(set(cands["query_id"].to_pylist())), pa.string())
        return Work(keys=ids, n_in=len(ids), data=cands)

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> pa.Array | list[str]:
        """Every query when the input run, settings and weights are those of ``previous``."""
        return work.keys if manifest_config(previous).get("key") == plan.config["key"] else []

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> ray.data.Dataset:
        import ray

        from verbatim_batch.engine.pair_plan import query_blocks

        job: RerankJob = self.job
        cands: pa.Table = work.data
        todo = drop_keys(cands, "query_id", skip)
        res = ctx.resources
        return ray.data.from_arrow(query_blocks(todo, res.batch_rows)).map_batches(
            RerankActor, **ray_args(res, RerankActor, batch_format="pyarrow",
                                    fn_constructor_kwargs={"config": job.reranker, "retries": job.batch_retries}))

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> StageResult:
        cands: pa.Table = work.data
        missing = pc.sum(pc.is_null(cands["chunk"]).cast(pa.int64())).as_py() or 0
        return StageResult(tables={}, counts={"queries": work.n_in, "candidates": cands.num_rows,
                                              "candidates_without_chunk": missing},
                           config={"model_id": _model_id(self.job.reranker)})


def _model_id(cfg) -> str:
    from verbatim_batch.retrieval.embedder import portable_model_id

    return portable_model_id(cfg.model)


def candidates(job: RerankJob, queries_path: str, chunks_run: str) -> pa.Table:
    """The rows to rerank: each query's first ``top_k`` rows of ``method``, with the query and chunk text
    (``rerank.CANDIDATE_COLUMNS``), ordered by query then first rank."""
    from verbatim_batch.extract.pairs import chunk_lookup

    retrieval = read_table(job.retrieval, "retrieval")
    methods = set(retrieval["method"].to_pylist())
    if job.method not in methods:
        raise ValueError(f"{job.retrieval} has no {job.method!r} rows (methods: {sorted(methods)})")
    rows = retrieval.filter(pc.and_(pc.equal(retrieval["method"], job.method),
                                    pc.less_equal(retrieval["rank"], job.top_k)))
    rows = rows.sort_by([("query_id", "ascending"), ("rank", "ascending")])
    query_table, _ = read_queries(queries_path)
    qmap = dict(zip(query_table["query_id"].to_pylist(), query_table["query"].to_pylist(), strict=True))
    texts = chunk_lookup(committed_table_dir(chunks_run, "chunks"), rows["chunk_id"].to_pylist())
    qids, cids = rows["query_id"].to_pylist(), rows["chunk_id"].to_pylist()
    return pa.table({
        "query_id": pa.array(qids, pa.string()),
        "query": pa.array([qmap.get(q) for q in qids], pa.string()),
        "chunk_id": pa.array(cids, pa.string()),
        "paper_id": rows["paper_id"],
        "chunk": pa.array([(texts.get(c) or {}).get("text") for c in cids], pa.large_string()),
        "first_method": pa.array([job.method] * rows.num_rows, pa.string()),
        "first_rank": rows["rank"],
        "first_score": rows["score"],
        "dense_rank": rows["dense_rank"],
        "bm25_rank": rows["bm25_rank"],
    })


def run_rerank(job: RerankJob) -> tuple[str, dict[str, Any]]:
    """Rerank each query's top ``top_k`` candidates of a retrieval run with a cross-encoder."""
    return run_stage(RerankStage(job))


COMMAND = Command("rerank", "optional: rerank each query's top retrieved chunks with a cross-encoder (between "
                  "retrieve and extract)", RerankJob, run_rerank, stage=RerankStage, folder="reranked",
                  when=lambda chain: chain.reranks)  # a chain reranks when its rerank section names a model
