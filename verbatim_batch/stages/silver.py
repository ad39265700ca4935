"""The silver job: sample -> queries -> retrieve -> teacher extraction -> filter -> split -> write.

Each step is its own committed run under the output folder, all under one run id, so a rerun with ``--run-id``
after a kill skips the steps already committed.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import option, settings
from verbatim_batch.core.runs import committed_table_dir, read_table
from verbatim_batch.core.tables import group_by
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    NOT_INCREMENTAL,
    Command,
    CompositeStage,
    Plan,
    RunOptions,
    Stage,
    StageContext,
    StageResult,
    bound_settings,
)
from verbatim_batch.extract.highlighter import HighlighterConfig
from verbatim_batch.extract.highlighter_spans import window_problem
from verbatim_batch.report.summary import print_run
from verbatim_batch.stages.extract import ExtractJob, run_extract
from verbatim_batch.stages.querygen import QueryGenJob, endpoint_llm, run_querygen
from verbatim_batch.stages.retrieve import RetrieveJob, run_retrieve


@dataclass
class SilverJob(RunOptions):
    """``output``: a folder for the job's runs: querygen/, retrieval/, teacher/, data/."""

    chunks: str = option(help="a committed chunk run", path=True)
    index: str = option(help="an index run built from that chunk run", path=True)
    # for query generation and the teacher (the teacher uses the paragraph prompt)
    llm: Any = endpoint_llm()
    n_papers: int = option(2000, "papers to sample, one chunk each", low=1, high=limits.ROWS)
    seed: int = option(0, "sampling seed", low=0, high=limits.SEED)
    top_k: int = option(ExtractJob.top_k, "retrieved chunks per query the teacher reads", low=1, high=limits.PER_QUERY)
    dev_fraction: float = option(0.1, "queries held out for the dev split", low=0, high=1)
    tokenizer: str | None = option(None, "write tokenized windows for this tokenizer (hub id or path)")
    max_length: int = option(HighlighterConfig.max_length, "tokens per window of the tokenized windows", low=16,
                             high=limits.TOKENS)
    stride: int = option(HighlighterConfig.stride, "tokens shared by neighbouring windows", low=0, high=limits.TOKENS)

    def __post_init__(self) -> None:
        super().__post_init__()  # the declared bounds and choices
        if problem := window_problem(self.max_length, self.stride):  # now, not after the LLM steps were paid for
            raise ValueError(problem)


def silver_pairs(queries: pa.Table, retrieval: pa.Table, top_k: int) -> list[dict[str, Any]]:
    """Top-k hybrid chunks of each generated query, plus its source chunk when retrieval missed it."""
    hits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in retrieval.filter(pc.equal(retrieval["method"], "hybrid")).to_pylist():
        if r["rank"] <= top_k:
            hits[r["query_id"]].append(r)
    out = []
    for q in queries.to_pylist():
        ranked = sorted(hits.get(q["query_id"], []), key=lambda r: r["rank"])
        rows = [{"query_id": q["query_id"], "query": q["query"], "chunk_id": r["chunk_id"], "rank": r["rank"],
                 "source": "gold" if r["chunk_id"] == q["chunk_id"] else "retrieved"} for r in ranked]
        if all(r["chunk_id"] != q["chunk_id"] for r in ranked):
            rows.append({"query_id": q["query_id"], "query": q["query"], "chunk_id": q["chunk_id"], "rank": None,
                         "source": "gold"})
        out.extend(rows)
    return out


class SilverDataStage(Stage):
    """The last step: teacher rows -> filtered, split silver tables (and tokenized windows)."""

    command = "silver-data"
    outcomes = {"in": ("rows",), "written": ("kept",), "failed": ("rows_failed",), "rejected": ("dropped.*",)}
    takes_previous = False

    def __init__(self, job: SilverJob, steps: dict[str, tuple[str, dict[str, Any]]]) -> None:
        super().__init__(dataclasses.replace(job, output=storage.join(storage.normalize(job.output), "data")))
        self.steps = steps

    def plan(self) -> Plan:
        job: SilverJob = self.job
        config = bound_settings(job, teacher_run=self.steps["teacher"][0])
        return Plan(config=config, inputs=tuple(path for path, _ in self.steps.values()))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        from verbatim_batch.silver import dataset as silver

        job: SilverJob = self.job
        (_, qg), (ex_dir, ex) = self.steps["querygen"], self.steps["teacher"]
        rows, failed = teacher_rows(ex_dir, job.chunks, job.llm.model)
        kept, dropped = silver.filter_rows(rows)
        train, dev = silver.split_by_query(kept, dev_fraction=job.dev_fraction, seed=job.seed)
        tokenizer = None
        if job.tokenizer:
            from verbatim_batch.core.models import load_tokenizer

            tokenizer = load_tokenizer(job.tokenizer, "--tokenizer")
        written = silver.write_silver(ctx.staging, train, dev, tokenizer=tokenizer, max_length=job.max_length,
                                      stride=job.stride)
        counts = {"papers": qg["counts"]["chunks"], "queries": qg["counts"]["queries"], "rows": len(rows) + failed,
                  "rows_failed": failed, "kept": len(kept), "train": len(train), "dev": len(dev),
                  "teacher_spans": ex["counts"]["spans"], "teacher_rejects": ex["counts"]["rejects"],
                  **{f"dropped.{k}": v for k, v in dropped.items()},
                  **{f"written.{k}": v for k, v in written.items() if isinstance(v, int)}}
        return StageResult(tables={}, counts=counts)


class SilverStage(CompositeStage):
    """The whole silver pipeline: each step a committed sub-run under the job's output, one run id."""

    command = "silver"
    reads = {"chunks": ("chunks",), "index": ("ids",)}
    takes_previous = False

    def plan(self) -> Plan:
        job: SilverJob = self.job
        if job.tokenizer:  # checked now, not after the LLM work (one line, exit 2)
            from verbatim_batch.core.models import load_tokenizer

            load_tokenizer(job.tokenizer, "--tokenizer")
        teacher = dataclasses.replace(job.llm, style="paragraph")
        config = bound_settings(job, llm=settings(teacher))
        return Plan(config=config, inputs=(job.chunks, job.index))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        from verbatim_batch.retrieval.retriever import RetrieverConfig

        job: SilverJob = self.job
        out = ctx.staging
        common = {"address": job.address, "num_cpus": job.num_cpus, "run_id": ctx.run_id,
                  "batch_retries": job.batch_retries}
        steps: dict[str, tuple[str, dict[str, Any]]] = {}
        steps["querygen"] = run_querygen(QueryGenJob(chunks=job.chunks, output=storage.join(out, "querygen"),
                                                     llm=job.llm, n_papers=job.n_papers, seed=job.seed, **common))
        queries = read_table(steps["querygen"][0], "queries").filter(pc.is_valid(pc.field("query")))
        qfile = storage.join(out, "querygen-queries.parquet")
        storage.write_parquet(queries.select(["query_id", "query"]), qfile)
        steps["retrieval"] = run_retrieve(RetrieveJob(
            index=job.index, queries=qfile, output=storage.join(out, "retrieval"),
            retriever=RetrieverConfig(index_dir=job.index, k=job.top_k, methods=("hybrid",)), **common))
        pairs = silver_pairs(queries, read_table(steps["retrieval"][0], "retrieval"), job.top_k)
        pfile = storage.join(out, "querygen-pairs.parquet")
        storage.write_parquet(pa.Table.from_pylist(pairs), pfile)
        steps["teacher"] = run_extract(ExtractJob(output=storage.join(out, "teacher"),
                                                  extractor=dataclasses.replace(job.llm, style="paragraph"),
                                                  pairs=pfile, chunks=job.chunks, **common))
        data_dir, data = run_stage(SilverDataStage(dataclasses.replace(job, run_id=ctx.run_id), steps))
        return StageResult(tables={f"data/{k}": v for k, v in data["tables"].items()}, counts=data["counts"],
                           timings_s={name: m["timings_s"]["total"] for name, (_, m) in
                                      {**steps, "data": (data_dir, data)}.items()},
                           manifest={"steps": {name: name for name in (*steps, "data")}})


def run_silver(job: SilverJob) -> tuple[str, dict[str, Any]]:
    """The whole silver pipeline; every step is its own committed run under ``job.output``."""
    return run_stage(SilverStage(job))


def teacher_rows(extract_dir: str, chunks_run: str, teacher_model: str) -> tuple[list[dict[str, Any]], int]:
    """One dict per teacher pair with its chunk, heading path and verbatim spans; and how many pairs failed."""
    from verbatim_batch.extract.pairs import chunk_lookup

    pairs = read_table(extract_dir, "pairs").to_pylist()
    spans = group_by(read_table(extract_dir, "spans", ["pair_id", "start", "end", "text"]).to_pylist())
    chunks_dir = committed_table_dir(chunks_run, "chunks")
    known = chunk_lookup(chunks_dir, [p["chunk_id"] for p in pairs]) if pairs else {}
    import pyarrow.dataset as pads

    # no pairs (the teacher got no queries): no look-up, an empty (null-typed) value set does not filter strings
    heads = storage.dataset(chunks_dir).to_table(
        columns=["chunk_id", "heading_path"],
        filter=pads.field("chunk_id").isin(pa.array(list(known), pa.string()))).to_pylist() if known else []
    heading = {h["chunk_id"]: h["heading_path"] for h in heads}
    rows = []
    for p in pairs:
        extra = json.loads(p["extra"]) if p["extra"] else {}
        chunk = known.get(p["chunk_id"])
        rows.append({
            "query_id": p["query_id"], "question": p["query"], "paper_id": p["paper_id"], "chunk_id": p["chunk_id"],
            "chunk": chunk["text"] if chunk else None, "source": extra.get("source", "retrieved"), "rank": p["rank"],
            "spans": sorted(spans.get(p["pair_id"], []), key=lambda s: s["start"]),
            "heading_path": heading.get(p["chunk_id"], []), "teacher_model": teacher_model, "error": p["error"],
        })
    ok = [r for r in rows if not r["error"] and r["chunk"] is not None]
    return ok, len(rows) - len(ok)


def print_silver(job: SilverJob, result: tuple[str, dict[str, Any]]) -> None:
    """The run folder, then the funnel from sampled papers to the train and dev splits."""
    path, manifest = result
    print_run(path, manifest)
    steps = ("papers", "queries", "rows", "kept", "train", "dev")
    print("  " + " -> ".join(f"{manifest['counts'].get(k, 0)} {k}" for k in steps))


COMMAND = Command("silver", "silver training data: sample, querygen, retrieve, teacher, filter, split", SilverJob,
                  run_silver, summary=print_silver, omit=NOT_INCREMENTAL)
