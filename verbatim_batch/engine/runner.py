"""The one owner of a run: every run-writing command goes through ``run_stage``.

A stage declares only what is its own; the runner does the rest for every stage alike.

``TableStage`` (chunk, embed, retrieve, extract, querygen): rows keyed by one column, written through the
generic sink. A stage declares its output ``tables``, its ``key_column``, a cheap ``plan`` (its settings and
inputs, a frozen ``Plan``), the ``work`` (every input key and what its dataset needs), what it can carry from
a previous run (``unchanged``), the ``dataset`` that produces the to-do rows, and its own ``counts``.
``run_stage`` then, in this order:

1. a rerun with the ``run_id`` of a committed run returns that run's manifest and does nothing else;
2. ``plan``, then refuses an output folder inside an input folder;
3. stages into a hidden folder named after the run id and bound to the settings' hash: a killed run
   resumed with other settings is refused (``runs.SettingsChangedError``), never mixed;
4. carries unchanged rows from ``previous``, skips the keys a killed run with this id completed, starts
   Ray only when something is left to do, writes through the sink;
5. checks every input key is accounted for (rows in = new + carried + resumed), or fails with a clear
   error; adds the standard counts (``rows_in``, ``rows_new``, ``rows_carried``, ``rows_resumed``);
6. writes the manifest and the report, and commits atomically.

``Stage`` (index, train, silver's last step): a stage that writes its own files (``execute``) into the
staging folder; it gets steps 1-3 and 6 alike.

A stage that runs Ray actors or tasks declares its ``resources`` (``pipeline.resources.Resources``, or one per
placement with a ``placement()`` that picks it); the runner applies the job's options to it (``batch_rows``,
``concurrency``, ``threads``, ``worker_restarts``), hands the result to the stage as ``ctx.resources`` and
records it in the manifest's ``runtime``: a stage never applies options to its own declaration.

``CompositeStage`` (nightly, silver): a run made of committed sub-runs in one folder (they record each
other's paths, so they stay in place); the folder is claimed and bound to the settings first, the manifest
is written last, and ``on_committed`` runs after the commit (and on a no-op rerun).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import input_paths, option, options_of, settings
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
from verbatim_batch.engine.ray_env import init_ray
from verbatim_batch.engine.resources import task_bounds
from verbatim_batch.engine.restarts import Restarting
from verbatim_batch.engine.sink import (
    TableSinkResult,
    carry_rows,
    compact,
    no_counts,
    sum_live_files,
    write_files_index,
)
from verbatim_batch.engine.telemetry import accounting, perf, session
from verbatim_batch.engine.telemetry.options import MetricsOptions
from verbatim_batch.engine.worker_faults import stopped

if TYPE_CHECKING:
    from verbatim_batch.engine.resources import Resources

log = logging.getLogger(__name__)

STANDARD_COUNTS = ("rows_in", "rows_new", "rows_carried", "rows_resumed")


def _run_id(run_id: str) -> str:
    from verbatim_batch.core.runs import safe_run_id

    return safe_run_id(run_id)


@dataclass(kw_only=True)
class RunOptions(MetricsOptions, Restarting):
    """What every run-writing job takes: where it writes, how it resumes, which Ray it runs on, where its
    metrics go."""

    output: str = option(help="run folder to create (atomically)", path=True, writes=True, runtime=True)
    overwrite: bool = option(False, "replace an existing run folder that this tool wrote (anything else is refused)",
                             runtime=True)
    run_id: str | None = option(None, "name the run; rerunning with the same id after a crash resumes it (committed "
                                "work is skipped) and a committed run is left as is", parse=_run_id, runtime=True)
    previous: str | None = option(None, "an earlier run of this stage: its results for unchanged input are carried "
                                  "over instead of computed again", path=True, runtime=True)
    address: str | None = option(None, "Ray cluster address", default_help="RAY_ADDRESS, else a local Ray",
                                 runtime=True)
    num_cpus: int | None = option(None, "CPUs for a local Ray", low=1,
                                  high=limits.WORKERS, default_help="all", runtime=True)
    batch_retries: int = option(2, "retries of a failed batch of rows before its rows become error rows (recorded "
                                "in the manifest)", low=0, high=limits.RETRIES, runtime=True)
    target_file_mb: float = option(128.0, "compaction merges a table's small files toward files of this size (MB)",
                                   low=0, high=limits.SIZE_MB, low_open=True, runtime=True)
    max_small_files: int = option(16, "compaction starts once a table has more files under a quarter of "
                                  "--target-file-mb than this", low=1, high=limits.ROWS, runtime=True)


@dataclass(frozen=True)
class Plan:
    """What a run will do, decided before any folder is touched (cheap: no model, no table scan)."""

    config: Mapping[str, Any]  # the settings that decide the output: hashed, and bound to the run id
    inputs: tuple[str, ...]  # paths the run reads (an output inside one of them is refused)
    facts: Any = None  # read-only facts the stage's later steps need (resolved paths, a schema)
    runtime: Mapping[str, Any] = field(default_factory=dict)  # how it runs (recorded, never hashed or bound)


def bound_settings(job: Any, **resolved: Any) -> dict[str, Any]:
    """The settings a run id is bound to (``Plan.config``), derived, never listed: the job's output-deciding
    options (``options.settings``: every field but the runtime ones, a nested config by its own settings), then
    what the plan resolved (a model's revision and config hash, a vector width, a config left to its default),
    which replaces the job's own value of the same name. A runtime option (a batch size, workers, retries,
    addresses) is in neither, so a killed run resumed with another value of one resumes."""
    return jsonable(settings(job)) | jsonable(resolved)


@dataclass(frozen=True)
class Work:
    """The rows a keyed stage has to produce."""

    keys: pa.Array | pa.ChunkedArray | None  # every input key; None when known only once read (``n_in`` counts)
    n_in: int
    data: Any = None  # what the stage's dataset needs (e.g. the pairs table)
    timings_s: Mapping[str, float] = field(default_factory=dict)
    n_todo: int | None = None  # with ``keys`` None: the records left to read (the stage set some aside itself)


@dataclass(frozen=True)
class Outcome:
    """What the runner did for a keyed stage, handed to the stage's ``counts``."""

    result: TableSinkResult  # every completed write, carried files included
    carried: pa.Array  # distinct keys carried from previous
    carried_rows: Mapping[str, int]  # rows carried per table, this run
    resumed: int  # keys a killed run with this id had completed
    new: int  # keys processed by this run
    staging: str


@dataclass
class StageResult:
    """What a stage reports back to the runner for its manifest."""

    tables: dict[str, dict[str, int]]  # table -> {"rows", "files"}
    counts: dict[str, int]
    timings_s: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # config learnt while running (e.g. the model loaded)
    manifest: dict[str, Any] = field(default_factory=dict)  # extra top-level manifest keys


@dataclass(frozen=True)
class StageContext:
    """One run in progress, as a stage sees it."""

    job: RunOptions
    run_id: str
    staging: str  # where the run writes (the composite's own folder for a composite run)
    config: Mapping[str, Any]
    started: float
    resources: Resources | None = None  # the stage's declaration with the job's options applied (``resolved``)

    def ray(self) -> None:
        """Start (or join) Ray; called only when there is work for it."""
        init_ray(self.job.address, self.job.num_cpus, oom_retries=self.job.worker_restarts)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


# the run options only an incremental stage takes (one that carries rows from ``--previous``)
NOT_INCREMENTAL = ("previous", "target_file_mb", "max_small_files")


@dataclass(frozen=True)
class Command:
    """A command, declared once in its stage module (``COMMAND = Command(...)``) and listed in the stage registry
    (``stages.registry``): the CLI's command, flags, handler and ``--help``, its YAML section, its Ray job
    (``jobs/<name>.py``), its chain step (with ``folder``) and the option reference are derived from it."""

    name: str  # ``verbatim-batch <name>``, a config file's section, a chain's ``--<name>-<option>`` flags
    help: str
    job: type  # the dataclass whose option fields the command takes
    run: Callable[[Any], Any] | None = None  # job -> result (a run's ``(folder, manifest)``)
    summary: Callable[[Any, Any], None] | None = None  # (job, result) -> prints it (None: the run folder's tables)
    stage: type[Stage] | None = None  # what a chain step reads and writes
    folder: str | None = None  # its folder in a chain run: set for a chain step, in registry order
    when: Callable[[Any], bool] | None = None  # a chain step the chain runs only when it says so (the reranker)
    omit: tuple[str, ...] = ()  # of the job's options, those the command does not take
    positional: tuple[tuple[str, str], ...] = ()  # (name, help) of positional arguments
    chain: bool = False  # takes every chain stage's options too (``run``, ``nightly``)


def declaration_problems(cls: type[Stage]) -> list[str]:
    """What is missing or inconsistent in a stage class's declarations (empty when sound)."""
    from verbatim_batch.engine.resources import Resources
    from verbatim_batch.engine.telemetry.declare import OUTCOMES

    out = []
    for name, tables in cls.reads.items():
        if not isinstance(name, str) or not isinstance(tables, tuple) or not tables \
                or not all(isinstance(t, str) and t for t in tables):
            out.append(f"reads[{name!r}] must name a job field and a non-empty tuple of table names")
    if bad := sorted(set(cls.outcomes) - set(OUTCOMES)):
        out.append(f"outcomes {bad} are not among {OUTCOMES}")
    res = cls.__dict__.get("resources")
    if res is not None and not isinstance(res, Resources) and not (
            isinstance(res, Mapping) and res and all(isinstance(r, Resources) for r in res.values())):
        out.append("resources must be a Resources, or a Resources per placement")
    if isinstance(res, Mapping) and cls.placement is Stage.placement:
        out.append("resources per placement need a placement() that picks one")
    tables = getattr(cls, "tables", None)
    if tables is not None:
        if not all(isinstance(s, pa.Schema) for s in tables.values()):
            out.append("tables must map names to Arrow schemas (tables.py)")
        for what in ("key_tables", "scratch_tables"):
            if extra := sorted(set(getattr(cls, what, ())) - set(tables)):
                out.append(f"{what} {extra} are not among its tables {sorted(tables)}")
        if cls.command and tables and not getattr(cls, "key_column", ""):
            out.append("a stage with tables names its key_column")
    return out


class Stage:
    """A stage that writes its own files into the staging folder (``execute``)."""

    command: ClassVar[str] = ""
    resumable: ClassVar[bool] = False  # keep the completed work of a killed run with the same run id
    takes_previous: ClassVar[bool] = True
    # rows by outcome beyond the runner's standard counts: {outcome: the stage's counts that make it}, e.g.
    # {"failed": ("pairs_failed",)} (telemetry.accounting; the outcomes are telemetry.declare.OUTCOMES)
    outcomes: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    # the runs it reads: {job field: the tables the run there must hold committed} (``expect_tables``: an
    # input is what it holds; a chain's folder stands for its stage folder that holds them)
    reads: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    # the tables its run holds once committed (a table stage's: its tables, less scratch ones)
    writes: ClassVar[tuple[str, ...]] = ()
    # what one actor or task needs from Ray, or one such per placement (``placement`` picks); None: no Ray work
    # of its own. The runner applies the job's options (``resolved``) and hands the result over as ctx.resources
    resources: ClassVar[Resources | Mapping[str, Resources] | None] = None

    def __init__(self, job: RunOptions) -> None:
        self.job = job

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A stage's declarations checked when its class is defined, not mid-run."""
        super().__init_subclass__(**kwargs)
        if "tables" in cls.__dict__ and "writes" not in cls.__dict__:
            cls.writes = tuple(t for t in cls.tables if t not in getattr(cls, "scratch_tables", ()))
        problems = declaration_problems(cls)
        if problems:
            raise TypeError(f"stage {cls.__name__}: {'; '.join(problems)}")

    def placement(self) -> str:
        """Which of its per-placement ``resources`` this run uses (only a stage declaring them per placement)."""
        raise NotImplementedError

    def resolved(self) -> Resources | None:
        """The declared ``resources`` (this run's placement's) with the job's options applied: what the runner
        hands the stage as ``ctx.resources``."""
        res = type(self).resources
        if isinstance(res, Mapping):
            res = res[self.placement()]
        return None if res is None else res.with_job(self.job)

    def plan(self) -> Plan:
        """Settings and inputs; raises on bad input before any folder is touched. Cheap."""
        raise NotImplementedError

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        raise NotImplementedError


class TableStage(Stage):
    """A stage of keyed rows written through the sink; the runner owns its whole loop."""

    resumable = True
    tables: ClassVar[Mapping[str, pa.Schema]] = {}  # output tables, in manifest order
    key_column: ClassVar[str] = ""  # the row key the key tables share (carry and resume go by it)
    key_tables: ClassVar[tuple[str, ...]] = ()  # default: the first table
    scratch_tables: ClassVar[tuple[str, ...]] = ()  # written by the sink for the stage only; not committed
    carry_after_write: ClassVar[bool] = False  # what is unchanged is known only once the input is read
    unchanged_verified: ClassVar[bool] = False  # ``unchanged`` checked the rows itself (carry trusts them)
    needs_ray: ClassVar[bool] = True

    @classmethod
    def record_keys(cls) -> dict[str, str]:
        """Table -> the column whose values a write records as done (resume skips them)."""
        return {name: cls.key_column for name in cls.key_tables or tuple(cls.tables)[:1]}

    def work(self, plan: Plan, ctx: StageContext) -> Work:
        raise NotImplementedError

    def unchanged(self, plan: Plan, work: Work, previous: str, staging: str) -> Iterable[str] | pa.Array:
        """Keys whose rows ``previous`` holds for the same input and settings (carried, not redone): strings,
        or an Arrow array of them (many keys: no Python set is built of them)."""
        return ()

    def schemas(self, plan: Plan) -> Mapping[str, pa.Schema]:
        """The output tables' schemas (a stage whose schema depends on its plan overrides this)."""
        return self.tables

    def dataset(self, plan: Plan, work: Work, skip: pa.Array, ctx: StageContext) -> Any:
        """The rows to write for every key not in ``skip``: a ``ray.data.Dataset``, or (a stage that runs in the
        driver) an iterable of Arrow tables."""
        raise NotImplementedError

    def writer(self, plan: Plan, work: Work) -> Callable[[pa.Table], dict[str, pa.Table]]:
        """Block -> tables, run inside the sink's write tasks. Default: rows of the first table."""
        from verbatim_batch.engine.batches import as_table

        return as_table(next(iter(self.tables)))

    def write_concurrency(self) -> int | None:
        """Parallel write tasks (None: as many as Ray schedules)."""
        return None

    table_counts: ClassVar[Callable[[str, pa.Table], dict[str, int]]] = staticmethod(no_counts)

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> StageResult | dict[str, int]:
        """The stage's own counts (and learnt config or timings, as a ``StageResult``)."""
        return {}


class CompositeStage(Stage):
    """A run made of committed sub-runs under one folder (``execute`` runs them into ``ctx.staging``)."""

    resumable = True

    def on_committed(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """After the commit, and on a no-op rerun of a committed run (e.g. move a ``current`` pointer)."""
        return manifest


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
                                   record_keys=stage.key_column, table_counts=stage.table_counts,
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
                              key_columns=stage.record_keys(), table_counts=stage.table_counts)
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
