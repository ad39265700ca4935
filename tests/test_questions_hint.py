"""A run of the offline (semantic) extractor whose queries are mostly natural questions says so once in its
summary, with the command that runs the highlighter (issue 53, item 8); keyword queries (the demo's) say nothing."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from verbatim_batch.core.runs import build_manifest, read_manifest, write_manifest
from verbatim_batch.report.summary import print_run


def _extract_run(path, queries, extractor="semantic"):
    (path / "pairs").mkdir(parents=True)
    pq.write_table(pa.table({"query": queries}), path / "pairs" / "part-0.parquet")
    manifest = build_manifest(run_id="r1", command="extract", config={"extractor": extractor, "retrieval": "RET"},
                              inputs=[], tables={"pairs": {"rows": len(queries), "files": 1}},
                              counts={"pairs": len(queries)}, timings_s={"total": 1.0})
    write_manifest(str(path), manifest)
    return str(path)


def test_natural_questions_with_the_semantic_extractor_get_one_hint(tmp_path, capsys):
    asked = ["What is the thickness of the cell wall?", "how do they measure recall", "Why is BM25 used?",
             "Which dataset is largest?", "recall measurement"]
    run = _extract_run(tmp_path / "q", asked * 3)  # a query on many pairs is one query
    print_run(run, read_manifest(run))
    out = capsys.readouterr().out
    assert out.count("look like natural questions") == 1
    assert "4 of 5 queries" in out and "--retrieval RET --extractor highlighter --model MODEL" in out
    for name, queries, kind in (("k", ["cell wall thickness", "recall measurement", "BM25"], "semantic"),
                                ("h", asked, "highlighter")):
        run = _extract_run(tmp_path / name, queries, kind)
        print_run(run, read_manifest(run))
        assert "natural questions" not in capsys.readouterr().out
