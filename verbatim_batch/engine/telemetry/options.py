"""The metrics options every command takes (declared once, here)."""

from __future__ import annotations

from dataclasses import dataclass

from verbatim_batch.core.options import Declared, option


def _push_url(url: str) -> str:
    from verbatim_batch.engine.telemetry.push import check_url

    return check_url(url)


def _job_label(value: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
        raise ValueError(f"expected 1-64 letters, digits, '_', '.' or '-', got {value!r}")
    return value


@dataclass(kw_only=True)
class MetricsOptions(Declared):
    """Where a command's metrics go when it ends (docs/operations.md)."""

    metrics_push: str | None = option(None, "push the command's metrics to this Prometheus Pushgateway when it "
                                      "ends, committed or refused (an unreachable gateway costs one warning)",
                                      parse=_push_url, metavar="URL", default_help="no push", runtime=True)
    metrics_job: str = option("verbatim-batch", "the Pushgateway's job label for the pushed metrics",
                              parse=_job_label, runtime=True)
