"""The Ray environment a stage runs in: joining or starting Ray (``init_ray``, the one place), the cluster's
CPUs and GPUs, and the CPU actor-pool rule (``actor_pool``) that ``resources.ray_args`` applies."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

# transformers' and the hub's progress bars (model loading) in workers: off
QUIET_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS",)
LOCAL_START_ATTEMPTS = 3  # a local Ray that fails to start (a loaded machine) is retried with backoff
AFTER_START: list = []  # called once Ray is up in this process: the CLI puts its SIGTERM handler back, which
#                        Ray's core worker replaces with its own (it logs a C++ stack and aborts the driver)
_STARTED_LOCAL = False  # this process started the Ray it runs on (``_start_local``), rather than joined one


def init_ray(address: str | None = None, num_cpus: int | None = None, log_to_driver: bool = True,
             oom_retries: int | None = None) -> None:
    """The one place Ray is started: join the cluster at ``address`` (or ``RAY_ADDRESS``; ``auto`` finds one here), else
    start a fresh local Ray on loopback only (``_start_local``; also ``address="local"``), never silently joining what
    ``ray start`` left. A no-op when Ray is up. ``oom_retries``: a local Ray's retries of tasks killed for memory."""
    import ray  # here, not at the top: the CLI parses its options without importing Ray

    if ray.is_initialized():
        return
    quiet_ray_data()
    address = address or os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        check_reachable(address)
        try:
            with keeping_sigterm():
                ray.init(address=address, log_to_driver=log_to_driver)
        except (ConnectionError, TimeoutError) as exc:
            raise ConnectionError(f"cannot join the Ray cluster at {address}: {str(exc).splitlines()[0][:200]}") \
                from None
    else:
        _start_local(num_cpus, log_to_driver, oom_retries)
    for hook in AFTER_START:
        hook()


def quiet_ray_data() -> None:
    """Ray Data's progress and warnings in a stage job's driver, made readable (``engine.progress``): its progress bars
    off (``VERBATIM_PROGRESS=ray`` keeps them); its never-true "Dataset job will hang unless more CPUs are freed up"
    consumed (stage pools always leave a CPU); its INFO lines and lost-worker stack traces to its log file only (the
    command ends with its own line, ``worker_faults``); Ray's token-auth notice and transformers' loading bars off."""

    from ray.data import DataContext
    from ray.util.debug import log_once

    from verbatim_batch.engine.progress import mode

    ctx = DataContext.get_current()
    if mode() != "ray":
        ctx.enable_progress_bars = False
        log_once("ray_data_progress_manager_disabled")
    if hasattr(ctx, "print_on_execution_start"):
        ctx.print_on_execution_start = False
    log_once("cpu_warning")
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    from verbatim_batch.engine.worker_faults import HideFaultTracebacks

    for handler in logging.getLogger("ray.data").handlers:  # the console one; its log file keeps everything
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            if not any(isinstance(f, HideFaultTracebacks) for f in handler.filters):
                handler.addFilter(HideFaultTracebacks())
            if mode() != "ray":  # below our progress lines: warnings and errors only
                handler.setLevel(max(handler.level, logging.WARNING))
    for name in QUIET_ENV:
        os.environ.setdefault(name, "1")  # inherited by the workers of a local Ray


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A cluster address with nothing listening is refused in ``timeout_s`` (``ray.init`` retries for minutes)."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        where = "--address" if address != os.environ.get("RAY_ADDRESS") else "RAY_ADDRESS"
        raise ConnectionError(f"no Ray cluster answers at {address} (from {where}): {exc.strerror or exc}; "
                              "start one, or unset it to run on a local Ray") from None


def _private_token_file() -> None:
    """Write the local Ray's auth token (``~/.ray/auth_token``) before Ray does, readable by this user only (Ray's
    follows the umask: any local user could read it), linked into place so it is never read half written; a token the
    user set up, or ``RAY_AUTH_MODE=disabled``, is left alone."""
    import secrets
    import tempfile
    from pathlib import Path

    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    try:
        path = Path.home() / ".ray" / "auth_token"
        if path.exists():
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".auth_token.", dir=path.parent)  # mode 0600 whatever the umask
    except (RuntimeError, OSError):  # no home folder to write in: Ray says what it needs when it starts
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # as Ray's own generator: 256 bits
        os.link(tmp, path)
    except FileExistsError:  # another process wrote it first: that one is used
        pass
    except OSError:
        return
    finally:
        Path(tmp).unlink(missing_ok=True)


def _temp_dir_hint(exc: BaseException) -> str:
    """What to do when Ray's session folder, under RAY_TMPDIR or else TMPDIR, is too deep for its sockets."""
    if "AF_UNIX path length" not in str(exc):
        return ""
    where = "RAY_TMPDIR" if "RAY_TMPDIR" in os.environ else "TMPDIR"
    return (f" ({where} is too long a path for Ray's sockets: set RAY_TMPDIR to a short folder, e.g. "
            "RAY_TMPDIR=/tmp)")


def _start_local(num_cpus: int | None = None, log_to_driver: bool = True, oom_retries: int | None = None) -> None:
    """A local Ray whose servers all bind 127.0.0.1: ``ray.init`` would swap a loopback node address for the routable
    one, so that swap is off for the call (tests/test_exposure.py checks the sockets); a ``reaper`` ends its processes
    when this driver dies."""
    if num_cpus is not None and num_cpus < 1:
        raise ValueError(f"--num-cpus must be at least 1, got {num_cpus}")
    import ray
    from ray._private import services

    from verbatim_batch.engine.restarts import Restarting

    oom = Restarting.worker_restarts if oom_retries is None else oom_retries

    _private_token_file()
    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is not None:
        services.resolve_ip_for_localhost = lambda host: host
    # "Started a local Ray instance." (INFO): the stage's progress line says it starts; warnings still print
    worker_log = logging.getLogger("ray._private.worker")
    level = worker_log.level
    worker_log.setLevel(max(level, logging.WARNING))
    try:
        for attempt in range(LOCAL_START_ATTEMPTS):
            started = time.time()
            try:
                with keeping_sigterm():
                    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                             log_to_driver=log_to_driver, _node_ip_address="127.0.0.1",
                             _system_config={"task_oom_retries": oom})
                break
            except Exception as exc:  # noqa: BLE001 - e.g. "node timed out during startup" on a loaded machine
                _abandon_start(started)
                if attempt + 1 == LOCAL_START_ATTEMPTS or "AF_UNIX path length" in str(exc):
                    raise ConnectionError(f"a local Ray did not start after {attempt + 1} attempt(s): "
                                          f"{str(exc).splitlines()[0][:200]}{_temp_dir_hint(exc)}") from None
                time.sleep(2.0 * 2**attempt)
            except BaseException:  # a signal mid start-up (SIGTERM, Ctrl-C): nothing it started stays
                _abandon_start(started)
                raise
    finally:
        worker_log.setLevel(level)
        if resolve is not None:
            services.resolve_ip_for_localhost = resolve
    global _STARTED_LOCAL
    _STARTED_LOCAL = True
    from verbatim_batch.engine.reaper import start

    start()  # the local Ray's processes do not outlive this driver, even after kill -9


@contextlib.contextmanager
def keeping_sigterm():
    """While Ray starts, this process's SIGTERM handler (the CLI's: one line, exit 143) stays: ``ray.init`` would
    replace it with one exiting 15 silently, so Ray's setter is a no-op for the call (``AFTER_START`` restores it)."""
    import signal
    import threading

    from ray._private import utils

    own = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or not callable(own):
        yield
        return
    setter = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = setter


def _abandon_start(started: float) -> None:
    """A failed or interrupted local start: Ray shut down and what it started since ``started`` ended."""
    import ray

    with contextlib.suppress(BaseException):  # cleaning up after a failure or a signal
        ray.shutdown()
    try:
        _end_children_since(started)
    except BaseException:  # noqa: BLE001
        _end_children_since(started)


def _end_children_since(started: float) -> None:
    """End what a failed local start left: this driver's descendants created since ``started``, nothing older."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for proc in children:
        with contextlib.suppress(psutil.Error):
            if proc.create_time() >= started - 1.0:
                proc.kill()


def started_locally() -> bool:
    """Whether this process's Ray is a local one it started (its metrics end with it)."""
    if not _STARTED_LOCAL:
        return False
    import ray

    return ray.is_initialized()


def gpus() -> int:
    """GPUs in the cluster."""
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


def cpus() -> int:
    """CPUs in the cluster (at least 1)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def actor_pool(n_cpus: int, concurrency: int, cpus_per_actor: float) -> tuple[int, float]:
    """``(actors, CPUs per actor)`` for a CPU actor pool that always leaves one CPU to the reads and writes around it;
    on one CPU the actors claim none; a pool that does not fit gets fewer actors, then less CPU each."""
    spare = max(0, n_cpus - 1)
    if not spare:
        return 1, 0.0
    actors = min(concurrency, max(1, int(spare // cpus_per_actor))) if cpus_per_actor > 0 else concurrency
    return actors, min(cpus_per_actor, spare / actors)
