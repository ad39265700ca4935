"""The chunk stage: a corpus (md folder, Parquet, JSONL) -> papers, chunks and quarantine tables.

A corpus datasource feeds blocks of raw records to a sink that runs ``IngestStage`` on each and writes the
three tables; Ray fuses read and write into one task per file group. With ``previous``, papers whose text and
metadata are unchanged are not chunked: their rows are carried from that run.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import carried_across, changed_setting, group, option, settings
from verbatim_batch.core.runs import (
    committed_table_dir,
    expect_corpus,
    jsonable,
    manifest_config,
    read_readable,
)
from verbatim_batch.core.tables import CHUNKS, PAPERS, QUARANTINE
from verbatim_batch.corpus import readers as corpus
from verbatim_batch.corpus.chunker import FORCED_SPLIT, OVERSIZED_BLOCK, UNDERSIZED, ChunkerConfig
from verbatim_batch.corpus.ingest import (
    DEFAULT_MAX_PAPER_MB,
    METADATA_FIELDS,
    UNCHANGED,
    IngestStage,
    paper_fingerprint,
)
from verbatim_batch.corpus.metadata import load_metadata, metadata_stats
from verbatim_batch.engine.ray_env import cpus
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.sink import changed_files
from verbatim_batch.engine.stage import Command, Outcome, Plan, RunOptions, StageContext, StageResult, TableStage, Work
from verbatim_batch.quality.verify import check_papers

log = logging.getLogger(__name__)

@dataclass
class ChunkJob(RunOptions):
    """Settings of the chunk job (the CLI and jobs/chunk.py build one of these)."""

    input: str = option(help="the corpus: a folder of .md or .txt files, or a Parquet/JSONL file or "
                       "folder", path=True)
    format: str = option("auto", "input format (auto: from file extensions)", choices=("auto", *corpus.FORMATS),
                         selects=True)  # a paper carries by its own fingerprint, however it was read
    metadata: str | None = option(None, "metadata table (.parquet/.jsonl/.csv) joined by paper id", path=True)
    chunker: ChunkerConfig = group(ChunkerConfig, default_factory=ChunkerConfig)
    max_paper_mb: float = option(DEFAULT_MAX_PAPER_MB, "quarantine papers larger than this (MB)", low=0,
                                 high=limits.SIZE_MB, low_open=True)
    store_text: bool = option(True, "do not keep paper text in the papers table", name="no_store_text", invert=True)
    concurrency: int | None = option(None, "parallel ingest tasks", low=1, high=limits.WORKERS,
                                     default_help="as many as Ray schedules", runtime=True)

    @property
    def max_paper_bytes(self) -> int:
        return int(self.max_paper_mb * 1024 * 1024)

    def config(self) -> dict[str, Any]:
        """The output-deciding options (``options.settings``), the chunker's hash and the byte limit with them."""
        return jsonable(settings(self)) | {"chunker": jsonable(self.chunker.to_dict()),
                                           "chunker_config_hash": self.chunker.hash,
                                           "max_paper_bytes": self.max_paper_bytes}


@dataclass(frozen=True)
class PreviousPaper:
    """A previous paper: its fingerprint (text and metadata), source path and source bytes' sha256 (if recorded)."""

    fingerprint: str
    sha256: str
    source: str
    source_sha256: str | None


def unchanged_map(job: ChunkJob) -> tuple[dict[str, PreviousPaper], int]:
    """``({paper_id: PreviousPaper}, n_rejected)`` for the papers of ``job.previous`` whose rows may be carried.

    Empty when a setting changed, the previous run stored no text, or its papers table has other columns. Its
    papers are trusted as they are when every papers and chunks file is what the run committed (``files.json``);
    else each is checked (``verify.check_papers``), and one that does not verify is chunked again (counted).
    """
    if not job.previous:
        return {}, 0
    prev, now = manifest_config(job.previous), job.config()
    # a paper carries across the inputs (by its own fingerprint), never another setting (the chunker by its hash)
    across = (*carried_across(ChunkJob), "chunker")
    if not job.store_text or changed_setting(prev, now, across=across, missing_same=True):
        return {}, 0
    papers_dir = committed_table_dir(job.previous, "papers")
    if set(_table_columns(papers_dir)) != set(PAPERS.names):
        return {}, 0
    # an unreadable papers file carries nothing: its papers are chunked again
    table, unreadable = read_readable(papers_dir, columns=["paper_id", "sha256", "source", "source_sha256",
                                                          *METADATA_FIELDS])
    n_lost = _footer_rows(papers_dir, unreadable)  # counted with the rejected papers, when their footers read
    if unreadable:
        log.warning("%s: papers files %s are unreadable: their papers are chunked again", job.previous,
                    unreadable[:5])
    if table is None:
        return {}, n_lost
    papers = table.to_pydict()
    if changed_files(job.previous, ("papers", "chunks")) == []:
        rejected: set[str] = set()
    else:
        rejected = check_papers(storage.normalize(job.previous), max_errors=0, want_rejected=True)["rejected"]
    previous = {pid: PreviousPaper(paper_fingerprint(sha, tuple(papers[f][i] for f in METADATA_FIELDS)), sha,
                                   papers["source"][i], papers["source_sha256"][i])
                for i, (pid, sha) in enumerate(zip(papers["paper_id"], papers["sha256"], strict=True))
                if pid not in rejected}
    return previous, len(rejected) + n_lost


def _footer_rows(table_dir: str, names: list[str]) -> int:
    """Rows of files whose data cannot be read, from the footers that can (plain files only)."""
    n = 0
    for name in names:
        path = storage.join(table_dir, name)
        try:
            n += storage.parquet_file(path).metadata.num_rows if storage.regular_file(path) else 0
        except (OSError, ValueError, pa.ArrowException):
            continue
    return n


def _table_columns(table_dir: str) -> list[str]:
    """Column names of a committed table (its first file's schema)."""
    for f in sorted(f for f in storage.listdir(table_dir) if f.endswith(".parquet")):
        path = storage.join(table_dir, f)
        try:  # the first file that can be read (a damaged one is not carried, see unchanged_map)
            if storage.regular_file(path):
                return storage.read_parquet_schema(path).names
        except (OSError, ValueError, pa.ArrowException):
            continue
    return []


def unchanged_sources(fs, files: list[corpus.SourceFile], duplicates: dict[str, str],
                      previous: dict[str, PreviousPaper], metadata: dict[str, tuple],
                      max_paper_bytes: int) -> dict[str, str]:
    """``{path: paper_id}`` of the md files a night need not read: a previous paper's source at the same path,
    with the bytes and metadata that run recorded (equal bytes give the same text, so its rows carry undecoded).
    A paper whose title comes from its text is left to the ingest, which reads the text."""
    wanted: dict[str, tuple[str, str]] = {}
    for f in files:
        if f.problem or f.size > max_paper_bytes:
            continue
        pid = corpus.md_paper_id(f.path).strip()
        prev = previous.get(pid)
        if prev is None or prev.source != f.path or not prev.source_sha256 or duplicates.get(pid, f.path) != f.path:
            continue
        meta = metadata.get(pid)
        if not meta or not meta[0] or paper_fingerprint(prev.sha256, meta) != prev.fingerprint:
            continue
        wanted[f.path] = (pid, prev.source_sha256)
    if not wanted:
        return {}
    from verbatim_batch.engine.listing import file_digests

    digests = file_digests(fs, [f for f in files if f.path in wanted])
    return {path: wanted[path][0] for path, digest in digests.items() if digest == wanted[path][1]}


def chunk_table_counts(name: str, table: pa.Table) -> dict[str, int]:
    """What a written papers, chunks or quarantine table adds to the manifest's counts."""
    counts: Counter = Counter()
    if name == "papers":
        counts["papers_bytes"] += pc.sum(table["n_bytes"]).as_py() or 0
        counts["papers_chars"] += pc.sum(table["n_chars"]).as_py() or 0
        for flags in table["flags"].to_pylist():
            counts.update(f"papers_flag.{f}" for f in flags)
    elif name == "chunks":
        for flags in table["flags"].to_pylist():
            counts.update(f"chunks_flag.{f}" for f in flags if f in (OVERSIZED_BLOCK, FORCED_SPLIT, UNDERSIZED))
    elif name == "quarantine":
        counts.update(f"quarantine.{r}" for r in table["reason"].to_pylist())
    return dict(counts)


@dataclass(frozen=True)
class ChunkWork:
    fs: Any
    files: list  # the files to read (all of them, less the unchanged sources)
    duplicates: dict[str, str]
    unchanged: dict[str, PreviousPaper]  # the previous run's papers that may be carried, by paper id
    rejected: int  # previous papers that did not verify (chunked again)
    same_sources: frozenset = frozenset()  # paper ids whose source bytes are unchanged (never read this run)
    previous_ids: frozenset = frozenset()  # the previous run's papers that could be carried
    skipped: tuple[int, tuple[str, ...]] = (0, ())  # files in the corpus folder its format does not read


def _ids(staging: str, table: str) -> set[str]:
    return set(storage.read_parquet(storage.join(staging, table), ["paper_id"])["paper_id"].to_pylist())


class ChunkStage(TableStage):
    command = "chunk"
    outcomes = {"rejected": ("quarantined",)}
    resumable = False
    tables = {"papers": PAPERS, "chunks": CHUNKS, "quarantine": QUARANTINE, "unchanged": UNCHANGED}
    key_column = "paper_id"
    key_tables = ("papers", "quarantine")
    scratch_tables = ("unchanged",)  # papers the ingest found unchanged: replaced by their carried rows
    carry_after_write = True
    unchanged_verified = True  # unchanged_map trusts a previous paper only once it verifies
    table_counts = staticmethod(chunk_table_counts)

    @classmethod
    def record_keys(cls) -> dict[str, str]:
        return {"papers": "source", "quarantine": "source", "unchanged": "source"}

    def plan(self) -> Plan:
        job: ChunkJob = self.job
        expect_corpus(job.input)  # a run folder's Parquet files are not papers
        fmt = corpus.detect_format(job.input) if job.format == "auto" else job.format
        if job.metadata:
            load_metadata(job.metadata)  # a bad metadata file stops the job here, with one line
        return Plan(config=job.config() | {"format": fmt},
                    inputs=(job.input, *([job.metadata] if job.metadata else [])), facts=fmt)

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        job: ChunkJob = self.job
        fmt = plan.facts
        fs, files = corpus.list_sources(job.input, fmt)
        meta_path = corpus.resolve(job.metadata)[1] if job.metadata else None
        if meta_path:  # a metadata file inside the input folder is not a paper
            files = [f for f in files if f.path != meta_path]
        # named in the manifest and the committed run's summary (report.summary.print_run), never silently
        n_skipped, first = corpus.skipped_files(job.input, fmt, ignore=(meta_path,) if meta_path else ())
        if fmt != "md" or job.address or os.environ.get("RAY_ADDRESS"):
            # Parquet/JSONL duplicates are a Ray read, and on a cluster the checks below are Ray tasks; locally they
            # run in threads, so a night whose files are unchanged never starts Ray
            ctx.ray()
        if fmt == "md":
            from verbatim_batch.engine.listing import md_duplicates

            duplicates, n_records = md_duplicates(files, job.max_paper_bytes)
        else:
            from verbatim_batch.engine.source import record_duplicates  # the ids of Parquet/JSONL records: a Ray read

            duplicates, n_records = record_duplicates(fs, files, fmt, job.max_paper_bytes, job.worker_restarts)
        t_scan = ctx.elapsed()
        previous, rejected = unchanged_map(job)
        same: dict[str, str] = {}
        if previous and fmt == "md":
            metadata = load_metadata(job.metadata) if job.metadata else {}
            same = unchanged_sources(fs, files, duplicates, previous, metadata, job.max_paper_bytes)
            files = [f for f in files if f.path not in same]
        paths = {f.path for f in files} if fmt == "md" else None
        same_ids = frozenset(same.values())  # a set: ``in same.values()`` was a scan per paper (quadratic at 10%)
        # a paper whose file moved is chunked again, so its row names the path it now comes from
        unchanged = {pid: p for pid, p in previous.items()
                     if pid not in same_ids and (paths is None or p.source in paths)}
        return Work(keys=None, n_in=n_records, n_todo=n_records - len(same),
                    data=ChunkWork(fs, files, duplicates, unchanged, rejected, same_ids,
                                   frozenset(previous), (n_skipped, tuple(first))),
                    timings_s={"scan": t_scan, "previous": ctx.elapsed() - t_scan})

    def writer(self, plan: Plan, work: Work) -> IngestStage:
        job: ChunkJob = self.job
        previous = work.data.unchanged  # carried by fingerprint, unless the source's bytes changed (IngestStage)
        return IngestStage(chunker=job.chunker, metadata_uri=job.metadata, duplicates=work.data.duplicates,
                           store_text=job.store_text, unchanged={pid: p.fingerprint for pid, p in previous.items()},
                           source_sha256={pid: p.source_sha256 for pid, p in previous.items() if p.source_sha256})

    def dataset(self, plan: Plan, work: Work, skip, ctx: StageContext):
        job: ChunkJob = self.job
        w: ChunkWork = work.data
        if not w.files:
            return []
        from verbatim_batch.engine.source import CorpusDatasource, read_corpus

        return read_corpus(CorpusDatasource(w.fs, w.files, plan.facts, job.max_paper_bytes,
                                            parallelism=max(200, 4 * cpus())), job.worker_restarts)

    def write_concurrency(self) -> int | None:
        return self.job.concurrency

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> set[str]:
        scratch = storage.join(staging, "unchanged")
        read = _ids(staging, "unchanged") if work.data.unchanged and storage.exists(scratch) else set()
        return read | work.data.same_sources

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> StageResult:
        w: ChunkWork = work.data
        rows = outcome.result.rows
        incremental: dict[str, int] = {}
        if self.job.previous and (w.previous_ids or w.rejected):
            same = set(outcome.carried.to_pylist())  # papers: thousands, not millions
            known = w.previous_ids
            new_ids = _ids(outcome.staging, "papers") - same
            present = new_ids | same | _ids(outcome.staging, "quarantine")
            incremental = {
                "papers_unchanged": len(same), "papers_changed": len(new_ids & known),
                "papers_added": len(new_ids - known), "papers_removed": len(known - present),
                "papers_unread": len(w.same_sources),
                "previous_papers_rejected": w.rejected,
            }
        counts = {"records_in": work.n_in, "papers": rows["papers"], "chunks": rows["chunks"],
                  "quarantined": rows["quarantine"], "duplicate_ids": len(w.duplicates),
                  "papers_chunked": rows["papers"] - incremental.get("papers_unchanged", 0),
                  "files_skipped": w.skipped[0], **incremental}
        skipped = {"skipped_files": {"count": w.skipped[0], "first": list(w.skipped[1]),
                                     "why": f"not {'/'.join(corpus.extensions(plan.facts))} files"}} \
            if w.skipped[0] else {}
        if not self.job.metadata:
            return StageResult(tables={}, counts=counts, manifest=skipped)
        meta = metadata_stats(self.job.metadata)  # what the metadata join left out: counted, duplicates named
        counts |= {f"metadata_{k}": v for k, v in meta.items() if k != "duplicates"}
        return StageResult(tables={}, counts=counts, manifest=skipped | {"metadata": {
            "duplicate_ids": meta["duplicates"], "rule": "the first row of an id wins; fields of the wrong type "
            "or over their size are ignored"}})


def run_chunk(job: ChunkJob) -> tuple[str, dict[str, Any]]:
    """Chunk a corpus into a committed run folder; returns ``(path, manifest)``."""
    return run_stage(ChunkStage(job))


COMMAND = Command("chunk", "chunk a corpus into papers/chunks/quarantine Parquet tables", ChunkJob, run_chunk,
                  stage=ChunkStage, folder="chunks", omit=("batch_retries",))
