"""``verbatim-batch publish``: a committed night (or chain run) as current-state Apache Iceberg tables.

    verbatim-batch publish nightly/ --warehouse lake/

For each published table (``lake.PUBLISHED``): the night's Parquet files are checked against the digests its run
recorded (a file changed since is refused before anything is written), its rows are compared with the table's
current rows by row hash (``lake_state``), and one transaction commits what changed as one snapshot tagged
``night-<run id>``: position deletes for the rows that left or changed, data files for the new ones (written by
Ray tasks on a cluster or from ``LOCAL_RAY_MIN_BYTES`` of Parquet, else in this process). A night whose files are
the current state's only tags the current snapshot.

Publishes to one local warehouse take turns (``lake.publish_lock``); a commit that loses a race compares the
night again with the table's new state. A publish killed before a commit leaves the table as it was.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from verbatim_batch.core import limits, storage, tables
from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.options import group, option
from verbatim_batch.core.redact import redact_text
from verbatim_batch.core.runs import MANIFEST_FILE, RUNS_DIR, current_run, read_files_index, read_manifest
from verbatim_batch.engine.lake import (
    CONTENT_PROP,
    FINGERPRINT_PROP,
    NIGHT_PROP,
    PUBLISHED,
    SOURCE_PROP,
    IcebergTarget,
    arrow_schema,
    catalog_faults,
    conform,
    ensure_table,
    fingerprint,
    is_published,
    night_properties,
    night_snapshot,
    open_catalog,
    publish_lock,
    retain,
    tag_of,
)
from verbatim_batch.engine.lake_convert import convert_tables
from verbatim_batch.engine.lake_state import (
    ROW_HASH,
    Change,
    cached_hashes,
    carried_hashes,
    commit_state,
    live_state,
    multiset_diff,
    plan_deletes,
    store_hashes,
)
from verbatim_batch.engine.lake_state import write_data_files as write_in_process
from verbatim_batch.engine.sink import CARRIED_FROM
from verbatim_batch.engine.stage import Command
from verbatim_batch.engine.telemetry.options import MetricsOptions

log = logging.getLogger(__name__)
# below this much Parquet a local publish writes in process (benchmarks/history/publish.md)
LOCAL_RAY_MIN_BYTES = 256 << 20
COMMIT_ATTEMPTS = 5  # a commit that lost a race with another writer is compared and tried again on the new state
# the tables a single stage run publishes, by its command
STAGE_RUN_TABLES = {"chunk": ("chunks",), "retrieve": ("retrieval",), "extract": ("pairs", "spans")}


@dataclass(kw_only=True)
class PublishJob(MetricsOptions):
    """Publish ``source`` (a nightly root's current night, a nightly or chain run folder, or a chunk, retrieve or
    extract run) to ``target``."""

    source: str = ""
    target: IcebergTarget = group(IcebergTarget, default_factory=IcebergTarget)
    address: str | None = option(None, "Ray cluster address", default_help="RAY_ADDRESS, else a local Ray")
    num_cpus: int | None = option(None, "CPUs for a local Ray", low=1, high=limits.WORKERS, default_help="all")
    convert: bool = option(False, "first convert tables the previous release wrote (a partition per night) to "
                           "current-state tables: the newest night becomes the current state, every earlier night "
                           "still readable becomes its tag")


@dataclass(frozen=True)
class Night:
    """What one publish reads: the night's id, its run folder, and the stage run holding each table."""

    night: str
    run_dir: str
    stages: dict[str, str] = field(default_factory=dict)


def find_night(source: str) -> Night:
    """The night ``source`` names: a nightly root (its current run), or a committed run folder (its run id)."""
    src = storage.normalize(source)
    if not storage.exists(src):
        raise FileNotFoundError(f"publish: {source} not found")
    if storage.exists(storage.join(src, MANIFEST_FILE)):
        run_dir = src
    elif storage.isdir(storage.join(src, RUNS_DIR)):
        run_id = current_run(src)
        if run_id is None:
            raise FileNotFoundError(f"{source} has no committed night yet (no CURRENT)")
        run_dir = storage.join(src, RUNS_DIR, run_id)
    else:
        raise ValueError(f"{source} is neither a nightly root nor a committed run folder (no manifest.json)")
    manifest = read_manifest(run_dir)
    command = manifest["command"]
    if command in ("nightly", "run"):
        stages = {name: storage.join(run_dir, spec.stage) for name, spec in PUBLISHED.items()}
    elif command in STAGE_RUN_TABLES:
        stages = {name: run_dir for name in STAGE_RUN_TABLES[command]}
    else:
        raise ValueError(f"{source} is a {command} run: publish takes a nightly root, a nightly or chain (run) "
                         f"folder, or a {', '.join(STAGE_RUN_TABLES)} run")
    return Night(manifest["run_id"], run_dir, stages)


def _conform_kept(batch: Any, name: str, night: str, keep: np.ndarray) -> Any:
    """A Ray batch of night rows, conformed, keeping the rows whose hash is in ``keep`` (the added ones)."""
    out = conform(batch, name, night)
    return out.filter(np.isin(out[ROW_HASH].to_numpy(), keep))


def write_added(table: Any, name: str, night: str, nights: NightFiles, added: dict[int, np.ndarray],
                job: PublishJob | None = None) -> list[Any]:
    """The added rows (row numbers per index into the night's files) written as uncommitted data files of
    ``table``, by Ray write tasks (with no ``job``: in this process). Returns their ``DataFile`` records."""
    if not added:
        return []
    if job is None:
        return write_in_process(table, (conform(storage.read_parquet(nights.files[i]), name, night).take(rows)
                                        for i, rows in sorted(added.items())))
    import ray

    from verbatim_batch.engine.iceberg_sink import DataFilesSink
    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.engine.resources import task_bounds
    from verbatim_batch.engine.restarts import Restarting

    keep = np.unique(np.concatenate([nights.hashes[i][rows] for i, rows in added.items()]))
    sink = DataFilesSink(table)
    init_ray(job.address, job.num_cpus)
    paths = [nights.files[i] for i in sorted(added)]
    fs, first = storage.resolve(paths[0])
    local = [first] + [storage.resolve(f)[1] for f in paths[1:]]
    bounds = task_bounds(Restarting.worker_restarts)  # retried a bounded number of times, as a stage's tasks
    ds = ray.data.read_parquet(local, filesystem=fs, ray_remote_args=bounds)
    ds = ds.map_batches(_conform_kept, batch_format="pyarrow", batch_size=None,
                        fn_kwargs={"name": name, "night": night, "keep": keep}, **bounds)
    ds.write_datasink(sink, ray_remote_args=bounds)
    return sink.data_files


def table_files(night: Night, name: str) -> list[str]:
    """The Parquet files of the night's table ``name``."""
    folder = storage.join(night.stages[name], name)
    return sorted(storage.join(folder, f) for f in storage.listdir(folder) if f.endswith(".parquet"))


@dataclass
class NightFiles:
    """A night's table as files: their paths, checked digests, and row hashes once read (``night_hashes``)."""

    files: list[str]
    digests: list[str]
    hashes: list[np.ndarray] = field(default_factory=list)
    carried: list[Any] = field(default_factory=list)  # per file: its files.json ``carried_from`` (or None)

    @property
    def content(self) -> str:
        """One digest of the night's rows: the same files (by their bytes) give the same content."""
        return tables.stable_hash(*sorted(self.digests), size=8)


def checked_files(night: Night, name: str) -> NightFiles:
    """The night's Parquet files of table ``name`` with their digests, each checked against the run's
    ``files.json``: a changed or unrecorded file is refused in one line naming ``verify``."""
    files = table_files(night, name)
    stage_dir = night.stages[name]
    index, problems = read_files_index(stage_dir)
    listed = (index or {}).get(name, {}) if index is not None else None
    digests, carried = [], []
    for path in files:
        digest = storage.file_digest(path)
        base = path.rsplit("/", 1)[-1]
        known = listed.get(base) if listed is not None else None
        if listed is not None and (known is None or known.get("digest") != digest):
            why = "is not in the run's files.json" if known is None else "differs from the digest the run recorded"
            raise ValueError(f"{name}/{base} of {stage_dir} {why} (changed after the commit?): nothing published; "
                             f"`verbatim-batch verify {night.run_dir}` lists what changed")
        digests.append(digest)
        carried.append(known.get(CARRIED_FROM) if known is not None else None)
    if listed is not None:
        missing = sorted(set(listed) - {p.rsplit("/", 1)[-1] for p in files})
        if missing or problems:
            what = f"files.json lists a file that is missing: {missing[0]}" if missing else problems[0]
            raise ValueError(f"{name}/ of {stage_dir}: {what}; nothing published; `verbatim-batch verify "
                             f"{night.run_dir}` lists what changed")
    else:
        log.warning("%s: the run has no files.json (an older release): its files are published unchecked", stage_dir)
    return NightFiles(files, digests, carried=carried)


def night_hashes(table: Any, name: str, night: str, nights: NightFiles) -> None:
    """Each night file's row hashes: recorded for its digest by an earlier publish, else (a carried file) those of
    the rows it took from an earlier one (``carried_hashes``), else read and hashed; then recorded."""
    key = list(PUBLISHED[name].key)
    nights.hashes = []
    for i, (path, digest) in enumerate(zip(nights.files, nights.digests, strict=True)):
        hashes = cached_hashes(table, digest)
        if hashes is None and i < len(nights.carried) and nights.carried[i] is not None:
            try:  # its key columns, as conform casts them
                keys = storage.read_parquet(path, columns=key).cast(
                    pa.schema([arrow_schema(name).field(k) for k in key]))
            except (KeyError, ValueError, pa.ArrowException):
                keys = None  # read and hashed below, where a bad column is reported
            hashes = carried_hashes(table, nights.carried[i], keys) if keys is not None else None
            if hashes is not None:
                store_hashes(table, digest, hashes, keys)
        if hashes is None:
            rows = conform(storage.read_parquet(path), name, night)
            hashes = rows[ROW_HASH].to_numpy()
            store_hashes(table, digest, hashes, rows.select(key))
        nights.hashes.append(hashes)


def night_change(table: Any, job: PublishJob, name: str, night: str, nights: NightFiles,
                 ray_writes: bool) -> Change:
    """What ``night`` changes in ``table``: deletes for the rows that left or changed, data files for new ones."""
    live = live_state(table)
    night_hashes(table, name, night, nights)
    old = np.concatenate([f.hashes[f.live] for f in live]) if live else np.zeros(0, np.int64)
    new = np.concatenate(nights.hashes) if nights.hashes else np.zeros(0, np.int64)
    gone, added = multiset_diff(old, new)
    change = plan_deletes(live, gone)
    per_file: dict[int, np.ndarray] = {}
    at = 0
    for i, h in enumerate(nights.hashes):
        rows = np.flatnonzero(added[at:at + len(h)])
        at += len(h)
        if len(rows):
            per_file[i] = rows
    change.added = write_added(table, name, night, nights, per_file, job if ray_writes else None)
    return change


def with_ray(job: PublishJob, night: Night) -> bool:
    """Whether the data files are written by Ray tasks: on a cluster, or from ``LOCAL_RAY_MIN_BYTES`` of Parquet
    (for less, even one Ray Data execution per table costs more than writing them here)."""
    import ray

    from verbatim_batch.engine.ray_env import started_locally

    if job.address or os.environ.get("RAY_ADDRESS") or (ray.is_initialized() and not started_locally()):
        return True
    total = 0
    for name in night.stages:
        for path in table_files(night, name):
            fs, local = storage.resolve(path)
            total += fs.get_file_info(local).size or 0
    return total >= LOCAL_RAY_MIN_BYTES


def _published(catalog: Any, job: PublishJob, night: Night, name: str) -> bool:
    """Whether table ``name`` already holds this night with the same contents (a refused table raises here)."""
    table = ensure_table(catalog, job.target.namespace_name, name)
    return is_published(table, night.night, fingerprint(read_manifest(night.stages[name])))


def _done(table: Any, namespace: str, name: str, night: Night, **facts: Any) -> dict[str, Any]:
    return {"table": f"{namespace}.{name}", "snapshot": night_snapshot(table, night.night), **facts}


def publish_table(catalog: Any, job: PublishJob, night: Night, name: str, nights: NightFiles,
                  ray_writes: bool = True) -> dict[str, Any]:
    """One table of the night: nothing when published with the same contents, else what changed committed as one
    snapshot tagged with the night. Returns what was done."""
    from pyiceberg.exceptions import CommitFailedException

    namespace = job.target.namespace_name
    table = ensure_table(catalog, namespace, name)
    digest = fingerprint(read_manifest(night.stages[name]))
    if is_published(table, night.night, digest):
        return _done(table, namespace, name, night, published=False)
    summary = {NIGHT_PROP: night.night, FINGERPRINT_PROP: digest, CONTENT_PROP: nights.content,
               SOURCE_PROP: redact_text(night.run_dir)[:500]}
    for attempt in range(COMMIT_ATTEMPTS):
        fault_point("publish.write")  # the night's changes about to be read and written
        if table.current_snapshot() is not None and table.properties.get(CONTENT_PROP) == nights.content:
            change = Change()  # the current state is this night's files: nothing to read or write
        else:
            change = night_change(table, job, name, night.night, nights, ray_writes)
        fault_point("publish.commit")  # data files written, nothing committed
        try:
            commit_state(table, change, summary, tag_of(night.night),
                         night_properties(table, night.night, digest, nights.content))
            break
        except CommitFailedException:
            table = catalog.load_table((namespace, name))
            if is_published(table, night.night, digest):  # another publish of the same night won the race
                return _done(table, namespace, name, night, published=False)
            if attempt == COMMIT_ATTEMPTS - 1:
                raise ValueError(f"{namespace}.{name}: other writers committed first {COMMIT_ATTEMPTS} times; "
                                 "nothing of this night was committed to it: publish again") from None
            log.warning("%s.%s: another writer committed first; comparing the night with its new state",
                        namespace, name)
    table = catalog.load_table((namespace, name))
    retained = retain(table, job.target.keep_nights) if job.target.keep_nights else {}
    return _done(table, namespace, name, night, published=True, rows=sum(f.record_count for f in change.added),
                 files=len(change.added), deleted=change.rows_deleted,
                 delete_files=len(change.deletes), bytes=sum(f.file_size_in_bytes for f in change.added),
                 written_by="ray" if ray_writes and change.added else "driver", **retained)


def run_publish(job: PublishJob) -> dict[str, Any]:
    """Publish ``job.source``'s night to ``job.target``, one commit per table not holding it yet. Returns
    ``{"night", "source", "tables", "converted"}``."""
    job.target.check()
    night = find_night(job.source)
    catalog = open_catalog(job.target)
    with catalog_faults(job.target), publish_lock(job.target):
        converted = convert_tables(catalog, job.target.namespace_name) if job.convert else []
        todo = [name for name in PUBLISHED if name in night.stages and not _published(catalog, job, night, name)]
        checked = {name: checked_files(night, name) for name in todo}  # every file, before anything is written
        ray_writes = bool(todo) and with_ray(job, night)
        done = [publish_table(catalog, job, night, name, checked[name], ray_writes) if name in checked
                else _done(catalog.load_table((job.target.namespace_name, name)), job.target.namespace_name, name,
                           night, published=False)
                for name in PUBLISHED if name in night.stages]
    return {"night": night.night, "source": night.run_dir, "tables": done, "converted": converted}


def print_published(job: PublishJob | None, result: dict[str, Any]) -> None:
    """What a publish did, a line per table."""
    for c in result.get("converted", []):
        print(f"{c['table']} converted to a current-state table: {c['nights']} nights as tags")
    print(f"night {result['night']} published from {result['source']}")
    for t in result["tables"]:
        if not t["published"]:
            what = f"already published (snapshot {t['snapshot']}): nothing to do"
        elif not (t["rows"] or t["deleted"]):
            what = f"nothing changed: tagged the current snapshot {t['snapshot']}"
        else:
            what = (f"snapshot {t['snapshot']}: {t['rows']} rows added in {t['files']} files (written by "
                    f"{t['written_by']}), {t['deleted']} deleted")
        print(f"  {t['table']:<18} {what}")


COMMAND = Command("publish", "publish a night's chunks, retrieval, pairs and spans as Apache Iceberg tables (one "
                  "snapshot per night; a night already published is left as it is)", PublishJob, run_publish,
                  positional=(("source", "a nightly root (its current night), a nightly or chain run folder, or a "
                               "chunk, retrieve or extract run"),), summary=print_published)
