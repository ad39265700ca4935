"""The stage contract checks itself (issue 41): a stage declares the runs it reads by the tables they must hold
(``Stage.reads``), an input is accepted for what it holds whichever command wrote it, a chain's folder stands for
its stage folder that holds the tables, a stage class with inconsistent declarations fails when it is
defined, not mid-run, and the runner applies the job's options to a stage's declared resources and hands them
over (``ctx.resources``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from verbatim_batch.core.runs import build_manifest, expect_tables, holding, write_manifest
from verbatim_batch.engine.resources import Resources
from verbatim_batch.engine.stage import Stage, TableStage


def _run(path: Path, command: str, tables: dict, stages: dict | None = None, created: str = "") -> str:
    path.mkdir(parents=True, exist_ok=True)
    extra = ({"stages": stages} if stages else {}) | ({"created_at": created} if created else {})
    manifest = build_manifest(run_id="r1", command=command, config={}, inputs=[],
                              tables={t: {"rows": 1, "files": 1} for t in tables}, counts={}, timings_s={}) | extra
    write_manifest(str(path), manifest)
    return str(path)


def test_an_input_is_what_it_holds(tmp_path):
    own = _run(tmp_path / "own", "my-dedup", {"papers", "chunks", "quarantine"})  # a stage of a user's own
    assert expect_tables(own, "--chunks", ("chunks",)) == own
    with pytest.raises(ValueError, match=r"--index expects a committed run holding ids; .* is a my-dedup run "
                                         r"holding chunks, papers, quarantine$"):
        expect_tables(own, "--index", ("ids",))


def test_a_chain_folder_stands_for_its_stage_folder(tmp_path):
    chain = tmp_path / "demo"
    # committed in the chain's order (a manifest's keys are written sorted: the stages' order is their commits')
    _run(chain / "chunks", "chunk", {"papers", "chunks", "quarantine"}, created="2026-11-28T01:00:00+00:00")
    _run(chain / "retrieval", "retrieve", {"retrieval"}, created="2026-11-28T01:10:00+00:00")
    _run(chain / "reranked", "rerank", {"retrieval"}, created="2026-11-28T01:20:00+00:00")
    _run(chain / "spans", "extract", {"spans", "pairs", "rejects"}, created="2026-11-28T01:30:00+00:00")
    stages = {"chunks": "chunks", "retrieval": "retrieval", "reranked": "reranked", "spans": "spans"}
    _run(chain, "run", {"chunks/papers", "spans/spans"}, stages)
    assert expect_tables(str(chain), "--chunks", ("chunks",)) == str(chain / "chunks")
    assert holding(str(chain), ("retrieval",)) == str(chain / "reranked")  # the last, as the chain wires spans
    assert holding(str(chain), ("ids",)) is None
    # a forged stage name never leads outside the run
    forged = tmp_path / "forged"
    _run(forged, "run", set(), {"../demo/chunks": "x", "/etc": "y", ".hidden": "z"})
    assert holding(str(forged), ("chunks",)) is None


def test_inconsistent_declarations_fail_when_the_class_is_defined():
    with pytest.raises(TypeError, match="reads"):
        class BadReads(Stage):  # noqa: F841
            command = "bad-reads"
            reads = {"chunks": ()}

    with pytest.raises(TypeError, match=r"key_tables \['nope'\] are not among its tables"):
        class BadKeys(TableStage):  # noqa: F841
            command = "bad-keys"
            tables = {"rows": pa.schema([("row_id", pa.string())])}
            key_column = "row_id"
            key_tables = ("nope",)

    with pytest.raises(TypeError, match="outcomes"):
        class BadOutcome(Stage):  # noqa: F841
            command = "bad-outcome"
            outcomes = {"lost": ("x",)}

    with pytest.raises(TypeError, match="Arrow schemas"):
        class BadSchema(TableStage):  # noqa: F841
            command = "bad-schema"
            tables = {"rows": "row_id: string"}
            key_column = "row_id"

    with pytest.raises(TypeError, match=r"placement\(\)"):
        class NoPlacement(Stage):  # noqa: F841
            command = "no-placement"
            resources = {"cpu": Resources(cpus=1), "gpu": Resources(gpus=1)}

    with pytest.raises(TypeError, match="resources must be"):
        class BadResources(Stage):  # noqa: F841
            command = "bad-resources"
            resources = {"cpus": 1}

    class Good(TableStage):
        command = "good"
        reads = {"chunks": ("chunks",)}
        tables = {"rows": pa.schema([("row_id", pa.string())])}
        key_column = "row_id"

    assert Good.reads == {"chunks": ("chunks",)}


def test_every_shipped_stage_declares_what_it_reads():
    from verbatim_batch.stages.embed import EmbedStage
    from verbatim_batch.stages.extract import ExtractStage
    from verbatim_batch.stages.index import IndexStage
    from verbatim_batch.stages.querygen import QueryGenStage
    from verbatim_batch.stages.rerank import RerankStage
    from verbatim_batch.stages.retrieve import RetrieveStage
    from verbatim_batch.stages.silver import SilverStage

    for stage in (EmbedStage, IndexStage, RetrieveStage, RerankStage, ExtractStage, QueryGenStage, SilverStage):
        assert stage.reads, stage.__name__


def test_evaluate_and_verify_take_a_chain_folder_or_a_nightly_root(tmp_path):
    """``evaluate --predictions`` reads the span table of an extract run, a chain's folder (its spans stage: the
    chain folder's own files.json was read as Parquet before) or a nightly root (its current run); ``verify``
    takes a nightly root for its current run."""
    from verbatim_batch.core.runs import run_of
    from verbatim_batch.quality.evaluate import _span_table_path

    chain = tmp_path / "root" / "runs" / "n1"
    _run(chain / "chunks", "chunk", {"papers", "chunks", "quarantine"}, created="2026-11-28T01:00:00+00:00")
    _run(chain / "spans", "extract", {"spans", "pairs", "rejects"}, created="2026-11-28T01:30:00+00:00")
    _run(chain, "nightly", {"papers", "chunks", "spans"}, {"chunks": "chunks", "spans": "spans"})
    (tmp_path / "root" / "CURRENT").write_text("n1\n")
    assert _span_table_path(str(chain)) == str(chain / "spans" / "spans")
    assert _span_table_path(str(chain / "spans")) == str(chain / "spans" / "spans")
    assert _span_table_path(str(tmp_path / "root")) == str(chain / "spans" / "spans")
    assert run_of(str(tmp_path / "root")) == str(chain) and run_of(str(chain)) == str(chain)
    demo = tmp_path / "verbatim-demo"  # the demo's output: a plain folder of stage runs, no manifest of its own
    _run(demo / "spans", "extract", {"spans", "pairs", "rejects"}, created="2026-11-28T01:30:00+00:00")
    assert _span_table_path(str(demo)) == str(demo / "spans" / "spans")  # its files.json was read as Parquet
    table = tmp_path / "table"
    table.mkdir()
    assert _span_table_path(str(table)) == str(table)  # a bare span table folder
    with pytest.raises(ValueError, match="--predictions: .* holds no spans table"):
        _span_table_path(str(chain / "chunks"))


def test_the_runner_hands_a_stage_its_resources_with_the_jobs_options_and_records_them(tmp_path):
    """A stage declares what its actors need; the runner applies the job's per-stage options (``batch_rows``,
    ``concurrency``, ``worker_restarts``), gives the stage the result as ``ctx.resources`` and records it in the
    manifest's ``runtime``; one declared per placement is picked by the stage's ``placement()``."""
    import dataclasses

    from verbatim_batch.core.options import option
    from verbatim_batch.core.runs import read_manifest
    from verbatim_batch.engine.runner import run_stage
    from verbatim_batch.engine.stage import Plan, RunOptions, StageResult

    @dataclasses.dataclass(kw_only=True)
    class ToyJob(RunOptions):
        size: str = option("small", "which placement", choices=("small", "big"))
        batch_rows: int = option(16, "rows per call", low=1, runtime=True)
        concurrency: int | None = option(None, "actors", low=1, runtime=True)

    seen = []

    class Toy(Stage):
        command = "toy"
        resources = {"small": Resources(cpus=1, batch_rows=16), "big": Resources(cpus=2, gpus=1, batch_rows=16)}

        def placement(self) -> str:
            return self.job.size

        def plan(self) -> Plan:
            return Plan(config={"size": self.job.size}, inputs=())

        def execute(self, plan, ctx) -> StageResult:
            seen.append(ctx.resources)
            return StageResult(tables={}, counts={})

    job = ToyJob(output=str(tmp_path / "a"), size="big", batch_rows=5, concurrency=3, worker_restarts=1)
    path, manifest = run_stage(Toy(job))
    want = Resources(cpus=2, gpus=1, actors=3, batch_rows=5, restarts=1)
    assert seen == [want]
    assert read_manifest(path)["runtime"]["resources"] == dataclasses.asdict(want)
    run_stage(Toy(ToyJob(output=str(tmp_path / "b"))))  # the defaults: the small placement as declared
    assert seen[-1] == Resources(cpus=1, batch_rows=16)


def test_every_shipped_stage_gets_its_declaration_with_the_jobs_options():
    """The index build's task took its declaration as it stood and so ignored ``--worker-restarts`` (a stage
    applied the options to its own declaration); the runner applies them for every stage alike now."""
    from verbatim_batch.extract.semantic import SemanticConfig
    from verbatim_batch.stages.embed import EmbedJob, EmbedStage
    from verbatim_batch.stages.extract import PLACEMENT_RESOURCES, ExtractJob, ExtractStage
    from verbatim_batch.stages.index import IndexJob, IndexStage

    assert IndexStage(IndexJob(embeddings="e", chunks="c", output="o", worker_restarts=7)).resolved().restarts == 7
    embed = EmbedStage(EmbedJob(chunks="c", output="o", batch_rows=9, worker_restarts=0)).resolved()
    assert (embed.batch_rows, embed.restarts, embed.gpus) == (9, 0, 1)
    extract = ExtractStage(ExtractJob(pairs="p", output="o", extractor=SemanticConfig(), batch_rows=4))
    assert extract.resolved() == PLACEMENT_RESOURCES[extract.placement()].with_(batch_rows=4)
