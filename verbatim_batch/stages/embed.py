"""The embed stage: a chunk run -> an embeddings table, one model per GPU (else CPU actors)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import carried_across, changed_setting, group, option, settings
from verbatim_batch.core.runs import committed_table_dir, manifest_config
from verbatim_batch.core.tables import embeddings_schema
from verbatim_batch.engine.batches import drop_keys, strip_internal, with_counts
from verbatim_batch.engine.model_actor import ModelActor, host
from verbatim_batch.engine.resources import Cluster, Resources, ray_args, task_bounds
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Command, Plan, RunOptions, StageContext, TableStage, Work, bound_settings
from verbatim_batch.retrieval.embedder import EmbedderConfig

if TYPE_CHECKING:
    import ray  # imported where a stage runs: the CLI parses its options without importing Ray

log = logging.getLogger(__name__)


EMBED_COLUMNS = ("chunk_id", "paper_id", "context", "text", "heading_path")  # heading_path: optional


def embed_tokenize(batch: pa.Table, config) -> pa.Table:
    """CPU stage in front of ``EmbedActor``: chunk rows -> the same rows with their tokens, so the model's process
    (one per GPU) runs only the forward pass."""
    import time

    from verbatim_batch.retrieval.embedder import EmbedTokenizer

    tokenizer = host(EmbedTokenizer, config)
    t0 = time.perf_counter()
    out = tokenizer.tokenize_table(batch.select([c for c in EMBED_COLUMNS if c in batch.column_names]))
    return with_counts(out, {"time_ms.tokenize": round(1000 * (time.perf_counter() - t0))})


class EmbedActor(ModelActor):
    """One Embedder per actor (per GPU); batches not tokenized by ``embed_tokenize`` are tokenized here. A batch
    that still fails after its retries fails the job (a vector cannot be an error row)."""

    what = "embed"

    def load(self, config):
        from verbatim_batch.retrieval.embedder import Embedder

        return Embedder(config)

    @property
    def embedder(self):
        return self.model

    def run(self, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        batch, carried = strip_internal(batch)  # the tokenize stage's time rides on to the sink
        carried.pop("stage_retries", None)
        return self.model(batch), dict(carried)

    def counts(self, before, after, wall_s: float) -> dict[str, int]:
        return {"padded_tokens": after["padded_tokens"] - before["padded_tokens"],
                "time_ms.tokenize": round(1000 * (after["tokenize_s"] - before["tokenize_s"])),
                "time_ms.forward": round(1000 * (after["forward_s"] - before["forward_s"]))}


def embed_dataset(chunks: ray.data.Dataset, config, res: Resources, retries: int = 2,
                  cluster: Cluster | None = None) -> ray.data.Dataset:
    """Chunk rows -> embeddings rows (with internal count columns): tokenised in CPU tasks
    (``embed_tokenize``), then the forward pass alone on the model actors (the job's and ``api.embed``'s path)."""
    ds = chunks.map_batches(embed_tokenize, batch_format="pyarrow", fn_kwargs={"config": config},
                            **task_bounds(res.restarts))
    return ds.map_batches(EmbedActor, **ray_args(res, EmbedActor, cluster, batch_format="pyarrow",
                                                 fn_constructor_kwargs={"config": config, "retries": retries}))


@dataclass
class EmbedJob(RunOptions):
    chunks: str = option(help="a committed chunk run folder", path=True)
    embedder: Any = group(EmbedderConfig)  # None: the offline default
    batch_rows: int = option(1024, "chunks per actor call, sorted and packed inside", low=1,
                             high=limits.BATCH, runtime=True)
    concurrency: int | None = option(None, "model actors", low=1,
                                     high=limits.WORKERS, default_help="one per GPU, else 1", runtime=True)
    threads: int | None = option(None, "torch threads per CPU actor", low=1,
                                 high=limits.THREADS, default_help="all CPUs", runtime=True)


def unchanged_chunks(previous: str, chunks_dir: str, config: dict[str, Any]) -> tuple[pa.Array, str | None]:
    """Chunk ids whose vectors ``previous`` holds and may be carried (same id, context and settings, the
    embedder by its hash and weights), and why none may be, if so."""
    prev = manifest_config(previous)
    if key := changed_setting(prev, config, across=(*carried_across(EmbedJob), "embedder")):
        return pa.array([], pa.string()), f"embedder changed ({key})"
    new = storage.read_parquet(chunks_dir, columns=["chunk_id", "context"])
    old = storage.read_parquet(committed_table_dir(prev["chunks"], "chunks"), columns=["chunk_id", "context"])
    same = new.join(old, "chunk_id", right_suffix="_old")
    return same.filter(pc.equal(same["context"], same["context_old"]))["chunk_id"], None


def embed_table_counts(name: str, table: pa.Table) -> dict[str, int]:
    windows = table["windows"].cast(pa.int64())
    return {"tokens": pc.sum(table["n_tokens"]).as_py() or 0,
            "truncated": pc.sum(table["truncated"].cast(pa.int64())).as_py() or 0,
            # truncated rows of one window: with --max-windows above 1, reference lists (their first window only)
            "truncated_first_window": pc.sum(pc.and_(table["truncated"], pc.equal(windows, 1)).cast(pa.int64())
                                             ).as_py() or 0,
            "windows": pc.sum(windows).as_py() or 0,
            "multi_window": pc.sum(pc.greater(windows, 1).cast(pa.int64())).as_py() or 0}


@dataclass(frozen=True)
class EmbedFacts:
    config: Any  # EmbedderConfig
    chunks_dir: str
    schema: pa.Schema


class EmbedStage(TableStage):
    command = "embed"
    reads = {"chunks": ("chunks",)}
    key_column = "chunk_id"
    table_counts = staticmethod(embed_table_counts)
    resources = Resources(cpus=1, gpus=1, batch_rows=EmbedJob.batch_rows)  # one model per GPU, else CPU actors

    tables = {"embeddings": embeddings_schema(1)}  # the vector width is the model's: see ``schemas``

    def schemas(self, plan: Plan) -> dict[str, pa.Schema]:
        return {"embeddings": plan.facts.schema}

    def plan(self) -> Plan:
        from transformers import AutoConfig

        from verbatim_batch.retrieval.embedder import EmbedderConfig, embedder_fingerprint

        job: EmbedJob = self.job
        cfg = job.embedder or EmbedderConfig()
        chunks_dir = committed_table_dir(job.chunks, "chunks")
        revision = embedder_fingerprint(cfg)  # the model folder checked (models.check_model_dir) before it is read
        dim = int(AutoConfig.from_pretrained(cfg.model, revision=cfg.revision,
                                             trust_remote_code=cfg.trust_remote_code).hidden_size)
        config = bound_settings(job, embedder=settings(cfg), embedder_hash=cfg.hash, dim=dim, model_revision=revision)
        schema = embeddings_schema(dim, pa.float16() if cfg.output_dtype == "float16" else pa.float32())
        return Plan(config=config, inputs=(job.chunks,), facts=EmbedFacts(cfg, chunks_dir, schema))

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        ids = storage.read_parquet(plan.facts.chunks_dir, columns=["chunk_id"])["chunk_id"]
        return Work(keys=ids, n_in=len(ids))

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> pa.Array:
        same, why_not = unchanged_chunks(previous, plan.facts.chunks_dir, plan.config)
        if why_not:
            log.info("embed: nothing carried from %s: %s", previous, why_not)
        return same

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> ray.data.Dataset:
        job: EmbedJob = self.job
        import ray

        bounds = task_bounds(ctx.resources.restarts)
        ds = ray.data.read_parquet(plan.facts.chunks_dir, ray_remote_args=bounds).select_columns(list(EMBED_COLUMNS))
        if len(skip):
            ds = ds.map_batches(drop_keys, fn_kwargs={"column": "chunk_id", "keys": skip}, batch_format="pyarrow",
                                **bounds)
        return embed_dataset(ds, plan.facts.config, ctx.resources, job.batch_retries)


def run_embed(job: EmbedJob) -> tuple[str, dict[str, Any]]:
    """Embed every chunk of a chunk run into an embeddings table (only the new ones, given ``previous``)."""
    return run_stage(EmbedStage(job))


COMMAND = Command("embed", "embed the chunks of a chunk run", EmbedJob, run_embed, stage=EmbedStage,
                  folder="embeddings")
