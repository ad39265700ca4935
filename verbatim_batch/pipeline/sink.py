"""Writing a stage's tables: a Ray Datasink that runs a stage's writer on each block and records every
completed write (so a resumed run skips it), and the carry of unchanged rows from a previous run.

The sink knows nothing of any stage: the stage hands it a writer (block -> tables), the schemas, the key
column recorded per table, and a function of its own that counts a written table (``table_counts``).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Datasink
from ray.data.block import BlockAccessor

from .. import storage
from ..faults import fault_point
from ..runs import CARRIED_PREFIX, WRITES_DIR, committed_table_dir, read_writes, record_write
from ..tables import stable_hash
from .batches import strip_internal

TableCounter = Callable[[str, pa.Table], dict[str, int]]


def no_counts(name: str, table: pa.Table) -> dict[str, int]:
    return {}


@dataclass
class TableSinkResult:
    """Every completed write of a staging folder, summed: rows and files per table, counts, keys covered."""

    rows: Counter = field(default_factory=Counter)
    files: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)
    keys: set[str] = field(default_factory=set)


class StageTableSink(Datasink):
    """Runs a stage's writer on each block and writes ``<staging>/<table>/part-<key>.parquet``.

    The writer (e.g. ``IngestStage``) maps one Arrow batch to several tables (papers, chunks, quarantine).
    Running it inside the write task, fused with the read, keeps its outputs out of Ray's object store. The
    file key hashes the row keys a write task holds, so the same input gives the same file names.

    Every write ends with a record in ``_writes/part-<key>.json`` (row counts, counts, the row keys it
    covers), written after its table files: a write is done exactly when its record exists.
    ``runs.completed_keys`` reads them back so a resumed run skips that work, and ``finish`` (called by the
    runner, once) sums them, old writes and carried files included.
    """

    def __init__(self, writer: Callable[[pa.Table], dict[str, pa.Table]], staging: str,
                 schemas: dict[str, pa.Schema], key_columns: dict[str, str],
                 table_counts: TableCounter = no_counts) -> None:
        self.writer, self.staging, self.schemas = writer, staging, schemas
        self.key_columns, self.table_counts = key_columns, table_counts

    def _keys(self, output: dict[str, pa.Table]) -> list[str]:
        return [
            str(v) for name, col in self.key_columns.items() if name in output for v in output[name][col].to_pylist()
        ]

    def write(self, blocks: Iterable, ctx) -> dict[str, Any]:
        reported: Counter = Counter()
        outputs = []
        for block in blocks:
            table, counts = strip_internal(BlockAccessor.for_block(block).to_arrow())
            reported.update(counts)
            outputs.append(self.writer(table))
        outputs = [o for o in outputs if any(t.num_rows for t in o.values())]
        outputs.sort(key=lambda o: min(self._keys(o), default=""))  # same order whatever order blocks came in
        keys = sorted(k for o in outputs for k in self._keys(o))
        key = stable_hash(*keys, size=10)
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": {}, "keys": keys}
        counts: Counter = Counter(reported)
        t_write = time.perf_counter()
        for name, schema in self.schemas.items():
            parts = [o[name] for o in outputs if name in o and o[name].num_rows]
            if not parts:
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            counts.update(self.table_counts(name, table))
            folder = storage.join(self.staging, name)
            storage.makedirs(folder)
            storage.write_parquet(table if table.schema == schema else table.cast(schema),
                                  storage.join(folder, f"part-{key}.parquet"))
            out["rows"][name] = table.num_rows
            out["files"][name] = f"{name}/part-{key}.parquet"
            fault_point("sink.write")  # some of this write's tables are on disk, its record is not
        if any(k.startswith("time_ms.") for k in reported):  # stages that report their time get the write's too
            counts["time_ms.write"] += round(1000 * (time.perf_counter() - t_write))
        out["counts"] = dict(counts)
        if keys or counts.get("stage_retries"):
            record_write(self.staging, f"part-{key}", out)
            fault_point(f"sink.recorded:{next(iter(self.schemas))}")  # this write is done, the stage is not
        return {k: v for k, v in out.items() if k != "keys"}

    def finish(self) -> TableSinkResult:
        """Sum every completed write (this run's, a resumed run's, carried files) into one result; every
        table exists, even when empty."""
        result = TableSinkResult()
        for rec in read_writes(self.staging):
            result.rows.update(rec["rows"])
            for name, path in rec["files"].items():
                result.files[name].append(path)
            result.counts.update(rec["counts"])
            result.keys.update(rec.get("keys", []))
        for name, schema in self.schemas.items():
            if not result.files.get(name):
                folder = storage.join(self.staging, name)
                storage.makedirs(folder)
                storage.write_parquet(schema.empty_table(), storage.join(folder, "part-empty.parquet"))
                result.files[name].append(f"{name}/part-empty.parquet")
        return result


def carry_rows(previous: str, tables: dict[str, pa.Schema], key_column: str, keys: Iterable[str], staging: str,
               record_keys: str | None = None, table_counts: TableCounter = no_counts) -> tuple[set[str], Counter]:
    """Copy the rows of ``previous``'s ``tables`` whose ``key_column`` is in ``keys`` into ``staging``.

    Each previous file becomes one ``part-carried-*`` file and one recorded write (its ``record_keys`` column
    gives the write's row keys), so ``finish`` counts carried rows like written ones and a resumed run does
    not copy a file twice. Returns the keys found and the rows copied now, per table.
    """
    value_set = pa.array(sorted(set(keys)), pa.string())
    found: set[str] = set()
    rows: Counter = Counter()
    for name, schema in tables.items():
        prev_dir = committed_table_dir(previous, name)
        for f in storage.listdir(prev_dir):
            if not f.endswith(".parquet"):
                continue
            part = f"{CARRIED_PREFIX}{stable_hash(previous, name, f, size=8)}"
            table = storage.read_parquet(storage.join(prev_dir, f))
            table = table.filter(pc.is_in(table[key_column], value_set=value_set))
            found.update(table[key_column].to_pylist())
            record = f"{part}-{name}"
            if not table.num_rows or storage.exists(storage.join(staging, WRITES_DIR, f"{record}.json")):
                continue  # nothing to carry here, or carried already by the run being resumed
            path = f"{name}/{part}.parquet"
            storage.makedirs(storage.join(staging, name))
            storage.write_parquet(table if table.schema == schema else table.cast(schema), storage.join(staging, path))
            record_write(staging, record, {
                "rows": {name: table.num_rows}, "files": {name: path}, "counts": table_counts(name, table),
                "keys": [str(k) for k in table[record_keys].to_pylist()] if record_keys in table.column_names else []})
            rows[name] += table.num_rows
    return found, rows
