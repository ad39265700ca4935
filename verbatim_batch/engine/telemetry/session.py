"""What this process recorded for export, handed out once when the command ends.

The CLI opens a session for its command (``begin``), the runner records each stage run's metrics block as it
commits, or as it fails (``record``), and the CLI closes it with how the command ended (``finish``): the
samples go to a Pushgateway (``--metrics-push``) and, on a Ray cluster, to Ray's metrics (``ray_export``).
Neither can cost the run: a sink that cannot be reached is one warning line.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from verbatim_batch.engine.telemetry.declare import METRICS, OUTCOMES
from verbatim_batch.engine.telemetry.warning import warn


@dataclass
class Session:
    command: str
    push: str | None = None
    job: str = "verbatim-batch"
    address: str | None = None
    joins: bool = False  # the command takes --address: it may join a cluster to export its metrics
    stages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (stage, metrics block)
    started: float = field(default_factory=time.perf_counter)


_SESSION: Session | None = None


def begin(command: str, push: str | None = None, job: str | None = None, address: str | None = None,
          joins: bool = False) -> Session:
    """Open this process's session for ``command`` (nothing is exported without one). ``joins``: the command runs on
    Ray, so on a cluster it exports there even with no Ray work done (a night with nothing to do reports success)."""
    global _SESSION
    _SESSION = Session(command=command, push=push, job=job or "verbatim-batch", address=address, joins=joins)
    return _SESSION


def current() -> Session | None:
    return _SESSION


def record(stage: str, block: dict[str, Any]) -> None:
    """A stage run's metrics block (``accounting.stage_metrics``), recorded for export."""
    if _SESSION is not None:
        _SESSION.stages.append((stage, block))


TOTAL = "total"  # the stage label of the whole command's duration


def samples(session: Session, status: str, now: float | None = None) -> list[tuple[str, dict[str, str], Any]]:
    """``(metric name, labels, value)`` of the session (a histogram's value: its observations); counters summed over
    its stage runs, the command's duration observed as ``stage="total"``."""
    cmd = session.command
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    hist: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(list)
    for stage, block in session.stages:
        for outcome in OUTCOMES:
            sums[("verbatim_rows_total", (("command", cmd), ("stage", stage), ("outcome", outcome)))] += \
                block["rows"].get(outcome, 0)
        for m in METRICS:
            if m.kind == "counter" and m.name != "verbatim_rows_total" and m.sample in block:
                sums[(m.name, (("command", cmd), ("stage", stage)))] += block[m.sample]
        hist[(("command", cmd), ("stage", stage))].append(block["duration_seconds"])
    hist[(("command", cmd), ("stage", TOTAL))].append(round(time.perf_counter() - session.started, 3))
    out: list[tuple[str, dict[str, str], Any]] = [(n, dict(labels), v) for (n, labels), v in sums.items()]
    out += [("verbatim_stage_duration_seconds", dict(labels), v) for labels, v in hist.items()]
    out.append(("verbatim_runs_total", {"command": cmd, "status": status}, 1))
    if status == "committed":
        out.append(("verbatim_last_success_timestamp_seconds", {"command": cmd}, time.time() if now is None else now))
    return out


def finish(status: str) -> None:
    """Export what the session holds, once, with how the command ended; never raises."""
    global _SESSION
    session, _SESSION = _SESSION, None
    if session is None:
        return
    try:
        rows = samples(session, status)
    except Exception as exc:  # noqa: BLE001 - metrics never cost the run
        warn(f"metrics not exported: {type(exc).__name__}: {exc}")
        return
    if session.push:
        from verbatim_batch.engine.telemetry.push import push

        if status == "committed":  # the command's group, replaced: the last success and its figures
            push(session.push, session.job, session.command, rows, replace=True)
        else:  # its run alone, in a group of its status: a refused night never replaces a committed one's series
            push(session.push, session.job, session.command, [r for r in rows if r[0] == "verbatim_runs_total"],
                 replace=True, group={"status": status})
    address = session.address or os.environ.get("RAY_ADDRESS")
    ray = sys.modules.get("ray")
    joined = bool(ray is not None and ray.is_initialized() and not _started_locally())
    # a cluster is joined for its metrics only by a command that committed: a refused one (e.g. its cluster is
    # not there) says so in its own one line, and its push (if any) records the refusal
    if joined or (status == "committed" and session.joins and address and address != "local"
                  and not _started_locally()):
        from verbatim_batch.engine.telemetry.ray_export import export

        export(address, rows)


def _started_locally() -> bool:
    if "verbatim_batch.engine.ray_env" not in sys.modules:
        return False
    from verbatim_batch.engine.ray_env import started_locally

    return started_locally()
