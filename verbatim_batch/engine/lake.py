"""Publishing a night as Apache Iceberg tables: what is published, where, and the catalog's faults in one line.

Four tables (``<namespace>.chunks``, ``retrieval``, ``pairs``, ``spans``) hold the current state: one row per key
(``tables.PUBLISHED_KEYS``) of the night published last, with its ``night`` in front and ``row_hash`` last. A publish
commits one snapshot per table deleting the rows whose key left or changed and adding the new ones (``lake_state``);
each night is a tag ``night-<run id>`` with its fingerprint, so publishing it again is a no-op. ``retain`` keeps the
newest nights' tags and expires the rest. Tables of the previous release are refused with one line naming
``publish --convert`` (``lake_convert``). No Ray; pyiceberg (the ``iceberg`` extra) only when a catalog is opened.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from verbatim_batch.core import limits, storage, tables
from verbatim_batch.core.options import Declared, option
from verbatim_batch.core.redact import redact_text
from verbatim_batch.engine.lake_state import NIGHT, ROW_HASH, with_hashes

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DEFAULT_NAMESPACE = "verbatim"
DEFAULT_CATALOG = "verbatim"
CATALOG_FILE = "catalog.db"  # the SQL catalog (SQLite) a --warehouse folder holds by default
LOCK_FILE = ".publish.lock"  # in a local warehouse: publishes to it take turns
LOCK_WAIT_S = 600  # how long a publish waits for another one's turn on the same warehouse
MAX_NAMESPACE = 100  # characters: the namespace is a folder name in the warehouse
NIGHT_PROP, FINGERPRINT_PROP, SOURCE_PROP = "verbatim.night", "verbatim.fingerprint", "verbatim.source"
CONTENT_PROP = "verbatim.content"  # the digest of the night files the current state was made of
NIGHTS_PROP = "verbatim.nights"  # the published nights' tags, in publish order (JSON)
VERSION_PROP = "verbatim.schema-version"
TAG_PREFIX = "night-"
CONVERT_HINT = "verbatim-batch publish SOURCE --convert"  # with the same catalog options
NEEDS_EXTRA = "publishing needs the iceberg extra: pip install 'verbatim-batch[iceberg]'"


@dataclass(frozen=True)
class Published:
    """One published table: the run stage it comes from, its schema in ``tables.py`` and its key."""

    stage: str
    schema: pa.Schema
    key: tuple[str, ...]


# in commit order: spans last, so a reader of spans finds the chunks and pairs of its night already published
PUBLISHED: dict[str, Published] = {
    name: Published(stage, schema, tables.PUBLISHED_KEYS[name])
    for name, stage, schema in [("chunks", "chunks", tables.CHUNKS), ("retrieval", "retrieval", tables.RETRIEVAL),
                                ("pairs", "spans", tables.PAIRS), ("spans", "spans", tables.SPANS)]
}


class OldTables(ValueError):
    """A table written by the previous release (a partition per night): ``publish --convert`` converts it."""


@dataclass(frozen=True, kw_only=True)
class IcebergTarget(Declared):
    """Where nights are published: a catalog (by default pyiceberg's SQL catalog in ``WAREHOUSE/catalog.db``) and a
    namespace; ``publish`` and ``nightly`` (which publishes a committed night itself) take these options."""

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
        None, "nights kept readable by their tag: older nights' tags go, snapshots no kept tag names are expired "
        "and the files only they read are deleted (the current state is never touched)", low=1,
        high=limits.ROWS, default_help="all")

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
        if not self.namespace_name.replace("_", "").isalnum() or not self.namespace_name.isascii():
            raise ValueError(f"--namespace {self.namespace_name[:80]!r}: letters, digits and '_' only")
        if len(self.namespace_name) > MAX_NAMESPACE:
            raise ValueError(f"--namespace: {len(self.namespace_name)} characters, at most {MAX_NAMESPACE} (it "
                             "names a folder of the warehouse)")


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


def catalog_place(target: IcebergTarget) -> str:
    """The catalog as a line names it: its SQLite file, or its name."""
    uri = target.catalog_properties().get("uri", "")
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]
    return redact_text(uri) if uri else repr(target.catalog_name)


def fault_line(target: IcebergTarget, exc: BaseException) -> str | None:
    """One line for a catalog or warehouse fault (the file named, and what to do), or None for another error."""
    text = _first_line(exc)
    low = text.lower()
    db, folder = catalog_place(target), target.warehouse or "the warehouse"
    if type(exc).__module__.startswith("sqlalchemy"):
        if "locked" in low or "busy" in low:
            return (f"the Iceberg catalog {db} is locked by another process past its wait: let that process "
                    "finish (or find it: fuser on the file) and publish again")
        if "readonly" in low or "read-only" in low:
            return f"the Iceberg catalog {db} is read-only: make it and its folder writable, or use another --warehouse"
        if "not a database" in low or "malformed" in low or "no such table" in low:
            return (f"the Iceberg catalog {db} is damaged (not a SQLite catalog pyiceberg reads: {text[:120]}): "
                    "restore it from a backup, or publish to a new --warehouse")
        if "unable to open" in low:
            return f"cannot open the Iceberg catalog {db}: make its folder writable, or use another --warehouse"
        return f"the Iceberg catalog {db} failed: {redact_text(text[:200])}"
    if isinstance(exc, OSError):
        code = exc.errno
        if isinstance(exc, PermissionError) or code in (errno.EACCES, errno.EPERM, errno.EROFS) \
                or "permission denied" in low or "read-only file system" in low:
            return (f"cannot write to the warehouse {folder} ({text[:160]}): make it writable, or publish to "
                    "another --warehouse")
        if code == errno.ENAMETOOLONG or "name too long" in low:
            return f"the file system refuses a path under {folder} (name too long): use a shorter --namespace"
        if code == errno.ENOSPC or "no space" in low:
            return f"the warehouse {folder} is full ({text[:160]}): free space and publish again"
        return f"the warehouse {folder}: {redact_text(text[:200])}"
    return None


@contextlib.contextmanager
def catalog_faults(target: IcebergTarget) -> Iterator[None]:
    """Catalog and warehouse faults (a damaged, read-only or locked catalog, a warehouse it cannot write) as a
    ``ValueError`` of one line (exit 2 from the CLI); our own refusals pass as they are."""
    try:
        yield
    except (ValueError, NotImplementedError, FileNotFoundError):
        raise
    except Exception as exc:
        line = fault_line(target, exc)
        if line is None:
            raise
        raise ValueError(line) from None


def check_writable(target: IcebergTarget) -> None:
    """A local warehouse and its SQLite catalog must be writable: one line before anything is written."""
    if not target.warehouse or storage.is_remote(target.warehouse):
        return
    folder = target.warehouse
    db = catalog_place(target)
    for path in (folder, db) if not target.catalog_uri else (folder,):
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{'the Iceberg catalog' if path == db else 'the warehouse'} {path} is read-only: "
                             "make it writable, or publish to another --warehouse")


@contextlib.contextmanager
def publish_lock(target: IcebergTarget, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Publishes to one local warehouse take turns (``WAREHOUSE/.publish.lock``, an advisory lock): the later waits up
    to ``wait_s``, then stops with one line. Other catalogs rely on Iceberg's optimistic commits alone."""
    if not target.warehouse or storage.is_remote(target.warehouse):
        yield
        return
    import fcntl

    path = os.path.join(target.warehouse, LOCK_FILE)
    with catalog_faults(target):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ValueError(f"another publish to {target.warehouse} has held {path} for over "
                                     f"{wait_s:.0f} s: let it finish, then publish again") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def open_catalog(target: IcebergTarget) -> Catalog:
    """The catalog ``target`` names (a SQLite catalog in a local warehouse is created with its folder)."""
    require_extra()
    from pyiceberg.catalog import load_catalog

    props = target.catalog_properties()
    with catalog_faults(target):
        if props.get("type") == "sql" and target.warehouse:
            storage.makedirs(target.warehouse)
        check_writable(target)
        try:
            return load_catalog(target.catalog_name, **props)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"cannot open the Iceberg catalog {target.catalog_name!r}: "
                             f"{redact_text(_first_line(exc)[:300])}") from None


def arrow_schema(name: str) -> pa.Schema:
    """The Arrow schema of published table ``name``: ``night``, its ``tables.py`` columns, ``row_hash``."""
    source = PUBLISHED[name].schema
    return pa.schema([pa.field(NIGHT, pa.string(), nullable=False), *source,
                      pa.field(ROW_HASH, pa.int64(), nullable=False)])


def is_old_table(table: Table, name: str) -> bool:
    """Whether ``table`` is published table ``name`` as the previous release wrote it (a partition per night)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(table.schema(), include_field_ids=False).names == [NIGHT, *PUBLISHED[name].schema.names]


def create_table(catalog: Catalog, ident: tuple[str, str], name: str) -> None:
    """Published table ``name`` created under ``ident``: its schema, its key as identifier fields, unpartitioned;
    a table another publish created meanwhile is taken as it is."""
    from pyiceberg.exceptions import TableAlreadyExistsError

    with contextlib.suppress(TableAlreadyExistsError):
        with catalog.create_table_transaction(ident, schema=arrow_schema(name),
                                              properties={VERSION_PROP: tables.SCHEMA_VERSION,
                                                          "format-version": "2"}) as txn:
            with txn.update_schema() as schema:
                schema.set_identifier_fields(*PUBLISHED[name].key)


def ensure_table(catalog: Catalog, namespace: str, name: str) -> Table:
    """Published table ``name`` in ``namespace``, created when missing. A table of the previous release is
    refused with one line naming ``publish --convert``; one with other columns, with one naming --namespace."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError

    ident = (namespace, name)
    with contextlib.suppress(NamespaceAlreadyExistsError):  # another publish made it meanwhile
        catalog.create_namespace_if_not_exists(namespace)
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        create_table(catalog, ident, name)
        table = catalog.load_table(ident)
    if is_old_table(table, name):
        raise OldTables(f"{namespace}.{name} is a table of the previous release (a partition per night): convert "
                        f"the tables once with `{CONVERT_HINT}` and the same catalog options")
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


def tag_of(night: str) -> str:
    """The Iceberg tag of a published night."""
    return TAG_PREFIX + night


def night_tags(table: Table) -> list[str]:
    """The tags of the published nights, in the order they were published (``verbatim.nights``)."""
    try:
        listed = json.loads(table.properties.get(NIGHTS_PROP, "[]"))
    except ValueError:
        listed = []
    return [t for t in listed if isinstance(t, str) and t in table.metadata.refs]


def published_nights(table: Table) -> list[tuple[str, str, int]]:
    """``(night, fingerprint, snapshot id)`` of every night whose tag the table holds, in publish order."""
    return [(t[len(TAG_PREFIX):], table.properties.get(f"{FINGERPRINT_PROP}.{t}", ""),
             table.metadata.refs[t].snapshot_id) for t in night_tags(table)]


def is_published(table: Table, night: str, digest: str) -> bool:
    """Whether ``night`` was published with the same tables (``fingerprint``): a republish is a no-op."""
    tag = tag_of(night)
    return tag in table.metadata.refs and table.properties.get(f"{FINGERPRINT_PROP}.{tag}") == digest


def night_snapshot(table: Table, night: str) -> int | None:
    """The id of the snapshot tagged with ``night`` (the table as that night left it), or None."""
    ref = table.metadata.refs.get(tag_of(night))
    return ref.snapshot_id if ref is not None else None


def night_properties(table: Table, night: str, digest: str, content: str) -> dict[str, str]:
    """The table properties a publish of ``night`` sets: night, fingerprint by tag, content and publish order."""
    tag = tag_of(night)
    order = [t for t in night_tags(table) if t != tag] + [tag]
    return {NIGHT_PROP: night, f"{FINGERPRINT_PROP}.{tag}": digest, CONTENT_PROP: content,
            NIGHTS_PROP: json.dumps(order)}


def _snapshot_files(table: Table, snapshot: Any) -> set[str]:
    """Every file a snapshot reads: its manifest list, its manifests, and their live data and delete files."""
    files = {snapshot.manifest_list}
    for manifest in snapshot.manifests(table.io):
        files.add(manifest.manifest_path)
        files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return files


def retain(table: Table, keep: int) -> dict[str, int]:
    """Keep the tags of the last ``keep`` nights: older tags and fingerprints go, snapshots neither current nor tagged
    are expired, and the files only they read are deleted. Returns what went."""
    from pyiceberg.table.update import RemoveSnapshotRefUpdate

    order = night_tags(table)
    old = order[:-keep] if len(order) > keep else []
    if old:
        txn = table.transaction()
        txn._apply(tuple(RemoveSnapshotRefUpdate(ref_name=t) for t in old))
        txn.remove_properties(*[f"{FINGERPRINT_PROP}.{t}" for t in old if f"{FINGERPRINT_PROP}.{t}" in
                                table.properties])
        txn.set_properties({NIGHTS_PROP: json.dumps(order[len(old):])})
        table = txn.commit_transaction()
    current = table.current_snapshot()
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    doomed = [s for s in table.snapshots() if s.snapshot_id not in protected
              and (current is None or s.snapshot_id != current.snapshot_id)]
    if not doomed:
        return {"tags_removed": len(old), "snapshots_expired": 0, "files_deleted": 0}
    kept = set().union(*(_snapshot_files(table, s) for s in table.snapshots() if s not in doomed))
    gone = set().union(*(_snapshot_files(table, s) for s in doomed)) - kept
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in doomed]).commit()
    deleted = 0
    for path in sorted(gone):
        with contextlib.suppress(OSError):
            table.io.delete(path)
            deleted += 1
    return {"tags_removed": len(old), "snapshots_expired": len(doomed), "files_deleted": deleted}


def conform(batch: pa.Table, name: str, night: str) -> pa.Table:
    """A batch of run rows as published table ``name`` holds them: ``night`` in front, columns cast to their declared
    types (a nullable one an older run lacks as nulls), ``row_hash`` last."""
    schema = arrow_schema(name)
    columns = [pa.array([night] * batch.num_rows, pa.string())]
    for f in list(schema)[1:-1]:
        if f.name in batch.column_names:
            columns.append(batch[f.name].cast(f.type))
        elif f.nullable:
            columns.append(pa.nulls(batch.num_rows, f.type))
        else:
            raise ValueError(f"{name}: the run's table has no column {f.name}")
    columns.append(pa.array([0] * batch.num_rows, pa.int64()))
    return with_hashes(pa.Table.from_arrays(columns, schema=schema))
