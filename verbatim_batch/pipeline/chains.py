"""The chain chunk -> embed -> index -> retrieve -> extract, defined once.

The demo, nightly runs, benchmarks and tests all run it through ``run_chain``: each stage is its own
committed run folder under one output folder (``chunks/``, ``embeddings/``, ``index/``, ``retrieval/``,
``spans/``), optionally building on the same stages of an earlier chain (``previous``). With a ``reranker`` the
chain reranks the retrieval into ``reranked/`` and extracts from that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import corpus, storage
from ..options import Declared, OptionError, check, group, option, options_of
from ..runs import jsonable
from .chunk import ChunkJob, run_chunk  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .embed import EmbedJob, run_embed  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .extract import ExtractJob, run_extract  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .index import IndexJob, run_index  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .rerank import RerankJob, run_rerank  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .retrieve import RetrieveJob, run_retrieve  # noqa: F401 - runners looked up by name (STAGE_JOBS)
from .runner import CompositeStage, Plan, RunOptions, StageContext, StageResult, run_stage

STAGES = ("chunks", "embeddings", "index", "retrieval", "spans")
RERANK_STAGE = "reranked"  # between retrieval and spans, when the chain has a reranker
# each stage: the command whose options it takes (a config section of that name), its job, its runner's name
STAGE_JOBS: dict[str, tuple[str, type, str]] = {
    "chunks": ("chunk", ChunkJob, "run_chunk"), "embeddings": ("embed", EmbedJob, "run_embed"),
    "index": ("index", IndexJob, "run_index"), "retrieval": ("retrieve", RetrieveJob, "run_retrieve"),
    RERANK_STAGE: ("rerank", RerankJob, "run_rerank"), "spans": ("extract", ExtractJob, "run_extract")}
SECTIONS = tuple(command for command, _, _ in STAGE_JOBS.values())


@dataclass
class Chain(Declared):
    """What a chain run reads, and each stage's options by its command's name (``{"extract": {"threshold":
    0.3}}``: a config file's sections; unset options keep the stage job's defaults). A ``rerank`` section with a
    ``model`` adds the rerank stage between retrieval and extraction."""

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
        """Everything the chain reads, checked before its first stage (a missing query file found after hours
        of chunking is hours lost): the corpus, metadata and query files, and every stage's options. Raises
        with one line."""
        from .retrieve import read_queries

        for what, path in (("input", self.input), ("metadata", self.metadata)):
            if path and not storage.exists(path):
                raise FileNotFoundError(f"{what} not found: {path}")
        read_queries(self.queries)  # missing, unreadable or without a query column: refused here
        self.stage_jobs()

    @property
    def reranks(self) -> bool:
        return self.stages.get("rerank", {}).get("model") is not None

    def stage_jobs(self, output: str = "", **common: Any) -> dict[str, Any]:
        """``{stage folder: job}`` of every stage this chain runs, built from its section over the defaults
        (``output``: the chain's folder; ``common``: run options every stage shares)."""
        from ..options import build

        out = storage.normalize(output) if output else ""
        at = (lambda stage: storage.join(out, stage)) if out else (lambda stage: stage)
        wiring = {
            "chunks": {"input": self.input, "format": self.format, "metadata": self.metadata},
            "embeddings": {"chunks": at("chunks")},
            "index": {"embeddings": at("embeddings"), "chunks": at("chunks")},
            "retrieval": {"index": at("index"), "queries": self.queries},
            RERANK_STAGE: {"retrieval": at("retrieval")},
            "spans": {"retrieval": at(RERANK_STAGE if self.reranks else "retrieval")},
        }
        jobs = {}
        for stage in chain_stages(self):
            command, cls, _ = STAGE_JOBS[stage]
            values = self.stages.get(command, {}) | wiring[stage] | common | {"output": at(stage)}
            jobs[stage] = build(cls, values, lambda of, c=command: f"{of.flag} ({c}.{of.key})")
        return jobs


def stage_keys(command: str) -> tuple[str, ...]:
    """The options of stage ``command`` a chain takes from its section: all but what the chain wires (inputs,
    outputs and run options, which are the chain's own)."""
    cls = next(c for name, c, _ in STAGE_JOBS.values() if name == command)
    own = {of.key for of in options_of(RunOptions)} | {of.key for of in options_of(Chain)}
    return tuple(of.key for of in options_of(cls) if of.key not in own and not of.option.path)


def stage_options(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """A stage section's values, each checked as the option takes it (raises ``OptionError``)."""
    if command not in SECTIONS:
        raise OptionError(f"a chain has no stage {command!r} (its stages: {', '.join(SECTIONS)})")
    cls = next(c for name, c, _ in STAGE_JOBS.values() if name == command)
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
    results: dict[str, tuple[str, dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    for name, job in jobs.items():
        if previous and (name != RERANK_STAGE or storage.exists(storage.join(previous, name, "manifest.json"))):
            job.previous = storage.join(previous, name)
        t = time.perf_counter()
        results[name] = globals()[STAGE_JOBS[name][2]](job)  # looked up here: tests replace a runner
        timings[name] = time.perf_counter() - t
        if after_stage is not None:
            after_stage(name)
    return results, timings


def chain_stages(chain: Chain) -> tuple[str, ...]:
    """The chain's stages in order: ``STAGES``, with ``reranked`` before ``spans`` when it reranks."""
    return STAGES if not chain.reranks else (*STAGES[:-1], RERANK_STAGE, STAGES[-1])


def chain_result(results: dict[str, tuple[str, dict[str, Any]]], timings: dict[str, float],
                 table_prefix: bool, **manifest: Any) -> StageResult:
    """A composite run's result (``run``, ``nightly``): every stage's tables and counts as ``<stage>.<count>``
    (time spent is in each stage's own manifest)."""
    manifests = {name: m for name, (_, m) in results.items()}
    return StageResult(
        tables={(f"{stage}/{name}" if table_prefix else name): info for stage, m in manifests.items()
                for name, info in m["tables"].items()},
        counts=stage_counts(manifests), timings_s=timings,
        manifest={"stages": {name: name for name in manifests}} | manifest)


def stage_counts(manifests: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Every stage's counts as ``<stage>.<count>`` (time spent is in each stage's own manifest)."""
    return {f"{stage}.{key}": int(value) for stage, m in manifests.items() for key, value in m["counts"].items()
            if not key.startswith("time_ms.")}


@dataclass(kw_only=True)
class ChainJob(RunOptions):
    """``verbatim-batch run``: the whole chain on one corpus and query file, into ``output/<stage>``."""

    chain: Chain = group(Chain, required=True)


class ChainStage(CompositeStage):
    """The chain as one run: one Ray start for every stage, each stage its usual committed run folder under
    ``output`` (all under one run id, so a rerun after a kill skips committed stages and resumes the one that
    was interrupted), and a manifest and report for the whole."""

    command = "run"

    def plan(self) -> Plan:
        c: Chain = self.job.chain
        c.check()
        config = {"input": c.input, "queries": c.queries, "metadata": c.metadata, "format": c.format,
                  "stages": jsonable(c.stages)}
        return Plan(config=config, inputs=(c.input, c.queries, *([c.metadata] if c.metadata else [])))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job: ChainJob = self.job
        results, timings = run_chain(job.chain, ctx.staging, previous=job.previous, run_id=ctx.run_id,
                                     address=job.address, num_cpus=job.num_cpus, batch_retries=job.batch_retries)
        return chain_result(results, timings, table_prefix=True)


def run_chain_job(job: ChainJob) -> tuple[str, dict[str, Any]]:
    """``verbatim-batch run``: the chain as one committed, resumable run."""
    return run_stage(ChainStage(job))
