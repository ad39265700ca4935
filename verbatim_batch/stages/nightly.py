"""Nightly runs: re-extract a corpus incrementally against the last committed run.

Layout of a nightly root::

    ROOT/
      runs/<run_id>/            one immutable folder per run
        _run.json               the run id and the hash of its settings, the base run included (a rerun
                                with the same id and other settings, or another base, is refused)
        chunks/ embeddings/ index/ retrieval/ spans/    committed stage runs
        manifest.json           written last: the run is committed when it exists
        report.json report.html
      CURRENT                   id of the newest committed run
      current -> runs/<run_id>  the same, as a symlink

Each stage takes the base run's stage as ``previous`` and does only what changed. Every stage is committed under
the run's id, so rerunning with ``--run-id`` after a crash skips what was already done.

Readers load the current span table with one call, which reads ``CURRENT`` once and then the run folder it names
(reading through the ``current`` link could mix nights across a commit)::

    verbatim_batch.core.runs.current_table("ROOT", "spans")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from verbatim_batch.core import limits, storage
from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.options import group, option
from verbatim_batch.core.runs import (
    RUNS_DIR,
    OutputBusyError,
    acquire_lock,
    current_run,
    expect_nightly_root,
    lock_holder,
    new_run_id,
    publish,
    release_lock,
    safe_run_id,
)
from verbatim_batch.engine.lake import IcebergTarget
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import (
    NOT_INCREMENTAL,
    Command,
    CompositeStage,
    Plan,
    RunOptions,
    StageContext,
    StageResult,
)
from verbatim_batch.report.summary import night_changes, night_stages
from verbatim_batch.stages.chains import Chain, chain_result, chain_settings, run_chain
from verbatim_batch.stages.publish import PublishJob, print_published, run_publish


@dataclass(kw_only=True)
class NightlyJob(RunOptions):
    """A nightly run: a chain under ``root``. ``output`` is not set by the user: it is ``root/runs/<run id>``."""

    chain: Chain = group(Chain, required=True)
    root: str = option(help="folder holding runs/ and the current pointer", path=True, writes=True, runtime=True)
    keep_runs: int = option(7, "committed runs kept (older ones are deleted)", low=1, high=limits.ROWS, runtime=True)
    # with a warehouse or a catalog, the night publishes itself as Iceberg tables once committed (publish.py)
    publish: IcebergTarget | None = group(IcebergTarget)
    output: str = ""

    def config(self) -> dict[str, Any]:
        """What decides a night's outputs: the chain's settings (``chains.chain_settings``)."""
        return chain_settings(self.chain)


class NightlyStage(CompositeStage):
    command = "nightly"
    takes_previous = False

    def plan(self) -> Plan:
        job: NightlyJob = self.job
        c = job.chain
        c.check()
        # the base is part of the settings: a resumed night builds on the run it started from
        config = job.config() | {"base": current_run(storage.normalize(job.root))}
        return Plan(config=config, inputs=(c.input, c.queries, *([c.metadata] if c.metadata else [])))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job: NightlyJob = self.job
        base_id = plan.config["base"]
        base = storage.join(storage.normalize(job.root), RUNS_DIR, base_id) if base_id else None
        results, timings = run_chain(job.chain, ctx.staging, previous=base, run_id=ctx.run_id, address=job.address,
                                     num_cpus=job.num_cpus, batch_retries=job.batch_retries,
                                     after_stage=lambda name: fault_point(f"stage.done:{name}"))
        update = results["index"][1].get("update", {"action": "rebuilt"})
        return chain_result(results, timings, table_prefix=False, index_update=update)

    def on_committed(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        fault_point("nightly.committed")  # committed, `current` not yet moved
        job: NightlyJob = self.job
        manifest = manifest | {"pruned": publish(storage.normalize(job.root), manifest["run_id"], job.keep_runs)}
        if job.publish is not None:  # also on a rerun of a committed night: a publish cut short completes
            try:
                manifest["published"] = run_publish(PublishJob(source=path, target=job.publish,
                                                               address=job.address, num_cpus=job.num_cpus))
            except (ValueError, OSError) as exc:  # not a refusal (exit 2): the night is committed, its publish failed
                raise RuntimeError(f"night {manifest['run_id']} is committed and current, but publishing it failed: "
                                   f"{exc}; rerun the night with --run-id {manifest['run_id']} to publish it") from exc
        return manifest


def run_nightly(job: NightlyJob) -> tuple[str, dict[str, Any]]:
    """One incremental run under ``job.root``; moves ``current`` to it once it is committed.

    A night holds the root's lock (naming its run id and base) from before it plans until it has published, so a
    second night on the same root stops at once, and no night's retention removes the base another reads."""
    root = storage.normalize(job.root)
    expect_nightly_root(root)  # a chain or run folder as --root: refused before anything is written in it
    run_id = safe_run_id(job.run_id or new_run_id("nightly", {"root": root}))
    job.chain.check()  # a refusal for a missing input leaves nothing, not even the root's lock folder
    if job.publish is not None:  # the extra missing, a catalog it cannot open: refused before the night, not after
        from verbatim_batch.engine.lake import open_catalog

        job.publish.check()
        open_catalog(job.publish)
    runs = storage.join(root, RUNS_DIR)
    try:
        lock = acquire_lock(runs, run_id, info={"base": current_run(root)})
    except OutputBusyError:
        held = lock_holder(runs) or {}
        raise OutputBusyError(
            f"another nightly is running on {root} (run {held.get('run_id')}, pid {held.get('pid')} on "
            f"{held.get('host')}): this one stops before doing anything; wait for it to finish (if no such "
            f"run is going, delete {storage.join(root, '.' + RUNS_DIR + '.lock')})") from None
    try:
        return run_stage(NightlyStage(dataclasses.replace(job, run_id=run_id,
                                                          output=storage.join(root, RUNS_DIR, run_id))))
    finally:
        release_lock(lock)


def print_night(job: NightlyJob, result: tuple[str, dict[str, Any]]) -> None:
    """A committed night: what changed, what was redone and carried, where to read it."""
    path, manifest = result
    counts = manifest["counts"]
    print(f"nightly run {manifest['run_id']} committed to {path}; current -> {manifest['run_id']}")
    print(f"  {night_changes(manifest)}")
    print(f"  {night_stages(manifest)}")
    print(f"  pairs extracted {counts.get('spans.rows_new', 0)}, carried {counts.get('spans.rows_carried', 0)}; "
          f"{counts.get('spans.spans', 0)} spans")
    if manifest.get("published"):
        print_published(None, manifest["published"])
    if storage.is_remote(job.root):  # object stores have no `current` symlink: CURRENT names the run
        print(f"  load the current span table: verbatim_batch.core.runs.current_table('{job.root}', 'spans')")
    else:  # the night's own folder, not ROOT/current/...: a reader listing through the link while the next
        #     night moves it would open files of another night (FileNotFoundError)
        print(f"  load this night's span table: pandas.read_parquet('{storage.join(path, 'spans', 'spans')}')")


COMMAND = Command("nightly", "incremental run against the last committed one; moves ROOT/current", NightlyJob,
                  run_nightly, summary=print_night, omit=("overwrite", *NOT_INCREMENTAL), chain=True)
