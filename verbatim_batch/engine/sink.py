"""Writing a stage's tables: each write's files and records (the Ray Datasink is ``datasink.StageTableSink``), the
carry of unchanged rows from a previous run, compaction. The stage hands it a writer (block -> tables), the schemas,
the key column per table and its own table counter (``table_counts``).
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import storage
from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.runs import (
    CARRIED_PREFIX,
    WRITES_DIR,
    committed_table_dir,
    live_files,
    read_files_index,
    read_writes,
    record_write,
)
from verbatim_batch.core.runs import record_keys as keys_of_records
from verbatim_batch.core.tables import stable_hash
from verbatim_batch.core.tasks import install_runner
from verbatim_batch.engine.resources import Resources, ray_args

log = logging.getLogger(__name__)
TableCounter = Callable[[str, pa.Table], dict[str, int]]
CARRIED_FROM = "carried_from"  # a rewritten carried file's stats: the file its rows come from, and which rows
MAX_CARRIED_RANGES = 10_000  # ranges of rows a carried file's provenance lists at most (else it lists none)


def no_counts(name: str, table: pa.Table) -> dict[str, int]:
    return {}


@dataclass
class TableSinkResult:
    """Every live file of a staging folder, summed: rows and files per table, counts, keys, each file's stats."""

    rows: Counter = field(default_factory=Counter)
    files: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)
    keys: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # distinct, Arrow (can be millions)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)  # relpath -> table, rows, bytes, digest, counts


def write_table_file(staging: str, name: str, part: str, table: pa.Table, schema: pa.Schema,
                     table_counts: TableCounter) -> tuple[str, dict[str, Any]]:
    """Write one table's file of a write into the staging folder; ``(relpath, stats)``."""
    path = f"{name}/{part}.parquet"
    table = table if table.schema == schema else table.cast(schema)
    if table.num_rows:
        stats = storage.write_parquet_digest(table, storage.join(staging, path))
    else:
        stats = _write_empty_parquet(schema, storage.join(staging, path))
    return path, {"table": name, "rows": table.num_rows, "counts": table_counts(name, table), **stats}


def _write_empty_parquet(schema: pa.Schema, loc: str) -> dict[str, int | str]:
    """An empty table as a Parquet file with the schema and no row group (HF ``datasets`` fails on the empty row group
    ``pq.write_table`` writes); ``{"bytes", "digest"}``."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, schema, compression="zstd").close()
    data = sink.getvalue().to_pybytes()
    storage.write_bytes(loc, data)
    return {"bytes": len(data), "digest": storage.bytes_digest(data)}


def sum_live_files(staging: str, schemas: dict[str, pa.Schema]) -> TableSinkResult:
    records = read_writes(staging)
    result = TableSinkResult()
    for rec in records:
        result.counts.update(rec.get("counts", {}))  # per batch (retries, time); the files' own come below
    result.keys = keys_of_records(staging, records)
    for path, stats in sorted(live_files(records).items()):
        result.rows[stats["table"]] += stats["rows"]
        result.files[stats["table"]].append(path)
        result.counts.update(stats.get("counts", {}))
        result.stats[path] = stats
    for name, schema in schemas.items():
        if not result.files.get(name):
            path, stats = write_table_file(staging, name, "part-empty", schema.empty_table(), schema, no_counts)
            result.files[name].append(path)
            result.stats[path] = stats
    return result


def _carry_file(previous: str, prev_dir: str, name: str, f: str, schema: pa.Schema, key_column: str,
                value_set: pa.Array, staging: str, record_keys: str | None, table_counts: TableCounter,
                known: dict[str, Any] | None, rows_verified: bool) -> tuple[pa.Array, int, str] | None:
    """Carry one previous file's rows of ``value_set`` into ``staging``: by reference when every row is wanted and its
    bytes match the previous run's digest, else its wanted rows rewritten; a mismatching file is not carried (None)
    unless ``rows_verified`` (then rewritten). ``(keys found, rows, how)``, or None when it has none of the rows."""
    src = storage.join(prev_dir, f)
    part = f"{CARRIED_PREFIX}{stable_hash(previous, name, f, size=8)}"
    record = f"{part}-{name}"
    path = f"{name}/{part}.parquet"
    columns = [key_column] + ([record_keys] if record_keys and record_keys != key_column else [])
    try:
        if not storage.regular_file(src):
            raise ValueError("not a regular file")
        ids = storage.read_parquet(src, columns=columns)
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:  # damaged, or not a file we wrote
        log.warning("%s: unreadable (%s): not carried, its rows are done again", src, _one_line(exc))
        return pa.array([], pa.string()), 0, "unreadable"
    mask = _wanted(ids[key_column].combine_chunks(), value_set)
    n = pc.sum(mask).as_py() or 0
    if not n:
        return None
    found = ids.filter(mask)
    keys = found[record_keys].combine_chunks() if record_keys in found.column_names else pa.array([], pa.string())
    if storage.exists(storage.join(staging, WRITES_DIR, f"{record}.json")):
        return found[key_column].combine_chunks(), 0, "resumed"  # carried already by the run being resumed
    intact = known is not None and storage.file_digest(src) == known.get("digest")
    if known is not None and not intact:
        log.warning("%s: its bytes differ from what %s committed (damaged or edited): %s", src, previous,
                    "its verified rows are rewritten" if rows_verified else "not carried")
        if not rows_verified:
            return None
    if n == ids.num_rows and intact:
        how = storage.link_file(src, storage.join(staging, path))
        stats = {"table": name, **{k: known[k] for k in ("rows", "bytes", "digest", "counts") if k in known}}
    else:
        try:
            table = storage.read_parquet(src).filter(mask)
        except (OSError, ValueError, pa.ArrowException) as exc:  # its keys read, the rest of it does not
            log.warning("%s: unreadable (%s): not carried, its rows are done again", src, _one_line(exc))
            return pa.array([], pa.string()), 0, "unreadable"
        path, stats = write_table_file(staging, name, part, table, schema, table_counts)
        if intact:
            stats |= carried_from(known["digest"], mask)
        how = "rewritten"
    record_write(staging, record, {"rows": {name: n}, "files": {name: path}, "counts": {}, "stats": {path: stats}},
                 keys=keys)
    return found[key_column].combine_chunks(), n, how


def carried_from(digest: str, mask: pa.Array) -> dict[str, Any]:
    """A rewritten carried file's provenance (``files.json``): its rows are the ranges ``[start, stop)`` of the file
    with ``digest`` (whose row hashes a publish reuses, ``lake_state.carried_hashes``); nothing past too many ranges."""
    import numpy as np

    wanted = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), bool)  # as filter() drops nulls
    edges = np.flatnonzero(np.diff(np.r_[False, wanted, False].astype(np.int8)))
    if not len(edges) or len(edges) // 2 > MAX_CARRIED_RANGES:
        return {}
    return {CARRIED_FROM: {"digest": digest, "rows": edges.reshape(-1, 2).tolist()}}


def _one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _wanted(keys: pa.Array, value_set: pa.Array) -> pa.Array:
    """``pc.is_in(keys, value_set)``, hashing the smaller side (no hash table of the whole set per file)."""
    if len(value_set) <= 4 * len(keys):
        return pc.is_in(keys, value_set=value_set)
    here = value_set.filter(pc.is_in(value_set, value_set=keys))
    return pc.is_in(keys, value_set=here)


def carry_rows(previous: str, tables: dict[str, pa.Schema], key_column: str, keys: Iterable[str], staging: str,
               record_keys: str | None = None, table_counts: TableCounter = no_counts,
               rows_verified: bool = False) -> tuple[pa.Array, Counter]:
    """Carry the rows of ``previous``'s ``tables`` whose ``key_column`` is in ``keys`` into ``staging`` (``_carry_file``
    per file, each one recorded write, so ``finish`` counts it and a resumed run does not carry it twice): the distinct
    keys found (Arrow) and, per table, rows carried and files linked or rewritten."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):  # many keys: kept in Arrow, no Python set of them
        value_set = pc.unique(keys.cast(pa.string()))
        value_set = value_set.combine_chunks() if isinstance(value_set, pa.ChunkedArray) else value_set
    else:
        value_set = pa.array(sorted(set(keys)), pa.string())
    if not len(value_set):
        return pa.array([], pa.string()), Counter()
    index = files_index(previous)  # entries that are not what this tool writes are left out: not carried
    found: list[pa.Array] = []
    rows: Counter = Counter()
    calls = []
    for name, schema in tables.items():
        prev_dir = committed_table_dir(previous, name)
        for f in storage.listdir(prev_dir):
            if not f.endswith(".parquet"):
                continue
            known = index.get(name, {}).get(f) if index is not None else None
            if index is not None and known is None and not rows_verified:
                log.warning("%s/%s: not in %s's files.json, not carried", prev_dir, f, previous)
                continue
            calls.append((name, (previous, prev_dir, name, f, schema, key_column, value_set, staging, record_keys,
                                 table_counts, known, rows_verified)))
    for (name, _), got in zip(calls, in_tasks(_carry_file, [args for _, args in calls]), strict=True):
        if got is None:
            continue
        rows[f"files_{got[2]}"] += 1
        if got[2] == "unreadable":  # counted (carried_files.unreadable), its rows done again
            continue
        found.append(got[0].cast(pa.string()))
        rows[name] += got[1]
    return pc.unique(pa.chunked_array(found, pa.string())), rows


IO_TASK = Resources(cpus=1)  # a task of ``in_tasks``: one file's read, hash or rewrite


def ray_if_up() -> Any | None:
    """The ``ray`` module when this process has Ray up, else None, without importing Ray."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def in_tasks(fn: Callable, calls: list[tuple]) -> list:
    """``fn(*args)`` for each call: as Ray tasks when this driver has Ray up, else here."""
    ray = ray_if_up()
    if ray is None or len(calls) < 2:
        return [fn(*args) for args in calls]
    task = ray.remote(**ray_args(IO_TASK))(fn)
    shared: dict[int, Any] = {}  # an array every call takes (the keys) goes to the object store once
    calls = [tuple(shared.setdefault(id(a), ray.put(a)) if isinstance(a, pa.Array) else a for a in args)
             for args in calls]
    return ray.get([task.remote(*args) for args in calls])


install_runner(in_tasks)  # the lower floors' fan-outs (verify) run as Ray tasks when Ray is up


def _merge_files(staging: str, name: str, schema: pa.Schema, group: list[tuple[str, dict[str, Any]]]) -> str:
    """One compaction: ``group``'s files of ``name`` into one, recorded as replacing them (``runs.live_files``)."""
    paths = [p for p, _ in group]
    part = f"part-compact-{stable_hash(*paths, size=10)}"
    table = pa.concat_tables([storage.read_parquet(storage.join(staging, p)) for p in paths])
    path, stats = write_table_file(staging, name, part, table, schema, no_counts)
    counts: Counter = Counter()
    for _, st in group:
        counts.update(st.get("counts", {}))
    stats["counts"] = dict(counts)
    record_write(staging, f"{part}-{name}", {"rows": {}, "files": {}, "counts": {}, "keys": [],
                                             "stats": {path: stats}, "replaces": paths})
    fault_point("compact.recorded")  # the merged file is live, the files it replaced not yet deleted
    for p in paths:
        storage.remove(storage.join(staging, p))
    return path


def compact(staging: str, schemas: dict[str, pa.Schema], target_bytes: int, max_small_files: int) -> int:
    """Merge a table's small files (under a quarter of ``target_bytes``) into files of about ``target_bytes`` once there
    are over ``max_small_files``; returns the files merged away."""
    live = live_files(read_writes(staging))
    calls = []
    for name, schema in schemas.items():
        small = sorted((p, st) for p, st in live.items()
                       if st["table"] == name and st["rows"] and st.get("bytes", 0) < target_bytes // 4)
        if len(small) <= max_small_files:
            continue
        group: list[tuple[str, dict[str, Any]]] = []
        size = 0
        for p, st in small:
            if group and size + st.get("bytes", 0) > target_bytes:
                calls.append((staging, name, schema, group))
                group, size = [], 0
            group.append((p, st))
            size += st.get("bytes", 0)
        if len(group) > 1:
            calls.append((staging, name, schema, group))
    in_tasks(_merge_files, calls)
    return sum(len(c[3]) - 1 for c in calls)


def changed_files(run_dir: str, tables: Iterable[str]) -> list[str] | None:
    """Files of a committed run's ``tables`` whose bytes no longer match its ``files.json`` (or unlisted, or gone); None
    without ``files.json``. Hashing decodes nothing and runs as Ray tasks when Ray is up."""
    index = files_index(run_dir)
    if index is None:
        return None
    root = storage.normalize(run_dir)
    bad, calls = [], []
    for name in tables:
        listed = index.get(name, {})
        present = {f for f in storage.listdir(storage.join(root, name))  # a pipe or link is never hashed: changed
                   if f.endswith(".parquet") and storage.regular_file(storage.join(root, name, f))}
        bad += [f"{name}/{f}" for f in sorted(present ^ set(listed))]
        calls += [(f"{name}/{f}", listed[f]["digest"]) for f in sorted(present & set(listed))]
    digests = in_tasks(storage.file_digest, [(storage.join(root, rel),) for rel, _ in calls])
    return bad + [rel for (rel, want), got in zip(calls, digests, strict=True) if got != want]


FILES_INDEX = "files.json"  # a committed run's files: table -> name -> rows, bytes, digest, counts


def files_index(run_dir: str) -> dict[str, dict[str, dict[str, Any]]] | None:
    """A committed run's validated ``files.json`` (``runs.read_files_index``), or None: an entry not as this tool writes
    it is left out (its file untrusted), an unreadable one trusts no file."""
    index, problems = read_files_index(run_dir)
    for p in problems[:3]:
        log.warning("%s: %s", run_dir, p)
    return index


def write_files_index(staging: str, result: TableSinkResult, tables: Iterable[str]) -> None:
    """``files.json`` of a run about to commit: each file's rows, bytes, digest and counts (to carry and trust it)."""
    wanted = set(tables)
    index: dict[str, dict[str, Any]] = {name: {} for name in wanted}
    for path, stats in result.stats.items():
        name, _, fname = path.partition("/")
        if name in wanted:
            index[name][fname] = {k: v for k, v in stats.items() if k != "table"}
    storage.write_text(storage.join(staging, FILES_INDEX), json.dumps(index, sort_keys=True))
