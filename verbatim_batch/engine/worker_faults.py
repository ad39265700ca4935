"""A stage whose workers are lost beyond their bound: one line that names the stage, the cause and the way on.

Past the restart bound (``restarts.Restarting``) Ray raises in the driver; ``stopped`` turns that into a
``StageStopped``, which the CLI prints as one line with ``EXIT_CODE`` (docs/reference/exit-codes.md). Kinds:
**memory** (Ray's memory monitor: by how much, and which option makes a batch smaller), **worker** (the process
died: a kernel OOM kill or a crash, which Ray cannot tell apart, with the pid) and **node** (a node, its raylet or
its objects lost). No Ray import at module level (the CLI imports ``StageStopped``).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

EXIT_CODE = 3  # a stage stopped by lost workers or nodes; committed work is kept, a rerun resumes
RESUME = "committed work is kept (rerun with the same --run-id to resume)"


class StageStopped(RuntimeError):
    """A stage stopped because its workers or a node were lost more often than its bound allows."""

    def __init__(self, line: str, kind: str) -> None:
        super().__init__(line)
        self.kind = kind  # memory | worker | node


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _killed(text: str) -> list[tuple[str, float | None]]:
    """The workers Ray's memory monitor names as killed: (task name, GB it held), a stage's own workers first
    (Ray Data's ``MapWorker(...)``, or tasks), its bookkeeping actors (``ActorLocationTracker`` ...) last."""
    found = []
    for entry in re.findall(r"Selected to kill: \((.*?)\)\s*$", text, re.M):
        name = re.search(r"task name=([^,]+?)(?:\.__init__)?,", entry)
        held = re.search(r"actual memory used=([\d.]+)GB", entry)
        if name:
            found.append((name.group(1), float(held.group(1)) if held else None))
    return sorted(found, key=lambda item: ":" in item[0])  # "Class:Class" is one of Ray Data's own actors


def _memory_detail(text: str) -> str:
    """What Ray's memory monitor said, in figures: the node's use against the threshold, the worker's own use."""
    parts = []
    m = re.search(r"Memory usage (\d+)B exceeded threshold of (\d+)B", text)
    if m:
        used, limit = int(m.group(1)) / 1e9, int(m.group(2)) / 1e9
        parts.append(f"the node used {used:.2f} GB against Ray's threshold of {limit:.2f} GB "
                     f"({used - limit:+.2f} GB)")
    killed = _killed(text)
    if killed and killed[0][1] is not None:
        parts.append(f"the worker held {killed[0][1]:.2f} GB")
    return "; ".join(parts)


def _worker_name(text: str) -> str:
    m = re.search(r"class_name: (\S+)", text)
    if m:
        return m.group(1)
    killed = _killed(text)
    return killed[0][0] if killed else "a worker"


def _smaller_batches(job: Any, command: str = "") -> str:
    """Which of the job's options makes a model call smaller, with its value now, and its name in a chain."""
    chain = f"; --{command}-{{flag}} in run and nightly" if command else ""
    hints = [f"--{flag} (now {getattr(job, name)}{chain.format(flag=flag)})"
             for name, flag in (("batch_rows", "batch-rows"), ("token_budget", "token-budget"))
             if getattr(job, name, None) is not None]
    return f"lower {' or '.join(hints)} or give the workers more memory" if hints else \
        "give the workers more memory"


def stopped(command: str, job: Any, exc: BaseException) -> StageStopped | None:
    """The ``StageStopped`` for ``exc`` when lost workers or nodes ended the stage ``command``; else None (a bug
    or a bad input: raised as it is)."""
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, StageStopped):
            return e
    rx = sys.modules.get("ray.exceptions")
    if rx is None:  # Ray never ran in this process: no worker of it was lost
        return None

    restarts = getattr(job, "worker_restarts", None)
    bound = f"more often than --worker-restarts {restarts} allows" if restarts is not None else \
        "more often than its restart bound allows"
    for e in chain:
        text = str(e)
        if isinstance(e, rx.OutOfMemoryError) or "killed due to the node running low on memory" in text:
            detail = _memory_detail(text)
            return StageStopped(
                f"stage {command} stopped: {_worker_name(text)} was killed for memory by Ray's memory monitor "
                f"{bound}{f' ({detail})' if detail else ''}; {_smaller_batches(job, command)}; {RESUME}", "memory")
        lost_raylet = _local_raylet_lost()
        if lost_raylet or isinstance(e, (rx.NodeDiedError, rx.LocalRayletDiedError, rx.ObjectLostError)) or \
                re.search(r"raylet (is terminated|died)|node .* (died|is dead)", text, re.I):
            what = "this machine's Ray node: its raylet ended" if lost_raylet else \
                f"a Ray node ({type(e).__name__}: {_first_line(text)})"
            return StageStopped(f"stage {command} stopped: it lost {what}; {RESUME}", "node")
        if isinstance(e, (rx.ActorDiedError, rx.RayActorError, rx.WorkerCrashedError)):
            pid = re.search(r"\bpid: (\d+)", text)
            return StageStopped(
                f"stage {command} stopped: {_worker_name(text)} died {bound}"
                f"{f' (pid {pid.group(1)})' if pid else ''}: killed by the kernel's OOM killer (see dmesg) or a "
                f"signal, or crashed; if memory, {_smaller_batches(job, command)}; {RESUME}", "worker")
    return None


FAULT_TYPES = ("OutOfMemoryError", "ActorDiedError", "RayActorError", "WorkerCrashedError", "NodeDiedError",
               "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError")


def is_fault(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a lost worker, node or object: Ray's errors of that kind (and
    their subclasses, e.g. ``ActorUnavailableError``)."""
    return exc is not None and any(cls.__module__ == "ray.exceptions" and cls.__name__ in FAULT_TYPES
                                   for e in _chain(exc) for cls in type(e).__mro__)


def _local_raylet_lost() -> bool:
    """Whether the raylet of the local Ray this driver started has ended (a driver that joined a cluster has no
    such process to look at: False)."""
    try:
        from ray._private import worker

        node = worker._global_node
        infos = node.all_processes.get("raylet", []) if node is not None else []
        return any(info.process is not None and info.process.poll() is not None for info in infos)
    except Exception:  # noqa: BLE001 - Ray's internals moved: no verdict
        return False


class HideFaultTracebacks(logging.Filter):
    """On Ray Data's console handler only: its ERROR records about a lost worker, stack traces included (the command
    ends with its own line, ``stopped``); its log file keeps every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith("ray.data"):
            return True
        handled = record.exc_info[1] if record.exc_info else sys.exc_info()[1]  # logged inside its except
        return not is_fault(handled)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]
