"""Publishing a night as Apache Iceberg tables: what is published, where, and the one commit per table.

A published night is one snapshot of each of four Iceberg tables, ``<namespace>.chunks``, ``retrieval``,
``pairs`` and ``spans``: the rows of that night's tables with a ``night`` column (the run id published) in
front, partitioned by night (and extractor, or retrieval method). Each snapshot replaces that night's partition
(deletes its files, adds the new ones) in one commit, and records the night and a fingerprint of the run's
tables in its summary (``verbatim.night``, ``verbatim.fingerprint``): publishing the same night again finds it
there and commits nothing. Earlier nights stay in the table (``keep_nights`` drops the oldest in the same
snapshot), and every earlier snapshot stays readable (time travel, ``night_snapshot``).

The schemas are those of ``tables.py`` (``arrow_schema``): one declaration. This module holds no Ray: the data
files are written by ``pipeline.publish`` (Ray's Iceberg datasink), and committed here (``commit_night``).
pyiceberg is the ``iceberg`` extra, imported only when a catalog is opened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from verbatim_batch.core import storage, tables
from verbatim_batch.core.options import Declared, option
from verbatim_batch.core.redact import redact_text

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

NIGHT = "night"  # the partition column every published table starts with: the run id of the night
DEFAULT_NAMESPACE = "verbatim"
DEFAULT_CATALOG = "verbatim"
CATALOG_FILE = "catalog.db"  # the SQL catalog (SQLite) a --warehouse folder holds by default
NIGHT_PROP, FINGERPRINT_PROP, SOURCE_PROP = "verbatim.night", "verbatim.fingerprint", "verbatim.source"
VERSION_PROP = "verbatim.schema-version"
NEEDS_EXTRA = "publishing needs the iceberg extra: pip install 'verbatim-batch[iceberg]'"


@dataclass(frozen=True)
class Published:
    """One published table: the run stage it comes from, its schema in ``tables.py`` and its partition columns
    after ``night``."""

    stage: str
    schema: pa.Schema
    partition: tuple[str, ...] = ()


# in commit order: spans last, so a reader of spans finds the chunks and pairs of its night already published
PUBLISHED: dict[str, Published] = {
    "chunks": Published("chunks", tables.CHUNKS),
    "retrieval": Published("retrieval", tables.RETRIEVAL, ("method",)),
    "pairs": Published("spans", tables.PAIRS, ("extractor",)),
    "spans": Published("spans", tables.SPANS, ("extractor",)),
}


@dataclass(frozen=True, kw_only=True)
class IcebergTarget(Declared):
    """Where nights are published: a catalog (by default pyiceberg's SQL catalog in ``WAREHOUSE/catalog.db``)
    and a namespace. ``publish`` takes these options, and so does ``nightly``: a night given a warehouse or a
    catalog publishes itself once it is committed."""

    warehouse: str | None = option(
        None, "publish to Apache Iceberg tables here (a folder, or an object-store URI with --catalog-uri): "
        "pyiceberg's SQL catalog in WAREHOUSE/catalog.db (SQLite) unless --catalog-uri names another",
        path=True, writes=True, metavar="DIR")
    catalog_uri: str | None = option(
        None, "the Iceberg catalog's URI: sqlite:///FILE or postgresql://... (SQL catalog), http(s)://... (REST), "
        "thrift://... (Hive)", default_help="sqlite:///WAREHOUSE/catalog.db")
    catalog: str | None = option(
        None, "the catalog's name; without --warehouse and --catalog-uri, the catalog pyiceberg is configured with "
        "under this name (.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* variables: Glue, REST, ...)",
        default_help=DEFAULT_CATALOG)
    namespace: str | None = option(None, "the namespace of the tables chunks, retrieval, pairs and spans",
                                   default_help=DEFAULT_NAMESPACE)
    keep_nights: int | None = option(
        None, "nights kept in the tables' current snapshot: publishing a night drops older nights' partitions in "
        "the same snapshot (earlier snapshots still read them)", low=1, default_help="all")

    @property
    def catalog_name(self) -> str:
        return self.catalog or DEFAULT_CATALOG

    @property
    def namespace_name(self) -> str:
        return self.namespace or DEFAULT_NAMESPACE

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg's ``load_catalog`` properties (empty: the named catalog as pyiceberg is configured)."""
        props: dict[str, str] = {}
        if self.catalog_uri:
            props["uri"] = self.catalog_uri
        elif self.warehouse:
            if storage.is_remote(self.warehouse):
                raise ValueError(f"--warehouse {self.warehouse}: the default SQLite catalog must live on a local "
                                 "disk; give --catalog-uri (a SQL database, a REST or Hive catalog) for an "
                                 "object-store warehouse")
            props = {"type": "sql", "uri": "sqlite:///" + storage.join(self.warehouse, CATALOG_FILE)}
        if self.warehouse:
            props["warehouse"] = self.warehouse if storage.is_remote(self.warehouse) else "file://" + self.warehouse
        return props

    def check(self) -> None:
        """One-line refusals before anything runs: the extra missing, a namespace that is no name."""
        require_extra()
        self.catalog_properties()
        if not self.namespace_name.replace("_", "").isalnum():
            raise ValueError(f"--namespace {self.namespace_name!r}: letters, digits and '_' only")


def require_extra() -> None:
    """``NotImplementedError`` (one line, exit 2 from the CLI) when pyiceberg is not installed; a ValueError (one
    line) when its configuration file, which it reads on import, is not YAML it accepts."""
    try:
        import pyiceberg.catalog  # noqa: F401
    except ImportError:
        raise NotImplementedError(NEEDS_EXTRA) from None
    except Exception as exc:
        if not type(exc).__module__.startswith("strictyaml"):  # pyiceberg parses .pyiceberg.yaml with strictyaml
            raise
        raise ValueError("pyiceberg's configuration file (.pyiceberg.yaml, in PYICEBERG_HOME, the home folder or "
                         f"the current folder) is not YAML it accepts: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:2])[:200] if lines else type(exc).__name__


def open_catalog(target: IcebergTarget) -> Catalog:
    """The catalog ``target`` names (a SQLite catalog in a local warehouse is created with its folder)."""
    require_extra()
    from pyiceberg.catalog import load_catalog

    props = target.catalog_properties()
    if props.get("type") == "sql" and target.warehouse:
        storage.makedirs(target.warehouse)
    try:
        return load_catalog(target.catalog_name, **props)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"cannot open the Iceberg catalog {target.catalog_name!r}: "
                         f"{redact_text(str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)}") \
            from None


def arrow_schema(name: str) -> pa.Schema:
    """The Arrow schema of published table ``name``: ``night``, then the columns of its ``tables.py`` schema."""
    source = PUBLISHED[name].schema
    return pa.schema([pa.field(NIGHT, pa.string(), nullable=False), *source])


def ensure_table(catalog: Catalog, namespace: str, name: str) -> Table:
    """Published table ``name`` in ``namespace``, created (schema from ``arrow_schema``, partitioned by night and
    the table's partition columns) when missing. A table of that name with other columns is refused."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    ident = (namespace, name)
    catalog.create_namespace_if_not_exists(namespace)
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        try:
            with catalog.create_table_transaction(ident, schema=arrow_schema(name),
                                                  properties={VERSION_PROP: tables.SCHEMA_VERSION}) as txn:
                with txn.update_spec() as spec:
                    for column in (NIGHT, *PUBLISHED[name].partition):
                        spec.add_identity(column)
        except TableAlreadyExistsError:  # another publish made it meanwhile
            pass
        table = catalog.load_table(ident)
    problem = schema_problem(table, name)
    if problem:
        raise ValueError(f"{namespace}.{name} exists and is not a table of ours ({problem}): publish to another "
                         "--namespace")
    return table


def _plain(t: pa.DataType) -> pa.DataType:
    """Large and small variants as one (Iceberg has one string type)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_plain(t.value_type))
    return t


def schema_problem(table: Table, name: str) -> str | None:
    """Why ``table``'s schema is not ``arrow_schema(name)`` (column names, types, required), or None."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    have = schema_to_pyarrow(table.schema(), include_field_ids=False)
    want = arrow_schema(name)
    if have.names != want.names:
        return f"columns {have.names}, expected {want.names}"
    for h, w in zip(have, want, strict=True):
        if _plain(h.type) != _plain(w.type) or h.nullable != w.nullable:
            return f"column {h.name} is {h.type}{'' if h.nullable else ' not null'}, expected {w.type}"
    return None


def fingerprint(stage_manifest: dict[str, Any]) -> str:
    """What identifies a night's table contents: its stage run's id, commit time and table counts."""
    return tables.stable_hash(str(stage_manifest.get("run_id")), str(stage_manifest.get("created_at")),
                              json.dumps(stage_manifest.get("tables", {}), sort_keys=True), size=8)


def published_nights(table: Table) -> list[tuple[str, str, int]]:
    """``(night, fingerprint, snapshot id)`` of every publish in the current snapshot's history, oldest first."""
    from pyiceberg.table.snapshots import ancestors_of

    snap = table.current_snapshot()
    if snap is None:
        return []
    out = []
    for s in ancestors_of(snap, table.metadata):
        night = s.summary.get(NIGHT_PROP) if s.summary is not None else None
        if night is not None:
            out.append((night, s.summary.get(FINGERPRINT_PROP) or "", s.snapshot_id))
    return out[::-1]


def is_published(table: Table, night: str, digest: str) -> bool:
    """Whether ``night`` was published with the same tables (``fingerprint``): a republish is a no-op."""
    latest = [fp for n, fp, _ in published_nights(table) if n == night]
    return bool(latest) and latest[-1] == digest


def night_snapshot(table: Table, night: str) -> int | None:
    """The id of the snapshot that published ``night`` last (``table.scan(snapshot_id=...)`` reads the table
    as it was then), or None."""
    found = [snap for n, _, snap in published_nights(table) if n == night]
    return found[-1] if found else None


def _partition_night(data_file: Any) -> str | None:
    return data_file.partition[0] if data_file.partition is not None and len(data_file.partition) else None


def commit_night(table: Table, night: str, digest: str, data_files: list[Any], keep_nights: int | None = None,
                 source: str = "") -> int:
    """One snapshot: the files of ``night``'s partition (and, with ``keep_nights``, of nights older than the
    newest ``keep_nights``) deleted, ``data_files`` added, the night and its fingerprint in the snapshot's
    summary and ``verbatim.night`` in the table's properties, committed atomically (a commit that fails, or a
    process killed before it, leaves the table's current snapshot as it was). Returns the snapshot id."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo

    newest_first = list(dict.fromkeys([night, *(n for n, _, _ in reversed(published_nights(table)))]))
    keep = set(newest_first[1:keep_nights])  # this night's own partition is replaced either way
    scan = table.scan(row_filter=EqualTo(NIGHT, night) if keep_nights is None else AlwaysTrue())
    doomed = [task.file for task in scan.plan_files()
              if _partition_night(task.file) == night or (keep_nights is not None
                                                           and _partition_night(task.file) not in keep)]
    summary = {NIGHT_PROP: night, FINGERPRINT_PROP: digest, SOURCE_PROP: redact_text(source)[:500]}
    txn = table.transaction()
    txn.set_properties({NIGHT_PROP: night})
    with txn.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
        for data_file in doomed:
            overwrite.delete_data_file(data_file)
        for data_file in data_files:
            overwrite.append_data_file(data_file)
    txn.commit_transaction()
    snap = table.current_snapshot()
    return snap.snapshot_id if snap is not None else 0


def conform(batch: pa.Table, name: str, night: str) -> pa.Table:
    """A batch of run rows as published table ``name`` holds them: ``night`` in front, every column cast to its
    declared type (a column a run written before it existed lacks, when nullable, as nulls)."""
    schema = arrow_schema(name)
    columns = [pa.array([night] * batch.num_rows, pa.string())]
    for field in list(schema)[1:]:
        if field.name in batch.column_names:
            columns.append(batch[field.name].cast(field.type))
        elif field.nullable:
            columns.append(pa.nulls(batch.num_rows, field.type))
        else:
            raise ValueError(f"{name}: the run's table has no column {field.name}")
    return pa.Table.from_arrays(columns, schema=schema)
