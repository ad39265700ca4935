"""Metrics through ``ray.util.metrics`` on a Ray cluster, scraped by the cluster's Prometheus with Ray's own.

A driver may end before Ray's metrics agent reported its samples, so they go to one detached actor per cluster
(``verbatim_batch_metrics``, namespace ``verbatim_batch``, no CPU) that holds them for the cluster's life. Ray names
them ``ray_<name>`` and adds its labels; counters are running totals over every command (a restarted actor starts
again from zero, a counter reset), and zero increments are not recorded (Ray refuses them). Ray drops a gauge not
reported within two export intervals, so the actor sets its gauges again every ``KEEPALIVE_S``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

ACTOR_NAME = "verbatim_batch_metrics"
NAMESPACE = "verbatim_batch"
MAX_RESTARTS = 3  # a lost exporter is started again this many times, then the next command makes a new one
TIMEOUT_S = 30.0
KEEPALIVE_S = 5.0


class MetricsExporter:
    """Holds every declared metric (``declare.METRICS``) and records samples sent by drivers."""

    def __init__(self) -> None:
        from ray.util import metrics

        from verbatim_batch.engine.telemetry.declare import DURATION_BUCKETS, METRICS

        self.metrics: dict[str, Any] = {}
        for m in METRICS:
            if m.kind == "counter":
                self.metrics[m.name] = metrics.Counter(m.ray_name, m.help, m.labels)
            elif m.kind == "gauge":
                self.metrics[m.name] = metrics.Gauge(m.ray_name, m.help, m.labels)
            else:
                self.metrics[m.name] = metrics.Histogram(m.ray_name, m.help, list(DURATION_BUCKETS), m.labels)
        self.gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # set again every KEEPALIVE_S
        self.lock = threading.Lock()
        threading.Thread(target=self._keep_gauges, name="verbatim-gauges", daemon=True).start()

    def _keep_gauges(self) -> None:
        while True:
            time.sleep(KEEPALIVE_S)
            with self.lock:
                held = list(self.gauges.items())
            for (name, tags), value in held:
                try:
                    self.metrics[name].set(value, tags=dict(tags))
                except Exception:  # noqa: BLE001, S112 - the next round tries again
                    continue

    def record(self, rows: list[tuple[str, dict[str, str], Any]]) -> int:
        """Record ``rows`` (``session.samples``); returns how many were recorded."""
        n = 0
        for name, labels, value in rows:
            metric = self.metrics[name]
            if isinstance(value, list):
                for v in value:
                    metric.observe(float(v), tags=labels)
                    n += 1
            elif name.endswith("_total"):
                if value > 0:
                    metric.inc(float(value), tags=labels)
                    n += 1
            else:
                metric.set(float(value), tags=labels)
                with self.lock:
                    self.gauges[(name, tuple(sorted(labels.items())))] = float(value)
                n += 1
        return n


def exporter():
    """The cluster's exporter actor, made on first use."""
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS)(MetricsExporter)
    return cls.options(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote()


def export(address: str, rows: list[tuple[str, dict[str, str], Any]]) -> bool:
    """Send ``rows`` to the cluster's exporter at ``address`` (joined if need be); False, with one warning, if not."""
    from verbatim_batch.engine.telemetry.warning import warn

    try:
        import ray

        from verbatim_batch.engine.ray_env import init_ray

        init_ray(address)
        ray.get(exporter().record.remote(rows), timeout=TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - metrics never cost the run
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        warn(f"metrics not exported through Ray at {address}: {reason}")
        return False
    return True
