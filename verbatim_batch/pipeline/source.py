"""Reading a corpus into Ray Data: a datasource of raw records (md files, Parquet, JSONL) grouped into
read tasks, and the duplicate-id scan that runs before the chunk stage."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable

import pyarrow.fs as pafs
import ray
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from .. import corpus
from ..faults import fault_point


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


MIN_GROUP_BYTES = 8 * 1024 * 1024


def read_corpus(source: CorpusDatasource) -> ray.data.Dataset:
    return ray.data.read_datasource(source, override_num_blocks=len(source.groups))


def balanced_groups(files: list, parallelism: int, max_bytes: int) -> list[list]:
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
    """``({paper_id: winning source}, number of records)``; the first source in path order wins, among
    records the reader did not already reject (an unreadable or malformed record cannot cost a good one
    its place)."""
    if fmt == "md":
        pairs: Iterable[tuple[str | None, str]] = (
            (None if f.problem or f.size > max_paper_bytes else corpus.md_paper_id(f.path), f.path)
            for f in files)
    else:  # ids only: Parquet reads one column, JSONL parses lines once more
        ds = read_corpus(CorpusDatasource(fs, files, fmt, max_paper_bytes, ids_only=True))
        pairs = (  # a record the reader already rejected never wins over a good one
            (None if err else pid, src)
            for batch in ds.select_columns(["paper_id", "source", "error"]).iter_batches(batch_format="pyarrow")
            for pid, src, err in zip(batch["paper_id"].to_pylist(), batch["source"].to_pylist(),
                                     batch["error"].to_pylist(), strict=True)
        )
    return duplicate_winners(pairs)


def duplicate_winners(pairs: Iterable[tuple[str | None, str]]) -> tuple[dict[str, str], int]:
    """``({paper_id: winning source}, number of pairs)`` from ``(paper_id or None, source)`` pairs."""
    seen: dict[str, list[str]] = defaultdict(list)
    n = 0
    for pid, src in pairs:
        n += 1
        if pid is not None and pid.strip():
            seen[pid.strip()].append(src)
    dups = {pid: min(srcs, key=corpus.source_order) for pid, srcs in seen.items() if len(srcs) > 1}
    return dups, n


DIGEST_GROUP_BYTES = 64 * 1024 * 1024


def _digests(fs: pafs.FileSystem, paths: list[str]) -> list[str | None]:
    """sha256 of each file's bytes (None for one that cannot be read: the ingest will say why)."""
    import hashlib

    out: list[str | None] = []
    for path in paths:
        try:
            with fs.open_input_stream(path) as stream:
                out.append(hashlib.sha256(stream.read()).hexdigest())
        except OSError:
            out.append(None)
    return out


def file_digests(fs: pafs.FileSystem, files: list[corpus.SourceFile]) -> dict[str, str | None]:
    """``{path: sha256 of its bytes}``: as Ray tasks over groups of files when Ray is up (every node reads
    its share), else in this process's threads (hashlib and the reads release the GIL), so a local night
    that finds nothing changed never starts Ray."""
    from concurrent.futures import ThreadPoolExecutor

    from .sink import in_tasks

    groups = [[f.path for f in g] for g in balanced_groups(files, max(1, 4 * (os.cpu_count() or 1)),
                                                              DIGEST_GROUP_BYTES) if g]
    calls = [(fs, g) for g in groups]
    if ray.is_initialized():
        results = in_tasks(_digests, calls)
    else:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            results = list(pool.map(lambda call: _digests(*call), calls))
    return {path: d for group, got in zip(groups, results, strict=True) for path, d in zip(group, got, strict=True)}
