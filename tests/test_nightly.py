"""Nightly runs end to end, each one a real `verbatim-batch nightly` process on a local Ray.

Incremental behaviour (an unchanged corpus does no model work, a changed paper is the only one
re-chunked and re-embedded, the result equals a from-scratch run), the `current` pointer and retention.
Kill-and-resume lives in test_resume.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import EXAMPLES, PAPERS, assert_tables_match, canonical, make_corpus, nightly

from verbatim_batch.core.runs import current_run, current_table, read_manifest

pytestmark = pytest.mark.slow


def stage_table(root: Path, run_id: str, stage: str, table: str) -> pa.Table:
    return pq.read_table(root / "runs" / run_id / stage / table)


def fresh_paper_ids(root: Path, run_id: str, table: str, stage: str) -> set[str]:
    """paper ids of the rows a run produced itself (not the ones it carried from the run before)."""
    folder = root / "runs" / run_id / stage / table
    files = [f for f in folder.glob("*.parquet") if not f.name.startswith("part-carried-")]
    return set(pa.concat_tables([pq.read_table(f, columns=["paper_id"]) for f in files])["paper_id"].to_pylist())


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """Three nights over a 10-paper corpus: first run; no change; one paper edited, one removed, one added."""
    tmp = tmp_path_factory.mktemp("nightly")
    root = tmp / "root"
    corpus = make_corpus(tmp / "corpus", PAPERS[:10])
    nightly(root, corpus, "n1")
    night1 = {t: stage_table(root, "n1", s, t) for s, t in (("spans", "spans"), ("spans", "pairs"),
                                                            ("chunks", "chunks"), ("embeddings", "embeddings"))}
    nightly(root, corpus, "n2")
    edited, removed, added = PAPERS[3], PAPERS[5], PAPERS[12]
    text = (corpus / edited).read_text(encoding="utf-8")
    cut = text.index("\n## ", len(text) // 3) if "\n## " in text[len(text) // 3:] else len(text) // 2
    (corpus / edited).write_text(text[:cut] + "\n\nWe also report a new ablation on the held-out split.\n"
                                 + text[cut:], encoding="utf-8")
    (corpus / removed).unlink()
    shutil.copy(EXAMPLES / "corpus" / added, corpus / added)
    out = nightly(root, corpus, "n3", "--index-max-drift", "0.9", "--keep-runs", "2")
    scratch = tmp / "scratch"
    nightly(scratch, corpus, "n3")
    return {"root": root, "scratch": scratch, "corpus": corpus, "stdout": out.stdout, "night1": night1,
            "edited": edited.removesuffix(".md"), "removed": removed.removesuffix(".md"),
            "added": added.removesuffix(".md")}


def test_first_run_commits_and_sets_current(nights):
    root = nights["root"]
    manifest = read_manifest(str(root / "runs" / "n3"))
    assert manifest["command"] == "nightly" and manifest["status"] == "committed"
    assert current_run(str(root)) == "n3"
    assert os.path.realpath(root / "current") == os.path.realpath(root / "runs" / "n3")
    for stage in ("chunks", "embeddings", "index", "retrieval", "spans"):
        assert read_manifest(str(root / "runs" / "n3" / stage))["run_id"] == "n3"
    report = json.loads((root / "runs" / "n3" / "report.json").read_text())
    assert report["stage_counts"]["spans"]["pairs"] == manifest["counts"]["spans.pairs"]
    assert report["index_update"]["action"] == "added" and 0 <= report["abstention_rate"] <= 1
    assert '<div class="pair"' in (root / "runs" / "n3" / "report.html").read_text()  # spans shown in place


def test_unchanged_corpus_does_no_model_work(nights):
    """Night 2 saw the same corpus: nothing chunked, embedded or extracted; same spans as night 1."""
    root = nights["root"]
    counts = json.loads((root / "runs" / "n2" / "manifest.json").read_text())["counts"]
    assert counts["chunks.papers_unchanged"] == 10 and counts["chunks.papers_chunked"] == 0
    assert counts["embeddings.rows_new"] == 0 and counts["embeddings.rows_carried"] == counts["chunks.chunks"]
    assert counts["retrieval.reused"] == 1
    assert counts["spans.rows_new"] == 0 and counts["spans.rows_carried"] == counts["spans.pairs"] > 0
    index = read_manifest(str(root / "runs" / "n2" / "index"))
    assert index["update"]["action"] == "unchanged"
    for stage, table in (("spans", "spans"), ("spans", "pairs"), ("chunks", "chunks"), ("embeddings", "embeddings")):
        assert canonical(stage_table(root, "n2", stage, table)).equals(canonical(nights["night1"][table])), table


def test_changed_papers_are_the_only_ones_touched(nights):
    root, edited, added, removed = nights["root"], nights["edited"], nights["added"], nights["removed"]
    counts = json.loads((root / "runs" / "n3" / "manifest.json").read_text())["counts"]
    assert (counts["chunks.papers_changed"], counts["chunks.papers_added"], counts["chunks.papers_removed"],
            counts["chunks.papers_unchanged"]) == (1, 1, 1, 8)
    assert counts["chunks.papers_chunked"] == 2
    assert fresh_paper_ids(root, "n3", "chunks", "chunks") == {edited, added}
    assert fresh_paper_ids(root, "n3", "embeddings", "embeddings") <= {edited, added}
    new_chunks = stage_table(root, "n3", "chunks", "chunks")
    touched = new_chunks.filter(pc.is_in(new_chunks["paper_id"], pa.array([edited, added])))
    assert 0 < counts["embeddings.rows_new"] <= touched.num_rows
    assert removed not in set(new_chunks["paper_id"].to_pylist())
    index = read_manifest(str(root / "runs" / "n3" / "index"))
    # the index counts vectors: one per window of each chunk embedded tonight (tests/test_windows.py)
    folder = root / "runs" / "n3" / "embeddings" / "embeddings"
    fresh = [pq.read_table(f, columns=["windows"]) for f in folder.glob("*.parquet")
             if not f.name.startswith("part-carried-")]
    windows = sum(pc.sum(t["windows"].cast(pa.int64())).as_py() or 0 for t in fresh)
    assert index["update"]["action"] == "added" and index["counts"]["added"] == windows
    assert windows >= counts["embeddings.rows_new"] and index["counts"]["vectors"] >= index["counts"]["chunks"]
    # Pairs were extracted only where something changed: a changed paper's chunk, a pair new to the top-k, or
    # a pair the retrieval now ranks elsewhere (the rank is a column of the pair row).
    before = stage_table(root, "n2", "spans", "pairs")
    old_rank = dict(zip(before["pair_id"].to_pylist(), before["rank"].to_pylist(), strict=True))
    pairs = stage_table(root, "n3", "spans", "pairs")
    fresh = pairs.filter(pc.equal(pairs["run_id"], "n3")).to_pylist()
    assert len(fresh) == counts["spans.rows_new"] < pairs.num_rows
    assert all(p["paper_id"] in (edited, added) or old_rank.get(p["pair_id"]) != p["rank"] for p in fresh)
    assert "index added" in nights["stdout"]
    # The summary line says the same as the manifest (it once read every count as 0).
    assert "8 unchanged, 1 changed, 1 added, 1 removed" in nights["stdout"], nights["stdout"]
    assert (f"pairs extracted {counts['spans.rows_new']}, carried {counts['spans.rows_carried']}; "
            f"{counts['spans.spans']} spans") in nights["stdout"]


def test_incremental_run_equals_a_run_from_scratch(nights):
    """Carried rows + new rows = what a fresh run over the same corpus writes (run ids aside).

    Night 3 adds and removes a paper, which moves some retrieval ranks of unchanged pairs: a carried pair row
    must hold the rank of this night's retrieval, not the night it was extracted (a bug this test caught)."""
    root, scratch = nights["root"], nights["scratch"]
    for stage, table in (("chunks", "papers"), ("chunks", "chunks"), ("retrieval", "retrieval"),
                         ("spans", "pairs"), ("spans", "spans")):
        assert_tables_match(stage_table(root, "n3", stage, table), stage_table(scratch, "n3", stage, table),
                            f"{stage}/{table}", drop={"run_id"})


def test_current_span_table_loads_in_one_call_and_is_verbatim(nights):
    root = nights["root"]
    frame = pd.read_parquet(root / "current" / "spans" / "spans")
    assert len(frame) == current_table(str(root), "spans").num_rows > 0
    papers = {r["paper_id"]: r["markdown"] for r in current_table(str(root), "papers").to_pylist()}
    for row in frame.itertuples():
        assert papers[row.paper_id][row.paper_start:row.paper_end] == row.text


def test_retention_keeps_the_newest_runs(nights):
    root = nights["root"]
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["n2", "n3"]
    assert json.loads((root / "runs" / "n3" / "manifest.json").read_text())["index_update"]["action"] == "added"
