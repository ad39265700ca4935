"""The one place where stages are wired into Ray Data.

``run_chunk`` is the chunk job: a corpus datasource feeds blocks of raw records
to a sink that runs the ingest stage on each and writes the three tables it
produces (papers, chunks, quarantine) into the run's staging folder. Ray fuses
read and write into one task per file group. The run then commits atomically
with a manifest.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray.data import Datasink, Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

from . import corpus, storage
from .chunking import FORCED_SPLIT, OVERSIZED_BLOCK, UNDERSIZED, ChunkerConfig
from .faults import fault_point
from .ingest import DEFAULT_MAX_PAPER_BYTES, IngestStage
from .runs import (
    build_manifest,
    committed_run,
    completed_keys,
    new_run_id,
    read_manifest,
    read_writes,
    record_write,
    staged,
)
from .tables import CHUNKS, PAPERS, QUARANTINE, RETRIEVAL, stable_hash

log = logging.getLogger(__name__)

INGEST_TABLES = {"papers": PAPERS, "chunks": CHUNKS, "quarantine": QUARANTINE}


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``; ``auto`` finds one on this machine), else start a
    fresh local Ray (never silently joining whatever ``ray start`` left running here)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)


# --- reading ------------------------------------------------------------------------


class CorpusDatasource(Datasource):
    """Raw records (``tables.RAW_RECORDS``) from md files, Parquet or JSONL.

    Files are grouped into read tasks up front (``file_groups``); read it with
    ``read_corpus`` so Ray runs exactly one task per group and can fuse the read
    with the stages after it (an extra block split would prevent that).
    """

    def __init__(
        self,
        fs: pafs.FileSystem,
        files: list[corpus.SourceFile],
        fmt: str,
        max_paper_bytes: int,
        ids_only: bool = False,
        parallelism: int = 200,
    ) -> None:
        super().__init__()
        self.fs, self.files, self.fmt = fs, files, fmt
        self.max_paper_bytes, self.ids_only = max_paper_bytes, ids_only
        if fmt == "md":
            self.groups = _balanced_groups(files, max(1, parallelism), corpus.BLOCK_BYTES)
        else:
            self.groups = [[f] for f in files]

    def estimate_inmemory_data_size(self) -> int | None:
        return 0 if self.ids_only else sum(f.size for f in self.files)

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list[ReadTask]:
        groups = self.groups
        reader = corpus.READERS[self.fmt]
        fs, max_bytes, ids_only, fmt = self.fs, self.max_paper_bytes, self.ids_only, self.fmt

        def make(group: list[corpus.SourceFile]):
            def read():
                fault_point("chunk.read")
                return reader(fs, group, max_bytes, ids_only) if fmt == "md" else reader(fs, group[0], max_bytes,
                                                                                          ids_only)

            return read

        return [
            ReadTask(
                make(g),
                BlockMetadata(
                    num_rows=len(g) if self.fmt == "md" else None,
                    size_bytes=0 if ids_only else sum(f.size for f in g),
                    exec_stats=None,
                    input_files=[f.path for f in g],
                ),
            )
            for g in groups
        ]


MIN_GROUP_BYTES = 8 * 1024 * 1024


def read_corpus(source: CorpusDatasource) -> ray.data.Dataset:
    return ray.data.read_datasource(source, override_num_blocks=len(source.groups))


def _balanced_groups(files: list, parallelism: int, max_bytes: int) -> list[list]:
    """Contiguous groups of files: about ``parallelism`` of them, each 8 MiB to ``max_bytes``
    (so small corpora do not turn into many tiny tasks and files)."""
    total = sum(f.size for f in files)
    target = max(MIN_GROUP_BYTES, min(max_bytes, total // parallelism + 1))
    groups: list[list] = [[]]
    held = 0
    for f in files:
        if groups[-1] and held + f.size > target:
            groups.append([])
            held = 0
        groups[-1].append(f)
        held += f.size
    return groups


def find_duplicates(
    fs: pafs.FileSystem, files: list[corpus.SourceFile], fmt: str, max_paper_bytes: int
) -> tuple[dict[str, str], int]:
    """``({paper_id: winning source}, number of records)``; the first source in path order wins."""
    if fmt == "md":
        pairs: Iterable[tuple[str, str]] = ((corpus.md_paper_id(f.path), f.path) for f in files)
    else:  # ids only: Parquet reads one column, JSONL parses lines once more
        ds = read_corpus(CorpusDatasource(fs, files, fmt, max_paper_bytes, ids_only=True))
        pairs = (
            (pid, src)
            for batch in ds.select_columns(["paper_id", "source"]).iter_batches(batch_format="pyarrow")
            for pid, src in zip(batch["paper_id"].to_pylist(), batch["source"].to_pylist(), strict=True)
        )
    seen: dict[str, list[str]] = defaultdict(list)
    n = 0
    for pid, src in pairs:
        n += 1
        if pid is not None and pid.strip():
            seen[pid.strip()].append(src)
    dups = {pid: min(srcs, key=corpus.source_order) for pid, srcs in seen.items() if len(srcs) > 1}
    return dups, n


# --- the stage as a sink ----------------------------------------------------------------


@dataclass
class TableSinkResult:
    rows: Counter = field(default_factory=Counter)
    files: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)


RETRIES_COLUMN = "_retries"  # stage actors report retried batches in this column (stripped before writing)



class StageTableSink(Datasink):
    """Runs a multi-table stage on each block and writes ``<staging>/<table>/part-<key>.parquet``.

    The stage (e.g. ``IngestStage``) maps one Arrow batch to several tables (papers,
    chunks, quarantine). Running it inside the write task, fused with the read,
    keeps its outputs out of Ray's object store: packing three tables into one
    block to pass them between operators cost about a third of the stage's time.
    The file key hashes the row keys a write task holds, so the same input gives the
    same file names, and rows keep their input order.

    Every write ends with a record in ``_writes/part-<key>.json`` (row counts, counts,
    the row keys it covers), written after its table files: a write is done exactly
    when its record exists. ``completed_keys`` reads them back so a resumed run skips
    that work, and ``finish`` sums them into the result, old writes included.
    """

    def __init__(
        self,
        stage: Callable[[pa.Table], dict[str, pa.Table]],
        staging: str,
        schemas: dict[str, pa.Schema],
        key_columns: dict[str, str] | None = None,
    ) -> None:
        self.stage, self.staging, self.schemas = stage, staging, schemas
        self.key_columns = key_columns or {"papers": "source", "quarantine": "source"}
        self.result = TableSinkResult()

    def _keys(self, output: dict[str, pa.Table]) -> list[str]:
        return [
            str(v) for name, col in self.key_columns.items() if name in output for v in output[name][col].to_pylist()
        ]

    def write(self, blocks: Iterable, ctx) -> dict[str, Any]:
        retries = 0
        outputs = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if RETRIES_COLUMN in table.column_names:
                retries += pa.compute.sum(table[RETRIES_COLUMN]).as_py() or 0
                table = table.drop_columns([RETRIES_COLUMN])
            outputs.append(self.stage(table))
        outputs = [o for o in outputs if any(t.num_rows for t in o.values())]
        outputs.sort(key=lambda o: min(self._keys(o), default=""))  # same order whatever order blocks came in
        keys = sorted(k for o in outputs for k in self._keys(o))
        key = stable_hash(*keys, size=10)
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": {}, "keys": keys}
        counts: Counter = Counter({"stage_retries": retries} if retries else {})
        for name, schema in self.schemas.items():
            parts = [o[name] for o in outputs if name in o and o[name].num_rows]
            if not parts:
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            counts.update(_counts(name, table))
            folder = storage.join(self.staging, name)
            storage.makedirs(folder)
            storage.write_parquet(table if table.schema == schema else table.cast(schema),
                                  storage.join(folder, f"part-{key}.parquet"))
            out["rows"][name] = table.num_rows
            out["files"][name] = f"{name}/part-{key}.parquet"
            fault_point("sink.write")  # some of this write's tables are on disk, its record is not
        out["counts"] = dict(counts)
        if keys or retries:
            record_write(self.staging, f"part-{key}", out)
            fault_point(f"sink.recorded:{next(iter(self.schemas))}")  # this write is done, the stage is not
        return {k: v for k, v in out.items() if k != "keys"}

    def on_write_complete(self, write_result) -> None:
        self.finish()

    def finish(self) -> TableSinkResult:
        """Sum every completed write (this run's and a resumed run's) into ``result``; empty tables exist."""
        result = TableSinkResult()
        for rec in read_writes(self.staging):
            result.rows.update(rec["rows"])
            for name, path in rec["files"].items():
                result.files[name].append(path)
            result.counts.update(rec["counts"])
        for name, schema in self.schemas.items():  # every table exists, even when empty
            if not result.files.get(name):
                folder = storage.join(self.staging, name)
                storage.makedirs(folder)
                storage.write_parquet(schema.empty_table(), storage.join(folder, "part-empty.parquet"))
                result.files[name].append(f"{name}/part-empty.parquet")
        self.result = result
        return result


def _counts(name: str, table: pa.Table) -> dict[str, int]:
    counts: Counter = Counter()
    if name == "papers":
        counts["papers_bytes"] += pa.compute.sum(table["n_bytes"]).as_py() or 0
        counts["papers_chars"] += pa.compute.sum(table["n_chars"]).as_py() or 0
        for flags in table["flags"].to_pylist():
            counts.update(f"papers_flag.{f}" for f in flags)
    elif name == "chunks":
        for flags in table["flags"].to_pylist():
            counts.update(f"chunks_flag.{f}" for f in flags if f in (OVERSIZED_BLOCK, FORCED_SPLIT, UNDERSIZED))
    elif name == "quarantine":
        counts.update(f"quarantine.{r}" for r in table["reason"].to_pylist())
    elif name == "embeddings":
        counts["tokens"] += pa.compute.sum(table["n_tokens"]).as_py() or 0
        counts["truncated"] += pa.compute.sum(table["truncated"].cast(pa.int64())).as_py() or 0
    elif name == "retrieval":
        counts.update(f"rows.{m}" for m in table["method"].to_pylist())
    elif name == "rejects":
        counts.update(f"rejects.{r.split(':', 1)[0].split(' (', 1)[0]}" for r in table["reason"].to_pylist())
    return dict(counts)


# --- the chunk job ----------------------------------------------------------------------


@dataclass
class ChunkJob:
    """Settings of the chunk job (the CLI and jobs/chunk.py build one of these)."""

    input: str
    output: str
    format: str = "auto"
    metadata: str | None = None
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    max_paper_bytes: int = DEFAULT_MAX_PAPER_BYTES
    store_text: bool = True
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None
    concurrency: int | None = None
    run_id: str | None = None  # rerunning with the same id skips a committed run
    previous: str | None = None  # an earlier chunk run: its unchanged papers are carried, not chunked again

    def config(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "format": self.format,
            "metadata": self.metadata,
            "chunker": self.chunker.to_dict(),
            "chunker_config_hash": self.chunker.hash,
            "max_paper_bytes": self.max_paper_bytes,
            "store_text": self.store_text,
        }


def _unchanged_map(job: ChunkJob) -> dict[str, str]:
    """paper_id -> fingerprint of every paper of ``job.previous`` (empty when the chunker changed)."""
    from .ingest import METADATA_FIELDS, paper_fingerprint

    if not job.previous:
        return {}
    prev = _manifest_config(job.previous)
    if prev.get("chunker_config_hash") != job.chunker.hash or prev.get("store_text") != job.store_text:
        log.info("chunk: %s used another chunker config; every paper is chunked again", job.previous)
        return {}
    papers = storage.read_parquet(_committed_table_dir(job.previous, "papers"),
                                  columns=["paper_id", "sha256", *METADATA_FIELDS]).to_pydict()
    return {pid: paper_fingerprint(sha, tuple(papers[f][i] for f in METADATA_FIELDS))
            for i, (pid, sha) in enumerate(zip(papers["paper_id"], papers["sha256"], strict=True))}


def _carry_papers(previous: str, staging: str, ids: list[str]) -> dict[str, int]:
    """Copy ``previous``'s papers and chunks rows of the unchanged ``ids`` into the staging folder."""
    keys = pa.array(sorted(ids), pa.string())
    rows = {}
    for name in ("papers", "chunks"):
        prev_dir = _committed_table_dir(previous, name)
        rows[name] = 0
        for f in storage.listdir(prev_dir):
            if not f.endswith(".parquet"):
                continue
            table = storage.read_parquet(storage.join(prev_dir, f))
            table = table.filter(pa.compute.is_in(table["paper_id"], value_set=keys))
            if table.num_rows:
                storage.makedirs(storage.join(staging, name))
                path = storage.join(staging, name, f"part-carried-{stable_hash(f, size=8)}.parquet")
                storage.write_parquet(table, path)
                rows[name] += table.num_rows
    return rows


def run_chunk(job: ChunkJob) -> tuple[str, dict[str, Any]]:
    """Chunk a corpus into a committed run folder; returns ``(path, manifest)``.

    With ``previous``, papers whose text and metadata are unchanged are not chunked: their rows are
    copied from that run, so the output is still the whole corpus.
    """
    from .ingest import UNCHANGED

    t0 = time.perf_counter()
    fmt = corpus.detect_format(job.input) if job.format == "auto" else job.format
    if done_manifest := committed_run(job.output, job.run_id):
        return job.output, done_manifest
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id) as run:
        init_ray(job.address, job.num_cpus)
        fs, files = corpus.list_sources(job.input, fmt)
        if job.metadata:  # a metadata file inside the input folder is not a paper
            meta_path = corpus.resolve(job.metadata)[1]
            files = [f for f in files if f.path != meta_path]
        duplicates, n_records = find_duplicates(fs, files, fmt, job.max_paper_bytes)
        t_scan = time.perf_counter()
        unchanged = _unchanged_map(job)
        stage = IngestStage(chunker=job.chunker, metadata_uri=job.metadata, duplicates=duplicates,
                            store_text=job.store_text, unchanged=unchanged)
        if job.metadata:
            corpus.load_metadata(job.metadata)  # fail fast on a bad metadata file
        cpus = int(ray.cluster_resources().get("CPU", 1))
        ds = read_corpus(CorpusDatasource(fs, files, fmt, job.max_paper_bytes, parallelism=max(200, 4 * cpus)))
        sink = StageTableSink(stage, run.staging, INGEST_TABLES | {"unchanged": UNCHANGED},
                              key_columns={"papers": "source", "quarantine": "source", "unchanged": "source"})
        ds.write_datasink(sink, concurrency=job.concurrency)
        t_ingest = time.perf_counter()
        result = sink.finish()
        accounted = result.rows["papers"] + result.rows["quarantine"] + result.rows["unchanged"]
        if accounted != n_records:
            raise RuntimeError(f"{n_records} input records but {accounted} papers + quarantined + unchanged: "
                               "rows were lost")
        incremental = {}
        if job.previous and unchanged:
            same = storage.read_parquet(storage.join(run.staging, "unchanged"), ["paper_id"])["paper_id"]
            carried = _carry_papers(job.previous, run.staging, same.to_pylist())
            new_ids = set(storage.read_parquet(storage.join(run.staging, "papers"), ["paper_id"])["paper_id"]
                          .to_pylist()) - set(same.to_pylist())
            bad_ids = set(storage.read_parquet(storage.join(run.staging, "quarantine"), ["paper_id"])["paper_id"]
                          .to_pylist())
            present = new_ids | set(same.to_pylist()) | bad_ids
            incremental = {
                "papers_unchanged": len(same), "papers_changed": len(new_ids & unchanged.keys()),
                "papers_added": len(new_ids - unchanged.keys()), "papers_removed": len(unchanged.keys() - present),
                "chunks_carried": carried["chunks"],
            }
            for name in ("papers", "chunks"):
                result.rows[name] += carried[name]
                result.files[name].append("carried")
        storage.rmtree(storage.join(run.staging, "unchanged"))
        counts = {
            "records_in": n_records,
            "papers": result.rows["papers"],
            "chunks": result.rows["chunks"],
            "quarantined": result.rows["quarantine"],
            "duplicate_ids": len(duplicates),
            "papers_chunked": result.rows["papers"] - incremental.get("papers_unchanged", 0),
            **incremental,
            **result.counts,
        }
        config = job.config() | {"format": fmt} | ({"previous": job.previous} if job.previous else {})
        manifest = build_manifest(
            run_id=job.run_id or new_run_id("chunk", config),
            command="chunk",
            config=config,
            inputs=[job.input] + ([job.metadata] if job.metadata else []),
            tables={name: {"rows": result.rows[name], "files": len(result.files[name])} for name in INGEST_TABLES},
            counts=counts,
            timings_s={
                "scan": t_scan - t0,
                "ingest_and_write": t_ingest - t_scan,
                "total": time.perf_counter() - t0,
            },
        )
        return run.commit(manifest), manifest


# --- embed, index, retrieve -------------------------------------------------------------


def _committed_table_dir(run_dir: str, table: str) -> str:
    """``RUN_DIR/<table>`` of a committed run (raises if the run has no manifest)."""
    read_manifest(run_dir)
    path = storage.join(storage.normalize(run_dir), table)
    if not storage.isdir(path):
        raise FileNotFoundError(f"{run_dir} has no {table}/ table")
    return path


def _gpus() -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def _model_actor_args(concurrency: int | None, batch_rows: int) -> dict[str, Any]:
    """One model per GPU when the cluster has GPUs, else CPU actors."""
    gpus = _gpus()
    if gpus:
        return {"concurrency": concurrency or gpus, "num_gpus": 1, "batch_size": batch_rows}
    return {"concurrency": concurrency or 1, "num_cpus": 1, "batch_size": batch_rows}


def _with_retries(call: Callable[[pa.Table], pa.Table], batch: pa.Table, retries: int, what: str) -> pa.Table:
    """``call(batch)``, retried up to ``retries`` times with backoff on an exception (a transient fault: a
    flaky file system, an OOM on a shared GPU). The retry count rides along in ``RETRIES_COLUMN`` (first
    row) for the sink to add up into the manifest; the last failure is raised."""
    for attempt in range(retries + 1):
        try:
            fault_point(f"{what}.batch")
            out = call(batch)
            break
        except Exception as exc:  # noqa: BLE001 - anything may be transient; bounded
            if attempt == retries:
                raise
            log.warning("%s batch failed (attempt %d of %d), retrying: %s", what, attempt + 1, retries + 1, exc)
            time.sleep(min(30.0, 0.5 * 2**attempt))
    marks = [0] * out.num_rows
    if marks:
        marks[0] = attempt
    return out.append_column(RETRIES_COLUMN, pa.array(marks, pa.int32()))


class _EmbedActor:
    """One Embedder per actor (per GPU); torch threads sized to the node on CPU."""

    def __init__(self, config, threads: int | None = None, retries: int = 2) -> None:
        import torch

        from .embedding import Embedder

        if threads:
            torch.set_num_threads(threads)
        self.embedder = Embedder(config)
        self.retries = retries

    def __call__(self, batch: pa.Table) -> pa.Table:
        return _with_retries(self.embedder, batch, self.retries, "embed")


def _as_table(name: str):
    def wrap(table: pa.Table) -> dict[str, pa.Table]:
        return {name: table}

    return wrap


def _drop_keys(batch: pa.Table, column: str, keys: pa.Array) -> pa.Table:
    """Rows whose ``column`` is not in ``keys`` (work a resumed or incremental run already has)."""
    return batch.filter(pa.compute.invert(pa.compute.is_in(batch[column], value_set=keys)))


@dataclass
class EmbedJob:
    chunks: str  # a committed chunk run folder
    output: str
    embedder: Any = None  # EmbedderConfig; None: the offline default
    batch_rows: int = 1024
    concurrency: int | None = None
    threads: int | None = None
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None
    run_id: str | None = None  # rerunning with the same id resumes a killed run / skips a committed one
    previous: str | None = None  # an earlier embed run: vectors of unchanged chunks are carried over
    max_retries: int = 2


def _carry_embeddings(job: EmbedJob, chunks_dir: str, config: dict[str, Any], staging: str,
                      done: set[str]) -> tuple[set[str], str | None]:
    """Copy the vectors of ``job.previous`` whose chunk is unchanged (same id, same context) and embedder is
    the same (config and weights); returns the chunk ids carried and why nothing was carried, if so."""
    if not job.previous:
        return set(), None
    prev = json.loads(read_manifest(job.previous)["config"])
    for key in ("embedder_hash", "model_revision", "dim"):
        if prev.get(key) != config[key]:
            return set(), f"embedder changed ({key})"
    new = storage.read_parquet(chunks_dir, columns=["chunk_id", "context"])
    old = storage.read_parquet(_committed_table_dir(prev["chunks"], "chunks"), columns=["chunk_id", "context"])
    same = new.join(old, "chunk_id", right_suffix="_old")
    same = same.filter(pa.compute.equal(same["context"], same["context_old"]))["chunk_id"]
    prev_dir = _committed_table_dir(job.previous, "embeddings")
    carried: set[str] = set()
    for f in storage.listdir(prev_dir):
        if not f.endswith(".parquet"):
            continue
        name = f"{CARRIED_PREFIX}{stable_hash(job.previous, f, size=8)}"
        table = storage.read_parquet(storage.join(prev_dir, f))
        table = table.filter(pa.compute.is_in(table["chunk_id"], value_set=same))
        keys = table["chunk_id"].to_pylist()
        carried.update(keys)
        if not table.num_rows or set(keys) <= done:  # nothing here, or written by the run being resumed
            continue
        storage.makedirs(storage.join(staging, "embeddings"))
        storage.write_parquet(table, storage.join(staging, "embeddings", f"{name}.parquet"))
        record_write(staging, name, {"rows": {"embeddings": table.num_rows}, "keys": keys,
                                     "files": {"embeddings": f"embeddings/{name}.parquet"},
                                     "counts": {"carried": table.num_rows}})
    return carried, None


def run_embed(job: EmbedJob) -> tuple[str, dict[str, Any]]:
    """Embed every chunk of a chunk run into an embeddings table (only the new ones, given ``previous``)."""
    from transformers import AutoConfig

    from .embedding import EmbedderConfig, weights_fingerprint
    from .tables import embeddings_schema

    t0 = time.perf_counter()
    cfg = job.embedder or EmbedderConfig()
    chunks_dir = _committed_table_dir(job.chunks, "chunks")
    model_cfg = AutoConfig.from_pretrained(cfg.model, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    dim = int(model_cfg.hidden_size)
    config = {"chunks": job.chunks, "embedder": cfg.to_dict(), "embedder_hash": cfg.hash, "dim": dim,
              "model_revision": weights_fingerprint(cfg)}
    if done_manifest := committed_run(job.output, job.run_id):
        return job.output, done_manifest
    run_id = job.run_id or new_run_id("embed", config)
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id, resume=True) as run:
        init_ray(job.address, job.num_cpus)
        schema = embeddings_schema(dim, pa.float16() if cfg.output_dtype == "float16" else pa.float32())
        done = completed_keys(run.staging)
        carried, not_carried = _carry_embeddings(job, chunks_dir, config, run.staging, done)
        skip = done | carried
        all_ids = storage.read_parquet(chunks_dir, columns=["chunk_id"])["chunk_id"]
        skip_ids = pa.array(sorted(skip), pa.string())
        todo = len(all_ids) - (pa.compute.sum(pa.compute.is_in(all_ids, value_set=skip_ids)).as_py() or 0)
        sink = StageTableSink(_as_table("embeddings"), run.staging, {"embeddings": schema},
                              key_columns={"embeddings": "chunk_id"})
        if todo:  # no model is loaded when every chunk is carried or already done
            ds = ray.data.read_parquet(chunks_dir).select_columns(["chunk_id", "paper_id", "context", "text"])
            if skip:
                ds = ds.map_batches(_drop_keys, fn_kwargs={"column": "chunk_id", "keys": skip_ids},
                                    batch_format="pyarrow")
            actor = _model_actor_args(job.concurrency, job.batch_rows)
            threads = job.threads or (None if _gpus() else max(1, int(ray.cluster_resources().get("CPU", 1))))
            ds = ds.map_batches(_EmbedActor, batch_format="pyarrow", **actor,
                                fn_constructor_kwargs={"config": cfg, "threads": threads, "retries": job.max_retries})
            ds.write_datasink(sink)
        result = sink.finish()
        if result.rows["embeddings"] != len(all_ids):
            raise RuntimeError(f"{len(all_ids)} chunks but {result.rows['embeddings']} embeddings written")
        counts = {"chunks_in": len(all_ids), "embedded": todo, "carried": len(carried), **result.counts}
        counts["carried"] = len(carried)
        manifest = build_manifest(
            run_id=run_id, command="embed", config=config | ({"previous": job.previous} if job.previous else {}),
            inputs=[job.chunks] + ([job.previous] if job.previous else []),
            tables={"embeddings": {"rows": result.rows["embeddings"], "files": len(result.files["embeddings"])}},
            counts=counts | ({"resumed_rows": len(done)} if done else {}),
            timings_s={"total": time.perf_counter() - t0},
        )
        if not_carried:
            log.info("embed: nothing carried from %s: %s", job.previous, not_carried)
        return run.commit(manifest), manifest


@dataclass
class IndexJob:
    embeddings: str  # a committed embed run folder
    chunks: str  # the chunk run it came from (for BM25 text and paper ids)
    output: str
    dense: Any = None  # index.DenseSpec; None: auto by size
    bm25: bool = True
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None
    run_id: str | None = None  # rerunning with the same id skips a committed run
    previous: str | None = None  # an earlier index run to update instead of building from scratch
    max_drift: float = 0.2  # (removed + added) / old vectors above which the index is rebuilt


CARRIED_PREFIX = "part-carried-"  # table files an incremental run copied from the run before

def build_index_files(embeddings_dir: str, chunks_dir: str, folder: str, spec, bm25: bool) -> dict[str, Any]:
    """Build FAISS (+ BM25) into ``folder``: ``dense/``, ``bm25/``, ``ids.parquet`` (row -> chunk)."""
    import numpy as np

    from .index import build_dense, save_dense

    files = [storage.join(embeddings_dir, f) for f in storage.listdir(embeddings_dir) if f.endswith(".parquet")]
    metas = [storage.parquet_file(f) for f in files]
    n = sum(m.metadata.num_rows for m in metas)
    if n == 0:
        raise ValueError(f"{embeddings_dir} holds no embeddings")
    dim = metas[0].schema_arrow.field("vector").type.list_size

    def batches():
        for f in files:
            for rb in storage.parquet_file(f).iter_batches(columns=["vector"], batch_size=65_536):
                col = rb.column(0)
                flat = col.values.to_numpy(zero_copy_only=False)
                yield np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)

    t0 = time.perf_counter()
    index, resolved = build_dense(batches, n, dim, spec)
    t_dense = time.perf_counter() - t0
    ids = pa.concat_tables(storage.read_parquet(f, columns=["chunk_id", "paper_id"]) for f in files)
    ids = ids.append_column("row", pa.array(range(n), pa.int64()))
    with storage.local_dir(folder) as local:  # FAISS and bm25s write local files; uploaded when remote
        save_dense(index, os.path.join(local, "dense"))
        timings = {"dense_build": t_dense, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": n, "dim": dim, "spec": dataclasses.asdict(resolved), "timings": timings, "update": "rebuilt"}


def _write_ids_and_bm25(ids: pa.Table, chunks_dir: str, folder: str, bm25: bool) -> dict[str, float]:
    """``ids.parquet`` (row -> chunk) and the BM25 index over the chunk texts in row order (``folder``: local)."""
    from .index import Bm25Index

    if len(set(ids["chunk_id"].to_pylist())) != ids.num_rows:
        raise ValueError("duplicate chunk ids in the embeddings table")
    pq.write_table(ids, os.path.join(folder, "ids.parquet"))
    if not bm25:
        return {}
    t0 = time.perf_counter()
    texts = storage.read_parquet(chunks_dir, columns=["chunk_id", "text"])
    joined = ids.select(["chunk_id", "row"]).join(texts, "chunk_id", join_type="left outer").sort_by("row")
    missing = joined["text"].null_count
    if missing:
        raise ValueError(f"{missing} embedded chunks are missing from {chunks_dir}")
    Bm25Index.build(joined["text"].to_pylist()).save(os.path.join(folder, "bm25"))
    return {"bm25_build": time.perf_counter() - t0}


def _vectors(table: pa.Table):
    import numpy as np

    col = table["vector"].combine_chunks()
    flat = col.values.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat.reshape(len(col), col.type.list_size), dtype=np.float32)


def update_index_files(previous: str, embeddings_dir: str, chunks_dir: str, folder: str, bm25: bool,
                       max_drift: float, since_rebuild: tuple[int, int]) -> dict[str, Any] | None:
    """Update ``previous``'s index for an embed run that carried vectors from the one it indexed.

    Kept rows are the carried chunks (same id, same vector); everything else the old index holds is
    removed and the newly embedded chunks are added after the kept rows. Returns None when the drift
    calls for a rebuild (or the old index cannot tell what it holds). Drift is counted since the last
    rebuild (``since_rebuild``: vectors then, vectors removed or added since), not per night.
    """
    import numpy as np

    from .index import load_dense, plan_update, save_dense, update_dense

    t0 = time.perf_counter()
    files = [f for f in storage.listdir(embeddings_dir) if f.endswith(".parquet")]
    carried = pa.concat_tables(
        [storage.read_parquet(storage.join(embeddings_dir, f), columns=["chunk_id"]) for f in files
         if f.startswith(CARRIED_PREFIX)] or [pa.table({"chunk_id": pa.array([], pa.string())})])["chunk_id"]
    fresh = [f for f in files if not f.startswith(CARRIED_PREFIX)]
    old_ids = storage.read_parquet(storage.join(previous, "ids.parquet")).sort_by("row")
    keep = pa.compute.is_in(old_ids["chunk_id"], value_set=carried).to_numpy(zero_copy_only=False)
    if int(keep.sum()) != len(carried):
        return None  # carried vectors the old index does not have: it indexed another embed run
    new_tables = [storage.read_parquet(storage.join(embeddings_dir, f), columns=["chunk_id", "paper_id", "vector"])
                  for f in fresh]
    n_new = sum(t.num_rows for t in new_tables)
    removed = np.flatnonzero(~keep)
    base_n, changed = since_rebuild
    action, drift = plan_update(base_n, changed + len(removed), n_new, max_drift)
    if action == "rebuilt":
        return None
    dim = storage.parquet_file(storage.join(embeddings_dir, files[0])).schema_arrow.field("vector").type.list_size
    with storage.local_dir(folder) as local:
        if action == "unchanged":
            storage.copytree(storage.join(previous, "dense"), os.path.join(local, "dense"))
            if bm25 and storage.isdir(storage.join(previous, "bm25")):
                storage.copytree(storage.join(previous, "bm25"), os.path.join(local, "bm25"))
                bm25 = False
            ids = old_ids
        else:
            prev_local = storage.local_copy(previous, read_manifest(previous)["run_id"])
            index = load_dense(os.path.join(prev_local, "dense"), mmap=False)
            vectors = np.concatenate([_vectors(t) for t in new_tables]) if n_new else np.zeros((0, dim), np.float32)
            index = update_dense(index, removed, vectors)
            save_dense(index, os.path.join(local, "dense"))
            kept = old_ids.filter(pa.array(keep)).select(["chunk_id", "paper_id"])
            added = [t.select(["chunk_id", "paper_id"]) for t in new_tables]
            ids = pa.concat_tables([kept, *added])
            ids = ids.append_column("row", pa.array(range(ids.num_rows), pa.int64()))
        timings = {"dense_update": time.perf_counter() - t0, **_write_ids_and_bm25(ids, chunks_dir, local, bm25)}
    return {"n": ids.num_rows, "dim": dim, "timings": timings, "update": action, "drift": drift,
            "removed": len(removed), "added": n_new, "since_rebuild": [base_n, changed + len(removed) + n_new]}


def _index_fingerprint(ids_path: str, embed_config: dict[str, Any], spec: dict[str, Any], bm25: bool) -> str:
    """Identifies what an index answers: the vectors' model and the chunks in row order."""
    ids = storage.read_parquet(ids_path, columns=["chunk_id"])["chunk_id"].to_pylist()
    return stable_hash(json.dumps([embed_config.get("embedder_hash"), embed_config.get("model_revision"), spec, bm25],
                                  sort_keys=True), *ids)


def run_index(job: IndexJob) -> tuple[str, dict[str, Any]]:
    """Build the dense and full-text indexes of an embed run (on a GPU node when there is one).

    With ``previous`` (the index of the embed run that ``job.embeddings`` carried vectors from), the
    old index is updated in place (removed chunks out, new ones in, trained structure kept) unless the
    drift is over ``max_drift``; the manifest says which (``update``: unchanged, added or rebuilt).
    """
    from .index import DenseSpec

    t0 = time.perf_counter()
    emb_dir = _committed_table_dir(job.embeddings, "embeddings")
    chunks_dir = _committed_table_dir(job.chunks, "chunks")
    embed_manifest = read_manifest(job.embeddings)
    embed_config = json.loads(embed_manifest["config"])
    if done_manifest := committed_run(job.output, job.run_id):
        return job.output, done_manifest
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id) as run:
        stats = None
        if job.previous:
            prev = _manifest_config(job.previous)
            prev_embed = _manifest_config(prev["embeddings"])
            if (embed_config.get("previous") == prev["embeddings"] and prev["bm25"] == job.bm25
                    and prev_embed.get("model_revision") == embed_config.get("model_revision")
                    and (job.dense is None or dataclasses.asdict(job.dense) == dataclasses.asdict(DenseSpec()))):
                since = prev.get("since_rebuild") or [read_manifest(job.previous)["counts"]["vectors"], 0]
                stats = update_index_files(job.previous, emb_dir, chunks_dir, run.staging, job.bm25, job.max_drift,
                                           tuple(since))
                if stats:
                    stats["spec"] = prev["dense"]
        if stats is None:
            init_ray(job.address, job.num_cpus)
            task = ray.remote(num_cpus=1, num_gpus=1 if _gpus() else 0)(build_index_files)
            stats = ray.get(task.remote(emb_dir, chunks_dir, run.staging, job.dense or DenseSpec(), job.bm25))
        config = {
            "embeddings": job.embeddings, "chunks": job.chunks, "dense": stats["spec"], "bm25": job.bm25,
            "embedder": embed_config["embedder"],
            "fingerprint": _index_fingerprint(storage.join(run.staging, "ids.parquet"), embed_config, stats["spec"],
                                              job.bm25),
            "since_rebuild": stats.get("since_rebuild", [stats["n"], 0]),
        } | ({"previous": job.previous, "max_drift": job.max_drift} if job.previous else {})
        counts = {"vectors": stats["n"], "dim": stats["dim"]}
        counts |= {k: stats[k] for k in ("removed", "added") if k in stats}
        manifest = build_manifest(
            run_id=job.run_id or new_run_id("index", config), command="index", config=config,
            inputs=[job.embeddings, job.chunks], tables={"ids": {"rows": stats["n"], "files": 1}},
            counts=counts, timings_s={**stats["timings"], "total": time.perf_counter() - t0},
        )
        manifest["update"] = {"action": stats["update"], "drift": round(stats.get("drift", 1.0), 6)}
        return run.commit(manifest), manifest


class _RetrieveActor:
    def __init__(self, config) -> None:
        from .retrieval import Retriever

        self.retriever = Retriever(config)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.retriever(batch)


@dataclass
class RetrieveJob:
    index: str
    queries: str  # JSONL/Parquet with query (and query_id)
    output: str
    retriever: Any = None  # RetrieverConfig fields other than index_dir
    batch_rows: int = 256
    concurrency: int | None = None
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None
    run_id: str | None = None  # rerunning with the same id skips a committed run
    previous: str | None = None  # an earlier retrieval run, reused whole when index and queries are the same


def read_queries(path: str) -> tuple[pa.Table, int]:
    """``(query_id, query)`` rows of a query file, and how many rows were rejected (empty query)."""
    from .tables import query_id_for

    table = read_rows(path)
    if "query" not in table.column_names:
        raise ValueError(f"{path}: a query table needs a 'query' column, found {table.column_names}")
    queries = table["query"].to_pylist()
    qids = table["query_id"].to_pylist() if "query_id" in table.column_names else [None] * len(queries)
    keep = [(str(i) if i is not None else query_id_for(q), q) for i, q in zip(qids, queries, strict=True)
            if isinstance(q, str) and q.strip()]
    ids = [i for i, _ in keep]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate query_id values")
    out = pa.table({"query_id": pa.array(ids, pa.string()), "query": pa.array([q for _, q in keep], pa.string())})
    return out, len(queries) - len(keep)


def read_rows(path: str) -> pa.Table:
    """A small table from Parquet or JSONL (query files, pair files, labels)."""
    import pyarrow.json as pajson

    if path.endswith(".parquet") or storage.isdir(path):
        return storage.read_parquet(path)
    fs, local = storage.resolve(path)
    with fs.open_input_stream(local) as fh:
        return pajson.read_json(fh)


def _retrieval_key(index: str, queries: pa.Table, cfg) -> str:
    """Same key, same retrieval table: the index's fingerprint, the queries, the retriever settings."""
    settings = {k: v for k, v in _jsonable(dataclasses.asdict(cfg)).items() if k not in ("index_dir", "device")}
    return stable_hash(_manifest_config(index).get("fingerprint") or index, json.dumps(settings, sort_keys=True),
                       *queries["query_id"].to_pylist(), *queries["query"].to_pylist())


def run_retrieve(job: RetrieveJob) -> tuple[str, dict[str, Any]]:
    """Top-k chunks per query for dense, BM25 and hybrid search.

    With ``previous``, a run whose key (index fingerprint, queries, settings) matches is copied as is.
    """
    from .retrieval import RetrieverConfig

    t0 = time.perf_counter()
    cfg = job.retriever or RetrieverConfig(index_dir=job.index)
    cfg = dataclasses.replace(cfg, index_dir=storage.normalize(job.index))
    read_manifest(job.index)
    queries, rejected = read_queries(job.queries)
    key = _retrieval_key(job.index, queries, cfg)
    if done_manifest := committed_run(job.output, job.run_id):
        return job.output, done_manifest
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id) as run:
        reused = bool(job.previous) and _manifest_config(job.previous).get("key") == key
        if reused:
            storage.copytree(_committed_table_dir(job.previous, "retrieval"), storage.join(run.staging, "retrieval"))
            table = storage.read_parquet(storage.join(run.staging, "retrieval"), columns=["method"])
            result = TableSinkResult(rows=Counter({"retrieval": table.num_rows}),
                                     files={"retrieval": storage.listdir(storage.join(run.staging, "retrieval"))},
                                     counts=Counter(_counts("retrieval", table)))
        else:
            init_ray(job.address, job.num_cpus)
            blocks = [queries.slice(i, job.batch_rows) for i in range(0, max(1, queries.num_rows), job.batch_rows)]
            ds = ray.data.from_arrow(blocks)
            actor = _model_actor_args(job.concurrency, job.batch_rows)
            ds = ds.map_batches(_RetrieveActor, fn_constructor_kwargs={"config": cfg}, batch_format="pyarrow", **actor)
            sink = StageTableSink(_as_table("retrieval"), run.staging, {"retrieval": RETRIEVAL},
                                  key_columns={"retrieval": "query_id"})
            ds.write_datasink(sink)
            result = sink.finish()
        config = {"index": job.index, "queries": job.queries, "retriever": _jsonable(dataclasses.asdict(cfg)),
                  "key": key} | ({"previous": job.previous} if job.previous else {})
        manifest = build_manifest(
            run_id=job.run_id or new_run_id("retrieve", config), command="retrieve", config=config,
            inputs=[job.index, job.queries],
            tables={"retrieval": {"rows": result.rows["retrieval"], "files": len(result.files["retrieval"])}},
            counts={"queries": queries.num_rows, "rejected_empty_query": rejected, "reused": int(reused),
                    **result.counts},
            timings_s={"total": time.perf_counter() - t0},
        )
        return run.commit(manifest), manifest


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --- extract ----------------------------------------------------------------------------


class _ExtractActor:
    """One extractor (one model) per actor; batches of pairs in, packed pairs+spans out."""

    def __init__(self, config, run_id: str, threads: int | None = None, max_chunk_chars: int | None = None,
                 retries: int = 2) -> None:
        from .extract import build_extractor
        from .extract.stage import DEFAULT_MAX_CHUNK_CHARS, ExtractStage

        if threads:
            import torch

            torch.set_num_threads(threads)
        self.stage = ExtractStage(build_extractor(config), run_id, max_chunk_chars or DEFAULT_MAX_CHUNK_CHARS)
        self.retries = retries

    def _packed(self, batch: pa.Table) -> pa.Table:
        from .extract.stage import pack

        return pack(self.stage(batch))

    def __call__(self, batch: pa.Table) -> pa.Table:
        from .extract.stage import pack
        from .tables import PAIR_INPUT

        try:
            return _with_retries(self._packed, batch, self.retries, "extract")
        except Exception as exc:  # noqa: BLE001 - retries spent: error rows, the job goes on
            rows = batch.select(PAIR_INPUT.names).to_pylist()
            error = f"stage_failed: {type(exc).__name__}: {exc}"[:500]
            out = pack(self.stage.tables(rows, {}, [error] * len(rows), None))
            marks = [self.retries] + [0] * (out.num_rows - 1) if out.num_rows else []
            return out.append_column(RETRIES_COLUMN, pa.array(marks, pa.int32()))


@dataclass
class ExtractJob:
    """Settings of the extract job: pairs from a pairs file or a retrieval run, one extractor."""

    output: str
    extractor: Any  # HighlighterConfig | SemanticConfig
    pairs: str | None = None  # JSONL/Parquet pairs file
    retrieval: str | None = None  # a committed retrieval run
    chunks: str | None = None  # chunk run (default: found through the retrieval/index manifests)
    queries: str | None = None  # query file of the retrieval run (default: from its manifest)
    method: str = "hybrid"
    top_k: int = 5
    batch_rows: int = 64
    concurrency: int | None = None
    threads: int | None = None
    max_chunk_chars: int | None = None
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None
    run_id: str | None = None  # rerunning with the same id resumes a killed run / skips a committed one
    previous: str | None = None  # an earlier extract run: results of unchanged pairs are carried over
    max_retries: int = 2


def _manifest_config(run_dir: str) -> dict[str, Any]:
    return json.loads(read_manifest(run_dir)["config"])


def build_pairs(job: ExtractJob) -> tuple[pa.Table, dict[str, Any]]:
    """The job's ``PAIR_INPUT`` table, and where its parts came from."""
    from .extract.pairs import chunk_lookup, pairs_from_records, pairs_from_retrieval, read_pair_records
    from .runs import read_table

    if (job.pairs is None) == (job.retrieval is None):
        raise ValueError("give exactly one of --pairs FILE or --retrieval RUN_DIR")
    if job.pairs is not None:
        if not storage.exists(job.pairs):
            raise FileNotFoundError(f"pairs file not found: {job.pairs}")
        records = list(read_pair_records(job.pairs))
        wanted = [str(r["chunk_id"]) for r in records if r.get("chunk_id") is not None]
        chunks = chunk_lookup(_committed_table_dir(job.chunks, "chunks"), wanted) if job.chunks and wanted else {}
        return pairs_from_records(records, chunks), {"pairs": job.pairs, "chunks": job.chunks}
    retrieval_cfg = _manifest_config(job.retrieval)
    queries_path = job.queries or retrieval_cfg["queries"]
    chunks_run = job.chunks or _manifest_config(retrieval_cfg["index"])["chunks"]
    retrieval = read_table(job.retrieval, "retrieval")
    queries, _ = read_queries(queries_path)
    qmap = dict(zip(queries["query_id"].to_pylist(), queries["query"].to_pylist(), strict=True))
    ids = retrieval.filter(pa.compute.equal(retrieval["method"], job.method))["chunk_id"].to_pylist()
    chunks = chunk_lookup(_committed_table_dir(chunks_run, "chunks"), ids)
    table = pairs_from_retrieval(retrieval, qmap, chunks, job.method, job.top_k)
    return table, {"retrieval": job.retrieval, "queries": queries_path, "chunks": chunks_run}


def _extract_counts(pairs: pa.Table, spans_rows: int) -> dict[str, int]:
    errors = [e for e in pairs["error"].to_pylist() if e]
    n_spans = pairs["n_spans"].to_pylist()
    counts: Counter = Counter(f"errors.{e.split(':', 1)[0]}" for e in errors)
    counts.update({
        "pairs": pairs.num_rows,
        "pairs_with_spans": sum(1 for n in n_spans if n),
        "pairs_abstained": sum(1 for n, e in zip(n_spans, pairs["error"].to_pylist(), strict=True) if not n and not e),
        "pairs_failed": len(errors),
        "spans": spans_rows,
        "verbatim_violations": pa.compute.sum(pairs["n_violations"]).as_py() or 0,
    })
    return dict(counts)


def _query_blocks(pairs: pa.Table, rows: int) -> list[pa.Table]:
    """Blocks of about ``rows`` pairs that never split one query's run of pairs (LLM requests group them)."""
    qids = pairs["query_id"].to_pylist()
    blocks, start = [], 0
    for i in range(1, len(qids) + 1):
        if i == len(qids) or (i - start >= rows and qids[i] != qids[i - 1]):
            blocks.append(pairs.slice(start, i - start))
            start = i
    return blocks or [pairs]


class _LLMInterpret:
    """vLLM backend, after generation: answers -> spans/pairs/rejects through the same stage code."""

    def __init__(self, config, run_id: str) -> None:
        from .extract.stage import ExtractStage

        self.config = config
        self.stage = ExtractStage(_VllmInfo(config), run_id)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from .extract.llm import interpret
        from .extract.spans import PairResult
        from .extract.stage import pack

        outs = []
        for req in batch.to_pylist():
            rows = json.loads(req["pairs_json"])
            error = req.get("error")
            text = req.get("generated_text")
            if error or text is None:
                results = [PairResult([], None, f"llm_request_failed: {error or 'no output'}") for _ in rows]
            else:
                results = interpret(text, [r["chunk"] for r in rows], self.config, req["request_id"])
            outs.append(self.stage.tables(rows, dict(enumerate(results)), [None] * len(rows), req.get("latency_ms")))
        return pa.concat_tables([pack(o) for o in outs]) if outs else pa.table({})


class _VllmInfo:
    """What the stage records about an in-cluster vLLM model (the engine itself lives in ray.data.llm)."""

    name = "llm"

    def __init__(self, config) -> None:
        self.config = config

    def describe(self) -> dict[str, Any]:
        return {"model_id": self.config.model, "model_revision": None, "config_hash": self.config.hash}

    def extract(self, queries, chunks):  # pragma: no cover - generation happens in the vLLM stage
        raise NotImplementedError


def _vllm_requests(pairs: pa.Table, config, run_id: str) -> tuple[pa.Table, pa.Table | None]:
    """Request rows for the vLLM stage, and the tables of pairs that never reach it (invalid input)."""
    from .extract.llm import group_requests, request_id
    from .extract.stage import ExtractStage, pack, validate_pair

    rows = pairs.to_pylist()
    errors = [validate_pair(r, 200_000, 2_000) for r in rows]
    valid = [r for r, e in zip(rows, errors, strict=True) if e is None]
    invalid = [(r, e) for r, e in zip(rows, errors, strict=True) if e is not None]
    requests = []
    for group in group_requests([r["query_id"] for r in valid], config.docs_per_request):
        members = [valid[i] for i in group]
        chunks = [m["chunk"] for m in members]
        requests.append({"request_id": request_id(members[0]["query"], chunks), "query": members[0]["query"],
                         "chunks": chunks, "pairs_json": json.dumps(members)})
    bad = None
    if invalid:
        stage = ExtractStage(_VllmInfo(config), run_id)
        bad = pack(stage.tables([r for r, _ in invalid], {}, [e for _, e in invalid], None))
    return pa.Table.from_pylist(requests), bad


def _vllm_dataset(requests: pa.Table, config) -> ray.data.Dataset:
    """Generation with vLLM engines inside the cluster, through ``ray.data.llm`` (needs the ``llm`` extra)."""
    try:
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError as exc:
        raise NotImplementedError("the vllm backend needs the llm extra (pip install 'verbatim-batch[llm]')") from exc
    from .extract.llm import sampling
    from .extract.prompts import build_messages

    engine = vLLMEngineProcessorConfig(
        model_source=config.model, concurrency=config.engines, batch_size=config.batch_size,
        should_continue_on_error=True,  # a failed row carries its error instead of failing the job
        engine_kwargs={"tensor_parallel_size": config.tensor_parallel_size, "max_model_len": config.max_model_len,
                       "enable_prefix_caching": True, "gpu_memory_utilization": config.gpu_memory_utilization},
    )

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        params = sampling(config, len(row["chunks"]))
        schema = params.pop("response_format", None)
        if schema is not None:  # vLLM's structured output takes the JSON schema itself
            params["guided_decoding"] = {"json": schema["json_schema"]["schema"]}
        return {**row, "messages": build_messages(row["query"], list(row["chunks"]), config.style),
                "sampling_params": params}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"request_id": row["request_id"], "pairs_json": row["pairs_json"],
                "generated_text": row.get("generated_text"), "error": row.get("__inference_error__") or None,
                "latency_ms": None}

    processor = build_processor(engine, preprocess=preprocess, postprocess=postprocess)
    return processor(ray.data.from_arrow(requests))


def _extract_dataset(job: ExtractJob, pairs: pa.Table, cfg, run_id: str) -> ray.data.Dataset:
    """Packed pairs+spans+rejects blocks for the job's extractor."""
    from .extract.llm import LLMConfig

    if isinstance(cfg, LLMConfig) and cfg.backend == "vllm":
        requests, bad = _vllm_requests(pairs, cfg, run_id)
        ds = _vllm_dataset(requests, cfg).map_batches(
            _LLMInterpret, fn_constructor_kwargs={"config": cfg, "run_id": run_id}, batch_format="pyarrow",
            concurrency=job.concurrency or 1, num_cpus=1)
        return ds.union(ray.data.from_arrow(bad)) if bad is not None else ds
    kwargs = {"config": cfg, "run_id": run_id, "max_chunk_chars": job.max_chunk_chars, "retries": job.max_retries}
    if isinstance(cfg, LLMConfig):  # http: I/O bound actors, no GPU; blocks keep a query's pairs together
        ds = ray.data.from_arrow(_query_blocks(pairs, job.batch_rows))
        return ds.map_batches(_ExtractActor, batch_format="pyarrow", batch_size=None, num_cpus=0.5,
                              concurrency=job.concurrency or 2, fn_constructor_kwargs=kwargs)
    blocks = [pairs.slice(i, job.batch_rows) for i in range(0, max(1, pairs.num_rows), job.batch_rows)]
    actor = _model_actor_args(job.concurrency, job.batch_rows)
    kwargs["threads"] = job.threads or (None if _gpus() else max(1, int(ray.cluster_resources().get("CPU", 1))))
    return ray.data.from_arrow(blocks).map_batches(_ExtractActor, batch_format="pyarrow", **actor,
                                                   fn_constructor_kwargs=kwargs)


_EXTRACT_TABLES = ("spans", "pairs", "rejects")


def _carry_pairs(job: ExtractJob, pairs: pa.Table, config: dict[str, Any], staging: str, done: set[str]) -> set[str]:
    """Copy the rows of ``job.previous`` for pairs whose input (query, chunk text, paper, offset) and
    extractor (config hash, weights) are unchanged and that did not fail; returns their pair ids."""
    from .tables import PAIRS, REJECTS, SPANS, pair_input_hash

    if not job.previous:
        return set()
    prev = _manifest_config(job.previous)
    if prev.get("extractor_hash") != config["extractor_hash"] or (
            config.get("model_revision") and prev.get("model_revision") != config["model_revision"]):
        return set()
    cols = pairs.select(["pair_id", "query", "chunk", "paper_id", "chunk_start"]).to_pydict()
    wanted = {pid: pair_input_hash(q, c, p, s) for pid, q, c, p, s in zip(*cols.values(), strict=True)}
    old = storage.read_parquet(_committed_table_dir(job.previous, "pairs"), columns=["pair_id", "input_hash", "error"])
    carried = {pid for pid, h, err in zip(*old.to_pydict().values(), strict=True)
               if err is None and h is not None and wanted.get(pid) == h}
    if not carried:
        return carried
    keys = pa.array(sorted(carried), pa.string())
    for name, schema in zip(_EXTRACT_TABLES, (SPANS, PAIRS, REJECTS), strict=True):
        prev_dir = _committed_table_dir(job.previous, name)
        for f in storage.listdir(prev_dir):
            if not f.endswith(".parquet"):
                continue
            part = f"part-carried-{stable_hash(job.previous, name, f, size=8)}"
            table = storage.read_parquet(storage.join(prev_dir, f))
            table = table.filter(pa.compute.is_in(table["pair_id"], value_set=keys))
            if not table.num_rows:
                continue
            ids = table["pair_id"].to_pylist() if name == "pairs" else []
            if ids and set(ids) <= done:
                continue
            path = f"{name}/{part}.parquet"
            storage.makedirs(storage.join(staging, name))
            storage.write_parquet(table.cast(schema), storage.join(staging, path))
            counts = {"carried_pairs": table.num_rows} if name == "pairs" else _counts(name, table)
            record_write(staging, f"{part}-{name}", {"rows": {name: table.num_rows}, "files": {name: path},
                                                    "counts": counts, "keys": ids})
    return carried


def run_extract(job: ExtractJob) -> tuple[str, dict[str, Any]]:
    """Extract verbatim spans for every pair into ``spans/`` and ``pairs/`` tables.

    With ``previous``, pairs whose input and extractor are unchanged keep that run's rows; with a
    ``run_id`` a rerun after a crash extracts only the pairs no completed write covers.
    """
    from .extract import weights_fingerprint
    from .extract.stage import unpack
    from .tables import PAIRS, REJECTS, SPANS

    t0 = time.perf_counter()
    pairs, sources = build_pairs(job)
    t_pairs = time.perf_counter()
    cfg = job.extractor
    kind = type(cfg).__name__.removesuffix("Config").lower()
    config = {"extractor": kind, "extractor_config": _jsonable(cfg.to_dict()), "extractor_hash": cfg.hash,
              "method": job.method, "top_k": job.top_k, **sources}
    if weights := weights_fingerprint(cfg):
        config["model_revision"] = weights
    if done_manifest := committed_run(job.output, job.run_id):
        return job.output, done_manifest
    run_id = job.run_id or new_run_id("extract", config)
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id, resume=True) as run:
        done = completed_keys(run.staging)
        carried = _carry_pairs(job, pairs, config, run.staging, done)
        skip = pa.array(sorted(done | carried), pa.string())
        todo = pairs.filter(pa.compute.invert(pa.compute.is_in(pairs["pair_id"], value_set=skip)))
        sink = StageTableSink(unpack, run.staging, {"spans": SPANS, "pairs": PAIRS, "rejects": REJECTS},
                              key_columns={"pairs": "pair_id"})
        if todo.num_rows:  # no model is loaded when every pair is carried or already done
            init_ray(job.address, job.num_cpus)
            _extract_dataset(job, todo, cfg, run_id).write_datasink(sink)
        result = sink.finish()
        if result.rows["pairs"] != pairs.num_rows:
            raise RuntimeError(f"{pairs.num_rows} pairs in but {result.rows['pairs']} pair rows written")
        written = storage.read_parquet(storage.join(run.staging, "pairs"),
                                       columns=["error", "n_spans", "n_violations", "model_id", "model_revision"])
        loaded = written.filter(pa.compute.is_valid(written["model_revision"])).slice(0, 1).to_pylist()
        config |= {"model_id": loaded[0]["model_id"], "model_revision": loaded[0]["model_revision"]} if loaded else {}
        if job.previous:
            config["previous"] = job.previous
        manifest = build_manifest(
            run_id=run_id, command="extract", config=config,
            inputs=[v for v in sources.values() if v] + ([job.previous] if job.previous else []),
            tables={n: {"rows": result.rows[n], "files": len(result.files[n])} for n in _EXTRACT_TABLES},
            counts=_extract_counts(written, result.rows["spans"]) | {"rejects": result.rows["rejects"], **{
                k: v for k, v in result.counts.items() if k.startswith("rejects.") or k == "stage_retries"}}
            | {"extracted_pairs": todo.num_rows, "carried_pairs": len(carried)}
            | ({"resumed_pairs": len(done)} if done else {}),
            timings_s={"pairs": t_pairs - t0, "total": time.perf_counter() - t0},
        )
        return run.commit(manifest), manifest


# --- querygen and silver ----------------------------------------------------------------


class _QueryGenActor:
    """Three-step query generation for a batch of chunks over an OpenAI-compatible endpoint."""

    def __init__(self, config) -> None:
        from .extract.llm import OpenAIClient
        from .querygen import QueryGenerator

        client = OpenAIClient(config)
        self.generator = QueryGenerator(client.chat, config.model, max_in_flight=config.max_in_flight)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.generator(batch)


@dataclass
class QueryGenJob:
    chunks: str  # a committed chunk run (papers + chunks tables)
    output: str
    llm: Any  # extract.llm.LLMConfig (http backend)
    n_papers: int = 100
    seed: int = 0
    batch_rows: int = 16
    concurrency: int | None = None
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None


def run_querygen(job: QueryGenJob) -> tuple[str, dict[str, Any]]:
    """Sample papers, pick one chunk each, and generate 3 queries per chunk into a ``queries`` table."""
    from .querygen import QUERIES_SCHEMA, pick_chunks, sample_papers
    from .runs import read_table

    if job.llm.backend != "http":
        raise ValueError("querygen talks to an OpenAI-compatible endpoint (e.g. `vllm serve` on the cluster): "
                         "use the http backend")
    t0 = time.perf_counter()
    papers_dir = _committed_table_dir(job.chunks, "papers")
    names = storage.dataset(papers_dir).schema.names
    papers = storage.read_parquet(papers_dir, columns=[c for c in ("paper_id", "language", "authors") if c in names])
    paper_ids = sample_papers(papers, job.n_papers, job.seed)
    picked = pick_chunks(read_table(job.chunks, "chunks", ["chunk_id", "paper_id", "chunk_index", "text",
                                                           "heading_path"]), paper_ids, job.seed)
    config = {"chunks": job.chunks, "n_papers": job.n_papers, "seed": job.seed, "llm": _jsonable(job.llm.to_dict())}
    with staged(job.output, overwrite=job.overwrite) as run:
        init_ray(job.address, job.num_cpus)
        blocks = [picked.slice(i, job.batch_rows) for i in range(0, max(1, picked.num_rows), job.batch_rows)]
        ds = ray.data.from_arrow(blocks).map_batches(
            _QueryGenActor, fn_constructor_kwargs={"config": job.llm}, batch_format="pyarrow", batch_size=None,
            num_cpus=0.5, concurrency=job.concurrency or 2)
        sink = StageTableSink(_as_table("queries"), run.staging, {"queries": QUERIES_SCHEMA},
                              key_columns={"queries": "query_id"})
        ds.write_datasink(sink)
        queries = storage.read_parquet(storage.join(run.staging, "queries"))
        errors = [e for e in queries["error"].to_pylist() if e]
        manifest = build_manifest(
            run_id=new_run_id("querygen", config), command="querygen", config=config, inputs=[job.chunks],
            tables={"queries": {"rows": queries.num_rows, "files": len(sink.result.files["queries"])}},
            counts={"papers_eligible_sampled": len(paper_ids), "chunks": picked.num_rows,
                    "queries": queries.num_rows - len(errors), "query_errors": len(errors),
                    **Counter(f"errors.{e.split(':', 1)[0]}" for e in errors)},
            timings_s={"total": time.perf_counter() - t0},
        )
        return run.commit(manifest), manifest


@dataclass
class SilverJob:
    """The silver-data job: sample -> queries -> retrieve -> teacher extraction -> filter -> split -> write."""

    chunks: str  # committed chunk run
    index: str  # index folder built from that chunk run
    output: str  # a folder for the job's runs: querygen/, retrieval/, teacher/, data/
    llm: Any  # LLMConfig for query generation and the teacher (the teacher uses the paragraph prompt)
    n_papers: int = 2000
    seed: int = 0
    top_k: int = 5
    dev_fraction: float = 0.1
    tokenizer: str | None = None  # hub id or path; None: no tokenized windows
    max_length: int = 8192
    stride: int = 256
    overwrite: bool = False
    address: str | None = None
    num_cpus: int | None = None


def _silver_pairs(queries: pa.Table, retrieval: pa.Table, top_k: int) -> list[dict[str, Any]]:
    """Top-k hybrid chunks of each generated query, plus its source chunk when retrieval missed it."""
    hits: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in retrieval.filter(pa.compute.equal(retrieval["method"], "hybrid")).to_pylist():
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


def run_silver(job: SilverJob) -> tuple[str, dict[str, Any]]:
    """The whole silver pipeline; every step is its own committed run under ``job.output``."""
    from . import silver
    from .retrieval import RetrieverConfig
    from .runs import read_table

    t0 = time.perf_counter()
    out = storage.normalize(job.output)
    storage.makedirs(out)
    common = {"overwrite": job.overwrite, "address": job.address, "num_cpus": job.num_cpus}
    qg_dir, qg = run_querygen(QueryGenJob(chunks=job.chunks, output=storage.join(out, "querygen"), llm=job.llm,
                                          n_papers=job.n_papers, seed=job.seed, **common))
    queries = read_table(qg_dir, "queries").filter(pa.compute.is_valid(pa.compute.field("query")))
    qfile = storage.join(out, "querygen", "queries.parquet")
    storage.write_parquet(queries.select(["query_id", "query"]), qfile)
    ret_dir, _ = run_retrieve(RetrieveJob(
        index=job.index, queries=qfile, output=storage.join(out, "retrieval"),
        retriever=RetrieverConfig(index_dir=job.index, k=job.top_k, methods=("hybrid",)), **common))
    pairs = _silver_pairs(queries, read_table(ret_dir, "retrieval"), job.top_k)
    pfile = storage.join(out, "querygen", "pairs.parquet")
    storage.write_parquet(pa.Table.from_pylist(pairs), pfile)
    teacher = dataclasses.replace(job.llm, style="paragraph")
    ex_dir, ex = run_extract(ExtractJob(output=storage.join(out, "teacher"), extractor=teacher, pairs=pfile,
                                        chunks=job.chunks, **common))
    rows, failed = _teacher_rows(ex_dir, job.chunks, teacher.model)
    kept, dropped = silver.filter_rows(rows)
    train, dev = silver.split_by_query(kept, dev_fraction=job.dev_fraction, seed=job.seed)
    tokenizer = None
    if job.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(job.tokenizer)
    with staged(storage.join(out, "data"), overwrite=job.overwrite) as data:
        written = silver.write_silver(data.staging, train, dev, tokenizer=tokenizer, max_length=job.max_length,
                                      stride=job.stride)
        config = {"chunks": job.chunks, "index": job.index, "n_papers": job.n_papers, "seed": job.seed,
                  "top_k": job.top_k, "dev_fraction": job.dev_fraction, "teacher": _jsonable(teacher.to_dict()),
                  "tokenizer": job.tokenizer, "max_length": job.max_length, "stride": job.stride}
        counts = {"papers": qg["counts"]["chunks"], "queries": qg["counts"]["queries"], "rows": len(rows) + failed,
                  "rows_failed": failed, "kept": len(kept), "train": len(train), "dev": len(dev),
                  "teacher_spans": ex["counts"]["spans"], "teacher_rejects": ex["counts"]["rejects"],
                  **{f"dropped.{k}": v for k, v in dropped.items()},
                  **{f"written.{k}": v for k, v in written.items() if isinstance(v, int)}}
        manifest = build_manifest(
            run_id=new_run_id("silver", config), command="silver", config=config,
            inputs=[job.chunks, job.index, qg_dir, ret_dir, ex_dir],
            tables={}, counts=counts, timings_s={"total": time.perf_counter() - t0})
        return data.commit(manifest), manifest


def _teacher_rows(extract_dir: str, chunks_run: str, teacher_model: str) -> tuple[list[dict[str, Any]], int]:
    """One dict per teacher pair with its chunk, heading path and verbatim spans; and how many pairs failed."""
    from .extract.pairs import chunk_lookup
    from .runs import read_table

    pairs = read_table(extract_dir, "pairs").to_pylist()
    spans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in read_table(extract_dir, "spans", ["pair_id", "start", "end", "text"]).to_pylist():
        spans[s.pop("pair_id")].append(s)
    chunks_dir = _committed_table_dir(chunks_run, "chunks")
    known = chunk_lookup(chunks_dir, [p["chunk_id"] for p in pairs])
    import pyarrow.dataset as pads

    heads = storage.dataset(chunks_dir).to_table(
        columns=["chunk_id", "heading_path"], filter=pads.field("chunk_id").isin(list(known))).to_pylist()
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
