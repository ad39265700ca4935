"""The bound on a stage's lost workers: applied to every actor pool and task and to a local Ray's OOM retries."""

from __future__ import annotations

from dataclasses import dataclass

from verbatim_batch.core import limits
from verbatim_batch.core.options import Declared, option


@dataclass(kw_only=True)
class Restarting(Declared):
    """The bound on a stage's lost workers (a run option of every stage job, declared once, here)."""

    worker_restarts: int = option(3, "restarts of a stage's worker that crashed or was killed (the OOM killer, "
                                  "Ray's memory monitor) before the stage stops with one line, resumable with "
                                  "--run-id (Ray Data's own default is to restart forever)", low=0,
                                  high=limits.RETRIES, runtime=True)
