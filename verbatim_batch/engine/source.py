"""Reading a corpus into Ray Data: a datasource of raw records (md files, Parquet, JSONL) grouped into
read tasks. What a chunk run learns from the listing before it reads (duplicate ids, file digests) is in
``listing``, which needs no Ray."""

from __future__ import annotations

import pyarrow.fs as pafs
import ray
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from verbatim_batch.core.faults import fault_point
from verbatim_batch.corpus import readers as corpus
from verbatim_batch.engine.listing import balanced_groups, duplicate_winners
from verbatim_batch.engine.resources import task_bounds


class CorpusDatasource(Datasource):
    """Raw records (``tables.RAW_RECORDS``) from md files, Parquet or JSONL, in read tasks grouped up front
    (``file_groups``); ``read_corpus`` runs one task per group, so Ray fuses the read with the stages after it."""

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
            self.groups = balanced_groups(files, max(1, parallelism), corpus.BLOCK_BYTES)
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


def read_corpus(source: CorpusDatasource, restarts: int) -> ray.data.Dataset:
    """The corpus as a Ray dataset: one read task per group of files, retried ``restarts`` times (not forever)."""
    return ray.data.read_datasource(source, override_num_blocks=len(source.groups),
                                    ray_remote_args=task_bounds(restarts))


def record_duplicates(fs: pafs.FileSystem, files: list[corpus.SourceFile], fmt: str,
                      max_paper_bytes: int, restarts: int) -> tuple[dict[str, str], int]:
    """``({paper_id: winning source}, number of records)`` of a Parquet or JSONL corpus by a Ray read of the ids alone;
    the first source in path order wins, and a record the reader rejected never wins over a good one."""
    ds = read_corpus(CorpusDatasource(fs, files, fmt, max_paper_bytes, ids_only=True), restarts)
    return duplicate_winners(
        (None if err else pid, src)
        for batch in ds.select_columns(["paper_id", "source", "error"]).iter_batches(batch_format="pyarrow")
        for pid, src, err in zip(batch["paper_id"].to_pylist(), batch["source"].to_pylist(),
                                 batch["error"].to_pylist(), strict=True))
