"""The chunk stage: a corpus (md folder, Parquet, JSONL) -> papers, chunks and quarantine tables.

A corpus datasource feeds blocks of raw records to a sink that runs ``IngestStage`` on each and writes the
three tables; Ray fuses read and write into one task per file group. With ``previous``, papers whose text and
metadata are unchanged are not chunked: their rows are carried from that run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import corpus, storage
from ..chunking import ChunkerConfig
from ..ingest import DEFAULT_MAX_PAPER_BYTES, METADATA_FIELDS, UNCHANGED, IngestStage, paper_fingerprint
from ..runs import committed_table_dir, manifest_config
from ..tables import CHUNKS, PAPERS, QUARANTINE
from ..verify import iter_paper_checks
from .ray_env import cpus
from .runner import RunOptions, Stage, StageContext, StageResult, run_stage
from .sink import table_entries
from .source import CorpusDatasource, find_duplicates, read_corpus

INGEST_TABLES = {"papers": PAPERS, "chunks": CHUNKS, "quarantine": QUARANTINE}


@dataclass
class ChunkJob(RunOptions):
    """Settings of the chunk job (the CLI and jobs/chunk.py build one of these)."""

    input: str
    format: str = "auto"
    metadata: str | None = None
    chunker: ChunkerConfig = field(default_factory=ChunkerConfig)
    max_paper_bytes: int = DEFAULT_MAX_PAPER_BYTES
    store_text: bool = True
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


def unchanged_map(job: ChunkJob) -> tuple[dict[str, str], int]:
    """``({paper_id: fingerprint}, n_rejected)`` for the papers of ``job.previous`` whose rows may be carried.

    Empty when the chunker or ``store_text`` changed, and when the previous run stored no text: carried rows
    are trusted only when they verify (``verify.iter_paper_checks``: the stored text hashes to the paper's
    sha256, every chunk is that text at its offsets). A previous paper that does not verify (tampered or
    damaged rows) is not carried but chunked again from the source; ``n_rejected`` counts them.
    """
    if not job.previous:
        return {}, 0
    prev = manifest_config(job.previous)
    if (prev.get("chunker_config_hash") != job.chunker.hash or prev.get("store_text") != job.store_text
            or not job.store_text):
        return {}, 0
    papers = storage.read_parquet(committed_table_dir(job.previous, "papers"),
                                  columns=["paper_id", "sha256", *METADATA_FIELDS]).to_pydict()
    rejected = {pid for pid, problems, with_text, _ in iter_paper_checks(storage.normalize(job.previous))
                if pid and (problems or not with_text)}
    fingerprints = {pid: paper_fingerprint(sha, tuple(papers[f][i] for f in METADATA_FIELDS))
                    for i, (pid, sha) in enumerate(zip(papers["paper_id"], papers["sha256"], strict=True))
                    if pid not in rejected}
    return fingerprints, len(rejected)


def _ids(staging: str, table: str) -> set[str]:
    return set(storage.read_parquet(storage.join(staging, table), ["paper_id"])["paper_id"].to_pylist())


class ChunkStage(Stage):
    command = "chunk"

    def __init__(self, job: ChunkJob) -> None:
        super().__init__(job)
        self.fmt = corpus.detect_format(job.input) if job.format == "auto" else job.format

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        job = self.job
        if job.metadata:
            corpus.load_metadata(job.metadata)  # a bad metadata file stops the job here, with one line
        return job.config() | {"format": self.fmt}, [job.input] + ([job.metadata] if job.metadata else [])

    def execute(self, ctx: StageContext) -> StageResult:
        job: ChunkJob = self.job
        ctx.ray()
        fs, files = corpus.list_sources(job.input, self.fmt)
        if job.metadata:  # a metadata file inside the input folder is not a paper
            meta_path = corpus.resolve(job.metadata)[1]
            files = [f for f in files if f.path != meta_path]
        duplicates, n_records = find_duplicates(fs, files, self.fmt, job.max_paper_bytes)
        t_scan = ctx.elapsed()
        unchanged, n_rejected = unchanged_map(job)
        stage = IngestStage(chunker=job.chunker, metadata_uri=job.metadata, duplicates=duplicates,
                            store_text=job.store_text, unchanged=unchanged)
        ds = read_corpus(CorpusDatasource(fs, files, self.fmt, job.max_paper_bytes, parallelism=max(200, 4 * cpus())))
        sink = ctx.sink(stage, INGEST_TABLES | {"unchanged": UNCHANGED},
                        key_columns={"papers": "source", "quarantine": "source", "unchanged": "source"})
        ds.write_datasink(sink, concurrency=job.concurrency)
        t_ingest = ctx.elapsed()
        incremental: dict[str, int] = {}
        carried: dict[str, int] = {}
        if job.previous and unchanged:
            same = _ids(ctx.staging, "unchanged")
            _, carried = ctx.carry({"papers": PAPERS, "chunks": CHUNKS}, "paper_id", same)
            new_ids = _ids(ctx.staging, "papers") - same
            present = new_ids | same | _ids(ctx.staging, "quarantine")
            incremental = {
                "papers_unchanged": len(same), "papers_changed": len(new_ids & unchanged.keys()),
                "papers_added": len(new_ids - unchanged.keys()), "papers_removed": len(unchanged.keys() - present),
                "chunks_carried": carried.get("chunks", 0), "previous_papers_rejected": n_rejected,
            }
        result = sink.finish()
        accounted = (result.rows["papers"] - carried.get("papers", 0) + result.rows["quarantine"]
                     + result.rows["unchanged"])
        if accounted != n_records:
            raise RuntimeError(f"{n_records} input records but {accounted} papers + quarantined + unchanged: "
                               "rows were lost")
        storage.rmtree(storage.join(ctx.staging, "unchanged"))
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
        return StageResult(tables=table_entries(result, INGEST_TABLES), counts=counts,
                           timings_s={"scan": t_scan, "ingest_and_write": t_ingest - t_scan})


def run_chunk(job: ChunkJob) -> tuple[str, dict[str, Any]]:
    """Chunk a corpus into a committed run folder; returns ``(path, manifest)``."""
    return run_stage(ChunkStage(job))
