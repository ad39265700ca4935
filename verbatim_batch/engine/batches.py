"""What travels with a batch between a stage's actors and the sink: retries and per-batch figures ride in
internal columns, stripped in one place (``strip_internal``) before rows are written or handed to users."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core.faults import fault_point

log = logging.getLogger(__name__)

RETRIES_COLUMN = "_retries"  # retried attempts of a batch (first row)
COUNT_PREFIX = "_count_"  # figures of a batch (time, padding) in ``_count_<name>`` columns (first row)


def with_counts(table: pa.Table, counts: dict[str, int]) -> pa.Table:
    """``table`` with ``counts`` as ``_count_<name>`` columns on its first row, which the sink adds into the
    manifest."""
    for name, value in counts.items():
        marks = [0] * table.num_rows
        if marks:
            marks[0] = int(value)
        table = table.append_column(COUNT_PREFIX + name, pa.array(marks, pa.int64()))
    return table


def with_retries(call: Callable[[pa.Table], pa.Table], batch: pa.Table, retries: int, what: str) -> pa.Table:
    """``call(batch)``, retried up to ``retries`` times with backoff on an exception (a flaky file system, an OOM on a
    shared GPU); the retries ride in ``RETRIES_COLUMN`` (first row) for the manifest; the last failure raises."""
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
    return with_retry_count(out, attempt)


def with_retry_count(table: pa.Table, retries: int) -> pa.Table:
    marks = [0] * table.num_rows
    if marks:
        marks[0] = retries
    return table.append_column(RETRIES_COLUMN, pa.array(marks, pa.int32()))


def strip_internal(table: pa.Table) -> tuple[pa.Table, Counter]:
    """``table`` without its internal columns, and what they carried (retries and ``_count_`` figures, summed)."""
    counts: Counter = Counter()
    internal = [c for c in table.column_names if c == RETRIES_COLUMN or c.startswith(COUNT_PREFIX)]
    for name in internal:
        total = pc.sum(table[name]).as_py() or 0
        if total:
            counts["stage_retries" if name == RETRIES_COLUMN else name[len(COUNT_PREFIX):]] += total
    return (table.drop_columns(internal) if internal else table), counts


def strip_internal_batch(table: pa.Table) -> pa.Table:
    """``strip_internal`` for ``map_batches``: the rows only."""
    return strip_internal(table)[0]


def as_table(name: str) -> Callable[[pa.Table], dict[str, pa.Table]]:
    """A sink writer for a stage whose batches are rows of one table."""

    def wrap(table: pa.Table) -> dict[str, pa.Table]:
        return {name: table}

    return wrap


def drop_keys(batch: pa.Table, column: str, keys: pa.Array) -> pa.Table:
    """Rows whose ``column`` is not in ``keys`` (work a resumed or incremental run already has)."""
    return batch.filter(pc.invert(pc.is_in(batch[column], value_set=keys)))
