"""The settings a run id is bound to are derived from the options' roles, for every stage (issue 51).

Each stage's ``plan().config`` (hashed and bound to the run id: a killed run resumed with other settings is
refused) is built by ``engine.stage.bound_settings`` from the job's output-deciding options plus what the plan
resolved. Here every stage of the registry plans over small committed runs made by hand (manifests written by
the real code, tables where a plan reads them), and each of its options is changed in turn: a runtime option
never changes the bound settings (a resumed run with another value resumes), an output option always does.
No Ray: plans are cheap by contract. ``test_resume_with_another_token_budget`` then kills a real embed run and
resumes it with another ``--token-budget``, the case the option reference promises.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import assert_tables_match, tiny_model_dir
from test_option_roles import TURNED_ON_BY, _varied

from verbatim_batch.core import storage
from verbatim_batch.core.options import OptionError, options_of
from verbatim_batch.core.runs import build_manifest, read_manifest, read_table, write_manifest
from verbatim_batch.core.tables import config_hash
from verbatim_batch.extract.llm import LLMConfig
from verbatim_batch.retrieval.reranker import RerankerConfig
from verbatim_batch.stages.embed import EmbedJob, EmbedStage
from verbatim_batch.stages.index import IndexJob, IndexStage
from verbatim_batch.stages.querygen import QueryGenJob, QueryGenStage
from verbatim_batch.stages.rerank import RerankJob, RerankStage
from verbatim_batch.stages.retrieve import RetrieveJob, RetrieveStage
from verbatim_batch.stages.silver import SilverJob, SilverStage


def _committed(path: Path, command: str, config: dict) -> str:
    write_manifest(str(path), build_manifest(run_id=path.name, command=command, config=config, inputs=[],
                                             tables={}, counts={}, timings_s={}))
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """A chunk run (one chunk), an embed run, an index run, a retrieval run, a query file and a tiny model."""
    root = tmp_path_factory.mktemp("plans")
    model = str(tiny_model_dir(root / "model", "bert"))
    storage.write_parquet(pa.table({"chunk_id": ["c0"], "text": ["a chunk"]}),  # plans read no rows
                          str(root / "chunks" / "chunks" / "part-0.parquet"))
    chunks = _committed(root / "chunks", "chunk", {})
    emb = root / "embeddings"
    storage.write_parquet(pa.table({"chunk_id": ["c0"]}), str(emb / "embeddings" / "part-0.parquet"))
    embeddings = _committed(emb, "embed", {"chunks": chunks, "embedder": {"model": model}, "embedder_hash": "h",
                                           "dim": 32, "model_revision": "r"})
    index = _committed(root / "index", "index", {"chunks": chunks, "embeddings": embeddings,
                                                 "embedder": {"model": model}, "fingerprint": "f"})
    queries = root / "queries.jsonl"
    queries.write_text(json.dumps({"query_id": "q0", "query": "a question"}) + "\n", encoding="utf-8")
    retrieval = _committed(root / "retrieval", "retrieve", {"queries": str(queries), "index": index, "key": "k"})
    return {"root": str(root), "model": model, "chunks": chunks, "embeddings": embeddings, "index": index,
            "queries": str(queries), "retrieval": retrieval}


def _jobs(i: dict[str, str]) -> dict[str, tuple[type, type, dict]]:
    """Every keyed or plain stage that binds settings: (job class, stage class, the job's base arguments)."""
    from verbatim_batch.retrieval.embedder import EmbedderConfig

    out = lambda name: os.path.join(i["root"], "out", name)  # noqa: E731
    llm = LLMConfig(model="teacher", base_url="http://127.0.0.1:9/v1")
    return {
        "embed": (EmbedJob, EmbedStage, {"chunks": i["chunks"], "output": out("e"),
                                         "embedder": EmbedderConfig(model=i["model"])}),
        "index": (IndexJob, IndexStage, {"embeddings": i["embeddings"], "chunks": i["chunks"], "output": out("i")}),
        "retrieve": (RetrieveJob, RetrieveStage, {"index": i["index"], "queries": i["queries"], "output": out("r")}),
        "rerank": (RerankJob, RerankStage, {"retrieval": i["retrieval"], "chunks": i["chunks"], "output": out("k"),
                                            "reranker": RerankerConfig(model=i["model"])}),
        "querygen": (QueryGenJob, QueryGenStage, {"chunks": i["chunks"], "llm": llm, "output": out("q")}),
        "silver": (SilverJob, SilverStage, {"chunks": i["chunks"], "index": i["index"], "llm": llm,
                                            "output": out("s")}),
    }


def _with(job_cls: type, base: dict, key: str, value) -> object:
    """The job of ``base`` with option ``key`` set to ``value`` (a nested config's option on that config)."""
    of = next(o for o in options_of(job_cls) if o.key == key)
    kw = dict(base)
    if of.group:
        cfg = kw.get(of.group) or next(f for f in dataclasses.fields(job_cls) if f.name == of.group) \
            .metadata["group"].kinds[0]()
        extra = TURNED_ON_BY.get(key, {})
        kw[of.group] = dataclasses.replace(cfg, **extra, **{of.field: (not value) if of.option.invert else value})
    else:
        kw[of.field] = (not value) if of.option.invert else value
    return job_cls(**kw)


@pytest.mark.parametrize("stage", ["embed", "index", "retrieve", "rerank", "querygen", "silver"])
def test_plan_settings_follow_the_roles(inputs, stage):
    job_cls, stage_cls, base = _jobs(inputs)[stage]
    before = config_hash(stage_cls(job_cls(**base)).plan().config)
    tried = {True: [], False: []}
    for key, value, runtime in _varied(job_cls, skip={"model", "revision", "tokenizer", "backend"}):
        try:
            job = _with(job_cls, base, key, value)
        except (OptionError, ValueError, TypeError):
            continue  # a value this job refuses with its other settings (checked where it is declared)
        after = config_hash(stage_cls(job).plan().config)
        tried[runtime].append(key)
        if runtime:
            assert after == before, f"{stage}: --{key} is a runtime option but changed the settings bound to the run id"
        else:
            assert after != before, f"{stage}: --{key} decides the output but the bound settings ignore it"
    assert tried[False], f"{stage}: no output option tried"
    if stage != "index":  # the index job has no runtime option of its own
        assert tried[True], f"{stage}: no runtime option tried"


def test_embed_carries_by_every_setting_but_its_input(inputs, tmp_path):
    """Vectors carry from ``--previous`` when every bound setting is the one it recorded, the chunk run (the input,
    which a vector carries across by its chunk's context) aside: no hand list of embedder keys."""
    from verbatim_batch.retrieval.embedder import EmbedderConfig
    from verbatim_batch.stages.embed import unchanged_chunks

    def chunk_run(name: str, context: str) -> str:
        storage.write_parquet(pa.table({"chunk_id": ["c0", "c1"], "context": [context, "same"]}),
                              str(tmp_path / name / "chunks" / "part-0.parquet"))
        return _committed(tmp_path / name, "chunk", {})

    old, new = chunk_run("old", "before"), chunk_run("new", "after")
    job = EmbedJob(chunks=new, output=str(tmp_path / "e"), embedder=EmbedderConfig(model=inputs["model"]))
    config = EmbedStage(job).plan().config
    prev = _committed(tmp_path / "prev", "embed", config | {"chunks": old})  # another chunk run: carried across
    same, why = unchanged_chunks(prev, str(tmp_path / "new" / "chunks"), config)
    assert (same.to_pylist(), why) == (["c1"], None)  # c0's context changed
    for key, value in (("embedder_hash", "another"), ("dim", 7), ("model_revision", "another"),
                       ("a_setting_added_later", 1)):
        prev = _committed(tmp_path / f"prev-{key}", "embed", config | {"chunks": old, key: value})
        same, why = unchanged_chunks(prev, str(tmp_path / "new" / "chunks"), config | {key: config.get(key, 2)})
        assert (len(same), why) == (0, f"embedder changed ({key})")
    # the embedder by its hash: its model at another path (a bundled model in another venv) is the same model
    prev = _committed(tmp_path / "prev-path", "embed",
                      config | {"chunks": old, "embedder": config["embedder"] | {"model": "/elsewhere/model"}})
    assert unchanged_chunks(prev, str(tmp_path / "new" / "chunks"), config)[0].to_pylist() == ["c1"]


def _embed(chunks: str, output: str, model: str, run_id: str, budget: int, *extra: str, env: dict | None = None):
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "embed",
           "--chunks", chunks, "--output", output, "--run-id", run_id, "--model", model, "--num-cpus", "2",
           "--batch-rows", "4", "--token-budget", str(budget), *extra]
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=base | (env or {}))


@pytest.mark.slow
def test_resume_with_another_token_budget(tmp_path):
    """An embed run killed in its third model batch (its staging folder bound to its settings): rerun with the
    same run id and another output option, refused in one line; with only --token-budget (a runtime option)
    changed, it resumes instead of being refused and ends with the tables of a clean run."""
    from helpers import PAPERS, make_corpus

    from verbatim_batch.cli import main

    corpus = make_corpus(tmp_path / "corpus", PAPERS[:1])
    assert main(["chunk", "--input", str(corpus), "--output", str(tmp_path / "chunks"), "--num-cpus", "1"]) == 0
    model = str(tiny_model_dir(tmp_path / "model", "bert", pooling="mean"))
    chunks = str(tmp_path / "chunks")

    def kill(run: str, run_id: str, *extra: str) -> None:
        killed = _embed(chunks, str(tmp_path / run), model, run_id, 512, *extra,
                        env={"VERBATIM_BATCH_FAULT": f"embed.batch#3@{tmp_path / (run + '-fired')};target=driver"})
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        assert [d for d in os.listdir(tmp_path) if d.startswith(f".{run}.staging-")], "no staging folder to resume"

    kill("e", "e1")
    refused = _embed(chunks, str(tmp_path / "e"), model, "e1", 4096, "--output-dtype", "float16")
    assert refused.returncode == 2 and "other settings" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    resumed = _embed(chunks, str(tmp_path / "e"), model, "e1", 4096)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert read_manifest(str(tmp_path / "e"))["run_id"] == "e1"
    clean = _embed(chunks, str(tmp_path / "clean"), model, "e2", 4096)
    assert clean.returncode == 0, (clean.stdout + clean.stderr)[-3000:]
    assert_tables_match(read_table(str(tmp_path / "e"), "embeddings"),
                        read_table(str(tmp_path / "clean"), "embeddings"), "embeddings")
