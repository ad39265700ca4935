"""Metrics count the work done (issue 53, item 4): the tokens of rows carried from ``--previous`` are recorded
as ``carried.tokens`` and left out of ``model_tokens`` (a night that embedded 0 rows pushed 88297 tokens)."""

from __future__ import annotations

from verbatim_batch.engine.runner import _carried_counts
from verbatim_batch.engine.sink import TableSinkResult
from verbatim_batch.engine.telemetry.accounting import stage_metrics


def test_carried_rows_tokens_are_not_work_done():
    result = TableSinkResult()
    result.stats = {"embeddings/part-carried-1a2b.parquet": {"counts": {"tokens": 900, "windows": 9}},
                    "embeddings/part-00001.parquet": {"counts": {"tokens": 100, "windows": 1}}}
    carried = _carried_counts(result)
    assert carried == {"carried.tokens": 900, "carried.windows": 9}
    counts = {"tokens": 1000, **carried}
    assert stage_metrics(counts, {"total": 1.0}, {}, 0, 0)["model_tokens"] == 100
    all_carried = {"tokens": 900, "carried.tokens": 900}
    assert stage_metrics(all_carried, {"total": 1.0}, {}, 0, 0)["model_tokens"] == 0
