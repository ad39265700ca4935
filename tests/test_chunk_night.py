"""A chunk night reads only the sources that changed (issue 20).

Papers record the sha256 of their source's bytes (``source_sha256``); a night with ``--previous`` hashes the
md files of previous papers and never reads (decodes, normalises, re-hashes through the ingest) a file whose
bytes and metadata are unchanged. Its rows are carried. The result equals a run from scratch, and a night
that finds nothing changed, run as its own process, starts no Ray at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import EXAMPLES, PAPERS, assert_tables_match

from verbatim_batch.stages.chunk import ChunkJob, run_chunk

pytestmark = pytest.mark.slow


def _corpus(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        shutil.copy(EXAMPLES / "corpus" / name, folder / name)
    shutil.copy(EXAMPLES / "corpus" / "metadata.jsonl", folder.parent / "metadata.jsonl")
    return folder


def _chunk(corpus: Path, out: Path, previous: Path | None = None) -> dict:
    _, manifest = run_chunk(ChunkJob(input=str(corpus), output=str(out), metadata=str(corpus.parent / "metadata.jsonl"),
                                     previous=str(previous) if previous else None))
    return manifest["counts"]


def test_a_night_reads_only_the_sources_that_changed(ray_local, tmp_path):
    names = PAPERS[:8]
    corpus = _corpus(tmp_path / "c", names)
    _chunk(corpus, tmp_path / "full")
    stem = [n.removesuffix(".md") for n in names]

    edited = corpus / names[0]  # new bytes
    edited.write_text(edited.read_text(encoding="utf-8") + "\n\nA late erratum.\n", encoding="utf-8")
    meta = corpus.parent / "metadata.jsonl"  # paper 1: same bytes, a corrected title
    rows = [json.loads(line) for line in meta.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        if row["paper_id"] == stem[1]:
            row["title"] = "A corrected title"
    meta.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    touched = corpus / names[2]  # rewritten with the same bytes (a new mtime): unchanged
    touched.write_bytes(touched.read_bytes())
    (corpus / names[3]).unlink()  # removed
    (corpus / "moved").mkdir()  # same bytes at another path: chunked again, so its row names the new path
    shutil.move(corpus / names[4], corpus / "moved" / names[4])
    added = PAPERS[12]
    shutil.copy(EXAMPLES / "corpus" / added, corpus / added)

    counts = _chunk(corpus, tmp_path / "night", previous=tmp_path / "full")
    assert counts["papers_unread"] == 4  # papers 2 (touched), 5, 6, 7: hashed, never read through the ingest
    assert (counts["papers_unchanged"], counts["papers_changed"], counts["papers_added"],
            counts["papers_removed"]) == (4, 3, 1, 1)  # changed: 0 (bytes), 1 (metadata), 4 (moved)
    assert counts["rows_carried"] == 4 and counts["papers"] == 8

    _chunk(corpus, tmp_path / "scratch")
    for table in ("papers", "chunks", "quarantine"):
        assert_tables_match(pq.read_table(tmp_path / "night" / table), pq.read_table(tmp_path / "scratch" / table),
                            table)
    papers = {r["paper_id"]: r for r in pq.read_table(tmp_path / "night" / "papers").to_pylist()}
    assert papers[stem[1]]["title"] == "A corrected title"
    assert papers[stem[4]]["source"].endswith(f"moved/{names[4]}")


def test_a_night_with_nothing_changed_starts_no_ray_nor_imports_it(tmp_path):
    corpus = _corpus(tmp_path / "c", PAPERS[:3])
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "chunk",
           "--input", str(corpus), "--metadata", str(corpus.parent / "metadata.jsonl"), "--num-cpus", "1"]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    full = subprocess.run([*cmd, "--output", str(tmp_path / "full")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert full.returncode == 0, full.stderr[-3000:]
    # the night's process does not even import Ray (0.4 CPU-s of a 3 CPU-s night at 10% of the ACL)
    night_cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; rc = main(); "
                 "print('ray imported:', 'ray' in sys.modules); sys.exit(rc)", *cmd[3:]]
    night = subprocess.run([*night_cmd, "--output", str(tmp_path / "night"), "--previous", str(tmp_path / "full")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert night.returncode == 0, night.stderr[-3000:]
    assert "ray imported: False" in night.stdout
    manifest = json.loads((tmp_path / "night" / "manifest.json").read_text())
    assert manifest["counts"]["papers_unread"] == 3 and manifest["counts"]["rows_carried"] == 3
    assert "ray_start" not in manifest["timings_s"]
    # the full run did start one (Ray's own "Started a local Ray instance." line is no longer printed: issue 53)
    assert "ray_start" in json.loads((tmp_path / "full" / "manifest.json").read_text())["timings_s"]
