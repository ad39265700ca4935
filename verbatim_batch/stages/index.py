"""The index stage: an embed run (+ its chunk run) -> FAISS and BM25 indexes, built in one Ray task (on a
GPU node when there is one), or updated from ``previous`` when the embed run carried vectors from it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.core.options import group, option
from verbatim_batch.core.runs import committed_table_dir, manifest_config, read_manifest
from verbatim_batch.engine.resources import Resources, ray_args
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Command, Plan, RunOptions, Stage, StageContext, StageResult, bound_settings
from verbatim_batch.retrieval.index.dense import DenseSpec
from verbatim_batch.retrieval.index.folder import build_index_files, index_fingerprint, update_index_files


@dataclass
class IndexJob(RunOptions):
    embeddings: str = option(help="a committed embed run folder", path=True)
    chunks: str = option(help="the chunk run it came from (for BM25 text and paper ids)", path=True)
    dense: Any = group(DenseSpec)  # None: auto by size
    bm25: bool = option(True, "skip the full-text index", name="no_bm25", invert=True)
    max_drift: float = option(0.2, "with --previous: rebuild the index when (removed + added) / vectors since the "
                              "last build exceeds this", low=0)


@dataclass(frozen=True)
class IndexFacts:
    emb_dir: str
    chunks_dir: str
    embed_config: dict[str, Any]


class IndexStage(Stage):
    command = "index"
    reads = {"embeddings": ("embeddings",), "chunks": ("chunks",)}
    writes = ("ids",)  # the FAISS and BM25 files beside it
    outcomes = {"in": ("chunks",), "written": ("chunks",)}
    resources = Resources(cpus=1, gpus=1)  # the build: one task, on a GPU where the cluster has one

    def plan(self) -> Plan:
        job: IndexJob = self.job
        facts = IndexFacts(emb_dir=committed_table_dir(job.embeddings, "embeddings"),
                           chunks_dir=committed_table_dir(job.chunks, "chunks"),
                           embed_config=manifest_config(job.embeddings))
        return Plan(config=bound_settings(job, embedder=facts.embed_config["embedder"]),
                    inputs=(job.embeddings, job.chunks), facts=facts)

    def _update(self, facts: IndexFacts, staging: str) -> dict[str, Any] | None:
        """Stats of an in-place update of ``previous``, or None when it must be rebuilt."""
        from verbatim_batch.retrieval.index import DenseSpec

        job: IndexJob = self.job
        prev = manifest_config(job.previous)
        prev_embed = manifest_config(prev["embeddings"])
        if not (facts.embed_config.get("previous") == prev["embeddings"] and prev["bm25"] == job.bm25
                and prev_embed.get("model_revision") == facts.embed_config.get("model_revision")
                and (job.dense is None or dataclasses.asdict(job.dense) == dataclasses.asdict(DenseSpec()))):
            return None
        since = prev.get("since_rebuild") or [read_manifest(job.previous)["counts"]["vectors"], 0]
        stats = update_index_files(job.previous, facts.emb_dir, facts.chunks_dir, staging, job.bm25, job.max_drift,
                                   tuple(since))
        if stats:
            stats["spec"] = prev["dense"]
        return stats

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        from verbatim_batch.retrieval.index import DenseSpec

        job: IndexJob = self.job
        facts: IndexFacts = plan.facts
        unreadable = 0
        try:
            stats = self._update(facts, ctx.staging) if job.previous else None
        except (OSError, RuntimeError, ValueError, KeyError, pa.ArrowException) as exc:  # a damaged previous index
            logging.getLogger(__name__).warning("%s: cannot be updated (%s): the index is rebuilt", job.previous,
                                                (str(exc).splitlines() or [type(exc).__name__])[0][:200])
            for name in ("dense", "bm25", "ids.parquet"):  # whatever the update left half-written
                storage.rmtree(storage.join(ctx.staging, name))
            stats, unreadable = None, 1
        if stats is None:
            ctx.ray()
            import ray

            task = ray.remote(**ray_args(ctx.resources))(build_index_files)
            stats = ray.get(task.remote(facts.emb_dir, facts.chunks_dir, ctx.staging, job.dense or DenseSpec(),
                                        job.bm25))
        config = {
            "dense": stats["spec"],
            "fingerprint": index_fingerprint(storage.join(ctx.staging, "ids.parquet"), facts.embed_config,
                                             stats["spec"], job.bm25),
            "since_rebuild": stats.get("since_rebuild", [stats["n"], 0]),
        }
        counts = {"chunks": stats["n"], "vectors": stats["vectors"], "dim": stats["dim"],
                  "multi_window_chunks": stats["multi_window_chunks"]}
        counts |= {k: stats[k] for k in ("removed", "added") if k in stats} | (
            {"previous_unreadable": 1} if unreadable else {})
        return StageResult(
            tables={"ids": {"rows": stats["n"], "files": 1}}, counts=counts, timings_s=stats["timings"],
            config=config,
            manifest={"update": {"action": stats["update"], "drift": round(stats.get("drift", 1.0), 6)}})


def run_index(job: IndexJob) -> tuple[str, dict[str, Any]]:
    """Build the dense and full-text indexes of an embed run. With ``previous``, the old index is updated in
    place unless the drift is over ``max_drift``; the manifest's ``update`` says which."""
    return run_stage(IndexStage(job))


COMMAND = Command("index", "build FAISS + BM25 indexes from an embeddings run", IndexJob, run_index,
                  stage=IndexStage, folder="index", omit=("batch_retries",))
