"""Nightly runs end to end, each one a real `verbatim-batch nightly` process on a local Ray.

Incremental behaviour (an unchanged corpus does no model work, a changed paper is the only one
re-chunked and re-embedded, the result equals a from-scratch run), the `current` pointer and retention.
Kill-and-resume lives in test_resume.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from verbatim_batch.runs import current_run, current_table, read_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "verbatim_batch" / "examples"
PAPERS = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md"))
# Columns that measure a run rather than describe its output.
MEASURED = {"latency_ms"}


def make_corpus(folder: Path, names: list[str], n_queries: int = 4) -> Path:
    """Papers, their metadata and the first ``n_queries`` bundled queries (``queries.jsonl`` beside the folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(EXAMPLES / "corpus" / name, folder / name)
    shutil.copy(EXAMPLES / "corpus" / "metadata.jsonl", folder / "metadata.jsonl")
    lines = (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()[:n_queries]
    (folder.parent / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def nightly(root: Path, corpus: Path, run_id: str, *extra: str, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """One `verbatim-batch nightly` process (its own local Ray, 2 CPUs)."""
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "nightly",
           "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
           "--queries", str(corpus.parent / "queries.jsonl"), "--root", str(root), "--run-id", run_id,
           "--num-cpus", "2", "--extract-batch-rows", "16", "--embed-batch-rows", "64", *extra]
    base = {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT", "VERBATIM_BATCH_DRIVER_PID")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=base | {"HF_HUB_OFFLINE": "1"} | (env or {}))
    if check:
        assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done


def stage_table(root: Path, run_id: str, stage: str, table: str) -> pa.Table:
    return pq.read_table(root / "runs" / run_id / stage / table)


def canonical(table: pa.Table, drop: set[str] = frozenset()) -> pa.Table:
    """The table without measured columns, rows in a fixed order (file order is not part of the contract)."""
    table = table.drop_columns([c for c in table.column_names if c in MEASURED | set(drop)])
    keys = [f.name for f in table.schema if not pa.types.is_nested(f.type) and not pa.types.is_floating(f.type)
            and not pa.types.is_fixed_size_list(f.type)]
    return table.sort_by([(k, "ascending") for k in keys])


def assert_tables_match(got: pa.Table, want: pa.Table, what: str, drop: set[str] = frozenset()) -> None:
    """Same rows. Model scores (floats) agree to 1e-5: a pair scored in another batch (carried from an
    earlier night, or redone after a resume) gets the same spans, but its score can differ in the last bits."""
    got, want = canonical(got, drop), canonical(want, drop)
    floats = [f.name for f in got.schema if pa.types.is_floating(f.type)]
    assert got.num_rows == want.num_rows, f"{what}: {got.num_rows} rows, expected {want.num_rows}"
    assert got.drop_columns(floats).equals(want.drop_columns(floats)), f"{what} differs"
    for name in floats:
        g, w = got[name].to_numpy(zero_copy_only=False), want[name].to_numpy(zero_copy_only=False)
        np.testing.assert_allclose(g.astype(float), w.astype(float), atol=1e-5, err_msg=f"{what}.{name}")


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
    out = nightly(root, corpus, "n3", "--max-drift", "0.9", "--keep-runs", "2")
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
    assert index["update"]["action"] == "added" and index["counts"]["added"] == counts["embeddings.rows_new"]
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
