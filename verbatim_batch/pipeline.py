"""The one place where stages are wired into Ray Data.

``run_chunk`` is the chunk job: a corpus datasource feeds blocks of raw records
to a sink that runs the ingest stage on each and writes the three tables it
produces (papers, chunks, quarantine) into the run's staging folder. Ray fuses
read and write into one task per file group. The run then commits atomically
with a manifest.
"""

from __future__ import annotations

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

from . import corpus
from .chunking import FORCED_SPLIT, OVERSIZED_BLOCK, UNDERSIZED, ChunkerConfig
from .ingest import DEFAULT_MAX_PAPER_BYTES, IngestStage
from .runs import RunDir, build_manifest, new_run_id
from .tables import CHUNKS, PAPERS, QUARANTINE, stable_hash

log = logging.getLogger(__name__)

INGEST_TABLES = {"papers": PAPERS, "chunks": CHUNKS, "quarantine": QUARANTINE}


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


class StageTableSink(Datasink):
    """Runs a multi-table stage on each block and writes ``<staging>/<table>/part-<key>.parquet``.

    The stage (e.g. ``IngestStage``) maps one Arrow batch to several tables (papers,
    chunks, quarantine). Running it inside the write task, fused with the read,
    keeps its outputs out of Ray's object store: packing three tables into one
    block to pass them between operators cost about a third of the stage's time.
    The file key hashes the sources a write task holds, so the same input gives the
    same file names, and rows keep their input order.
    """

    def __init__(self, stage: Callable[[pa.Table], dict[str, pa.Table]], staging: str,
                 schemas: dict[str, pa.Schema]) -> None:
        self.stage, self.staging, self.schemas = stage, staging, schemas
        self.result = TableSinkResult()

    def write(self, blocks: Iterable, ctx) -> dict[str, Any]:
        outputs = [self.stage(BlockAccessor.for_block(block).to_arrow()) for block in blocks]
        outputs = [o for o in outputs if any(t.num_rows for t in o.values())]
        outputs.sort(key=_first_source)  # deterministic whatever order the blocks came in
        sources = sorted(
            s for o in outputs for name in ("papers", "quarantine") for s in o[name]["source"].to_pylist()
        )
        key = stable_hash(*sources, size=10)
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": {}}
        counts: Counter = Counter()
        for name, schema in self.schemas.items():
            parts = [o[name] for o in outputs if o[name].num_rows]
            if not parts:
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            counts.update(_counts(name, table))
            folder = os.path.join(self.staging, name)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"part-{key}.parquet")
            pq.write_table(table if table.schema == schema else table.cast(schema), path, compression="zstd")
            out["rows"][name] = table.num_rows
            out["files"][name] = os.path.relpath(path, self.staging)
        out["counts"] = dict(counts)
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


def _first_source(tables: dict[str, pa.Table]) -> str:
    firsts = [t["source"][0].as_py() for name, t in tables.items() if name != "chunks" and t.num_rows]
    return min(firsts) if firsts else ""


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
        cpus = int(ray.cluster_resources().get("CPU", 1))
        ds = read_corpus(CorpusDatasource(fs, files, fmt, job.max_paper_bytes, parallelism=max(200, 4 * cpus)))
        sink = StageTableSink(stage, run.staging, INGEST_TABLES)
        ds.write_datasink(sink, concurrency=job.concurrency)
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
