"""Current-state Iceberg tables: what a night changes, and the one snapshot that changes only that.

Each row holds the ``night`` that last wrote it and a ``row_hash`` of its other columns. Publishing compares the
night's row hashes with the table's live rows (``live_state``) as multisets: rows the night lacks are deleted, rows
the table lacks added, the rest not rewritten; ``commit_state`` makes that one snapshot (v2 position deletes, the
added files, the tag). A night file's hashes are cached by its digest (``HASHES_DIR``, never stale), so a carried
file is not read again (``carried_hashes`` for one carried by rewriting rows); the cache may be deleted any time.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from pyiceberg.table import Table, Transaction

NIGHT = "night"  # which night last wrote a row
ROW_HASH = "row_hash"  # a 64-bit hash of a row's columns (all but night and itself)
HASHES_DIR = "verbatim-hashes"  # under the table's location: a night file's row hashes, by the file's digest
PATH_FIELD_ID, POS_FIELD_ID = 2147483546, 2147483545  # the position-delete file's columns (Iceberg spec)
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(PATH_FIELD_ID)}),
    pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}),
])
FLUSH_ROWS = 200_000  # added rows are written out in batches of about this many


def row_hashes(batch: pa.Table) -> np.ndarray:
    """A 64-bit hash (as int64) of each row of ``batch`` over its columns but ``night`` and ``row_hash``: rows
    with equal values have equal hashes, in any process (pandas' keyed SipHash of each column, combined)."""
    import pandas as pd

    columns: dict[str, Any] = {}
    for name in batch.column_names:
        if name in (NIGHT, ROW_HASH):
            continue
        col = batch[name]
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            columns[name] = pc.binary_join(col, "\x1f").to_numpy(zero_copy_only=False)
            columns[name + "\x00n"] = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        else:
            columns[name] = col.to_numpy(zero_copy_only=False)
    if not columns or batch.num_rows == 0:
        return np.zeros(batch.num_rows, np.int64)
    return pd.util.hash_pandas_object(pd.DataFrame(columns), index=False).to_numpy().view(np.int64)


def with_hashes(batch: pa.Table) -> pa.Table:
    """``batch`` (a published table's columns, ``row_hash`` last) with its ``row_hash`` column computed."""
    hashes = pa.array(row_hashes(batch), pa.int64())
    return batch.set_column(batch.schema.get_field_index(ROW_HASH), batch.schema.field(ROW_HASH), hashes)


# --- the table's live rows --------------------------------------------------------------------------------------


@dataclass
class LiveFile:
    """One data file of the current snapshot: its record, each position's row hash, and which positions live."""

    file: Any
    hashes: np.ndarray
    live: np.ndarray


def live_state(table: Table) -> list[LiveFile]:
    """Every data file of ``table``'s current snapshot with the hashes of its rows and which of them no delete
    file removes (reads the ``row_hash`` column and the position-delete files only)."""
    from pyiceberg.io.pyarrow import _read_deletes

    snap = table.current_snapshot()
    if snap is None:
        return []
    deletes: dict[str, dict[str, pa.ChunkedArray]] = {}
    out = []
    for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
        path = task.file.file_path
        with table.io.new_input(path).open() as fh:
            hashes = pq.read_table(fh, columns=[ROW_HASH])[ROW_HASH].to_numpy()
        live = np.ones(len(hashes), bool)
        for d in task.delete_files:
            if d.file_path not in deletes:
                deletes[d.file_path] = _read_deletes(table.io, d)
            positions = deletes[d.file_path].get(path)
            if positions is not None and len(positions):
                live[positions.to_numpy()] = False
        out.append(LiveFile(task.file, hashes, live))
    return out


def _occurrence(values: np.ndarray) -> np.ndarray:
    """For each value, how many equal values come before it (0 for a unique value)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1] if len(values) else np.array([], int)
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    occ = np.empty(len(values), np.int64)
    occ[order] = np.arange(len(values)) - run_start
    return occ


def multiset_diff(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(gone, added)``: the ``old`` hashes ``new`` lacks and the ``new`` ones ``old`` lacks, repeats counted."""
    import pandas as pd

    old_keys = pd.MultiIndex.from_arrays([old, _occurrence(old)])
    new_keys = pd.MultiIndex.from_arrays([new, _occurrence(new)])
    return ~old_keys.isin(new_keys), ~new_keys.isin(old_keys)


# --- a night's row hashes, cached by file digest ---------------------------------------------------------------


def _cache_path(table: Table, digest: str) -> str:
    return f"{table.location().rstrip('/')}/{HASHES_DIR}/{digest.replace(':', '-')}.parquet"


def _read_cache(table: Table, digest: str, columns: list[str]) -> pa.Table | None:
    try:
        with table.io.new_input(_cache_path(table, digest)).open() as fh:
            return pq.read_table(fh, columns=columns)
    except (OSError, KeyError, pa.ArrowException):  # never recorded, removed, or recorded without these columns
        return None


def cached_hashes(table: Table, digest: str) -> np.ndarray | None:
    """The row hashes recorded for a night file with this digest, or None (never recorded, or removed)."""
    got = _read_cache(table, digest, [ROW_HASH])
    return None if got is None else got[ROW_HASH].to_numpy()


KEY_HASH = "key_hash"  # in the cache: a 64-bit hash of each row's key columns (``row_hashes`` of them)


def carried_hashes(table: Table, provenance: Any, keys: pa.Table) -> np.ndarray | None:
    """The row hashes of a night file that a run carried by rewriting an earlier file's rows (``provenance``: the
    earlier digest and its ``[start, stop)`` row ranges; ``keys``: the night file's key columns), as recorded for the
    earlier file; None (read and hash it) when there is no record or the ranges' recorded keys are not ``keys``."""
    if not isinstance(provenance, dict) or not isinstance(provenance.get("digest"), str):
        return None
    ranges = provenance.get("rows")
    if not isinstance(ranges, list) or not ranges or not all(
            isinstance(r, list) and len(r) == 2 and all(type(v) is int for v in r) for r in ranges):
        return None
    bounds = np.asarray(ranges, np.int64).reshape(-1, 2)
    starts, stops = bounds[:, 0], bounds[:, 1]
    if (starts < 0).any() or (stops <= starts).any() or (starts[1:] < stops[:-1]).any() \
            or int((stops - starts).sum()) != keys.num_rows:
        return None
    source = _read_cache(table, provenance["digest"], [ROW_HASH, KEY_HASH])
    if source is None or int(stops[-1]) > source.num_rows:
        return None
    rows = np.concatenate([np.arange(a, b) for a, b in bounds])
    if not np.array_equal(source[KEY_HASH].to_numpy()[rows], row_hashes(keys)):
        return None
    return source[ROW_HASH].to_numpy()[rows]


def store_hashes(table: Table, digest: str, hashes: np.ndarray, keys: pa.Table) -> None:
    """Cache a night file's row and key-column hashes under its digest (a failure to write is no error)."""
    with contextlib.suppress(OSError, pa.ArrowException):
        with table.io.new_output(_cache_path(table, digest)).create(overwrite=True) as fh:
            pq.write_table(pa.table({ROW_HASH: pa.array(hashes, pa.int64()),
                                     KEY_HASH: pa.array(row_hashes(keys), pa.int64())}), fh)


# --- the commit ------------------------------------------------------------------------------------------------


@dataclass
class Change:
    """What a night changes in one table: positions to delete per data file, files left empty, added data files."""

    deletes: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: list[Any] = field(default_factory=list)
    added: list[Any] = field(default_factory=list)
    rows_deleted: int = 0

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.dropped or self.added)


def plan_deletes(live: Sequence[LiveFile], gone: np.ndarray) -> Change:
    """The deletes of ``gone`` (a flag per live row, in ``live``'s order): position deletes for a file that keeps
    rows, the whole file for one that keeps none."""
    change = Change()
    at = 0
    for f in live:
        positions = np.flatnonzero(f.live)
        doomed = positions[gone[at:at + len(positions)]]
        at += len(positions)
        if not len(doomed):
            continue
        change.rows_deleted += len(doomed)
        if len(doomed) == len(positions):
            change.dropped.append(f.file)
        else:
            change.deletes[f.file.file_path] = doomed
    return change


def write_delete_files(table: Table, deletes: dict[str, np.ndarray]) -> list[Any]:
    """One Iceberg position-delete file per data file in ``deletes`` (its path bounds name that file, so a reader
    opens it only with that file). Returns their ``DataFile`` records."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    out = []
    provider = table.location_provider()
    for data_path, positions in sorted(deletes.items()):
        path = provider.new_data_location(f"{uuid.uuid4()}-deletes.parquet")
        rows = pa.table([pa.array([data_path] * len(positions), pa.string()),
                         pa.array(np.sort(positions), pa.int64())], schema=DELETE_SCHEMA)
        with table.io.new_output(path).create(overwrite=True) as fh:
            pq.write_table(rows, fh)
        bound = data_path.encode("utf-8")
        out.append(DataFile.from_args(
            content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET,
            partition=Record(), record_count=len(positions), file_size_in_bytes=len(table.io.new_input(path)),
            lower_bounds={PATH_FIELD_ID: bound}, upper_bounds={PATH_FIELD_ID: bound},
            spec_id=table.metadata.default_spec_id, sort_order_id=None, equality_ids=None, key_metadata=None))
    return out


def write_data_files(table: Table, batches: Iterable[pa.Table]) -> list[Any]:
    """The added rows (conformed, hashed) as ``table``'s data files, in batches of ``FLUSH_ROWS`` (not committed)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    out: list[Any] = []
    pending: list[pa.Table] = []

    def flush() -> None:
        if pending:
            out.extend(_dataframe_to_data_files(table_metadata=table.metadata, df=pa.concat_tables(pending),
                                                io=table.io))
            pending.clear()

    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
        if sum(b.num_rows for b in pending) >= FLUSH_ROWS:
            flush()
    flush()
    return out


def _producer(txn: Transaction, summary: dict[str, str], delete_files: list[Any]) -> Any:
    """A pyiceberg overwrite that also adds position-delete files (in a delete manifest), and that a conflicting
    commit does not rebase: the night is compared again with the table's new state instead (``publish``)."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestWriterV2
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    class StateOverwrite(_OverwriteFiles):
        def _manifests(self) -> list[Any]:
            manifests = super()._manifests()
            if delete_files:
                meta = self._transaction.table_metadata
                with DeleteManifestWriter(meta.spec(), self.schema(), self.new_manifest_output(), self._snapshot_id,
                                          self._compression) as writer:
                    for f in delete_files:
                        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED,
                                                           snapshot_id=self._snapshot_id, sequence_number=None,
                                                           file_sequence_number=None, data_file=f))
                manifests.append(writer.to_manifest_file())
            return manifests

        def _summary(self, snapshot_properties: dict[str, str] = summary) -> Any:
            added = self._added_data_files
            self._added_data_files = [*added, *delete_files]  # the summary counts the delete files too
            try:
                return super()._summary(snapshot_properties)
            finally:
                self._added_data_files = added

        def _refresh_for_retry(self) -> None:
            raise CommitFailedException("another writer committed to the table first")

    has_parent = txn.table_metadata.current_snapshot() is not None
    return StateOverwrite(operation=Operation.OVERWRITE if has_parent else Operation.APPEND, transaction=txn,
                          io=txn._table.io, snapshot_properties=summary)


def commit_state(table: Table, change: Change, summary: dict[str, str], tag: str,
                 properties: dict[str, str]) -> int:
    """One atomic commit: ``change`` as one snapshot (none when empty) with ``summary``, the tag ``tag`` on it (on the
    current one when nothing changed) and ``properties``; returns the tagged snapshot's id."""
    from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
    from pyiceberg.table.update import AssertRefSnapshotId, SetSnapshotRefUpdate

    txn = table.transaction()
    current = table.current_snapshot()
    if change.empty and current is not None:
        # nothing changed: no data file, no snapshot; the main branch must still be where it was compared
        snapshot_id = current.snapshot_id
        txn._apply((), (AssertRefSnapshotId(snapshot_id=snapshot_id, ref=MAIN_BRANCH),))
    else:  # (an empty first night commits an empty snapshot, so that its tag has one to name)
        delete_files = write_delete_files(table, change.deletes)
        with _producer(txn, summary, delete_files) as producer:
            for f in change.dropped:
                producer.delete_data_file(f)
            for f in change.added:
                producer.append_data_file(f)
        snapshot_id = producer.snapshot_id
    # the tag set (or moved) in the same commit; the catalog's swap of the table's metadata makes the whole
    # commit fail when another writer committed since this table was loaded
    txn._apply((SetSnapshotRefUpdate(snapshot_id=snapshot_id, ref_name=tag, type=SnapshotRefType.TAG),))
    txn.set_properties(properties)
    txn.commit_transaction()
    return snapshot_id


def table_change(table: Table, rows: pa.Table) -> Change:
    """What making ``rows`` (conformed, hashed) ``table``'s state changes, the added rows written (not committed)."""
    live = live_state(table)
    old = np.concatenate([f.hashes[f.live] for f in live]) if live else np.zeros(0, np.int64)
    gone, added = multiset_diff(old, rows[ROW_HASH].to_numpy())
    change = plan_deletes(live, gone)
    change.added = write_data_files(table, [rows.filter(pa.array(added))])
    return change
