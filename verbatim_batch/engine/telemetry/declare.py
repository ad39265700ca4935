"""Every metric verbatim-batch exports, declared once.

Prometheus naming: base units, ``_total`` on counters. Labels never carry ids or paths: ``command``, ``stage``,
``outcome`` (rows), ``status`` (runs); a Pushgateway adds ``job`` and ``instance``, Ray its own and ``ray_``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Row outcomes, the manifest's own accounting (``accounting.row_outcomes``). in = written + carried + resumed
# for every keyed stage; failed (error rows), withheld (spans the verbatim gate held back) and rejected
# (quarantined papers, LLM answers that could not be placed, empty queries) are counted apart.
OUTCOMES = ("in", "written", "carried", "resumed", "withheld", "rejected", "failed")
STATUSES = ("committed", "refused", "failed", "interrupted")
# Stage durations: from a few seconds (a carried stage) to a day (a first night over the whole Anthology).
DURATION_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)


@dataclass(frozen=True)
class Metric:
    """One exported metric: ``name`` as Prometheus shows it (counters end in ``_total``)."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...]
    sample: str  # the key of ``accounting``'s samples that sets it

    @property
    def ray_name(self) -> str:
        """The name given to ``ray.util.metrics`` (Ray appends ``_total`` to counters and prefixes ``ray_``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


METRICS: tuple[Metric, ...] = (
    Metric("verbatim_rows_total", "counter",
           "Rows of a stage by outcome: in, written (done by this run), carried (from --previous), resumed (done "
           "by a killed run with this id), failed (error rows), withheld (spans failing the verbatim check), "
           "rejected (quarantined papers, unplaceable LLM answers, empty queries)",
           ("command", "stage", "outcome"), "rows"),
    Metric("verbatim_stage_duration_seconds", "histogram",
           "Wall time of a stage run, from its start to its commit; stage=\"total\": the whole command",
           ("command", "stage"), "duration_seconds"),
    Metric("verbatim_model_tokens_total", "counter", "Tokens the stage's models processed (embed, rerank, "
           "highlighter)", ("command", "stage"), "model_tokens"),
    Metric("verbatim_model_batches_total", "counter", "Batches the stage's model actors completed",
           ("command", "stage"), "model_batches"),
    Metric("verbatim_read_bytes_total", "counter", "Bytes of the stage's inputs: the papers read, or the committed "
           "tables of its input runs", ("command", "stage"), "read_bytes"),
    Metric("verbatim_written_bytes_total", "counter", "Bytes of the files the stage committed",
           ("command", "stage"), "written_bytes"),
    Metric("verbatim_runs_total", "counter", "Commands that ended, by how: committed (exit 0), refused (exit 2), "
           "failed, interrupted (exit 130)", ("command", "status"), "runs"),
    Metric("verbatim_last_success_timestamp_seconds", "gauge", "Unix time the command last committed (set only "
           "then): alert on its age", ("command",), "last_success"),
)
BY_NAME = {m.name: m for m in METRICS}
