"""The chain chunk -> embed -> index -> retrieve -> (rerank) -> extract, defined once (``run_chain``).

Each stage is its own committed run folder under one output folder, optionally building on an earlier chain's
(``previous``). The steps are the registered stages with a chain ``folder``; the wiring is derived: each run a
stage reads (``Stage.reads``) is the folder of the last step before it that writes those tables, and the chain's
own options go to the first step whose job has a field of that name.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.options import Declared, OptionError, check, group, is_runtime, option, options_of, settings
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.runs import committed_run, expect_corpus, jsonable, read_manifest
from verbatim_batch.corpus import readers as corpus
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Command, CompositeStage, Plan, RunOptions, StageContext, StageResult
from verbatim_batch.report.summary import print_run
from verbatim_batch.stages import registry

RUNNERS: dict[str, Callable[[Any], tuple[str, dict[str, Any]]]] = {}  # a test may replace a step's runner here


def steps() -> list[Command]:
    """The chain's steps, in order (``registry.steps``)."""
    return registry.steps()


def step(folder: str) -> Command:
    return next(c for c in steps() if c.folder == folder)


def sections() -> tuple[str, ...]:
    """The stage sections a chain takes (a config file's ``extract:``, ...)."""
    return tuple(c.name for c in steps())


def base_stages() -> tuple[str, ...]:
    """The folders every chain run holds (the steps without a ``when``)."""
    return tuple(c.folder for c in steps() if c.when is None)


def stage_command(name: str) -> Command:
    """The chain step whose command is ``name``."""
    return next(c for c in steps() if c.name == name)


@dataclass
class Chain(Declared):
    """What a chain run reads, and each stage's options by command (``{"extract": {"threshold": 0.3}}``). A
    ``rerank`` section with a ``model`` adds the rerank stage."""

    input: str = option(help="the corpus: a folder of .md or .txt files, or a Parquet/JSONL file or "
                       "folder", path=True)
    queries: str = option(help="query file (JSONL, Parquet or CSV) with query (and query_id)", path=True)
    metadata: str | None = option(None, "metadata table (.parquet/.jsonl/.csv) joined by paper id", path=True)
    format: str = option("auto", "input format (auto: from file extensions)", choices=("auto", *corpus.FORMATS))
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()  # the declared bounds and choices
        self.stages = {name: stage_options(name, values) for name, values in self.stages.items()}

    def check(self) -> None:
        """Everything the chain reads and every stage's options, checked before the first stage (a missing query
        file found after hours of chunking is hours lost)."""
        for what, path in (("input", self.input), ("metadata", self.metadata)):
            if path and not storage.exists(path):
                raise FileNotFoundError(f"{what} not found: {path}")
        expect_corpus(self.input)  # a run folder's Parquet files are not papers
        read_queries(self.queries)  # missing, unreadable or without a query column: refused here
        self.stage_jobs()

    @property
    def reranks(self) -> bool:
        return self.stages.get("rerank", {}).get("model") is not None

    def stage_jobs(self, output: str = "", **common: Any) -> dict[str, Any]:
        """``{stage folder: job}`` of every stage this chain runs (``common``: run options every stage shares)."""
        from verbatim_batch.core.options import build

        out = storage.normalize(output) if output else ""
        at = (lambda stage: storage.join(out, stage)) if out else (lambda stage: stage)
        jobs = {}
        for stage, wiring in self.wiring().items():
            cmd = step(stage)
            wired = {name: (at(value) if name in cmd.stage.reads else value) for name, value in wiring.items()}
            values = self.stages.get(cmd.name, {}) | wired | common | {"output": at(stage)}
            jobs[stage] = build(cmd.job, values, lambda of, c=cmd.name: f"{of.flag} ({c}.{of.key})")
        return jobs

    def wiring(self) -> dict[str, dict[str, Any]]:
        """``{stage folder: {job field: value}}``: the inputs each stage reads (see the module docstring)."""
        own = {of.field: getattr(self, of.field) for of in options_of(Chain)}
        written: dict[str, str] = {}
        out: dict[str, dict[str, Any]] = {}
        for stage in chain_stages(self):
            cmd = step(stage)
            names = {f.name for f in dataclasses.fields(cmd.job)}
            values = {name: own.pop(name) for name in list(own) if name in names}
            for name, tables in cmd.stage.reads.items():
                if all(t in written for t in tables):
                    values[name] = written[tables[0]]
            for table in cmd.stage.writes:
                written[table] = stage
            out[stage] = values
        return out


def stage_keys(command: str) -> tuple[str, ...]:
    """The options of stage ``command`` a chain section takes: all but inputs, outputs and run options."""
    cls = stage_command(command).job
    own = {of.key for of in options_of(RunOptions)} | {of.key for of in options_of(Chain)}
    return tuple(of.key for of in options_of(cls) if of.key not in own and not of.option.path)


def stage_options(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """A stage section's values, each checked as the option takes it (raises ``OptionError``)."""
    if command not in sections():
        raise OptionError(f"a chain has no stage {command!r} (its stages: {', '.join(sections())})")
    cls = stage_command(command).job
    fields = {of.key: of for of in options_of(cls)}
    keys = stage_keys(command)
    out = {}
    for key, value in values.items():
        if key not in keys:
            raise OptionError(f"{command}: {key!r} is not an option a chain's {command} stage takes")
        try:
            out[key] = check(fields[key], value)
        except OptionError as exc:
            raise OptionError(f"{command}.{key} {exc}") from None
    return out


def run_chain(chain: Chain, output: str, *, previous: str | None = None, run_id: str | None = None,
              overwrite: bool = False, address: str | None = None, num_cpus: int | None = None,
              batch_retries: int = RunOptions.batch_retries, after_stage: Callable[[str], None] | None = None,
              ) -> tuple[dict[str, tuple[str, dict[str, Any]]], dict[str, float]]:
    """Run every stage into ``output/<stage>``; returns ``({stage: (path, manifest)}, {stage: seconds})``."""
    common = {"run_id": run_id, "overwrite": overwrite, "address": address, "num_cpus": num_cpus,
              "batch_retries": batch_retries}
    jobs = chain.stage_jobs(output, **common)
    if taken := [name for name, job in jobs.items() if committed_run(job.output, run_id)]:
        print(f"resuming run {run_id}: {', '.join(taken)} committed by it already, taken as committed; "
              f"{len(jobs) - len(taken)} of {len(jobs)} stages to run", file=sys.stderr)
    results: dict[str, tuple[str, dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    for name, job in jobs.items():
        # a step the earlier chain did not run (no reranker then, a step added since) starts without one
        if previous and storage.exists(storage.join(previous, name, "manifest.json")):
            job.previous = storage.join(previous, name)
        t = time.perf_counter()
        cmd = step(name)
        results[name] = RUNNERS.get(cmd.name, cmd.run)(job)
        timings[name] = time.perf_counter() - t
        if after_stage is not None:
            after_stage(name)
    return results, timings


def chain_stages(chain: Chain) -> tuple[str, ...]:
    """The chain's stage folders in order (a step with a ``when`` only when it says so)."""
    return tuple(c.folder for c in steps() if c.when is None or c.when(chain))


def chain_settings(chain: Chain) -> dict[str, Any]:
    """What decides a chain's outputs: its inputs and every stage job's output-deciding options (paths are the
    chain's wiring, so they are left out)."""
    stages = {name: {f.name: _setting(getattr(job, f.name), f) for f in dataclasses.fields(job)
                     if not is_runtime(f) and not ("option" in f.metadata and f.metadata["option"].path)}
              for name, job in chain.stage_jobs().items()}
    return {"input": chain.input, "queries": chain.queries, "metadata": chain.metadata, "format": chain.format,
            "stages": stages}


def _setting(value: Any, f: dataclasses.Field) -> Any:
    """A stage job's setting: a model config by its hash, a nested config by its settings, an unset group as
    its default's."""
    if value is None and "group" in f.metadata:
        try:
            value = f.metadata["group"].kinds[0]()
        except (TypeError, ValueError):  # a config with no default (a reranker needs its model): unset
            return None
    if hasattr(value, "hash") and dataclasses.is_dataclass(value):
        return value.hash
    return jsonable(settings(value)) if dataclasses.is_dataclass(value) else jsonable(value)


def chain_result(results: dict[str, tuple[str, dict[str, Any]]], timings: dict[str, float],
                 table_prefix: bool, **manifest: Any) -> StageResult:
    """A composite run's result (``run``, ``nightly``): every stage's tables, and counts as ``<stage>.<count>``
    (time spent is in each stage's own manifest)."""
    manifests = {name: m for name, (_, m) in results.items()}
    return StageResult(
        tables={(f"{stage}/{name}" if table_prefix else name): info for stage, m in manifests.items()
                for name, info in m["tables"].items()},
        counts={f"{stage}.{key}": int(value) for stage, m in manifests.items()
                for key, value in m["counts"].items() if not key.startswith("time_ms.")},
        timings_s=timings, manifest={"stages": {name: name for name in manifests}} | manifest)


@dataclass(kw_only=True)
class ChainJob(RunOptions):
    """``verbatim-batch run``: the whole chain on one corpus and query file, into ``output/<stage>``."""

    chain: Chain = group(Chain, required=True)


class ChainStage(CompositeStage):
    """The chain as one run: one Ray start, each stage its committed run folder under ``output``, all under one
    run id (a rerun after a kill skips committed stages), and a manifest and report for the whole."""

    command = "run"

    def plan(self) -> Plan:
        c: Chain = self.job.chain
        c.check()
        return Plan(config=chain_settings(c), inputs=(c.input, c.queries, *([c.metadata] if c.metadata else [])))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job: ChainJob = self.job
        results, timings = run_chain(job.chain, ctx.staging, previous=job.previous, run_id=ctx.run_id,
                                     address=job.address, num_cpus=job.num_cpus, batch_retries=job.batch_retries)
        return chain_result(results, timings, table_prefix=True)


def run_chain_job(job: ChainJob) -> tuple[str, dict[str, Any]]:
    """``verbatim-batch run``: the chain as one committed, resumable run."""
    return run_stage(ChainStage(job))


def print_chain(job: ChainJob, result: tuple[str, dict[str, Any]]) -> None:
    """Every stage's summary, then the chain run's folder and report."""
    path, manifest = result
    for stage in manifest.get("stages", {}):
        print(f"\n== {stage} ==")
        print_run(storage.join(path, stage), read_manifest(storage.join(path, stage)))
    print(f"\nchain run {manifest['run_id']} committed to {path} (report: {storage.join(path, 'report.html')})")


COMMAND = Command("run", "the whole chain chunk -> embed -> index -> retrieve -> extract on your corpus and "
                  "queries, one Ray start, each stage its run folder under --output", ChainJob, run_chain_job,
                  summary=print_chain, omit=("target_file_mb", "max_small_files"), chain=True)
