"""Run reports: report.json figures, and report.html rendered in a real headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest
from test_extract import CHUNK, make_token_classifier

from verbatim_batch.cli import main
from verbatim_batch.extract.highlighter import HighlighterConfig
from verbatim_batch.pipeline import ExtractJob, run_extract
from verbatim_batch.report import highlight
from verbatim_batch.runs import read_table

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def extract_run(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    model = make_token_classifier(root / "m")
    pairs = root / "pairs.jsonl"
    rows = [{"query": f"question {i}", "chunk": CHUNK[i * 40:] + " <b>&amp;</b>", "paper_id": f"P{i}",
             "chunk_index": i} for i in range(5)] + [{"query": "", "chunk": "x"}]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = HighlighterConfig(model=str(model), max_length=64, stride=16, threshold=0.0)  # every token: spans
    out, manifest = run_extract(ExtractJob(output=str(root / "x"), extractor=cfg, pairs=str(pairs)))
    return out, manifest, rows


def test_report_json_is_written_at_commit(extract_run):
    out, manifest, rows = extract_run
    with open(f"{out}/report.json", encoding="utf-8") as fh:
        report = json.load(fh)
    pairs = read_table(out, "pairs").to_pylist()
    assert report["run_id"] == manifest["run_id"] and report["command"] == "extract"
    assert report["tables"] == {"spans": manifest["tables"]["spans"]["rows"], "pairs": len(rows),
                                "rejects": 0}
    assert report["errors_by_reason"] == {"empty_query": 1}
    ok = [p["n_spans"] for p in pairs if not p["error"]]
    assert report["abstention_rate"] == sum(1 for n in ok if n == 0) / len(ok)
    assert report["spans_per_pair"]["max"] == max(ok) and report["verbatim_violations"] == 0
    assert report["throughput"]["pairs_per_s"] > 0 and "total" in report["timings_s"]
    # where the time went: Ray start-up apart, model / gate / write summed over actors, pairs/s without start-up
    spent = report["time_breakdown"]
    assert {"read_pairs_s", "ray_start_s", "extract_and_write_wall_s", "model_s_summed_over_actors",
            "gate_s_summed_over_actors", "write_s_summed_over_actors"} <= set(spent), spent
    assert spent["model_s_summed_over_actors"] > 0
    assert spent["pairs_per_s_excluding_ray_start"] == pytest.approx(
        manifest["counts"]["rows_new"] / spent["extract_and_write_wall_s"])
    assert spent["extract_and_write_wall_s"] + spent["ray_start_s"] <= manifest["timings_s"]["total"]
    with open(f"{out}/report.html", encoding="utf-8") as fh:
        assert "Where the extract time went" in fh.read()


def test_highlight_escapes_text_and_marks_spans():
    chunk = "a <b> & c d e"
    out = highlight(chunk, [{"start": 2, "end": 5, "score": 0.5, "align": None},
                            {"start": 4, "end": 9, "score": 0.9, "align": "exact"}])
    assert out.startswith("a <mark") and "&lt;b&gt;" in out and "<b>" not in out
    assert out.count("<mark") == 2 and 'title="score 0.90 · exact"' in out


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_report_html_renders_with_highlights_in_chromium(extract_run, tmp_path):
    out, _, rows = extract_run
    assert main(["report", out, "--samples", "4"]) == 0
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}",
           "--dump-dom", f"file://{out}/report.html"]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert "<h1>verbatim-batch extract run</h1>" in dom
    marks = re.findall(r'<mark class="span" data-start="(\d+)" data-end="(\d+)" title="([^"]+)">(.*?)</mark>',
                       dom, re.S)
    assert marks, dom[:2000]
    chunks = [r["chunk"] for r in rows]
    for start, end, title, inner in marks:
        assert title.startswith("score ")
        assert any(c[int(start):int(end)] == html.unescape(inner) for c in chunks)  # in place, verbatim
    assert len(re.findall(r'class="pair"', dom)) == 4
