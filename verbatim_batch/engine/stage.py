"""The stage contract: what a stage declares and what the runner (``engine.runner``) hands it.

``TableStage`` (chunk, embed, retrieve, extract, querygen): keyed rows through the generic sink; it declares its
``tables`` and ``key_column``, a cheap ``plan``, the ``work``, what it can carry (``unchanged``), the ``dataset``
of the rows to do and its ``counts``. ``Stage`` (index, train) writes its own files (``execute``);
``CompositeStage`` (nightly, silver) is a run of committed sub-runs in one folder. Ray work declares its
``resources``; the runner applies the job's options to them and hands the result over as ``ctx.resources``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from verbatim_batch.core import limits
from verbatim_batch.core.options import option, settings
from verbatim_batch.core.runs import jsonable, safe_run_id
from verbatim_batch.engine.restarts import Restarting
from verbatim_batch.engine.telemetry.options import MetricsOptions

if TYPE_CHECKING:
    from verbatim_batch.engine.resources import Resources
    from verbatim_batch.engine.sink import TableSinkResult


@dataclass(kw_only=True)
class RunOptions(MetricsOptions, Restarting):
    """What every run-writing job takes: where it writes, how it resumes, which Ray it runs on, where its
    metrics go."""

    output: str = option(help="run folder to create (atomically)", path=True, writes=True, runtime=True)
    overwrite: bool = option(False, "replace an existing run folder that this tool wrote (anything else is refused)",
                             runtime=True)
    run_id: str | None = option(None, "name the run; rerunning with the same id after a crash resumes it (committed "
                                "work is skipped) and a committed run is left as is", parse=safe_run_id, runtime=True)
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
    """The settings a run id is bound to (``Plan.config``): the job's output-deciding options
    (``options.settings``), then what the plan resolved (a model's revision, a vector width), which replaces the
    job's value of the same name. No runtime option is in them, so a run resumes with another value of one."""
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
        from verbatim_batch.engine.ray_env import init_ray

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

    # table -> counts summed into the manifest (tokens, ...), run in the sink's write tasks; None: none
    table_counts: ClassVar[Callable[[str, pa.Table], dict[str, int]] | None] = None

    def counts(self, plan: Plan, work: Work, outcome: Outcome) -> StageResult | dict[str, int]:
        """The stage's own counts (and learnt config or timings, as a ``StageResult``)."""
        return {}


class CompositeStage(Stage):
    """A run made of committed sub-runs under one folder (``execute`` runs them into ``ctx.staging``)."""

    resumable = True

    def on_committed(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """After the commit, and on a no-op rerun of a committed run (e.g. move a ``current`` pointer)."""
        return manifest
