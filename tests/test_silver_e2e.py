"""The silver job end to end on the example corpus, against a real local OpenAI-compatible server.

The served model is a tiny chat model trained in the test to answer each of the pipeline's
prompts with a fixed reply (tests/llmserver.py), so every step has something real to chew on:
query types, questions, search queries and teacher answers all travel over HTTP.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from llmserver import OpenAIServer, make_scripted_chat_model, require_server

from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.extract.llm import LLMConfig
from verbatim_batch.retrieval.embedder import DEFAULT_MODEL
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_batch.stages.embed import EmbedJob, run_embed
from verbatim_batch.stages.index import IndexJob, run_index
from verbatim_batch.stages.silver import SilverJob, run_silver

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow
CORPUS = Path(__file__).resolve().parents[1] / "verbatim_batch" / "examples" / "corpus"
TEACHER = '{"doc_0": ["we train"], "doc_1": ["the results"], "doc_2": [], "doc_3": [], "doc_4": []}'
SCRIPT = [
    ("Which 3 of the question types", '["Definition", "Quantification", "Comparison"]'),
    ("Write one question of type", "What is the method used for training?"),
    ("Write the short search query", "training method dataset"),
    ("<doc_0>", TEACHER),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_server()
    work = tmp_path_factory.mktemp("silver-llm")
    model = make_scripted_chat_model(work / "model", SCRIPT)
    with OpenAIServer(model, work) as srv:
        yield srv


@pytest.fixture(scope="module")
def built(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("silver-runs")
    chunks, _ = run_chunk(ChunkJob(input=str(CORPUS), output=str(tmp / "chunks"), format="md",
                                   metadata=str(CORPUS / "metadata.jsonl")))
    emb, _ = run_embed(EmbedJob(chunks=chunks, output=str(tmp / "emb")))
    index, _ = run_index(IndexJob(embeddings=emb, chunks=chunks, output=str(tmp / "index")))
    return chunks, index


def test_silver_job_end_to_end(served, built, tmp_path):
    chunks, index = built
    llm = LLMConfig(model=served.model, base_url=served.base_url, max_tokens=96, max_in_flight=2, timeout_s=300)
    job_dir, manifest = run_silver(SilverJob(chunks=chunks, index=index, output=str(tmp_path / "silver"), llm=llm,
                                             n_papers=4, seed=1, tokenizer=DEFAULT_MODEL, max_length=128, stride=32))
    assert manifest["command"] == "silver" and set(manifest["steps"]) == {"querygen", "retrieval", "teacher", "data"}
    data = str(Path(job_dir) / "data")  # the job folder holds each step's run; the silver tables are in data/
    counts = manifest["counts"]
    # papers -> queries -> rows -> kept -> train/dev, as the paper reports them
    assert counts["papers"] == 4 and counts["queries"] == 12  # 3 question types per chunk
    assert counts["rows"] >= counts["queries"] and counts["rows_failed"] == 0
    assert counts["kept"] == counts["train"] + counts["dev"] <= counts["rows"]
    assert counts["kept"] + sum(v for k, v in counts.items() if k.startswith("dropped.")) == counts["rows"]
    queries = read_table(str(tmp_path / "silver" / "querygen"), "queries").to_pylist()
    assert {q["question_type"] for q in queries} == {"Definition", "Quantification", "Comparison"}
    assert {q["query"] for q in queries} == {"training method dataset"}
    teacher = json.loads(read_manifest(str(tmp_path / "silver" / "teacher"))["config"])
    assert teacher["extractor_config"]["style"] == "paragraph"

    from datasets import load_dataset

    files = {s: str(Path(data) / f"{s}.parquet") for s in ("train", "dev")
             if pq.read_metadata(str(Path(data) / f"{s}.parquet")).num_rows}
    ds = load_dataset("parquet", data_files=files)
    rows = [r for split in ds.values() for r in split]
    assert len(rows) == counts["kept"]
    assert {r["source"] for r in rows} <= {"gold", "retrieved"}
    for r in rows:
        assert r["label"] == (1 if r["spans"] else 0)
        for s in r["spans"]:
            assert r["chunk"][s["start"]:s["end"]] == s["text"]  # the verbatim promise holds in training data
    windows = load_dataset("parquet", data_files={s: str(Path(data) / "windows" / f"{s}.parquet") for s in files})
    first = next(iter(windows.values()))[0]
    assert len(first["input_ids"]) == len(first["labels"]) <= 128 and -100 in first["labels"]


def test_silver_killed_resumes_by_run_id(served, built, tmp_path):
    """`verbatim-batch silver --run-id`: SIGKILLed right after its first querygen write; the rerun with the
    same id keeps that write (no query generated twice), runs the other steps and commits the data."""
    chunks, index = built
    out = tmp_path / "silver"
    argv = [sys.executable, "-m", "verbatim_batch.cli", "silver", "--chunks", chunks, "--index", index,
            "--output", str(out), "--model", served.model, "--base-url", served.base_url, "--max-tokens", "96",
            "--max-in-flight", "2", "--timeout", "300", "--n-papers", "4", "--seed", "1", "--run-id", "s1",
            "--num-cpus", "2"]
    marker = tmp_path / "fired"
    env = {**os.environ, "VERBATIM_BATCH_FAULT": f"sink.recorded:queries#1@{marker};target=driver"}
    killed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    assert marker.exists() and not (out / "querygen" / "manifest.json").exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    qg = read_manifest(str(out / "querygen"))
    assert qg["run_id"] == "s1" and qg["counts"]["rows_resumed"] == 4 and qg["counts"]["queries"] == 12
    teacher = read_manifest(str(out / "teacher"))["counts"]
    data = read_manifest(str(out / "data"))
    assert data["run_id"] == "s1" and data["counts"]["rows"] == teacher["pairs"]
    assert not list(out.glob(".*staging*")), "staging folders left behind"
