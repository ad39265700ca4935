"""The one base of the stages' model actors (embed, extract's model extractors, rerank; ``api``'s processors),
and what the CPU tasks around them share.

A ``ModelActor`` sets torch's threads once, loads its model once (``load``), does each batch with retries
(``batches.with_retries``), reports the batch's cost as ``_count_`` columns (``counts``: its ``stats`` growth and
wall time) and, where the stage says so (``failed_rows``), turns a batch whose retries are spent into one
``stage_failed`` row per input row. Its Ray arguments come from ``resources.ray_args``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pyarrow as pa

from verbatim_batch.engine.batches import with_counts, with_retries, with_retry_count
from verbatim_batch.engine.live import Reporter

_HOSTS: dict[tuple[Any, Any], Any] = {}


def host(factory: Callable[[Any], Any], config: Any) -> Any:
    """``factory(config)`` once per worker process: a tokenizer the CPU tasks in front of the actors share."""
    key = (factory, config)
    if key not in _HOSTS:
        _HOSTS[key] = factory(config)
    return _HOSTS[key]


def stage_failed(exc: BaseException) -> str:
    """The error of each row of a batch the stage gave up on (retries spent)."""
    return f"stage_failed: {type(exc).__name__}: {exc}"[:500]


class ModelActor:
    """One model per actor (per GPU); subclasses give ``load`` and ``run``, optionally ``counts`` and
    ``failed_rows``."""

    what: ClassVar[str] = "model"  # the stage, in retry warnings and fault points (``<what>.batch``)

    def __init__(self, config: Any, threads: int | None = None, retries: int = 2,
                 token_budget: int | None = None) -> None:
        if threads:
            import torch

            torch.set_num_threads(threads)
        if token_budget is not None and dataclasses.is_dataclass(config) and any(
                f.name == "token_budget" for f in dataclasses.fields(config)):
            config = dataclasses.replace(config, token_budget=token_budget)
        self.config = config
        self.retries = retries
        born = time.perf_counter()
        self.model = self.load(config)
        self._idle_since = time.perf_counter()
        self._load_ms = round(1000 * (self._idle_since - born))
        self._live = Reporter()  # the driver's progress line: loaded, and rows through the model (``live``)
        self._live.loaded()

    def load(self, config: Any) -> Any:
        """The model, loaded once per actor."""
        raise NotImplementedError

    def run(self, batch: pa.Table) -> tuple[pa.Table, dict[str, int]]:
        """One attempt at a batch: the output rows, and counts that ride along with them (e.g. an earlier CPU
        stage's, ``batches.strip_internal``); ``counts`` are added to them."""
        raise NotImplementedError

    def stats(self) -> Mapping[str, Any]:
        """The model's running totals (tokens, seconds, ...), whose growth over a batch ``counts`` reports."""
        return getattr(self.model, "stats", None) or {}

    def counts(self, before: Mapping[str, Any], after: Mapping[str, Any], wall_s: float) -> dict[str, int]:
        """What one batch cost: the growth of ``stats`` from ``before`` to ``after``, and ``wall_s``."""
        return {}

    def failed_rows(self, batch: pa.Table, error: str) -> pa.Table | None:
        """Rows for a batch whose retries are spent, each with ``error`` (``stage_failed: ...``); None: it raises."""
        return None

    def _attempt(self, batch: pa.Table) -> pa.Table:
        before = dict(self.stats())
        t0 = time.perf_counter()
        with self._live.batch(batch.num_rows, self.model):
            out, carried = self.run(batch)
        t1 = time.perf_counter()
        counts = Counter(carried)  # what rode along, plus what this batch cost here (added up, per name)
        counts.update(self.counts(before, self.stats(), t1 - t0))
        # the performance report's actor figures (telemetry.perf): batches, time busy, time waiting for input
        # since the last batch, and the model's load time once
        counts.update({"batches": 1, "time_ms.actor_busy": round(1000 * (t1 - t0)),
                       "time_ms.actor_wait": round(1000 * max(0.0, t0 - self._idle_since)),
                       "time_ms.actor_load": self._load_ms})
        self._idle_since, self._load_ms = t1, 0
        return with_counts(out, dict(counts))

    def __call__(self, batch: pa.Table) -> pa.Table:
        try:
            return with_retries(self._attempt, batch, self.retries, self.what)
        except Exception as exc:  # noqa: BLE001 - retries spent: error rows where the stage has them
            out = self.failed_rows(batch, stage_failed(exc))
            if out is None:
                raise
            return with_retry_count(out, self.retries)
