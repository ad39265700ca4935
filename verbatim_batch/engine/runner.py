"""The one owner of a run: every run-writing command goes through ``run_stage`` (the stage contract it runs is
``engine.stage``). A stage declares only what is its own; the runner does the rest for every stage alike:

1. a rerun with the ``run_id`` of a committed run returns that run's manifest and does nothing else;
2. ``plan``, then refuses an output folder inside an input folder;
3. stages into a hidden folder named after the run id and bound to the settings' hash: a killed run
   resumed with other settings is refused (``runs.SettingsChangedError``), never mixed;
4. (a ``TableStage``) carries unchanged rows from ``previous``, skips the keys a killed run with this id
   completed, starts Ray only when something is left to do, writes through the sink, checks every input key is
   accounted for (rows in = new + carried + resumed) and adds the standard counts; (a ``Stage``) ``execute``;
5. writes the manifest (the stage's resolved ``resources`` in its ``runtime``) and the report, and commits
   atomically. A ``CompositeStage``'s folder is claimed and bound to the settings first, its manifest written
   last, and ``on_committed`` runs after the commit (and on a no-op rerun).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import storage
from verbatim_batch.core.options import input_paths, options_of
from verbatim_batch.core.redact import redact
from verbatim_batch.core.runs import (
    CARRIED_PREFIX,
    acquire_lock,
    build_manifest,
    check_output_names,
    claim_composite,
    committed_run,
    completed_keys,
    expect_tables,
    jsonable,
    new_run_id,
    release_lock,
    safe_run_id,
    staged,
    write_manifest,
)
from verbatim_batch.core.tables import config_hash
from verbatim_batch.engine.progress import Progress
from verbatim_batch.engine.resources import task_bounds
from verbatim_batch.engine.restarts import Restarting
from verbatim_batch.engine.sink import carry_rows, compact, no_counts, sum_live_files, write_files_index
from verbatim_batch.engine.stage import (
    CompositeStage,
    Outcome,
    Plan,
    Stage,
    StageContext,
    StageResult,
    TableStage,
)
from verbatim_batch.engine.telemetry import accounting, perf, session
from verbatim_batch.engine.worker_faults import stopped

log = logging.getLogger(__name__)


def write_report(run_dir: str, manifest: dict[str, Any]) -> None:
    from verbatim_batch.report.build import write_report as write

    write(run_dir, manifest)


def refuse_output_inside_inputs(output: str, inputs: Iterable[str]) -> None:
    """A run folder inside one of its own input folders would be read back as input by the next run (and a
    folder the user owns would fill with ours): refused."""
    if storage.is_remote(output):
        return
    out = os.path.realpath(output)
    for path in inputs:
        if not path or storage.is_remote(path) or not os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        if out == real or out.startswith(real.rstrip(os.sep) + os.sep):
            raise ValueError(f"--output {output} is inside the input folder {path}: choose an output outside it")


def resolve_reads(stage: Stage) -> None:
    """Each run ``stage`` reads (``Stage.reads``) checked by the tables it holds before anything else is read; a
    chain's folder given for one is replaced by its stage folder that holds them."""
    flags = {of.field: of.flag for of in options_of(type(stage.job)) if of.group is None}
    changes = {}
    for name, tables in stage.reads.items():
        if not hasattr(stage.job, name):
            raise TypeError(f"stage {type(stage).__name__} reads {name!r}, which {type(stage.job).__name__} lacks")
        value = getattr(stage.job, name)
        if value:
            found = expect_tables(value, flags.get(name, name), tables)
            if found != value:
                changes[name] = found
    if changes:
        stage.job = dataclasses.replace(stage.job, **changes)


_OUTER: list[str | None] = [None]  # the run id the outermost run of this process uses (given or generated)
_DEPTH = [0]  # runs going on in this process: a chain's stages run inside the chain's run


def outer_run_id() -> str | None:
    """The run id of the outermost run this process started last (a generated one too): what an interrupted
    command names so that "rerun with the same --run-id" can be done."""
    return _OUTER[0]


def run_stage(stage: Stage) -> tuple[str, dict[str, Any]]:
    """Run ``stage`` into ``stage.job.output``; returns ``(path, manifest)`` of the committed run."""
    if _DEPTH[0] == 0:
        _OUTER[0] = stage.job.run_id
    _DEPTH[0] += 1
    try:
        return _run_stage(stage)
    finally:
        _DEPTH[0] -= 1


def _run_stage(stage: Stage) -> tuple[str, dict[str, Any]]:
    job = stage.job
    t0 = time.perf_counter()
    if job.run_id is not None:
        safe_run_id(job.run_id)
    if job.previous and not stage.takes_previous:
        raise ValueError(f"{stage.command} takes no --previous")
    output = storage.normalize(job.output)
    if done := committed_run(output, job.run_id):
        return output, stage.on_committed(output, done) if isinstance(stage, CompositeStage) else done
    check_output_names(output, job.run_id)  # names and paths the file system can hold, before anything is written
    refuse_output_inside_inputs(output, input_paths(job))  # before any input is listed or read
    resolve_reads(stage)
    window = perf.open_window()  # the performance report's figures: CPU-s of every process, memory, GPU
    try:
        return _run(stage, output, window, t0)
    except Exception as exc:  # lost workers or nodes past their bound: one line (``worker_faults``)
        if (fault := stopped(stage.command, job, exc)) is None or fault is exc:
            raise
        raise fault from None
    finally:
        perf.discard(window)


def _restarts(job: Any, resources: Any) -> int:
    """The bound on a stage's lost tasks: its resolved resources', else the job's ``--worker-restarts``."""
    if resources is not None:
        return resources.restarts
    restarts = getattr(job, "worker_restarts", None)
    return Restarting.worker_restarts if restarts is None else restarts


def _run(stage: Stage, output: str, window: perf.Window | None, t0: float) -> tuple[str, dict[str, Any]]:
    job = stage.job
    plan = stage.plan()
    config = dict(plan.config) | ({"previous": job.previous} if job.previous else {})
    inputs = [*plan.inputs, *([job.previous] if job.previous else [])]
    refuse_output_inside_inputs(output, inputs)
    run_id = job.run_id or new_run_id(stage.command, config)
    if _DEPTH[0] == 1 and isinstance(stage, CompositeStage):  # bound to its folder: a rerun with it resumes (an
        _OUTER[0] = run_id  # unnamed stage run's staging is removed when it fails: it has no id to give)
    settings = config_hash(config)
    resources = stage.resolved()
    runtime = {**plan.runtime, **({"resources": dataclasses.asdict(resources)} if resources else {})}
    if isinstance(stage, CompositeStage):
        lock = acquire_lock(output, run_id)
        try:
            folder = claim_composite(output, run_id, settings, overwrite=job.overwrite)
            ctx = StageContext(job=job, run_id=run_id, staging=folder, config=config, started=t0,
                               resources=resources)
            manifest = _manifest(stage, run_id, config, inputs, stage.execute(plan, ctx), t0, folder, window,
                                 runtime)
            write_manifest(folder, manifest, on_commit=write_report)
        finally:
            release_lock(lock)
        return folder, stage.on_committed(folder, manifest)
    with staged(output, overwrite=job.overwrite, run_id=job.run_id, resume=stage.resumable,
                settings_hash=settings) as run:
        ctx = StageContext(job=job, run_id=run_id, staging=run.staging, config=config, started=t0,
                           resources=resources)
        if isinstance(stage, TableStage):
            result = _run_table_stage(stage, plan, ctx)
        else:
            result = stage.execute(plan, ctx)
        manifest = _manifest(stage, run_id, config, inputs, result, t0, run.staging, window, runtime)
        path = run.commit(manifest, on_commit=write_report)
        session.record(stage.command, manifest["metrics"])
        return path, manifest


def _manifest(stage: Stage, run_id: str, config: dict[str, Any], inputs: list[str], result: StageResult,
              t0: float, staging: str, window: perf.Window | None,
              runtime: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's manifest, with its metrics (what is exported for it) and performance report; ``runtime``
    (the plan's runtime options, credentials in URLs redacted) is recorded beside the settings, never hashed."""
    timings = {**result.timings_s, "total": time.perf_counter() - t0}
    manifest = build_manifest(
        run_id=run_id, command=stage.command, config=config | result.config, inputs=inputs,
        tables=result.tables, counts=result.counts, timings_s=timings)
    manifest.update(result.manifest)
    if runtime:
        manifest["runtime"] = redact(jsonable(dict(runtime)))
    counts = manifest["counts"]
    if isinstance(stage, CompositeStage):  # its stages' runs hold their own rows and bytes
        manifest["metrics"] = {"duration_seconds": round(timings["total"], 3)}
    else:
        manifest["metrics"] = accounting.stage_metrics(
            counts, timings, stage.outcomes, accounting.read_bytes(counts, inputs),
            accounting.written_bytes(staging))
    rows = manifest["metrics"].get("rows", {})
    manifest["performance"] = perf.performance(window, counts, rows, timings.get("work_and_write"))
    return manifest


def _lost(stage: Stage, n_in: int, accounted: int, message: str) -> RuntimeError:
    """Rows were lost: recorded for export (in, and what was accounted for as written) before the run fails."""
    rows = accounting.row_outcomes({"rows_in": n_in, "rows_new": accounted}, {})
    session.record(stage.command, {"rows": rows, "duration_seconds": 0.0})
    return RuntimeError(message)


def _carried_counts(result: Any) -> dict[str, int]:
    """The table counts (``Stage.table_counts``: tokens, ...) of the rows carried from ``--previous``, as
    ``carried.<count>``: the metrics count the work done, so the tokens of carried rows are not counted again."""
    out: dict[str, int] = {}
    for path, stats in result.stats.items():
        if storage.split(path)[1].startswith(CARRIED_PREFIX):
            for key, value in (stats.get("counts") or {}).items():
                out[f"carried.{key}"] = out.get(f"carried.{key}", 0) + int(value or 0)
    return out


def _unique_in(keys: pa.Array | pa.ChunkedArray, value_set: pa.Array) -> int:
    """How many distinct ``keys`` are in ``value_set`` (Arrow compute: no Python set of the keys)."""
    if not len(value_set) or not len(keys):
        return 0
    return len(pc.unique(keys.filter(pc.is_in(keys, value_set=value_set))))


def _run_table_stage(stage: TableStage, plan: Plan, ctx: StageContext) -> StageResult:
    """The loop every keyed stage shares: carry, skip, Ray, sink, row check, standard counts."""
    job = ctx.job
    none = pa.array([], pa.string())
    done = completed_keys(ctx.staging) if stage.resumable else none  # distinct keys, Arrow
    work = stage.work(plan, ctx)
    schemas = dict(stage.schemas(plan))
    carried = none
    carried_rows: dict[str, int] = {}
    carried_files: dict[str, int] = {}

    def carry() -> None:
        try:
            keys = stage.unchanged(plan, work, job.previous, ctx.staging)
        except (OSError, pa.ArrowException) as exc:  # a damaged previous run: nothing carried, all done again
            log.warning("%s: cannot read what it holds (%s): nothing is carried from it", job.previous,
                        (str(exc).splitlines() or [type(exc).__name__])[0][:200])
            keys = []
            carried_files["carried_files.previous_unreadable"] = 1
        tables = {k: v for k, v in schemas.items() if k not in stage.scratch_tables}
        nonlocal carried
        carried, rows = carry_rows(job.previous, tables, stage.key_column, keys, ctx.staging,
                                   record_keys=stage.key_column, table_counts=stage.table_counts or no_counts,
                                   rows_verified=stage.unchanged_verified)
        carried_rows.update({k: v for k, v in rows.items() if not k.startswith("files_")})
        carried_files.update({f"carried_files.{k[6:]}": v for k, v in rows.items() if k.startswith("files_")})

    if job.previous and not stage.carry_after_write:
        carry()
    skip = pc.unique(pa.chunked_array([done, carried], pa.string()))
    if work.keys is None:
        todo = work.n_in if work.n_todo is None else work.n_todo
    else:
        todo = len(work.keys) - _unique_in(work.keys, skip)
    timings: dict[str, float] = dict(work.timings_s)
    if todo:  # nothing is loaded when every row is carried or already done, and Ray is not even imported
        from verbatim_batch.engine.datasink import StageTableSink

        sink = StageTableSink(stage.writer(plan, work), ctx.staging, schemas,
                              key_columns=stage.record_keys(), table_counts=stage.table_counts or no_counts)
        t = time.perf_counter()
        if stage.needs_ray:
            ctx.ray()
            timings["ray_start"] = time.perf_counter() - t
        t = time.perf_counter()
        rows = stage.dataset(plan, work, skip, ctx)
        with Progress(stage.command, ctx.staging, todo, unique=work.keys is not None):  # rows done/total, ETA
            if hasattr(rows, "write_datasink"):
                rows.write_datasink(sink, concurrency=stage.write_concurrency(),
                                    ray_remote_args=task_bounds(_restarts(job, ctx.resources)))
            else:
                for table in rows:
                    sink.write([table], None)
        timings["work_and_write"] = time.perf_counter() - t
    if job.previous and stage.carry_after_write:
        carry()
    published = {n: s for n, s in schemas.items() if n not in stage.scratch_tables}
    merged = compact(ctx.staging, published, int(job.target_file_mb * 2**20), job.max_small_files)
    result = sum_live_files(ctx.staging, schemas)  # what the sink's finish() sums: every live file
    resumed = len(done) - _unique_in(done, carried)
    if work.keys is None:  # one row per input record in the key tables
        out = sum(result.rows[t] for t in stage.key_tables or tuple(stage.tables)[:1])
        if out != work.n_in:
            raise _lost(stage, work.n_in, out, f"{stage.command}: {work.n_in} rows in but {out} accounted for "
                        f"({', '.join(stage.key_tables)}): rows were lost")
    else:
        wanted = pc.unique(work.keys)  # Arrow, not a Python set: a stage's keys can be millions
        missing = wanted.filter(pc.invert(pc.is_in(wanted, value_set=result.keys)))
        if len(missing) or len(wanted) != work.n_in:
            raise _lost(stage, work.n_in, len(wanted) - len(missing),
                        f"{stage.command}: {work.n_in} rows in but {len(wanted) - len(missing)} written, carried or "
                        f"resumed (e.g. {sorted(missing.to_pylist())[:3]} missing): rows were lost")
    for name in stage.scratch_tables:
        storage.rmtree(storage.join(ctx.staging, name))
    write_files_index(ctx.staging, result, published)
    n_carried = len(carried) if work.keys is not None else sum(carried_rows.get(t, 0) for t in stage.key_tables)
    outcome = Outcome(result=result, carried=carried, carried_rows=carried_rows, resumed=resumed,
                      new=work.n_in - n_carried - resumed, staging=ctx.staging)
    own = stage.counts(plan, work, outcome)
    own = own if isinstance(own, StageResult) else StageResult(tables={}, counts=own)
    standard = {"rows_in": work.n_in, "rows_new": outcome.new, "rows_carried": n_carried, "rows_resumed": resumed,
                **carried_files, **({"files_compacted": merged} if merged else {}), **_carried_counts(result)}
    clash = set(standard) & set(own.counts)
    if clash:
        raise RuntimeError(f"{stage.command} counts {sorted(clash)} clash with the runner's standard counts")
    return StageResult(
        tables=own.tables or {n: {"rows": result.rows[n], "files": len(result.files[n])} for n in published},
        counts={**result.counts, **own.counts, **standard}, timings_s={**timings, **own.timings_s},
        config=own.config, manifest=own.manifest)
