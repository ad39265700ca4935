"""``verbatim-batch <command>``: the command-line entry point.

Options are declared once in ``options`` and shared by the commands that take them; ``commands`` turns them
into jobs. A ``--config FILE`` (YAML) supplies defaults that flags override (``verbatim_batch.cli.config``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time


def _while_starting(signum: int, frame: object) -> None:
    """A SIGTERM or Ctrl-C while the CLI's modules load (before ``main``'s handlers): one line and 143 or 130."""
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    os.write(2, f"verbatim-batch: {what} while starting; nothing was run\n".encode())
    os._exit(128 + signum)


# put back once the modules are in: a caller importing the package keeps its own handlers
_BEFORE = {sig: signal.signal(sig, _while_starting) for sig in (signal.SIGTERM, signal.SIGINT)
           if threading.current_thread() is threading.main_thread() and signal.getsignal(sig) in (
               signal.SIG_DFL, signal.default_int_handler)}

from verbatim_batch.cli.commands import EXAMPLES, handler  # noqa: E402 - after the start-up handlers
from verbatim_batch.cli.options import COMMANDS, Parser, add_options, flag_of  # noqa: E402

for _sig, _handler in _BEFORE.items():
    signal.signal(_sig, _handler)

DESCRIPTION = ("Chunk papers, embed and index them, retrieve, and extract verbatim evidence spans at their exact "
               "offsets, on Ray. `verbatim-batch demo` runs the whole chain on the bundled papers; "
               "`verbatim-batch COMMAND --help` tells each command's options.")

__all__ = ["EXAMPLES", "build_parser", "main", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser, with ``parser.commands`` (sub-parsers) and ``parser.required`` (required keys) by command."""
    parser = Parser(prog="verbatim-batch", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    parser.commands, parser.required = {}, {}
    for name, spec in COMMANDS.items():
        parser.commands[name] = p = sub.add_parser(name, help=spec.help, description=spec.help)
        parser.required[name] = add_options(p, name)
    sub.add_parser("synth", help="write a synthetic corpus: verbatim-batch synth --out DIR --n 100 "
                   "(see python -m verbatim_synth --help)", add_help=False)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; a ``--config FILE`` supplies defaults that flags override."""
    from verbatim_batch.cli import config

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--config")
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # ``--config`` without a file: the command's parser says so, in one line
        known = argparse.Namespace(config=None)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if known.config and command in parser.commands:
        ignored: list[str] = []
        try:
            parser.commands[command].set_defaults(**config.load_config(known.config, command, ignored))
        except config.ConfigError as exc:
            parser.exit(2, f"verbatim-batch {command}: config error: {exc}\n")
        if ignored:
            print(f"verbatim-batch {command}: {known.config}: not used by {command} (for other commands): "
                  f"{', '.join(dict.fromkeys(ignored))}", file=sys.stderr)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's parser names the closest flag it takes
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    missing = [k for k in sorted(parser.required.get(args.command, ())) if getattr(args, k, None) is None]
    if missing:
        flags = ", ".join(flag_of(args.command, k) for k in missing)
        parser.commands[args.command].error(f"the following arguments are required: {flags}")
    return args


def main(argv: list[str] | None = None) -> int:
    from verbatim_batch.core.faults import mark_driver

    mark_driver()  # crash tests can aim a fault at this process from a worker
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["synth"]:  # the generator has its own options
        from verbatim_synth import main as synth_main

        return synth_main(argv[1:])
    watch_ctrl_c()  # from here on a SIGTERM or Ctrl-C ends the command with its one line and code
    command, ended = (argv[0] if argv and not argv[0].startswith("-") else "?"), [0, False]  # [rc, line said]
    try:
        args = parse_args(argv)
        command = args.command
        from verbatim_batch.engine.telemetry import session

        session.begin(command, push=getattr(args, "metrics_push", None), job=getattr(args, "metrics_job", None),
                      address=getattr(args, "address", None), joins=hasattr(args, "address"))
        status = "failed"
        try:
            ended[0], status = _run(args)
            ended[1] = ended[0] in (130, 143)
        finally:
            session.finish(status)  # the metrics, pushed and exported however the command ended
        return ended[0]
    except KeyboardInterrupt:  # a signal while the command line was read or the metrics pushed
        if ended[1]:
            return ended[0]  # a second signal: the command's line is said already
        return _ended(command, "terminated (SIGTERM)", 143) if _TERM.is_set() else _ended(command, "interrupted", 130)
    finally:
        restore_signals()


def _run(args: argparse.Namespace) -> tuple[int, str]:
    """The command run: ``(exit code, status)``, its faults, limits and signals ended with one line each."""
    try:
        rc = handler(args.command)(args)
        if rc != 0 and _CTRL_C.is_set():
            raise KeyboardInterrupt  # a failure after Ctrl-C: the Ctrl-C ended it
        return rc, "committed" if rc == 0 else "failed"
    except (FileNotFoundError, FileExistsError, PermissionError, ConnectionError, ValueError,
            NotImplementedError) as exc:
        from verbatim_batch.core.redact import redact_text

        print(f"verbatim-batch {args.command}: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2, "refused"
    except MemoryError:  # this process (the driver) ran out: its error path must not need memory either
        return _ended(args.command, "error: out of memory in this process (MemoryError): raise its memory limit "
                      "(ulimit -v, the container's) or lower --batch-rows", 2), "failed"
    except BaseException as exc:
        from verbatim_batch.engine.worker_faults import EXIT_CODE, StageStopped

        if _TERM.is_set():  # SIGTERM (kill, a pod's shutdown, a scheduler's timeout): as a Ctrl-C, exit 143
            return _ended(args.command, "terminated (SIGTERM)", 143), "interrupted"
        if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):  # a thread or process limit
            return _ended(args.command, "error: cannot start a thread (a process or thread limit: ulimit -u, the "
                          "container's pids limit)", 2), "failed"
        if isinstance(exc, StageStopped) and not _CTRL_C.is_set():  # lost workers past their bound: one line
            return _ended(args.command, f"error: {exc}", EXIT_CODE, resume=False), "failed"  # it says how to resume
        if not interrupted(exc):
            raise
        # Ctrl-C: one line; committed work stays, a run's staging is resumable. Ray Data may turn the
        # KeyboardInterrupt raised while it runs into a failed dataset: the Ctrl-C is what ended the command.
        return _ended(args.command, "interrupted", 130), "interrupted"


def _ended(command: str, what: str, code: int, resume: bool = True) -> int:
    """A command ended by a fault, a limit or a signal: Ray shut down first (its lines before ours), one line."""
    from verbatim_batch.engine.runner import outer_run_id
    from verbatim_batch.engine.worker_faults import RESUME

    stop_ray_quietly()
    run_id = outer_run_id()
    if resume:
        what += f"; {RESUME.removesuffix(')')}: --run-id {run_id})" if run_id else f"; {RESUME}"
    elif run_id and RESUME in what:  # a stage stopped past its bound: its line says how to resume, not with what
        what = what.replace(RESUME, f"{RESUME.removesuffix(')')}: --run-id {run_id})")
    print(f"verbatim-batch {command}: {what}", file=sys.stderr)
    return code


_CTRL_C = threading.Event()
_TERM = threading.Event()
_SAVED: dict[int, object] = {}  # the handlers before ``watch_ctrl_c``, put back when the command ends


def restore_signals() -> None:
    """The SIGINT and SIGTERM handlers as they were before the command (``main`` called in a longer process)."""
    if threading.current_thread() is threading.main_thread():
        for signum, handler in _SAVED.items():
            if handler is not None:
                signal.signal(signum, handler)
    _SAVED.clear()
    from verbatim_batch.engine import ray_env

    ray_env.AFTER_START.clear()


def watch_ctrl_c() -> None:
    """Remember a Ctrl-C as well as raising KeyboardInterrupt; a SIGTERM (at its default) ends the command the
    same way, so its lock and an unnamed run's staging go (Python's default would leave both)."""
    _CTRL_C.clear()
    _TERM.clear()
    if threading.current_thread() is not threading.main_thread():
        return
    _SAVED.update({signal.SIGINT: signal.getsignal(signal.SIGINT), signal.SIGTERM: signal.getsignal(signal.SIGTERM)})

    def on_sigterm(signum: int, frame: object) -> None:
        _TERM.set()
        _CTRL_C.set()
        raise KeyboardInterrupt

    ours = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if ours:
        signal.signal(signal.SIGTERM, on_sigterm)
    from verbatim_batch.engine import ray_env

    def again() -> None:
        """Once Ray is up: our SIGTERM handler back (Ray installs its own), and a signal that came meanwhile ends
        the command now."""
        if ours and threading.current_thread() is threading.main_thread() and signal.SIGTERM in _SAVED:
            signal.signal(signal.SIGTERM, on_sigterm)
        if _CTRL_C.is_set():
            raise KeyboardInterrupt

    ray_env.AFTER_START[:] = [again]
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_sigint(signum: int, frame: object) -> None:
        _CTRL_C.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` ended the command because of a Ctrl-C: a KeyboardInterrupt, one in its chain of causes,
    or any error after a SIGINT reached this process."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return _CTRL_C.is_set()


# Ray Data's threads in the driver that call into Ray's core worker while a dataset stops: the executor's
# scheduling loop and its metadata fetcher. Ray Data waits 2 s for them; on a busy machine they run longer, and a
# call into a core worker that ``ray.shutdown()`` has already closed ends the process at once with exit 1 and Ray's
# "The core worker has already been shutdown" (seen on CI: a Ctrl-C while the embed actors started gave exit 1).
RAY_DATA_THREADS = ("StreamingExecutor-", "ray-data-metadata-prefetch")
JOIN_S = 30.0


def stop_ray_quietly() -> None:
    """Ray, if this process started or joined it, shut down now (after up to ``JOIN_S`` for Ray Data's stopping
    threads), ignoring a second Ctrl-C or Ray's errors: the user asked to stop; the message matters more."""
    ray = sys.modules.get("ray")
    if ray is None:
        return
    with contextlib.suppress(BaseException):
        deadline = time.monotonic() + JOIN_S
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and thread.name.startswith(RAY_DATA_THREADS):
                thread.join(max(0.0, deadline - time.monotonic()))
        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
