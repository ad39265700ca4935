"""The one place where stages are wired into Ray Data.

``run_chunk`` is the chunk job: a corpus datasource feeds raw records to the
ingest stage (plain Ray tasks, fused with the read), and a datasink writes the
three tables it produces into the run's staging folder; the run then commits
atomically with a manifest.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray.data import Datasink, Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

from . import corpus
from .chunking import FORCED_SPLIT, OVERSIZED_BLOCK, UNDERSIZED, ChunkerConfig
from .ingest import DEFAULT_MAX_PAPER_BYTES, IngestStage
from .runs import RunDir, build_manifest, new_run_id
from .tables import CHUNKS, PAPERS, QUARANTINE, stable_hash

log = logging.getLogger(__name__)

INGEST_TABLES = {"papers": PAPERS, "chunks": CHUNKS, "quarantine": QUARANTINE}
SORT_KEYS = {
    "papers": [("paper_id", "ascending"), ("source", "ascending")],
    "chunks": [("paper_id", "ascending"), ("chunk_index", "ascending")],
    "quarantine": [("source", "ascending")],
}


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start Ray locally."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)


# --- reading ------------------------------------------------------------------------


class CorpusDatasource(Datasource):
    """Raw records (``tables.RAW_RECORDS``) from md files, Parquet or JSONL."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        files: list[corpus.SourceFile],
        fmt: str,
        max_paper_bytes: int,
        ids_only: bool = False,
    ) -> None:
        super().__init__()
        self.fs, self.files, self.fmt = fs, files, fmt
        self.max_paper_bytes, self.ids_only = max_paper_bytes, ids_only

    def estimate_inmemory_data_size(self) -> int | None:
        return 0 if self.ids_only else sum(f.size for f in self.files)

    def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list[ReadTask]:
        if self.fmt == "md":
            groups = _balanced_groups(self.files, max(1, parallelism), corpus.BLOCK_BYTES)
        else:
            groups = [[f] for f in self.files]
        reader = corpus.READERS[self.fmt]
        fs, max_bytes, ids_only, fmt = self.fs, self.max_paper_bytes, self.ids_only, self.fmt

        def make(group: list[corpus.SourceFile]):
            if fmt == "md":
                return lambda: reader(fs, group, max_bytes, ids_only)
            return lambda: reader(fs, group[0], max_bytes, ids_only)

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
        ds = ray.data.read_datasource(CorpusDatasource(fs, files, fmt, max_paper_bytes, ids_only=True))
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


# --- stage wrapper and sink -----------------------------------------------------------


def pack_tables(tables: dict[str, pa.Table]) -> pa.Table:
    """Several tables as one Ray block: a row per table, its Arrow IPC stream as bytes."""
    names, payloads = [], []
    for name, table in tables.items():
        if table.num_rows:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            names.append(name)
            payloads.append(sink.getvalue().to_pybytes())
    return pa.table({"table": pa.array(names, pa.string()), "ipc": pa.array(payloads, pa.large_binary())})


def unpack_tables(block: pa.Table) -> Iterable[tuple[str, pa.Table]]:
    for name, payload in zip(block["table"].to_pylist(), block["ipc"].to_pylist(), strict=True):
        yield name, pa.ipc.open_stream(payload).read_all()


def _run_packed(batch: pa.Table, stage) -> pa.Table:
    return pack_tables(stage(batch))


@dataclass
class TableSinkResult:
    rows: Counter = field(default_factory=Counter)
    files: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)


class MultiTableSink(Datasink):
    """Writes packed blocks into ``<staging>/<table>/part-<key>.parquet``.

    The file key hashes the sources a write task holds, so the same input gives
    the same files; rows inside a file are sorted.
    """

    def __init__(self, staging: str, schemas: dict[str, pa.Schema]) -> None:
        self.staging, self.schemas = staging, schemas
        self.result = TableSinkResult()

    def write(self, blocks: Iterable, ctx) -> dict[str, Any]:
        parts: dict[str, list[pa.Table]] = defaultdict(list)
        for block in blocks:
            for name, table in unpack_tables(BlockAccessor.for_block(block).to_arrow()):
                parts[name].append(table)
        tables = {name: pa.concat_tables(ts).sort_by(SORT_KEYS[name]) for name, ts in parts.items()}
        sources = sorted(
            s for name in ("papers", "quarantine") if name in tables for s in tables[name]["source"].to_pylist()
        )
        key = stable_hash(*sources, size=10)
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": _counts(tables)}
        for name, table in tables.items():
            folder = os.path.join(self.staging, name)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"part-{key}.parquet")
            pq.write_table(table.cast(self.schemas[name]), path, compression="zstd")
            out["rows"][name] = table.num_rows
            out["files"][name] = os.path.relpath(path, self.staging)
        return out

    def on_write_complete(self, write_result) -> None:
        for ret in write_result.write_returns:
            self.result.rows.update(ret["rows"])
            for name, path in ret["files"].items():
                self.result.files[name].append(path)
            self.result.counts.update(ret["counts"])
        for name, schema in self.schemas.items():  # every table exists, even when empty
            if not self.result.files.get(name):
                folder = os.path.join(self.staging, name)
                os.makedirs(folder, exist_ok=True)
                pq.write_table(schema.empty_table(), os.path.join(folder, "part-empty.parquet"))
                self.result.files[name].append(os.path.join(name, "part-empty.parquet"))


def _counts(tables: dict[str, pa.Table]) -> dict[str, int]:
    counts: Counter = Counter()
    papers = tables.get("papers")
    if papers is not None:
        counts["papers_bytes"] += sum(papers["n_bytes"].to_pylist())
        counts["papers_chars"] += sum(papers["n_chars"].to_pylist())
        for flags in papers["flags"].to_pylist():
            counts.update(f"papers_flag.{f}" for f in flags)
    chunks = tables.get("chunks")
    if chunks is not None:
        for flags in chunks["flags"].to_pylist():
            counts.update(f"chunks_flag.{f}" for f in flags if f in (OVERSIZED_BLOCK, FORCED_SPLIT, UNDERSIZED))
    bad = tables.get("quarantine")
    if bad is not None:
        counts.update(f"quarantine.{r}" for r in bad["reason"].to_pylist())
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


def run_chunk(job: ChunkJob) -> tuple[str, dict[str, Any]]:
    """Chunk a corpus into a committed run folder; returns ``(path, manifest)``."""
    t0 = time.perf_counter()
    fmt = corpus.detect_format(job.input) if job.format == "auto" else job.format
    run = RunDir(job.output, overwrite=job.overwrite)
    try:
        init_ray(job.address, job.num_cpus)
        fs, files = corpus.list_sources(job.input, fmt)
        if job.metadata:  # a metadata file inside the input folder is not a paper
            meta_path = corpus.resolve(job.metadata)[1]
            files = [f for f in files if f.path != meta_path]
        duplicates, n_records = find_duplicates(fs, files, fmt, job.max_paper_bytes)
        t_scan = time.perf_counter()
        stage = IngestStage(
            chunker=job.chunker, metadata_uri=job.metadata, duplicates=duplicates, store_text=job.store_text
        )
        if job.metadata:
            corpus.load_metadata(job.metadata)  # fail fast on a bad metadata file
        ds = ray.data.read_datasource(CorpusDatasource(fs, files, fmt, job.max_paper_bytes))
        ds = ds.map_batches(
            _run_packed, fn_kwargs={"stage": stage}, batch_format="pyarrow", batch_size=None,
            concurrency=job.concurrency,
        )
        sink = MultiTableSink(run.staging, INGEST_TABLES)
        ds.write_datasink(sink)
        t_ingest = time.perf_counter()
        result = sink.result
        accounted = result.rows["papers"] + result.rows["quarantine"]
        if accounted != n_records:
            raise RuntimeError(f"{n_records} input records but {accounted} papers + quarantined: rows were lost")
        counts = {
            "records_in": n_records,
            "papers": result.rows["papers"],
            "chunks": result.rows["chunks"],
            "quarantined": result.rows["quarantine"],
            "duplicate_ids": len(duplicates),
            **result.counts,
        }
        config = job.config() | {"format": fmt}
        manifest = build_manifest(
            run_id=new_run_id("chunk", config),
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
    except BaseException:
        run.abort()
        raise
