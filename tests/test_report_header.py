"""The report says things once and says what a night changed (issue 53, item 6): the reason no GPU was sampled
(pynvml not installed, no GPU) is one note under the performance table, not a cell of every row; a nightly
report's header names its papers unchanged, changed, added and removed."""

from __future__ import annotations

from verbatim_batch.core.runs import build_manifest, write_manifest
from verbatim_batch.report.build import write_report
from verbatim_batch.report.perf import performance_html

WHY = "pynvml is not installed (pip install nvidia-ml-py on GPU nodes)"


def test_the_gpu_note_is_said_once_per_report():
    row = {"wall_s": 1.0, "cpu_s": 2.0, "gpu": {"skipped": WHY}}
    page = performance_html({"chunks": row, "embeddings": row, "spans": row, "whole run": row})
    assert page.count("pynvml is not installed") == 1
    assert page.count("<td>none</td>") == 4


def test_a_nightly_reports_header_says_what_changed(tmp_path):
    counts = {"chunks.papers_unchanged": 2, "chunks.papers_changed": 1, "chunks.papers_added": 1,
              "chunks.papers_removed": 0}
    manifest = build_manifest(run_id="n2", command="nightly", config={"base": "n1"}, inputs=[], tables={},
                              counts=counts, timings_s={})
    write_manifest(str(tmp_path), manifest)
    report = write_report(str(tmp_path))
    assert report["changed"] == "papers: 2 unchanged, 1 changed, 1 added, 0 removed"
    page = (tmp_path / "report.html").read_text()
    head = page[page.index("<h1>"):page.index("<h1>") + 400]
    assert "This night: papers: 2 unchanged, 1 changed, 1 added, 0 removed" in head
