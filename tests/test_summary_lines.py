"""Every summary line a user might not understand says what it means and which option changes it (issue 53,
item 5): an embed run's truncated chunks, told apart from reference lists kept to their first window, and a rerank
run's inputs cut to its length."""

from __future__ import annotations

import pyarrow as pa

from verbatim_batch.core.runs import build_manifest, read_manifest, write_manifest
from verbatim_batch.report.summary import print_run
from verbatim_batch.stages.embed import embed_table_counts


def _run(path, command, counts, config):
    manifest = build_manifest(run_id="r1", command=command, config=config, inputs=[], tables={},
                              counts=counts, timings_s={"total": 1.0})
    write_manifest(str(path), manifest)
    return str(path)


def test_an_embed_run_says_what_truncated_means_and_the_option(tmp_path, capsys):
    # five chunks: two cut at the limit of 8 windows, one reference list kept to its first window, two whole
    table = pa.table({"n_tokens": pa.array([2000, 2100, 300, 100, 900], pa.int32()),
                      "truncated": [True, True, True, False, False],
                      "windows": pa.array([8, 8, 1, 1, 4], pa.int16())})
    counts = embed_table_counts("embeddings", table)
    run = _run(tmp_path / "e", "embed", counts, {"embedder": {"max_windows": 8}})
    print_run(run, read_manifest(run))
    out = capsys.readouterr().out
    assert "2 chunk(s) longer than --max-windows 8 windows" in out and "a larger --max-windows embeds more" in out
    assert "1 reference list(s) embedded in their first window only" in out and "--reference-windows" in out
    assert "cut after --max-windows" not in out

    # --max-windows 1: every truncated chunk is cut at the one window, none is told as a reference list
    run = _run(tmp_path / "one", "embed", counts, {"embedder": {"max_windows": 1}})
    print_run(run, read_manifest(run))
    out = capsys.readouterr().out
    assert "3 chunk(s) longer than --max-windows 1 windows" in out and "reference list" not in out

    # nothing truncated: no line about it
    whole = embed_table_counts("embeddings", table.slice(3))
    run = _run(tmp_path / "whole", "embed", whole, {"embedder": {"max_windows": 8}})
    print_run(run, read_manifest(run))
    out = capsys.readouterr().out
    assert "windows in all" in out and "--max-windows" not in out and "reference" not in out


def test_a_rerank_run_says_its_inputs_were_cut_and_the_option(tmp_path, capsys):
    run = _run(tmp_path / "r", "rerank", {"tokens": 900, "padded_tokens": 950, "truncated": 4},
               {"reranker": {"max_length": 512}})
    print_run(run, read_manifest(run))
    out = capsys.readouterr().out
    assert "4 (query, chunk) input(s) cut to the reranker's --max-length 512 tokens" in out
    assert "windows in all" not in out  # not an embed run's line
