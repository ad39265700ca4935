"""A night with nothing changed does what docs/nightly.md says (issue 53, item 4): it starts no Ray (not even
imports it), and its summary names each stage's state ``unchanged``; its index is ``unchanged`` with nothing
added or removed, also after a night that changed something (the drift since the last build once made such a
night's index say ``added`` with 0 added and 0 removed). Its corpus has a file touched with the same bytes (a
new mtime): once enough to start a local Ray for nothing. Real `verbatim-batch nightly` processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from helpers import PAPERS, canonical, make_corpus, nightly

from verbatim_batch.core.runs import read_manifest

pytestmark = pytest.mark.e2e

UNCHANGED = "stages: chunk unchanged; embed unchanged; index unchanged; retrieve unchanged; extract unchanged"


def test_a_night_with_nothing_changed_starts_no_ray_and_names_each_stage_unchanged(tmp_path):
    root, corpus = tmp_path / "root", make_corpus(tmp_path / "corpus", PAPERS[:3])
    first = nightly(root, corpus, "n1")
    assert "index built" in first.stdout
    started = [s for s in ("chunks", "embeddings", "index", "retrieval", "spans")
               if "ray_start" in read_manifest(str(root / "runs" / "n1" / s))["timings_s"]]
    assert started, "the first night started no Ray"  # (Ray's own line about it is no longer printed)
    edited = corpus / PAPERS[0]
    edited.write_text(edited.read_text(encoding="utf-8") + "\n\nA late erratum on the held-out split.\n",
                      encoding="utf-8")
    changed = nightly(root, corpus, "n2")
    assert "stages: chunk 1 paper chunked; embed " in changed.stdout and "index added (" in changed.stdout

    touched = corpus / PAPERS[1]
    touched.write_bytes(touched.read_bytes())  # same bytes, a new mtime
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; rc = main(); "
           "print('ray imported:', 'ray' in sys.modules); sys.exit(rc)",
           "nightly", "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
           "--queries", str(corpus.parent / "queries.jsonl"), "--root", str(root), "--run-id", "n3",
           "--num-cpus", "2"]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT")}
    night = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env | {"HF_HUB_OFFLINE": "1"})
    assert night.returncode == 0, (night.stdout + night.stderr)[-4000:]
    assert "ray imported: False" in night.stdout and "Started a local Ray" not in night.stderr, night.stderr
    assert UNCHANGED in night.stdout, night.stdout
    assert "papers: 3 unchanged, 0 changed, 0 added, 0 removed" in night.stdout
    index = read_manifest(str(root / "runs" / "n3" / "index"))
    assert index["update"]["action"] == "unchanged"
    assert (index["counts"]["added"], index["counts"]["removed"]) == (0, 0)
    for stage, table in (("chunks", "chunks"), ("embeddings", "embeddings"), ("spans", "spans"), ("spans", "pairs")):
        got, want = (pq.read_table(root / "runs" / n / stage / table) for n in ("n3", "n2"))
        assert canonical(got).equals(canonical(want)), table
