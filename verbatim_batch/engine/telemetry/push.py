"""Metrics to a Prometheus Pushgateway when a command ends (``--metrics-push URL``): the batch-job convention.

The group is ``job`` (``--metrics-job``) and ``command``: a committed command replaces its group (HTTP PUT),
``verbatim_last_success_timestamp_seconds`` included; a refused or failed one only adds its samples (POST), so
the last success stays. Counters hold the last command's figures, not a running total (a Pushgateway keeps
what was pushed last). A user:password in the URL becomes basic auth for that host; the gateway must answer
in ``TIMEOUT_S``; a gateway that cannot be reached or refuses costs one warning line, never the run.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from verbatim_batch.engine.telemetry.declare import BY_NAME, DURATION_BUCKETS

TIMEOUT_S = 5.0


def check_url(url: str) -> str:
    """A Pushgateway URL as the option takes it: http(s)://host[:port][/path]; raises ValueError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http://HOST:PORT or https://HOST:PORT of a Pushgateway, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError("a Pushgateway URL takes no query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError(f"the Pushgateway URL's port is not a number: {url!r}") from None
    return url


def registry(rows: list[tuple[str, dict[str, str], Any]], with_success: bool):
    """A ``prometheus_client`` registry of ``rows`` (``session.samples``)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

    disable_created_metrics()  # no *_created series beside each counter and histogram
    reg = CollectorRegistry()
    made: dict[str, Any] = {}
    for name, labels, value in rows:
        m = BY_NAME[name]
        if m.kind == "gauge" and not with_success:
            continue
        if name not in made:
            keys = list(m.labels)
            if m.kind == "counter":
                made[name] = Counter(m.name.removesuffix("_total"), m.help, keys, registry=reg)
            elif m.kind == "gauge":
                made[name] = Gauge(m.name, m.help, keys, registry=reg)
            else:
                made[name] = Histogram(m.name, m.help, keys, buckets=DURATION_BUCKETS, registry=reg)
        metric = made[name].labels(**labels)
        if m.kind == "counter":
            metric.inc(value)
        elif m.kind == "gauge":
            metric.set(value)
        else:
            for v in value:
                metric.observe(v)
    return reg


def push(url: str, job: str, command: str, rows: list[tuple[str, dict[str, str], Any]], replace: bool) -> bool:
    """Push ``rows`` to the gateway at ``url``; False (and one warning line) when it cannot."""
    from prometheus_client import push_to_gateway, pushadd_to_gateway
    from prometheus_client.exposition import basic_auth_handler, default_handler

    from verbatim_batch.engine.telemetry.warning import warn

    parts = urllib.parse.urlsplit(url)
    user, password = parts.username, parts.password
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else parts.netloc
    gateway = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def handler(url, method, timeout, headers, data):
        if user is not None:  # only to the gateway named: no redirect is followed for PUT/POST
            return basic_auth_handler(url, method, timeout, headers, data, urllib.parse.unquote(user),
                                      urllib.parse.unquote(password or ""))
        return default_handler(url, method, timeout, headers, data)

    send = push_to_gateway if replace else pushadd_to_gateway
    try:
        send(gateway, job=job, registry=registry(rows, with_success=replace), grouping_key={"command": command},
             timeout=TIMEOUT_S, handler=handler)
    except Exception as exc:  # noqa: BLE001 - an unreachable or refusing gateway never costs the run
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        warn(f"metrics not pushed to {gateway}: {reason}")
        return False
    return True
