"""The one owner of a stage run.

A stage declares what is its own (``Stage.plan``: its config and inputs, checked before any folder is
touched; ``Stage.execute``: the work, writing tables into the staging folder) and hands itself to
``run_stage``, which does the rest for every stage alike:

- a rerun with the ``run_id`` of a committed run returns that run's manifest and does nothing;
- the run writes into a hidden staging folder named after its run id; a resumable stage keeps the completed
  writes a killed run with the same id left there (``StageContext.done``), any other stage starts over;
- ``previous`` (an earlier run of the same stage) goes into the config and inputs; the stage decides what
  it can carry from it (``StageContext.carry``);
- Ray starts only when the stage asks for it (``StageContext.ray``), so a run with nothing to do loads
  nothing;
- timings, the manifest, the atomic commit and the report page.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .. import storage
from ..runs import RunDir, build_manifest, committed_run, completed_keys, new_run_id, safe_run_id, staged
from .ray_env import init_ray
from .sink import StageTableSink, carry_rows


@dataclass(kw_only=True)
class RunOptions:
    """What every run-writing job takes; the CLI's run and Ray option groups fill these."""

    output: str
    overwrite: bool = False  # replace an existing run folder
    run_id: str | None = None  # rerunning with the same id resumes a killed run / skips a committed one
    previous: str | None = None  # an earlier run of the same stage: unchanged work is carried, not redone
    address: str | None = None  # Ray cluster address (default: RAY_ADDRESS, else a local Ray)
    num_cpus: int | None = None  # CPUs of a local Ray
    max_retries: int = 2  # retries of a failed batch before its rows fail


@dataclass
class StageResult:
    """What a stage reports back to the runner for its manifest."""

    tables: dict[str, dict[str, int]]  # table -> {"rows", "files"}
    counts: dict[str, int]
    timings_s: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # config learnt while running (e.g. the model loaded)
    manifest: dict[str, Any] = field(default_factory=dict)  # extra top-level manifest keys


@dataclass
class StageContext:
    """One stage run in progress, as the stage's ``execute`` sees it."""

    job: RunOptions
    run: RunDir
    run_id: str
    config: dict[str, Any]
    done: set[str]  # row keys of the writes a killed run with this id completed
    started: float

    @property
    def staging(self) -> str:
        return self.run.staging

    def ray(self) -> None:
        """Start (or join) Ray; stages call it only when they have work for it."""
        init_ray(self.job.address, self.job.num_cpus)

    def sink(self, stage: Callable[[pa.Table], dict[str, pa.Table]], schemas: dict[str, pa.Schema],
             key_columns: dict[str, str]) -> StageTableSink:
        """A sink writing ``stage``'s tables into the staging folder, each write recorded for resume."""
        return StageTableSink(stage, self.staging, schemas, key_columns=key_columns)

    def carry(self, tables: dict[str, pa.Schema], key_column: str, keys: Iterable[str],
              record_keys: str | None = None) -> tuple[set[str], dict[str, int]]:
        """Copy ``previous``'s rows of ``keys`` (see ``sink.carry_rows``); nothing without ``previous``."""
        if not self.job.previous:
            return set(), {}
        return carry_rows(self.job.previous, tables, key_column, keys, self.staging, record_keys)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


class Stage:
    """A stage's own part of a run. Subclasses set ``command`` and implement ``plan`` and ``execute``."""

    command = ""
    resumable = False  # keep the completed writes of a killed run with the same run id

    def __init__(self, job: RunOptions) -> None:
        self.job = job

    def plan(self) -> tuple[dict[str, Any], list[str]]:
        """``(config, inputs)``; raises on bad input before any folder is touched."""
        raise NotImplementedError

    def execute(self, ctx: StageContext) -> StageResult:
        raise NotImplementedError


def write_report(run_dir: str, manifest: dict[str, Any]) -> None:
    from ..report import write_report as write

    write(run_dir, manifest)


def _refuse_output_inside_inputs(output: str, inputs: list[str]) -> None:
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


def run_stage(stage: Stage) -> tuple[str, dict[str, Any]]:
    """Run ``stage`` into ``stage.job.output``; returns ``(path, manifest)`` of the committed run."""
    job = stage.job
    t0 = time.perf_counter()
    if job.run_id is not None:
        safe_run_id(job.run_id)
    config, inputs = stage.plan()
    if job.previous:
        config, inputs = config | {"previous": job.previous}, [*inputs, job.previous]
    _refuse_output_inside_inputs(job.output, inputs)
    if done := committed_run(job.output, job.run_id):
        return job.output, done
    run_id = job.run_id or new_run_id(stage.command, config)
    with staged(job.output, overwrite=job.overwrite, run_id=job.run_id, resume=stage.resumable) as run:
        done_keys = completed_keys(run.staging) if stage.resumable else set()
        ctx = StageContext(job=job, run=run, run_id=run_id, config=config, done=done_keys, started=t0)
        result = stage.execute(ctx)
        manifest = build_manifest(
            run_id=run_id, command=stage.command, config=config | result.config, inputs=inputs,
            tables=result.tables, counts=result.counts,
            timings_s={**result.timings_s, "total": time.perf_counter() - t0},
        )
        manifest.update(result.manifest)
        return run.commit(manifest, on_commit=write_report), manifest

