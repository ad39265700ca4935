"""Writing a stage's tables: a Ray Datasink that runs a stage on each block and records every completed
write (so a resumed run skips it), the carry of unchanged rows from a previous run, and batch retries."""

from __future__ import annotations

import logging
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
from ..chunking import FORCED_SPLIT, OVERSIZED_BLOCK, UNDERSIZED
from ..faults import fault_point
from ..index.folder import CARRIED_PREFIX
from ..runs import WRITES_DIR, committed_table_dir, read_writes, record_write
from ..tables import stable_hash

log = logging.getLogger(__name__)



@dataclass
class TableSinkResult:
    rows: Counter = field(default_factory=Counter)
    files: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter = field(default_factory=Counter)


RETRIES_COLUMN = "_retries"  # stage actors report retried batches in this column (stripped before writing)
COUNT_PREFIX = "_count_"  # stage actors report figures of a batch (time, padding) in ``_count_<name>`` columns


def with_counts(table: pa.Table, counts: dict[str, int]) -> pa.Table:
    """``table`` with ``counts`` as ``_count_<name>`` columns on its first row; the sink adds them into the
    manifest's counts (``time_ms.<part>`` for where time went) and strips them before writing."""
    for name, value in counts.items():
        marks = [0] * table.num_rows
        if marks:
            marks[0] = int(value)
        table = table.append_column(COUNT_PREFIX + name, pa.array(marks, pa.int64()))
    return table



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
        reported: Counter = Counter()
        outputs = []
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if RETRIES_COLUMN in table.column_names:
                retries += pc.sum(table[RETRIES_COLUMN]).as_py() or 0
                table = table.drop_columns([RETRIES_COLUMN])
            for name in [c for c in table.column_names if c.startswith(COUNT_PREFIX)]:
                reported[name[len(COUNT_PREFIX):]] += pc.sum(table[name]).as_py() or 0
                table = table.drop_columns([name])
            outputs.append(self.stage(table))
        outputs = [o for o in outputs if any(t.num_rows for t in o.values())]
        outputs.sort(key=lambda o: min(self._keys(o), default=""))  # same order whatever order blocks came in
        keys = sorted(k for o in outputs for k in self._keys(o))
        key = stable_hash(*keys, size=10)
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": {}, "keys": keys}
        counts: Counter = Counter({"stage_retries": retries} if retries else {})
        counts.update(reported)
        t_write = time.perf_counter()
        for name, schema in self.schemas.items():
            parts = [o[name] for o in outputs if name in o and o[name].num_rows]
            if not parts:
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            counts.update(table_counts(name, table))
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


def table_counts(name: str, table: pa.Table) -> dict[str, int]:
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
    elif name == "embeddings":
        counts["tokens"] += pc.sum(table["n_tokens"]).as_py() or 0
        counts["truncated"] += pc.sum(table["truncated"].cast(pa.int64())).as_py() or 0
    elif name == "retrieval":
        counts.update(f"rows.{m}" for m in table["method"].to_pylist())
    elif name == "rejects":
        counts.update(f"rejects.{r.split(':', 1)[0].split(' (', 1)[0]}" for r in table["reason"].to_pylist())
    return dict(counts)


def with_retries(call: Callable[[pa.Table], pa.Table], batch: pa.Table, retries: int, what: str) -> pa.Table:
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


def as_table(name: str):
    def wrap(table: pa.Table) -> dict[str, pa.Table]:
        return {name: table}

    return wrap


def drop_keys(batch: pa.Table, column: str, keys: pa.Array) -> pa.Table:
    """Rows whose ``column`` is not in ``keys`` (work a resumed or incremental run already has)."""
    return batch.filter(pc.invert(pc.is_in(batch[column], value_set=keys)))


def carry_rows(previous: str, tables: dict[str, pa.Schema], key_column: str, keys: Iterable[str], staging: str,
               record_keys: str | None = None) -> tuple[set[str], Counter]:
    """Copy the rows of ``previous``'s ``tables`` whose ``key_column`` is in ``keys`` into ``staging``.

    Each previous file becomes one ``part-carried-*`` file and one recorded write (its ``record_keys`` column
    gives the write's row keys), so the sink's ``finish`` counts carried rows like written ones and a resumed
    run does not copy a file twice. Returns the keys found and the rows copied now, per table.
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


def table_entries(result: TableSinkResult, names: Iterable[str]) -> dict[str, dict[str, int]]:
    """The manifest's ``tables`` entries (rows, files) of a sink's result."""
    return {name: {"rows": result.rows[name], "files": len(result.files[name])} for name in names}
