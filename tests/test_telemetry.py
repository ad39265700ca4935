"""Metrics and the performance report (issue 39): computed in one place from the manifest, pushed to a real
Pushgateway (Debian's prometheus-pushgateway on loopback; skipped with a reason where it is not installed), and
declared once (the metric reference is generated from the declarations)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import EXAMPLES, PAPERS, REPO

from verbatim_batch.engine.telemetry import accounting, session
from verbatim_batch.engine.telemetry.declare import BY_NAME, METRICS, OUTCOMES

CLI = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"HF_HUB_OFFLINE": "1"}


def test_samples_sum_stage_runs_and_set_last_success_only_when_committed():
    s = session.Session(command="run")
    block = accounting.stage_metrics({"rows_in": 5, "rows_new": 3, "rows_carried": 2, "pairs_failed": 1,
                                      "tokens": 70, "batches": 2}, {"total": 4.0}, {"failed": ("pairs_failed",)},
                                     read_bytes=10, written_bytes=20)
    s.stages += [("extract", block), ("extract", block)]
    rows = session.samples(s, "committed", now=123.0)
    got = {(n, tuple(sorted(lab.items()))): v for n, lab, v in rows}
    key = ("verbatim_rows_total", (("command", "run"), ("outcome", "in"), ("stage", "extract")))
    assert got[key] == 10
    assert got[("verbatim_rows_total", (("command", "run"), ("outcome", "failed"), ("stage", "extract")))] == 2
    assert got[("verbatim_model_tokens_total", (("command", "run"), ("stage", "extract")))] == 140
    assert got[("verbatim_stage_duration_seconds", (("command", "run"), ("stage", "extract")))] == [4.0, 4.0]
    assert len(got[("verbatim_stage_duration_seconds", (("command", "run"), ("stage", "total")))]) == 1
    assert got[("verbatim_last_success_timestamp_seconds", (("command", "run"),))] == 123.0
    refused = {n for n, _, _ in session.samples(s, "refused")}
    assert "verbatim_last_success_timestamp_seconds" not in refused and "verbatim_runs_total" in refused
    assert {n for n, _, _ in rows} <= set(BY_NAME)


def test_row_outcomes_take_what_a_stage_declares():
    counts = {"rows_in": 9, "rows_new": 4, "rows_carried": 3, "rows_resumed": 2, "dropped.rank": 2, "dropped.x": 1}
    out = accounting.row_outcomes(counts, {"rejected": ("dropped.*",)})
    assert out == {"in": 9, "written": 4, "carried": 3, "resumed": 2, "withheld": 0, "rejected": 3, "failed": 0}
    with pytest.raises(ValueError, match="unknown row outcome"):
        accounting.row_outcomes(counts, {"lost": ("x",)})


def test_every_stage_declares_known_outcomes():
    from verbatim_batch import stages as pipeline  # noqa: F401 - every stage class defined
    from verbatim_batch.engine.stage import Stage
    from verbatim_batch.stages import train as job  # noqa: F401

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    stages = [c for c in subclasses(Stage) if c.command]
    assert {"chunk", "extract", "retrieve", "index"} <= {c.command for c in stages}
    for cls in stages:
        assert set(cls.outcomes) <= set(OUTCOMES), cls


def test_metric_names_follow_prometheus_conventions():
    for m in METRICS:
        assert m.name.startswith("verbatim_") and (m.name.endswith("_total") == (m.kind == "counter")), m.name
        assert not {"run_id", "path", "paper_id", "query_id"} & set(m.labels), m.name


def test_the_metric_reference_is_current():
    """docs/reference/metrics.md is generated: `python -m verbatim_batch.engine.telemetry.reference >
    docs/reference/metrics.md`."""
    from verbatim_batch.engine.telemetry.reference import markdown

    assert (REPO / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8") == markdown()


@pytest.mark.parametrize("url", ["ftp://gw:9091", "gw:9091", "http://gw:port", "http://gw:9091/?a=1", ""])
def test_a_bad_pushgateway_url_is_refused_in_one_line(url, tmp_path):
    done = subprocess.run([*CLI, "chunk", "--input", str(tmp_path), "--output", str(tmp_path / "o"),
                           "--metrics-push", url], capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2 and "--metrics-push" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def pushgateway(tmp_path_factory):
    """Debian's Pushgateway on loopback, with a persistence file of its own (tests/promservers.py)."""
    from promservers import PUSHGATEWAY, Pushgateway

    if PUSHGATEWAY is None:
        pytest.skip("prometheus-pushgateway is not installed (apt-get install prometheus-pushgateway; CI does)")
    with Pushgateway(tmp_path_factory.mktemp("pgw")) as gateway:
        yield gateway.url


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("instance",)))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name.startswith("verbatim_")}


def test_pushed_metrics_equal_the_manifest_and_a_refusal_keeps_the_last_success(pushgateway, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in PAPERS[:3]:
        shutil.copy(EXAMPLES / "corpus" / name, corpus / name)
    out = tmp_path / "chunks"
    done = subprocess.run([*CLI, "chunk", "--input", str(corpus), "--output", str(out), "--num-cpus", "1",
                           "--metrics-push", pushgateway, "--metrics-job", "t-push"],
                          capture_output=True, text=True, timeout=900, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning" not in done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    block = manifest["metrics"]
    assert block["rows"]["in"] == block["rows"]["written"] == 3
    assert block["read_bytes"] == manifest["counts"]["papers_bytes"] and block["written_bytes"] > 0
    got = _scrape(pushgateway)
    labels = (("command", "chunk"), ("job", "t-push"), ("stage", "chunk"))
    for outcome, n in block["rows"].items():
        assert got[("verbatim_rows_total", tuple(sorted((*labels, ("outcome", outcome)))))] == n
    assert got[("verbatim_read_bytes_total", labels)] == block["read_bytes"]
    assert got[("verbatim_written_bytes_total", labels)] == block["written_bytes"]
    assert got[("verbatim_stage_duration_seconds_sum", labels)] == pytest.approx(block["duration_seconds"])
    success = got[("verbatim_last_success_timestamp_seconds", (("command", "chunk"), ("job", "t-push")))]
    assert abs(success - time.time()) < 3600
    perf = manifest["performance"]
    assert perf["cpu_s"] > 0 and perf["peak_rss_bytes"] > 0 and perf["wall_s"] > 0
    assert "skipped" in perf["gpu"] or perf["gpu"]["devices"] >= 1
    assert "<h2>Performance</h2>" in (out / "report.html").read_text()

    refused = subprocess.run([*CLI, "chunk", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o2"),
                              "--metrics-push", pushgateway, "--metrics-job", "t-push"],
                             capture_output=True, text=True, timeout=300, env=_env())
    assert refused.returncode == 2
    after = _scrape(pushgateway)
    assert after[("verbatim_runs_total", (("command", "chunk"), ("job", "t-push"), ("status", "refused")))] == 1
    assert after[("verbatim_last_success_timestamp_seconds", (("command", "chunk"), ("job", "t-push")))] == success
