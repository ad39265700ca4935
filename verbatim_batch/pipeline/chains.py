"""The chain chunk -> embed -> index -> retrieve -> extract, defined once.

The demo, nightly runs, benchmarks and tests all run it through ``run_chain``: each stage is its own
committed run folder under one output folder (``chunks/``, ``embeddings/``, ``index/``, ``retrieval/``,
``spans/``), optionally building on the same stages of an earlier chain (``previous``). With a ``reranker`` the
chain reranks the retrieval into ``reranked/`` and extracts from that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import storage
from ..chunking import ChunkerConfig
from ..runs import jsonable
from .chunk import ChunkJob, run_chunk
from .embed import EmbedJob, run_embed
from .extract import ExtractJob, run_extract
from .index import IndexJob, run_index
from .rerank import RerankJob, run_rerank
from .retrieve import RetrieveJob, run_retrieve
from .runner import CompositeStage, Plan, RunOptions, StageContext, StageResult, run_stage

STAGES = ("chunks", "embeddings", "index", "retrieval", "spans")
RERANK_STAGE = "reranked"  # between retrieval and spans, when the chain has a reranker


@dataclass
class Chain:
    """What a chain run reads and how each stage is set up (None: the stage's offline default)."""

    input: str  # the corpus
    queries: str  # the query file
    metadata: str | None = None
    format: str = "auto"
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    embedder: Any = None  # EmbedderConfig
    dense: Any = None  # index.DenseSpec
    extractor: Any = None  # extractor config; None: the offline semantic extractor
    reranker: Any = None  # rerank.RerankerConfig; None: no rerank stage (extract reads the retrieval)
    # defaults are the stage jobs' own (declared once, there)
    method: str = ExtractJob.method
    top_k: int = ExtractJob.top_k
    max_drift: float = IndexJob.max_drift
    embed_batch_rows: int = EmbedJob.batch_rows
    extract_batch_rows: int = ExtractJob.batch_rows
    rerank_top_k: int = RerankJob.top_k


def run_chain(chain: Chain, output: str, *, previous: str | None = None, run_id: str | None = None,
              overwrite: bool = False, address: str | None = None, num_cpus: int | None = None,
              batch_retries: int = RunOptions.batch_retries, after_stage: Callable[[str], None] | None = None,
              ) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, float]]:
    """Run every stage into ``output/<stage>``; returns ``({stage: (path, manifest)}, {stage: seconds})``."""
    from ..embedding import EmbedderConfig
    from ..extract.semantic import SemanticConfig

    out = storage.normalize(output)

    def at(stage: str) -> str:
        return storage.join(out, stage)

    def prev(stage: str) -> str | None:
        return storage.join(previous, stage) if previous else None

    common = {"run_id": run_id, "overwrite": overwrite, "address": address, "num_cpus": num_cpus,
              "batch_retries": batch_retries}
    steps: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
        "chunks": lambda: run_chunk(ChunkJob(
            input=chain.input, output=at("chunks"), format=chain.format, metadata=chain.metadata,
            chunker=chain.chunker, previous=prev("chunks"), **common)),
        "embeddings": lambda: run_embed(EmbedJob(
            chunks=at("chunks"), output=at("embeddings"), embedder=chain.embedder or EmbedderConfig(),
            batch_rows=chain.embed_batch_rows, previous=prev("embeddings"), **common)),
        "index": lambda: run_index(IndexJob(
            embeddings=at("embeddings"), chunks=at("chunks"), output=at("index"), dense=chain.dense,
            previous=prev("index"), max_drift=chain.max_drift, **common)),
        "retrieval": lambda: run_retrieve(RetrieveJob(
            index=at("index"), queries=chain.queries, output=at("retrieval"), previous=prev("retrieval"),
            **common)),
        RERANK_STAGE: lambda: run_rerank(RerankJob(
            retrieval=at("retrieval"), reranker=chain.reranker, output=at(RERANK_STAGE), top_k=chain.rerank_top_k,
            previous=prev(RERANK_STAGE) if previous and storage.exists(storage.join(
                previous, RERANK_STAGE, "manifest.json")) else None, **common)),
        "spans": lambda: run_extract(ExtractJob(
            output=at("spans"), extractor=chain.extractor or SemanticConfig(),
            retrieval=at(RERANK_STAGE if chain.reranker is not None else "retrieval"),
            method=chain.method, top_k=chain.top_k, batch_rows=chain.extract_batch_rows, previous=prev("spans"),
            **common)),
    }
    results: dict[str, tuple[str, dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    for name in chain_stages(chain):
        t = time.perf_counter()
        results[name] = steps[name]()
        timings[name] = time.perf_counter() - t
        if after_stage is not None:
            after_stage(name)
    return results, timings


def chain_stages(chain: Chain) -> tuple[str, ...]:
    """The chain's stages in order: ``STAGES``, with ``reranked`` before ``spans`` when it has a reranker."""
    return STAGES if chain.reranker is None else (*STAGES[:-1], RERANK_STAGE, STAGES[-1])


@dataclass(kw_only=True)
class ChainJob(RunOptions):
    """``verbatim-batch run``: the whole chain on one corpus and query file, into ``output/<stage>``."""

    chain: Chain


class ChainStage(CompositeStage):
    """The chain as one run: one Ray start for every stage, each stage its usual committed run folder under
    ``output`` (all under one run id, so a rerun after a kill skips committed stages and resumes the one that
    was interrupted), and a manifest and report for the whole."""

    command = "run"

    def plan(self) -> Plan:
        c: Chain = self.job.chain
        config = {"input": c.input, "queries": c.queries, "metadata": c.metadata, "format": c.format,
                  "chunker": c.chunker.to_dict(), "embedder": jsonable(c.embedder.to_dict()) if c.embedder else None,
                  "extractor": jsonable(c.extractor.to_dict()) if c.extractor else None,
                  "dense": jsonable(c.dense.__dict__) if c.dense is not None else None, "method": c.method,
                  "top_k": c.top_k, "max_drift": c.max_drift}
        return Plan(config=config, inputs=(c.input, c.queries, *([c.metadata] if c.metadata else [])))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job: ChainJob = self.job
        results, timings = run_chain(job.chain, ctx.staging, previous=job.previous, run_id=ctx.run_id,
                                     address=job.address, num_cpus=job.num_cpus, batch_retries=job.batch_retries)
        manifests = {name: m for name, (_, m) in results.items()}
        return StageResult(
            tables={f"{stage}/{name}": info for stage, m in manifests.items() for name, info in m["tables"].items()},
            counts={f"{stage}.{k}": int(v) for stage, m in manifests.items() for k, v in m["counts"].items()
                    if not k.startswith("time_ms.")},
            timings_s=timings, manifest={"stages": {name: name for name in results}})


def run_chain_job(job: ChainJob) -> tuple[str, dict[str, Any]]:
    """``verbatim-batch run``: the chain as one committed, resumable run."""
    return run_stage(ChainStage(job))
