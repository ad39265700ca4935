"""The Ray Datasink of a stage's tables (``StageTableSink``): runs the stage's writer on each block, writes its
tables and records the write (``sink``). Apart from ``sink`` because it needs Ray Data at import, which the
runner imports only when a stage writes (the CLI parses its options without Ray)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from ray.data import Datasink
from ray.data.block import BlockAccessor

from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.runs import record_write
from verbatim_batch.core.tables import stable_hash
from verbatim_batch.engine.batches import strip_internal
from verbatim_batch.engine.sink import TableCounter, TableSinkResult, no_counts, sum_live_files, write_table_file


class StageTableSink(Datasink):
    """Runs a stage's writer on each block (fused with the read, so its outputs stay out of the object store) and writes
    ``<staging>/<table>/part-<key>.parquet``, the key a hash of the block's row keys. Each write ends with a record
    ``_writes/part-<key>.json`` after its files, so a write is done exactly when its record exists."""

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
        out: dict[str, Any] = {"rows": {}, "files": {}, "counts": dict(reported), "keys": keys, "stats": {}}
        t_write = time.perf_counter()
        for name, schema in self.schemas.items():
            parts = [o[name] for o in outputs if name in o and o[name].num_rows]
            if not parts:
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            path, stats = write_table_file(self.staging, name, f"part-{key}", table, schema, self.table_counts)
            out["rows"][name], out["files"][name], out["stats"][path] = table.num_rows, path, stats
            fault_point("sink.write")  # some of this write's tables are on disk, its record is not
        if any(k.startswith("time_ms.") for k in reported):  # stages that report their time get the write's too
            out["counts"]["time_ms.write"] = round(1000 * (time.perf_counter() - t_write))
        if keys or reported.get("stage_retries"):
            record_write(self.staging, f"part-{key}", out)
            fault_point(f"sink.recorded:{next(iter(self.schemas))}")  # this write is done, the stage is not
        return {k: v for k, v in out.items() if k not in ("keys", "stats")}

    def finish(self) -> TableSinkResult:
        """Sum every live file (writes, resumed, carried and compacted) into one result; every table exists, even
        empty."""
        return sum_live_files(self.staging, self.schemas)
