"""The embed stage: a chunk run -> an embeddings table, one model per GPU (else CPU actors)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

from .. import storage
from ..runs import committed_table_dir, manifest_config
from ..tables import embeddings_schema
from .ray_env import cpu_threads, model_actor_args
from .runner import RunOptions, Stage, StageContext, StageResult, run_stage
from .sink import as_table, drop_keys, table_entries, with_counts, with_retries

log = logging.getLogger(__name__)


class EmbedActor:
    """One Embedder per actor (per GPU); torch threads sized to the node on CPU."""

    def __init__(self, config, threads: int | None = None, retries: int = 2) -> None:
        import torch

        from ..embedding import Embedder

        if threads:
            torch.set_num_threads(threads)
        self.embedder = Embedder(config)
        self.retries = retries

    def _embed(self, batch: pa.Table) -> pa.Table:
        before = dict(self.embedder.stats)
        out = self.embedder(batch)
        after = self.embedder.stats
        return with_counts(out, {
            "padded_tokens": after["padded_tokens"] - before["padded_tokens"],
            "time_ms.tokenize": round(1000 * (after["tokenize_s"] - before["tokenize_s"])),
            "time_ms.forward": round(1000 * (after["forward_s"] - before["forward_s"]))})

    def __call__(self, batch: pa.Table) -> pa.Table:
        return with_retries(self._embed, batch, self.retries, "embed")


@dataclass
class EmbedJob(RunOptions):
    chunks: str  # a committed chunk run folder
    embedder: Any = None  # EmbedderConfig; None: the offline default
    batch_rows: int = 1024
    concurrency: int | None = None
    threads: int | None = None


def unchanged_chunks(previous: str, chunks_dir: str, config: dict[str, Any]) -> tuple[pa.Array, str | None]:
    """Chunk ids whose vectors ``previous`` holds and may be carried (same id, same context, same embedder:
    config and weights), and why none may be, if so."""
    prev = manifest_config(previous)
    for key in ("embedder_hash", "model_revision", "dim"):
        if prev.get(key) != config[key]:
            return pa.array([], pa.string()), f"embedder changed ({key})"
    new = storage.read_parquet(chunks_dir, columns=["chunk_id", "context"])
    old = storage.read_parquet(committed_table_dir(prev["chunks"], "chunks"), columns=["chunk_id", "context"])
    same = new.join(old, "chunk_id", right_suffix="_old")
    return same.filter(pc.equal(same["context"], same["context_old"]))["chunk_id"], None


class EmbedStage(Stage):
    command = "embed"
    resumable = True

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        from transformers import AutoConfig

        from ..embedding import EmbedderConfig, weights_fingerprint

        job: EmbedJob = self.job
        self.cfg = job.embedder or EmbedderConfig()
        self.chunks_dir = committed_table_dir(job.chunks, "chunks")
        model_cfg = AutoConfig.from_pretrained(self.cfg.model, revision=self.cfg.revision,
                                               trust_remote_code=self.cfg.trust_remote_code)
        self.dim = int(model_cfg.hidden_size)
        config = {"chunks": job.chunks, "embedder": self.cfg.to_dict(), "embedder_hash": self.cfg.hash,
                  "dim": self.dim, "model_revision": weights_fingerprint(self.cfg)}
        return config, [job.chunks]

    def execute(self, ctx: StageContext) -> StageResult:
        job: EmbedJob = self.job
        cfg = self.cfg
        schema = embeddings_schema(self.dim, pa.float16() if cfg.output_dtype == "float16" else pa.float32())
        carried: set[str] = set()
        if job.previous:
            same, why_not = unchanged_chunks(job.previous, self.chunks_dir, ctx.config)
            if why_not:
                log.info("embed: nothing carried from %s: %s", job.previous, why_not)
            carried, _ = ctx.carry({"embeddings": schema}, "chunk_id", same.to_pylist(), record_keys="chunk_id")
        skip = ctx.done | carried
        all_ids = storage.read_parquet(self.chunks_dir, columns=["chunk_id"])["chunk_id"]
        skip_ids = pa.array(sorted(skip), pa.string())
        todo = len(all_ids) - (pc.sum(pc.is_in(all_ids, value_set=skip_ids)).as_py() or 0)
        sink = ctx.sink(as_table("embeddings"), {"embeddings": schema}, key_columns={"embeddings": "chunk_id"})
        if todo:  # no model is loaded when every chunk is carried or already done
            ctx.ray()
            ds = ray.data.read_parquet(self.chunks_dir).select_columns(["chunk_id", "paper_id", "context", "text"])
            if skip:
                ds = ds.map_batches(drop_keys, fn_kwargs={"column": "chunk_id", "keys": skip_ids},
                                    batch_format="pyarrow")
            ds = ds.map_batches(EmbedActor, batch_format="pyarrow", **model_actor_args(job.concurrency, job.batch_rows),
                                fn_constructor_kwargs={"config": cfg, "threads": cpu_threads(job.threads),
                                                       "retries": job.max_retries})
            ds.write_datasink(sink)
        result = sink.finish()
        if result.rows["embeddings"] != len(all_ids):
            raise RuntimeError(f"{len(all_ids)} chunks but {result.rows['embeddings']} embeddings written")
        counts = {**result.counts, "chunks_in": len(all_ids), "embedded": todo, "carried": len(carried)}
        return StageResult(tables=table_entries(result, ["embeddings"]),
                           counts=counts | ({"resumed_rows": len(ctx.done)} if ctx.done else {}))


def run_embed(job: EmbedJob) -> tuple[str, dict[str, Any]]:
    """Embed every chunk of a chunk run into an embeddings table (only the new ones, given ``previous``)."""
    return run_stage(EmbedStage(job))
