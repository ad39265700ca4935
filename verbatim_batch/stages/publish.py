"""``verbatim-batch publish``: a committed night (or chain run) as Apache Iceberg tables, written through Ray.

    verbatim-batch publish nightly/ --warehouse lake/

For each published table (``publish.PUBLISHED``) the night's Parquet files are read by Ray and written as
Iceberg data files by Ray's own Iceberg datasink (the ``write()`` that ``Dataset.write_iceberg`` runs in each
write task), so a cluster writes them in parallel; then one pyiceberg transaction per table commits them as one
snapshot that replaces the night's partition (``publish.commit_night``). ``write_iceberg`` itself is not used
for the commit: its overwrite is a delete snapshot and an append snapshot, it commits nothing for a night
without rows (the night's old partition would stay), and it can commit a schema change before any data. A
publish killed before its commit leaves data files no snapshot refers to, and the table as it was. A small local
publish (no cluster, under ``LOCAL_RAY_MIN_BYTES`` of Parquet) runs the same datasink ``write()`` in this process
instead, as ``verify`` does.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.options import group, option
from verbatim_batch.core.runs import MANIFEST_FILE, RUNS_DIR, current_run, read_manifest
from verbatim_batch.engine.lake import (
    PUBLISHED,
    IcebergTarget,
    commit_night,
    conform,
    ensure_table,
    fingerprint,
    is_published,
    night_snapshot,
    open_catalog,
)
from verbatim_batch.engine.telemetry.options import MetricsOptions

log = logging.getLogger(__name__)
# a local publish of less Parquet than this writes in this process: through a local Ray it cost 36-53 tree CPU-s
# against 4.5-5.5 in process for a 20-paper night (benchmarks/history/publish.md)
LOCAL_RAY_MIN_BYTES = 256 << 20
COMMIT_ATTEMPTS = 3  # a commit that lost a race with another writer of the table is tried again on the new state
# the tables a single stage run publishes, by its command
STAGE_RUN_TABLES = {"chunk": ("chunks",), "retrieve": ("retrieval",), "extract": ("pairs", "spans")}


@dataclass(kw_only=True)
class PublishJob(MetricsOptions):
    """Publish ``source`` (a nightly root's current night, a nightly or chain run folder, or a chunk, retrieve or
    extract run) to ``target``."""

    source: str = ""
    target: IcebergTarget = group(IcebergTarget, default_factory=IcebergTarget)
    address: str | None = option(None, "Ray cluster address", default_help="RAY_ADDRESS, else a local Ray")
    num_cpus: int | None = option(None, "CPUs for a local Ray", low=1, default_help="all")


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


def write_data_files(table: Any, name: str, night: str, files: list[str], job: PublishJob | None = None) -> list[Any]:
    """The night's Parquet ``files`` of table ``name`` written as data files of ``table`` (not committed): by Ray
    write tasks, or, with no ``job`` (a small local publish), by the same datasink's ``write`` in this process, a
    file at a time. Returns their pyiceberg ``DataFile`` records."""
    import ray

    from verbatim_batch.engine.iceberg_sink import DataFilesSink
    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.engine.resources import task_bounds
    from verbatim_batch.engine.restarts import Restarting

    sink = DataFilesSink(table)
    if job is None:
        return [f for path in files
                for f in sink.write([conform(storage.read_parquet(path), name, night)], None).data_files]
    init_ray(job.address, job.num_cpus)
    fs, first = storage.resolve(files[0])
    paths = [first] + [storage.resolve(f)[1] for f in files[1:]]
    bounds = task_bounds(Restarting.worker_restarts)  # retried a bounded number of times, as a stage's tasks
    ds = ray.data.read_parquet(paths, filesystem=fs, ray_remote_args=bounds)
    ds = ds.map_batches(conform, batch_format="pyarrow", batch_size=None, fn_kwargs={"name": name, "night": night},
                        **bounds)
    ds.write_datasink(sink, ray_remote_args=bounds)
    return sink.data_files


def table_files(night: Night, name: str) -> list[str]:
    """The Parquet files of the night's table ``name``."""
    folder = storage.join(night.stages[name], name)
    return sorted(storage.join(folder, f) for f in storage.listdir(folder) if f.endswith(".parquet"))


def with_ray(job: PublishJob, night: Night) -> bool:
    """Whether the data files are written by Ray tasks: on a cluster (``--address``, ``RAY_ADDRESS``, or this
    process joined to one), or when the night's tables hold ``LOCAL_RAY_MIN_BYTES`` of Parquet or more. A smaller
    local publish writes them in this process, also where the night's own local Ray is up: a local Ray's start,
    and even one Ray Data execution per table, cost more than writing them."""
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


def publish_table(catalog: Any, job: PublishJob, night: Night, name: str, ray_writes: bool = True) -> dict[str, Any]:
    """One table of the night: nothing when it was published with the same contents, else its data files
    written (by Ray tasks, or in this process without ``ray_writes``) and committed as one snapshot. Returns what
    was done."""
    from pyiceberg.exceptions import CommitFailedException

    namespace = job.target.namespace_name
    table = ensure_table(catalog, namespace, name)
    stage_dir = night.stages[name]
    digest = fingerprint(read_manifest(stage_dir))
    if is_published(table, night.night, digest):
        return {"table": f"{namespace}.{name}", "snapshot": night_snapshot(table, night.night), "published": False}
    files = table_files(night, name)
    data_files = write_data_files(table, name, night.night, files, job if ray_writes else None) if files else []
    fault_point("publish.commit")  # data files written, nothing committed
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            snapshot = commit_night(table, night.night, digest, data_files, job.target.keep_nights, night.run_dir)
            break
        except CommitFailedException:
            table = catalog.load_table((namespace, name))
            if is_published(table, night.night, digest):  # another publish of the same night won the race
                return {"table": f"{namespace}.{name}", "snapshot": night_snapshot(table, night.night),
                        "published": False}
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            log.warning("%s.%s: another writer committed first; committing again on its snapshot", namespace, name)
    return {"table": f"{namespace}.{name}", "snapshot": snapshot, "published": True,
            "rows": sum(f.record_count for f in data_files), "files": len(data_files),
            "written_by": "ray" if ray_writes else "driver"}


def run_publish(job: PublishJob) -> dict[str, Any]:
    """Publish ``job.source``'s night to ``job.target``: one snapshot per table (chunks, retrieval, pairs, spans,
    in that order), none for a table that already holds this night. Returns ``{"night", "source", "tables":
    [...]}``."""
    job.target.check()
    night = find_night(job.source)
    catalog = open_catalog(job.target)
    ray_writes = with_ray(job, night)
    done = [publish_table(catalog, job, night, name, ray_writes) for name in PUBLISHED if name in night.stages]
    return {"night": night.night, "source": night.run_dir, "tables": done}
