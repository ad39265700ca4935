"""Metrics to a Prometheus Pushgateway when a command ends (``--metrics-push URL``): the batch-job convention.

A committed command replaces (HTTP PUT) its group, ``job`` (``--metrics-job``) and ``command``. A refused, failed
or interrupted one pushes its ``verbatim_runs_total`` alone to a group with ``status`` too, so it never replaces a
committed command's series. Counters hold the last command's figures per group, not a running total.

The push never follows a redirect (one warning naming where it points), sends ``user:password`` only to the host
named, prints no password, and never holds the command past ``DEADLINE_S`` (connect, send and answer together).
Label values go base64-encoded in the path (``<label>@base64/<value>``), so every accepted label pushes.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from typing import Any

from verbatim_batch.core.redact import redact_url
from verbatim_batch.engine.telemetry.declare import BY_NAME, DURATION_BUCKETS

DEADLINE_S = 5.0  # the whole push: connect, send, the answer's status and first bytes
ANSWER_BYTES = 4096  # of a refusal's body, for its warning line


def check_url(url: str) -> str:
    """A Pushgateway URL as the option takes it: http(s)://[user:password@]host[:port][/path]; raises
    ValueError, quoting the URL with its user info masked."""
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number, or out of range
    except ValueError as exc:
        what = "port is not a number" if "port" in str(exc).lower() else "is not a URL"
        raise ValueError(f"the Pushgateway URL's {what}: {shown!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http://HOST:PORT or https://HOST:PORT of a Pushgateway, got {shown!r}")
    if parts.query or parts.fragment:
        raise ValueError("a Pushgateway URL takes no query or fragment")
    return url


def group_path(job: str, grouping: dict[str, str]) -> str:
    """``/metrics/job@base64/<job>/<label>@base64/<value>...``: every value base64url-encoded, as the Pushgateway
    API allows, so that no value (``.``, ``..``, one with ``/``) changes the path."""
    def pair(key: str, value: str) -> str:
        return f"/{key}@base64/{base64.urlsafe_b64encode(value.encode()).decode() or '='}"

    return "/metrics" + pair("job", job) + "".join(pair(k, v) for k, v in sorted(grouping.items()))


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


class PushFailed(Exception):
    """Why a push did not land (its message is the warning's reason)."""


def _request(parts: urllib.parse.SplitResult, method: str, path: str, body: bytes, headers: dict[str, str],
             deadline_s: float) -> tuple[int, str, str | None, bytes]:
    """One HTTP request to ``parts``' host within ``deadline_s``: ``(status, reason, Location, the answer's first
    bytes)``; no redirect followed. Raises ``PushFailed``, or ``TimeoutError`` past the deadline."""
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=deadline_s)
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            done["answer"] = (answer.status, answer.reason, answer.getheader("Location"),
                              answer.read(ANSWER_BYTES) if answer.status >= 400 else b"")
        except Exception as exc:  # noqa: BLE001 - reported by the caller, in one line
            done["error"] = exc

    worker = threading.Thread(target=run, name="verbatim-metrics-push", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive() or isinstance(done.get("error"), TimeoutError):  # silent or dribbling: the socket is
        # shut, so that the thread ends too
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        raise TimeoutError("no complete answer in time")
    conn.close()
    if "error" in done:
        exc = done["error"]
        raise PushFailed(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
    return done["answer"]


def push(url: str, job: str, command: str, rows: list[tuple[str, dict[str, str], Any]], replace: bool,
         deadline_s: float = DEADLINE_S, group: dict[str, str] | None = None) -> bool:
    """Push ``rows`` into the gateway group ``job``, ``command`` and ``group``'s labels (``replace``: PUT, else POST);
    False, with one warning line, when it cannot within ``deadline_s``."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    from verbatim_batch.engine.telemetry.warning import warn

    started = time.monotonic()
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    gateway = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    path = parts.path.rstrip("/") + group_path(job, {"command": command} | (group or {}))
    headers = {"Content-Type": CONTENT_TYPE_LATEST, "Connection": "close"}
    if parts.username is not None:  # basic auth, to this host only: nothing else is ever contacted
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    try:
        body = generate_latest(registry(rows, with_success=replace))
        status, reason, location, answer = _request(parts, "PUT" if replace else "POST", path, body, headers,
                                                    max(0.1, deadline_s - (time.monotonic() - started)))
        if 300 <= status < 400:
            raise PushFailed(f"it answered {status} {reason}, a redirect to {_where(location, parts)}; not "
                             "followed (metrics and credentials go only to the URL given)")
        if status >= 300:
            said = answer.decode("utf-8", "replace").strip().splitlines()
            raise PushFailed(f"it answered {status} {reason}" + (f": {said[0][:200]}" if said else ""))
    except TimeoutError:
        warn(f"metrics not pushed to {gateway}: no complete answer within {deadline_s:g} s (the push's deadline); "
             "given up")
        return False
    except Exception as exc:  # noqa: BLE001 - an unreachable or refusing gateway never costs the run
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        warn(f"metrics not pushed to {gateway}: {reason}")
        return False
    return True


def _where(location: str | None, parts: urllib.parse.SplitResult) -> str:
    """A redirect's target, as a warning names it: its URL masked (``redact_url``), another host said so."""
    if not location:
        return "nowhere (no Location)"
    target = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(parts), location))
    other = (target.hostname, target.port or target.scheme) != (parts.hostname, parts.port or parts.scheme)
    return redact_url(urllib.parse.urlunsplit(target))[:200] + (" (another host)" if other else "")
