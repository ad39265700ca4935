"""Where a fan-out of independent calls runs: in this process, unless the engine has installed a runner.

The lower floors never import Ray. A check that can use a cluster (``verify.check_papers``) hands its calls to
``run_each``; the engine installs ``engine.sink.in_tasks`` when it is imported, which runs them as Ray tasks
when this driver has Ray up and here otherwise. Either way the results come back in call order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Runner = Callable[[Callable[..., Any], list[tuple]], list]
_runner: Runner | None = None


def install_runner(runner: Runner) -> None:
    """Make ``run_each`` use ``runner`` (the engine's, at its import)."""
    global _runner
    _runner = runner


def run_each(fn: Callable[..., Any], calls: list[tuple]) -> list:
    """``fn(*call)`` for each call, in order: through the installed runner, else here."""
    return [fn(*call) for call in calls] if _runner is None else _runner(fn, calls)
