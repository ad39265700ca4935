"""Fault injection for crash tests: kill a process at a named point of a run.

Off unless ``VERBATIM_BATCH_FAULT`` is set (one dict lookup per point). Its value is ``POINT[#N][@MARKER]`` with
``;key=value`` options, several joined by ``|``: ``POINT`` a ``fault_point`` name (``commit``, ``sink.write``,
``stage.done:<name>``, ...); ``N`` the N-th time this process reaches it (default 1); ``MARKER`` a file created
when it fires, after which it never fires again in any process. The default is ``SIGKILL`` (no cleanup, like the
OOM killer); ``action=raise`` raises ``InjectedFault`` (a transient error), ``action=stop`` sends SIGSTOP,
``action=hog`` (``mb=N``, default 8192) takes memory 64 MB every 20 ms; ``target=driver`` aims at the process
that called ``mark_driver``.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "VERBATIM_BATCH_FAULT"
DRIVER_ENV = "VERBATIM_BATCH_DRIVER_PID"
_hits: Counter = Counter()


def mark_driver() -> None:
    """Record this process as the driver (workers started after this inherit it; a value inherited from a
    parent process is replaced, or a fault aimed at "the driver" would kill that parent)."""
    os.environ[DRIVER_ENV] = str(os.getpid())


class InjectedFault(RuntimeError):
    """The error ``action=raise`` throws."""


def _parse(spec: str) -> tuple[str, int, str | None, dict[str, str]]:
    spec, *opts = spec.split(";")
    options = {"target": "self", "action": "kill"}
    for opt in opts:
        key, _, value = opt.partition("=")
        options[key.strip()] = value.strip()
    spec, _, marker = spec.partition("@")
    point, _, nth = spec.partition("#")
    return point.strip(), int(nth or 1), marker.strip() or None, options


def fault_point(name: str) -> None:
    """SIGKILL here when ``VERBATIM_BATCH_FAULT`` names this point (see the module doc)."""
    specs = os.environ.get(ENV)
    if not specs:
        return
    for spec in specs.split("|"):
        point, nth, marker, options = _parse(spec)
        if point == name:
            _fire(name, nth, marker, options)
            return


def _fire(name: str, nth: int, marker: str | None, options: dict[str, str]) -> None:
    _hits[name] += 1
    if _hits[name] < nth:
        return
    if marker is not None:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    if options["action"] == "raise":
        raise InjectedFault(f"injected fault at {name}")
    if options["action"] == "hog":
        _hog(int(options.get("mb", "8192")))
        return
    pid = int(os.environ.get(DRIVER_ENV, os.getpid())) if options["target"] == "driver" else os.getpid()
    os.kill(pid, signal.SIGSTOP if options["action"] == "stop" else signal.SIGKILL)


def _hog(mb: int) -> None:
    """Take ``mb`` MB of memory, page by page (so that it is resident), slowly enough for a monitor to see it."""
    import time

    held = []
    for _ in range(0, mb, 64):
        block = bytearray(64 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        held.append(block)
        time.sleep(0.02)
