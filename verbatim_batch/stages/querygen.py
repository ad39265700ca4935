"""The querygen stage: a chunk run -> generated queries (three per sampled chunk) over an OpenAI-compatible
endpoint."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import group, option, runtime
from verbatim_batch.core.runs import committed_table_dir, read_table
from verbatim_batch.core.tables import GENERATED_QUERIES
from verbatim_batch.engine.batches import drop_keys
from verbatim_batch.engine.resources import Resources, ray_args
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    NOT_INCREMENTAL,
    Command,
    Outcome,
    Plan,
    RunOptions,
    StageContext,
    TableStage,
    Work,
    bound_settings,
)
from verbatim_batch.extract.llm import LLMConfig

if TYPE_CHECKING:
    import ray  # imported where a stage runs: the CLI parses its options without importing Ray


class QueryGenActor:
    """Three-step query generation for a batch of chunks over an OpenAI-compatible endpoint."""

    def __init__(self, config) -> None:
        from verbatim_batch.extract.llm import OpenAIClient
        from verbatim_batch.silver.querygen import QueryGenerator

        client = OpenAIClient(config)
        self.generator = QueryGenerator(client.chat, config.model, max_in_flight=config.max_in_flight)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.generator(batch)


def endpoint_llm() -> Any:
    """The LLM options of a job that asks an endpoint with prompts of its own (querygen, silver): those of the HTTP
    backend (``when``) and the model's, not the extraction prompt's."""
    return group(LLMConfig, required=True, fixed={"backend": "http"}, omit=("style", "docs_per_request"))


@dataclass
class QueryGenJob(RunOptions):
    chunks: str = option(help="a committed chunk run", path=True)
    llm: Any = endpoint_llm()
    n_papers: int = option(100, "papers to sample, one chunk each", low=1, high=limits.ROWS)
    seed: int = option(0, "sampling seed", low=0, high=limits.SEED)
    batch_rows: int = runtime(16)
    concurrency: int | None = option(None, "parallel request actors", low=1,
                                     high=limits.WORKERS, default_help="2", runtime=True)


class QueryGenStage(TableStage):
    command = "querygen"
    reads = {"chunks": ("chunks",)}
    tables = {"queries": GENERATED_QUERIES}
    key_column = "chunk_id"  # a write covers whole chunks: a rerun skips them
    takes_previous = False
    # I/O-bound actors (requests to an endpoint), two by default; each call one block of batch_rows chunks
    resources = Resources(cpus=0.5, actors=2, batch_rows=QueryGenJob.batch_rows, whole_blocks=True)

    def plan(self) -> Plan:
        job: QueryGenJob = self.job
        if job.llm.backend != "http":
            raise ValueError("querygen talks to an OpenAI-compatible endpoint (e.g. `vllm serve` on the cluster): "
                             "use the http backend")
        return Plan(config=bound_settings(job), inputs=(job.chunks,))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        from verbatim_batch.silver.querygen import pick_chunks, sample_papers

        job: QueryGenJob = self.job
        papers_dir = committed_table_dir(job.chunks, "papers")
        names = storage.dataset(papers_dir).schema.names
        papers = storage.read_parquet(papers_dir,
                                      columns=[c for c in ("paper_id", "language", "authors") if c in names])
        paper_ids = sample_papers(papers, job.n_papers, job.seed)
        picked = pick_chunks(read_table(job.chunks, "chunks", ["chunk_id", "paper_id", "chunk_index", "text",
                                                               "heading_path"]), paper_ids, job.seed)
        return Work(keys=picked["chunk_id"], n_in=picked.num_rows, data=(picked, len(paper_ids)))

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> ray.data.Dataset:
        job: QueryGenJob = self.job
        picked = work.data[0]
        todo = drop_keys(picked, "chunk_id", skip)
        res = ctx.resources
        rows = res.batch_rows
        blocks = [todo.slice(i, rows) for i in range(0, todo.num_rows, rows)]
        import ray

        return ray.data.from_arrow(blocks).map_batches(
            QueryGenActor, **ray_args(res, QueryGenActor, batch_format="pyarrow",
                                      fn_constructor_kwargs={"config": job.llm}))

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> dict[str, int]:
        queries = storage.read_parquet(storage.join(outcome.staging, "queries"), columns=["error"])
        errors = [e for e in queries["error"].to_pylist() if e]
        return {"papers_eligible_sampled": work.data[1], "chunks": work.n_in,
                "queries": queries.num_rows - len(errors), "query_errors": len(errors),
                **Counter(f"errors.{e.split(':', 1)[0]}" for e in errors)}


def run_querygen(job: QueryGenJob) -> tuple[str, dict[str, Any]]:
    """Sample papers, pick one chunk each, and generate 3 queries per chunk into a ``queries`` table."""
    return run_stage(QueryGenStage(job))


COMMAND = Command("querygen", "generate 3 search queries per sampled chunk with an LLM (3 steps)", QueryGenJob,
                  run_querygen, omit=NOT_INCREMENTAL + ("batch_retries",))
