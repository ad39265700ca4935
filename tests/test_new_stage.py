"""A stage and an option of a user's own, defined entirely in this file (issue 41): a dedup step between chunk and
embed, declared by what it reads and writes, joins the chain without touching the chain's code; its options
become a config section; its output-deciding option changes the run id and its runtime one does not; a chain
with it resumes after a failure and the next chain carries from it. A new output-deciding option of the extract
job is bound to the run the same way.

The wiring tests need no Ray; the chain test runs the whole chain (e2e tier, ``tests/conftest.py``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from verbatim_batch.core import storage
from verbatim_batch.core.options import option, settings
from verbatim_batch.core.runs import committed_table_dir, read_manifest
from verbatim_batch.core.tables import config_hash
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import Command, Plan, RunOptions, Stage, StageContext, StageResult
from verbatim_batch.stages import chains, registry
from verbatim_batch.stages.chains import Chain
from verbatim_batch.stages.extract import ExtractJob, ExtractStage

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "verbatim_batch" / "examples"


@dataclasses.dataclass(kw_only=True)
class DedupJob(RunOptions):
    """Drop chunks whose text repeats an earlier chunk's (and chunks shorter than ``min_chars``)."""

    chunks: str = option(help="the chunk run", path=True)
    min_chars: int = option(0, "drop chunks shorter than this", low=0)
    workers: int = option(1, "parallel readers", low=1, runtime=True)


class DedupStage(Stage):
    command = "dedup"
    reads = {"chunks": ("chunks",)}
    writes = ("papers", "chunks")

    def plan(self) -> Plan:
        job: DedupJob = self.job
        return Plan(config={"chunks": job.chunks} | {k: v for k, v in settings(job).items() if k != "chunks"},
                    inputs=(job.chunks,))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        job: DedupJob = self.job
        papers = storage.read_parquet(committed_table_dir(job.chunks, "papers"))
        chunks = storage.read_parquet(committed_table_dir(job.chunks, "chunks"))
        seen: set[str] = set()
        keep = []
        for text in chunks["text"].to_pylist():
            keep.append(text not in seen and len(text) >= job.min_chars)
            seen.add(text)
        kept = chunks.filter(pa.array(keep))
        for name, table in (("papers", papers), ("chunks", kept)):
            storage.write_parquet(table, storage.join(ctx.staging, name, "part-0.parquet"))
        return StageResult(tables={"papers": {"rows": papers.num_rows, "files": 1},
                                   "chunks": {"rows": kept.num_rows, "files": 1}},
                           counts={"chunks_in": chunks.num_rows, "chunks_dropped": chunks.num_rows - kept.num_rows})


def run_dedup(job: DedupJob) -> tuple[str, dict]:
    return run_stage(DedupStage(job))


# the stage's one declaration: its command, options, YAML section and chain step all come from it
COMMAND = Command("dedup", "drop repeated and short chunks", DedupJob, run_dedup, stage=DedupStage, folder="deduped")


@pytest.fixture
def with_dedup() -> Iterator[None]:
    registry.add(COMMAND, after="chunk")
    try:
        yield
    finally:
        registry.remove("dedup")


def _chain(tmp_path: Path, **stages) -> Chain:
    return Chain(input=str(EXAMPLES / "corpus"), queries=str(EXAMPLES / "queries.jsonl"), stages=stages)


def test_a_new_step_is_wired_by_what_it_reads_and_writes(with_dedup, tmp_path):
    wiring = _chain(tmp_path).wiring()
    assert list(wiring) == ["chunks", "deduped", "embeddings", "index", "retrieval", "spans"]
    assert wiring["deduped"] == {"chunks": "chunks"}
    assert wiring["embeddings"] == {"chunks": "deduped"}  # the last step that writes chunks
    assert wiring["index"] == {"embeddings": "embeddings", "chunks": "deduped"}
    assert wiring["retrieval"]["index"] == "index" and wiring["spans"]["retrieval"] == "retrieval"
    assert wiring["chunks"]["input"] == str(EXAMPLES / "corpus")
    jobs = _chain(tmp_path, dedup={"min_chars": 40}).stage_jobs("/tmp/out")
    assert jobs["deduped"].min_chars == 40 and jobs["embeddings"].chunks == "/tmp/out/deduped"
    assert "dedup" in chains.sections()


def test_without_the_step_the_wiring_is_the_chains_own(tmp_path):
    wiring = _chain(tmp_path).wiring()
    assert wiring["embeddings"] == {"chunks": "chunks"} and "deduped" not in wiring
    reranking = _chain(tmp_path, rerank={"model": "some/cross-encoder"}).wiring()
    assert reranking["reranked"]["retrieval"] == "retrieval" and reranking["spans"]["retrieval"] == "reranked"


def test_the_new_stage_is_a_command_a_section_a_job_and_a_reference_entry(with_dedup, tmp_path, capsys):
    """Registered from this file alone, the stage is a CLI command with its flags, a chain's config section and
    ``--dedup-*`` flags, a job ``build_job`` makes, and a section of the regenerated option reference; taken out
    again, it is none of these."""
    from verbatim_batch.cli import main
    from verbatim_batch.cli.commands import build_job
    from verbatim_batch.cli.config import load_config
    from verbatim_batch.cli.reference import markdown as options_reference

    with pytest.raises(SystemExit):
        main(["dedup", "--help"])
    assert "--min-chars" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--dedup-min-chars" in capsys.readouterr().out
    job = build_job("dedup", chunks=str(tmp_path / "c"), output=str(tmp_path / "o"), min_chars=5)
    assert isinstance(job, DedupJob) and job.min_chars == 5
    config = tmp_path / "c.yaml"
    config.write_text("dedup:\n  min_chars: 7\n", encoding="utf-8")
    assert load_config(str(config), "run")["dedup.min_chars"] == 7
    assert "## `verbatim-batch dedup`" in options_reference() and "`dedup:`" in options_reference()


def test_a_stage_taken_out_is_gone():
    from verbatim_batch.cli.options import COMMANDS
    from verbatim_batch.cli.reference import markdown as options_reference

    assert "dedup" not in COMMANDS and "dedup" not in chains.sections()
    assert "verbatim-batch dedup" not in options_reference()


def test_the_new_options_roles_decide_the_chains_settings(with_dedup, tmp_path):
    base = config_hash(chains.chain_settings(_chain(tmp_path)))
    assert config_hash(chains.chain_settings(_chain(tmp_path, dedup={"workers": 4}))) == base
    assert config_hash(chains.chain_settings(_chain(tmp_path, dedup={"min_chars": 40}))) != base


@dataclasses.dataclass(kw_only=True)
class MyExtractJob(ExtractJob):
    """The extract job with an option of the user's own: output-deciding, and one that is runtime only."""

    answer_style: str = option("short", "how long an answer may be", choices=("short", "long"))
    trace: bool = option(False, "log each pair", runtime=True)


def test_a_new_extract_option_is_bound_to_the_run(tmp_path):
    """Its value is part of the settings a run id is bound to; a runtime option of its own is not."""
    from verbatim_batch.extract.semantic import SemanticConfig

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"query": "q", "chunk": "c"}) + "\n")

    def bound(**kw) -> str:
        """The settings hash a run id is bound to (resuming it with other settings is refused)."""
        job = MyExtractJob(output=str(tmp_path / "o"), pairs=str(pairs), extractor=SemanticConfig(), **kw)
        return config_hash(ExtractStage(job).plan().config)

    assert bound(answer_style="long") != bound()
    assert bound(trace=True) == bound()
    with pytest.raises(ValueError, match="answer_style must be one of short, long"):
        MyExtractJob(output="o", pairs=str(pairs), answer_style="medium")


@pytest.mark.e2e
def test_a_chain_with_the_new_step_resumes_and_carries(with_dedup, ray_local, tmp_path, monkeypatch):
    """The chain with the dedup step on four bundled papers: the spans stage fails once (its runner replaced),
    the rerun with the same run id resumes (every committed stage left as it was), and a second chain built on
    the first carries every embedding (the same chunks, deduplicated the same way)."""
    from verbatim_batch.stages.chains import run_chain

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    names = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md"))[:4]
    for name in names:
        (corpus / name).write_text((EXAMPLES / "corpus" / name).read_text(encoding="utf-8"), encoding="utf-8")
    ids = {name.removesuffix(".md") for name in names}
    queries = tmp_path / "queries.jsonl"  # the bundled queries about these papers
    queries.write_text("".join(line + "\n" for line in (EXAMPLES / "queries.jsonl").read_text().splitlines()
                               if line.strip() and json.loads(line).get("paper_id") in ids))
    chain = Chain(input=str(corpus), queries=str(queries), stages={"dedup": {"min_chars": 1000}})
    out = tmp_path / "first"

    def broken(job):
        raise RuntimeError("the spans stage failed")

    monkeypatch.setitem(chains.RUNNERS, "extract", broken)
    with pytest.raises(RuntimeError, match="spans stage failed"):
        run_chain(chain, str(out), run_id="r1", num_cpus=2)
    committed = {s: read_manifest(str(out / s))["created_at"] for s in ("chunks", "deduped", "embeddings")}
    monkeypatch.undo()
    results, _ = run_chain(chain, str(out), run_id="r1", num_cpus=2)
    assert {s: read_manifest(str(out / s))["created_at"] for s in committed} == committed  # left as they were
    dedup = results["deduped"][1]
    assert dedup["counts"]["chunks_in"] > dedup["tables"]["chunks"]["rows"] > 0
    embedded = storage.read_parquet(str(out / "embeddings" / "embeddings"), ["chunk_id"])["chunk_id"]
    kept = storage.read_parquet(str(out / "deduped" / "chunks"), ["chunk_id"])["chunk_id"]
    assert sorted(embedded.to_pylist()) == sorted(kept.to_pylist())  # embed read the dedup step's chunks
    spans = storage.read_parquet(str(out / "spans" / "spans"))
    assert spans.num_rows > 0 and pc.all(pc.is_in(spans["chunk_id"], kept)).as_py()

    second, _ = run_chain(chain, str(tmp_path / "second"), previous=str(out), run_id="r2", num_cpus=2)
    counts = second["embeddings"][1]["counts"]
    assert counts["rows_carried"] == len(kept) and counts["rows_new"] == 0


def test_the_guide_lists_the_files_a_stage_touches():
    """docs/development.md lists the files a stage touches; each exists for the rerank stage, and every
    registered stage has its Ray job entry point."""
    import re

    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("<!-- stage-files -->", 1)[1].split("<!-- /stage-files -->", 1)[0]
    paths = re.findall(r"`([\w/<>.-]+\.(?:py|md))`", block)
    assert len(paths) == 7, paths
    missing = [p for p in paths if not (REPO / p.replace("<name>", "rerank")).exists()]
    assert missing == []
    assert [c.name for c in registry.STAGES if not (REPO / "jobs" / f"{c.name}.py").exists()] == []
