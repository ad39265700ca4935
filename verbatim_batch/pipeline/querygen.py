"""The querygen stage: a chunk run -> generated queries (three per sampled chunk) over an OpenAI-compatible
endpoint."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from .. import storage
from ..runs import committed_table_dir, jsonable, read_table
from ..tables import GENERATED_QUERIES
from .ray_env import cpu_actor_args
from .runner import RunOptions, Stage, StageContext, StageResult, run_stage
from .sink import as_table, table_entries


class QueryGenActor:
    """Three-step query generation for a batch of chunks over an OpenAI-compatible endpoint."""

    def __init__(self, config) -> None:
        from ..extract.llm import OpenAIClient
        from ..querygen import QueryGenerator

        client = OpenAIClient(config)
        self.generator = QueryGenerator(client.chat, config.model, max_in_flight=config.max_in_flight)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.generator(batch)


@dataclass
class QueryGenJob(RunOptions):
    chunks: str  # a committed chunk run (papers + chunks tables)
    llm: Any  # extract.llm.LLMConfig (http backend)
    n_papers: int = 100
    seed: int = 0
    batch_rows: int = 16
    concurrency: int | None = None


class QueryGenStage(Stage):
    command = "querygen"
    resumable = True  # a write covers whole chunks (its keys are chunk ids): a rerun skips them

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        from ..querygen import pick_chunks, sample_papers

        job: QueryGenJob = self.job
        if job.llm.backend != "http":
            raise ValueError("querygen talks to an OpenAI-compatible endpoint (e.g. `vllm serve` on the cluster): "
                             "use the http backend")
        papers_dir = committed_table_dir(job.chunks, "papers")
        names = storage.dataset(papers_dir).schema.names
        papers = storage.read_parquet(papers_dir,
                                      columns=[c for c in ("paper_id", "language", "authors") if c in names])
        self.paper_ids = sample_papers(papers, job.n_papers, job.seed)
        self.picked = pick_chunks(read_table(job.chunks, "chunks", ["chunk_id", "paper_id", "chunk_index", "text",
                                                                    "heading_path"]), self.paper_ids, job.seed)
        config = {"chunks": job.chunks, "n_papers": job.n_papers, "seed": job.seed, "llm": jsonable(job.llm.to_dict())}
        return config, [job.chunks]

    def execute(self, ctx: StageContext) -> StageResult:
        job: QueryGenJob = self.job
        todo = self.picked.filter(pc.invert(pc.is_in(self.picked["chunk_id"],
                                                     value_set=pa.array(sorted(ctx.done), pa.string()))))
        sink = ctx.sink(as_table("queries"), {"queries": GENERATED_QUERIES}, key_columns={"queries": "chunk_id"})
        if todo.num_rows:
            ctx.ray()
            rows = job.batch_rows
            blocks = [todo.slice(i, rows) for i in range(0, todo.num_rows, rows)]
            ds = ray.data.from_arrow(blocks).map_batches(
                QueryGenActor, fn_constructor_kwargs={"config": job.llm}, batch_format="pyarrow", batch_size=None,
                **cpu_actor_args(job.concurrency or 2, 0.5))
            ds.write_datasink(sink)
        result = sink.finish()
        queries = storage.read_parquet(storage.join(ctx.staging, "queries"))
        errors = [e for e in queries["error"].to_pylist() if e]
        counts = {"papers_eligible_sampled": len(self.paper_ids), "chunks": self.picked.num_rows,
                  "queries": queries.num_rows - len(errors), "query_errors": len(errors),
                  **Counter(f"errors.{e.split(':', 1)[0]}" for e in errors)}
        return StageResult(tables=table_entries(result, ["queries"]),
                           counts=counts | ({"resumed_chunks": len(ctx.done)} if ctx.done else {}))


def run_querygen(job: QueryGenJob) -> tuple[str, dict[str, Any]]:
    """Sample papers, pick one chunk each, and generate 3 queries per chunk into a ``queries`` table."""
    return run_stage(QueryGenStage(job))
