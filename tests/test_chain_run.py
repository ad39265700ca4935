"""`verbatim-batch run`: the whole chain on a user's corpus and queries as one committed, resumable run, on the
session's real local Ray (one Ray for every stage)."""

from __future__ import annotations

import json

import pytest
from helpers import PAPERS, make_corpus

from verbatim_batch.cli import main
from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.stages.chains import base_stages

pytestmark = pytest.mark.slow


def test_run_commits_every_stage_under_one_id_and_refuses_other_settings(ray_local, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    corpus = make_corpus(tmp_path / "corpus", PAPERS[:2], n_queries=2)
    out = tmp_path / "chain"
    argv = ["run", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"), "--queries",
            str(tmp_path / "queries.jsonl"), "--output", str(out), "--run-id", "c1", "--top-k", "2",
            "--embed-batch-rows", "64", "--extract-batch-rows", "16"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    manifest = read_manifest(str(out))
    assert manifest["command"] == "run" and manifest["run_id"] == "c1"
    assert set(manifest["stages"]) == set(base_stages())
    for stage in base_stages():
        sub = read_manifest(str(out / stage))
        assert sub["run_id"] == "c1", stage
        assert f"== {stage} ==" in printed
    c = manifest["counts"]
    assert c["chunks.papers"] == 2 and c["spans.pairs"] == c["spans.rows_in"] == 2 * 2
    spans = read_table(str(out / "spans"), "spans").to_pylist()
    chunks = {r["chunk_id"]: r["text"] for r in read_table(str(out / "chunks"), "chunks").to_pylist()}
    assert all(chunks[s["chunk_id"]][s["start"]:s["end"]] == s["text"] for s in spans)
    assert (out / "report.html").is_file()
    # the same id again: nothing is redone, whatever the options say (a committed run is never mixed)
    assert main(argv) == 0 and read_manifest(str(out)) == manifest
    assert main([*argv, "--top-k", "3", "--overwrite"]) == 0  # committed: a no-op, never a mix
    assert json.loads(read_manifest(str(out))["config"])["stages"]["spans"]["top_k"] == 2  # by stage folder
    # each stage's manifest records the settings the chain gave it
    assert json.loads(read_manifest(str(out / "spans"))["config"])["top_k"] == 2
