"""What a chunk run learns from the corpus listing before it reads a paper: duplicate paper ids, and the
sha256 of the files a night may carry unread. No Ray here (a Parquet or JSONL corpus's ids are a Ray read:
``source.record_duplicates``); digests run as Ray tasks only when Ray is already up. A local night that finds
nothing changed never imports Ray (about 0.4 CPU-s of its 3, benchmarks/history/scale.md)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable

import pyarrow.fs as pafs

from verbatim_batch.corpus import readers as corpus
from verbatim_batch.engine.sink import in_tasks, ray_if_up

MIN_GROUP_BYTES = 8 * 1024 * 1024


def balanced_groups(files: list, parallelism: int, max_bytes: int) -> list[list]:
    """Contiguous groups of files: about ``parallelism`` of them, each 8 MiB to ``max_bytes`` (no tiny tasks)."""
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


def md_duplicates(files: list[corpus.SourceFile], max_paper_bytes: int) -> tuple[dict[str, str], int]:
    """``({paper_id: winning source}, number of files)`` of a folder of md/txt papers, from the listing alone (an id is
    its file's stem; a file the reader rejects never wins). Parquet and JSONL: ``source.record_duplicates``."""
    return duplicate_winners(
        (None if f.problem or f.size > max_paper_bytes else corpus.md_paper_id(f.path), f.path) for f in files)


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
    """``{path: sha256 of its bytes}``: Ray tasks over groups of files when Ray is up, else threads here, so a local
    night that finds nothing changed never starts Ray."""
    from concurrent.futures import ThreadPoolExecutor

    groups = [[f.path for f in g] for g in balanced_groups(files, max(1, 4 * (os.cpu_count() or 1)),
                                                              DIGEST_GROUP_BYTES) if g]
    calls = [(fs, g) for g in groups]
    if ray_if_up() is not None:
        results = in_tasks(_digests, calls)
    else:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            results = list(pool.map(lambda call: _digests(*call), calls))
    return {path: d for group, got in zip(groups, results, strict=True) for path, d in zip(group, got, strict=True)}
