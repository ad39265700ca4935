"""deploy/: the alert rules and their unit tests through promtool (as CI runs them), the example Prometheus
configuration, and the Grafana dashboard's shape. promtool is Debian's (``apt-get install prometheus``); without it
the promtool tests skip, saying why. What the queries return against real servers: tests/test_metrics_servers.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from verbatim_batch.engine.telemetry.declare import METRICS

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "deploy" / "prometheus"
ALERTS = PROM / "alerts.yml"
ALERTS_TEST = PROM / "alerts_test.yml"
CONFIG = PROM / "prometheus.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "verbatim-batch.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")

ALERT_NAMES = {"VerbatimNoSuccessfulNight", "VerbatimRowsLost", "VerbatimSpansWithheld", "VerbatimStageFailures",
               "VerbatimNightSlow"}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[dict]:
    """The alerting rules (the recording rules they read are left out)."""
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


# --- promtool ----------------------------------------------------------------------------------------------------


@needs_promtool
def test_promtool_check_rules():
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_test_rules():
    done = promtool("test", "rules", str(ALERTS_TEST))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_check_config():
    done = promtool("check", "config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "alerts.yml" in done.stdout and "10 rules found" in done.stdout  # the rule file is found and read


# Each change breaks one alert: its unit tests (the tests of that alert alone, for time) must catch it.
BREAKS = [
    ("VerbatimNoSuccessfulNight", "> 26 * 3600", "> 30 * 3600"),  # the 26 h of the missing night
    ("VerbatimNoSuccessfulNight", "absent(", "absent(up or "),  # never pushed: no longer read as missing
    ("VerbatimRowsLost", 'outcome=~"written|carried|resumed"})\n          > 0',
     'outcome=~"written|carried|resumed"})\n          > 5'),
    ("VerbatimRowsLost", "0 * sum by (command, stage)", "sum by (command, stage)"),  # Ray: nothing written
    ("VerbatimRowsLost", "[26h] offset 26h", "[26h] offset 52h"),  # Ray: the window's start
    ("VerbatimSpansWithheld", 'verbatim_rows_total{outcome="withheld"}) > 0',
     'verbatim_rows_total{outcome="withheld"}) > 3'),
    ("VerbatimStageFailures", "> 0.01", "> 0.05"),  # 1% of failed rows
    ("VerbatimNightSlow", "2 * max by (job, command)", "3 * max by (job, command)"),  # twice the median
    ("VerbatimNightSlow", "2 * quantile_over_time", "3 * quantile_over_time"),  # twice the median, Ray form
]


@needs_promtool
@pytest.mark.parametrize(("alert", "old", "new"), BREAKS, ids=[f"{b[0]}: {b[2]}" for b in BREAKS])
def test_the_unit_tests_catch_a_broken_rule(tmp_path, alert, old, new):
    text = ALERTS.read_text(encoding="utf-8")
    assert old in text, old
    (tmp_path / "alerts.yml").write_text(text.replace(old, new), encoding="utf-8")
    tests = yaml.safe_load(ALERTS_TEST.read_text(encoding="utf-8"))
    tests["tests"] = [t for t in tests["tests"] if any(c["alertname"] == alert for c in t["alert_rule_test"])]
    assert tests["tests"]
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    assert promtool("check", "rules", "alerts.yml", cwd=tmp_path).returncode == 0  # still a valid rule file
    done = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert done.returncode != 0, f"the unit tests pass with {new!r}:\n{done.stdout}"
    assert f"alertname: {alert}" in done.stdout + done.stderr, done.stdout + done.stderr


# --- the rules and their tests, read -------------------------------------------------------------------------------


def test_every_alert_in_both_forms_with_tests_firing_and_not():
    by_name: dict[str, set[str]] = {}
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "labels", "annotations", "for"}, rule
        by_name.setdefault(rule["alert"], set()).add(rule["labels"].get("source", "both"))
        expr = rule["expr"]
        assert "increase(" not in expr  # Ray's series begin with their first row: increase() misses it
        if rule["labels"].get("source") == "ray":
            assert "ray_verbatim_" in expr and not re.search(r"(?<!ray_)verbatim_", expr), expr
        elif rule["labels"].get("source") == "pushgateway":
            assert "ray_" not in expr, expr
        else:
            assert "ray_verbatim_" in expr and re.search(r"(?<!ray_)verbatim_", expr), expr
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"] and notes["runbook_url"].startswith("docs/operations.md#")
    assert set(by_name) == ALERT_NAMES
    assert all(forms in ({"both"}, {"pushgateway", "ray"}) for forms in by_name.values()), by_name

    tests = yaml.safe_load(ALERTS_TEST.read_text(encoding="utf-8"))
    assert tests["rule_files"] == ["alerts.yml"]
    fired: dict[str, set[str]] = {}
    quiet: set[str] = set()
    for test in tests["tests"]:
        for check in test["alert_rule_test"]:
            if check["exp_alerts"]:
                for alert in check["exp_alerts"]:
                    fired.setdefault(check["alertname"], set()).add(alert["exp_labels"].get("source", "both"))
            else:
                quiet.add(check["alertname"])
    assert fired == by_name, "every alert fires in a test, in each of its forms"
    assert quiet == ALERT_NAMES, "every alert has a test where it does not fire"


def _slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (its default toc slugify)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def test_runbook_links_are_sections_of_the_operations_guide():
    guide = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    anchors = {_slug(line.lstrip("#")) for line in guide.splitlines() if line.startswith("#")}
    for rule in rules():
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor in anchors, f"{rule['alert']}: docs/operations.md has no section #{anchor}"


def test_the_example_config_scrapes_the_gateway_and_ray_and_loads_the_rules():
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["pushgateway"]["honor_labels"] is True  # the pushed job and command labels stay
    assert jobs["ray"]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]


# --- the dashboard -------------------------------------------------------------------------------------------------


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_dashboard_shape():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41 and board["uid"] == "verbatim-batch"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "job", "command"}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${datasource}"}
    for v in ("job", "command"):
        assert variables[v]["type"] == "query" and variables[v]["datasource"] == source
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels()]
    assert len(titles) == len(set(titles))
    for p in panels():
        assert p["datasource"] == source and p["targets"], p["title"]
        assert all(t["datasource"] == source and t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["description"], p["title"]
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]


def test_each_panel_on_our_metrics_reads_both_forms():
    """A panel on verbatim-batch's metrics has queries for the Pushgateway form and for the Ray form, so either
    source fills it; every declared metric is on the dashboard in both forms."""
    used = set()
    for p in panels():
        exprs = [t["expr"] for t in p["targets"]]
        ours = [e for e in exprs if "verbatim_" in e]
        if not ours:
            continue
        pushgateway = [e for e in ours if re.search(r"(?<!ray_)verbatim_", e) and "ray_verbatim_" not in e]
        ray = [e for e in ours if "ray_verbatim_" in e and not re.search(r"(?<!ray_)verbatim_", e)]
        assert pushgateway and ray and len(pushgateway) == len(ray) == len(ours) / 2, p["title"]
        assert all('job=~"$job"' in e and 'command=~"$command"' in e for e in pushgateway), p["title"]
        assert all('command=~"$command"' in e and "increase(" not in e for e in ray), p["title"]
        used |= {m for e in ours for m in re.findall(r"\b(?:ray_)?(verbatim_\w+?)(?:_sum|_count|_bucket)?\{", e)}
    assert used == {m.name for m in METRICS}


def test_gpu_panels_are_marked():
    """Panels on GPU metrics say so first in their description (the server test skips them, with a reason, where
    no GPU is); no other panel does."""
    gpu_metric = re.compile(r"ray_node_(gpus|gram)_|ray_data_gpu_")
    for p in panels():
        on_gpu = any(gpu_metric.search(t["expr"]) for t in p["targets"])
        assert on_gpu == p["description"].startswith("GPU:"), p["title"]
    assert sum(p["description"].startswith("GPU:") for p in panels()) >= 2


def test_ray_data_operator_panels():
    """Ray Data's own operator metrics, by the names Ray 2.60 exports (checked against a running Ray by
    tests/test_metrics_servers.py)."""
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for name in ("ray_data_output_rows", "ray_data_output_bytes", "ray_data_num_tasks_running",
                 "ray_data_task_submission_backpressure_time", "ray_data_obj_store_mem_used",
                 "ray_node_gpus_utilization"):
        assert name in exprs, name
