"""A refused, failed or interrupted command never replaces a committed one's series on the Pushgateway (issue 53,
item 4): it pushes its run alone into a group of its own status, while the committed command's group keeps its
figures and its last success. A real Pushgateway on loopback (tests/promservers.py); no Ray."""

from __future__ import annotations

import urllib.request

import pytest

from verbatim_batch.engine.telemetry import session


@pytest.fixture()
def pushgateway(tmp_path):
    from promservers import PUSHGATEWAY, Pushgateway

    if PUSHGATEWAY is None:
        pytest.skip("prometheus-pushgateway is not installed (apt-get install prometheus-pushgateway; CI does)")
    with Pushgateway(tmp_path / "pgw") as gateway:
        yield gateway.url


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "instance"))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name.startswith("verbatim_")}


def _night(url: str, status: str, rows: dict[str, int] | None = None) -> None:
    session.begin("nightly", push=url, job="t53")
    if rows is not None:
        session.record("chunks", {"rows": rows, "duration_seconds": 2.5, "model_tokens": 0, "model_batches": 0,
                                  "read_bytes": 100, "written_bytes": 50})
    session.finish(status)


def test_a_refused_or_failed_night_never_replaces_the_committed_nights_series(pushgateway, capsys):
    _night(pushgateway, "committed", {"in": 10, "written": 4, "carried": 6})
    committed = _scrape(pushgateway)
    group = (("command", "nightly"), ("job", "t53"))
    rows = ("verbatim_rows_total", tuple(sorted((*group, ("stage", "chunks"), ("outcome", "written")))))
    success = ("verbatim_last_success_timestamp_seconds", group)
    assert committed[("verbatim_runs_total", (*group, ("status", "committed")))] == 1
    assert committed[rows] == 4 and success in committed

    _night(pushgateway, "refused")  # e.g. a missing input: refused before any stage
    _night(pushgateway, "failed", {"in": 10, "written": 1})  # a night that failed in its chunk stage
    _night(pushgateway, "refused")  # the next refusal replaces the last one's group, not the committed night's
    after = _scrape(pushgateway)
    for name_labels in (success, rows, ("verbatim_runs_total", (*group, ("status", "committed")))):
        assert after[name_labels] == committed[name_labels], name_labels  # the committed night's, as it was
    for status in ("refused", "failed"):
        assert after[("verbatim_runs_total", (*group, ("status", status)))] == 1
    # the failed night's partial figures are not pushed: the alerts and panels read the committed night's only
    assert [k for k in after if k[0] != "verbatim_runs_total" and ("status", "failed") in k[1]] == []
    assert sum(v for (name, labels), v in after.items()
               if name == "verbatim_rows_total" and ("outcome", "written") in labels) == 4
    assert "warning" not in capsys.readouterr().err
