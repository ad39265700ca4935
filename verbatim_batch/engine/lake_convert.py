"""``publish --convert``: tables of the previous release (a partition per night) as current-state tables.

Converting replays the old table's nights, oldest first (each read from the snapshot that published it), into a new
current-state table, one commit and one tag per night; a night whose snapshot or files are gone is left out. The
new table is built under a temporary name, then replaces the old one; a conversion cut short is started again (or,
past the drop, finished) by running it again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from verbatim_batch.engine.lake import (
    FINGERPRINT_PROP,
    NIGHT_PROP,
    PUBLISHED,
    conform,
    create_table,
    is_old_table,
    night_properties,
    tag_of,
)
from verbatim_batch.engine.lake_state import NIGHT, commit_state, table_change

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

TEMP_SUFFIX = "__converting"


def old_nights(table: Table) -> list[tuple[str, str, int]]:
    """``(night, fingerprint, snapshot id)`` of each night an old table published, in order, its current night last."""
    last: dict[str, tuple[str, int]] = {}
    for snap in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        night = summary.get(NIGHT_PROP)
        if night is not None:
            last.pop(night, None)
            last[night] = (summary.get(FINGERPRINT_PROP, ""), snap.snapshot_id)
    current = table.properties.get(NIGHT_PROP)
    if current in last:
        last[current] = last.pop(current)
    return [(night, fp, snap) for night, (fp, snap) in last.items()]


def _night_rows(table: Table, night: str, snapshot_id: int) -> pa.Table | None:
    from pyiceberg.expressions import EqualTo

    try:
        return table.scan(snapshot_id=snapshot_id, row_filter=EqualTo(NIGHT, night)).to_arrow()
    except (OSError, ValueError):  # the snapshot's files are gone (expired and cleaned up)
        return None


def convert_table(catalog: Catalog, namespace: str, name: str) -> dict[str, Any] | None:
    """Convert one table of the previous release (or finish a cut-short conversion); None if nothing to convert."""
    from pyiceberg.exceptions import NoSuchTableError

    ident, temp = (namespace, name), (namespace, name + TEMP_SUFFIX)

    def load(i: tuple[str, str]) -> Table | None:
        try:
            return catalog.load_table(i)
        except NoSuchTableError:
            return None

    old, partial = load(ident), load(temp)
    if old is None and partial is not None:  # cut short after the old table was dropped: only the rename is left
        catalog.rename_table(temp, ident)
        return {"table": ".".join(ident), "nights": len(json.loads(partial.properties.get("verbatim.nights", "[]")))}
    if old is None or not is_old_table(old, name):
        return None
    if partial is not None:
        catalog.purge_table(temp)
    create_table(catalog, temp, name)
    new = catalog.load_table(temp)
    nights = 0
    for night, fp, snapshot_id in old_nights(old):
        rows = _night_rows(old, night, snapshot_id)
        if rows is None:
            continue
        batch = conform(rows.drop_columns([NIGHT]), name, night)
        change = table_change(new, batch)
        summary = {NIGHT_PROP: night, FINGERPRINT_PROP: fp, "verbatim.converted": "true"}
        commit_state(new, change, summary, tag_of(night), night_properties(new, night, fp, ""))
        new = catalog.load_table(temp)
        nights += 1
    catalog.purge_table(ident)
    catalog.rename_table(temp, ident)
    return {"table": ".".join(ident), "nights": nights}


def convert_tables(catalog: Catalog, namespace: str) -> list[dict[str, Any]]:
    """Every published table of ``namespace`` that the previous release wrote, converted."""
    return [done for name in PUBLISHED if (done := convert_table(catalog, namespace, name)) is not None]
