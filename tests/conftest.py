"""Shared fixtures (one real local Ray instance for the whole test session), the test tiers, per-test
timeouts, and interrupts that end the run with pytest's summary.

Tiers, applied here as markers at collection (README: the test command runs unit and stage; `.ci/run` runs those
and a part of e2e, docs/development.md#testing):

- ``unit``: no Ray, seconds. Everything not below.
- ``stage``: a test that uses the session's Ray (the ``ray_local`` fixture) or runs a command that starts a
  Ray of its own (``STAGE`` below): one stage at a time.
- ``e2e``: whole chains (nightly, kill and resume, node stop, multi-node, silver, train, the cluster example):
  the modules and tests named in ``E2E`` below, and every test that uses ``nightly_baseline``.

``pytest -m "not e2e"`` is the README's test command; ``pytest -m e2e`` the rest. A test module may also mark
itself (``pytestmark = pytest.mark.e2e``); the higher tier wins. ``VB_TIER_AUDIT=FILE pytest ...`` writes one
line per test that started a Ray while it ran (in this process or in a child), with its tier: a ``unit``
line there is a test to name in ``STAGE``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# On a loaded machine the GCS can answer late; by default a driver (this pytest process) exits when it cannot
# reach the GCS for 60 s, which would end the whole session. Waited out longer, a slow GCS fails one test.
os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")

# --- test tiers ------------------------------------------------------------------------------------------------

TIERS = ("unit", "stage", "e2e")
RAY_FIXTURES = {"ray_local", "_ray_session"}  # a test that uses one of these is at least `stage`
E2E_FIXTURES = {"nightly_baseline"}  # a whole nightly chain, made once per session
SESSION_PER_WORKER = {"_ray_session"}  # under xdist each worker has its own session Ray
# Tests that start a Ray by running a command (in this process or a child), without the fixture: at least `stage`.
# A module name stands for all its tests; `module::function` for one test (all its parameters).
STAGE = {
    "test_chunk_night.py",  # the chunk stage over two nights, one of them a subprocess
    "test_environment.py",  # chunk runs in a hostile environment, each a subprocess with a local Ray of its own
    "test_worker_faults.py::test_a_worker_killed_at_every_batch_stops_the_stage_and_the_run_resumes",  # embed
    "test_worker_faults.py::test_a_worker_out_of_memory_ends_with_the_figures_and_the_option_to_lower",  # runs
    "test_pipeline.py::test_killed_run_leaves_no_output_and_next_run_cleans_up",  # jobs/chunk.py, killed
    "test_task_bounds.py",  # chunk runs whose read task is killed at every attempt, then resumed
    "test_plan_settings.py::test_resume_with_another_token_budget",  # embed runs killed, refused, resumed
}
# Whole chains: the nightly and kill-and-resume runs, node stop, multi-node, silver end to end, Ray Train, the
# guide's cluster example (docs/cluster.md#a-ray-head-of-your-own-on-this-machine); each is minutes of Ray and
# model start-up.
E2E = {
    "test_nightly.py",
    "test_resume.py",
    "test_node_stop.py",
    "test_multinode.py",
    "test_silver_e2e.py",
    "test_silver_empty.py",
    "test_cluster_example.py",
    "test_chain_run.py",
    "test_previous_release.py",  # a night of release 4bc016d, then one of this tree, on the same root
    "test_llm_e2e.py",
    "test_exposure.py",
    "test_vllm.py",
    "test_retrieval_pipeline.py",  # chunk -> embed -> index -> retrieve -> extract, each stage killed and resumed
    "test_paths.py",  # a `run` chain, then evaluate/extract/verify/api from two working directories
    "test_refusals.py::test_ctrl_c_ends_a_run_with_one_line_and_no_traceback",  # a `run` chain, interrupted
    # a lost raylet and SIGTERM mid-embed, each resumed (3-4 min each on a loaded 2-core machine; the README's
    # tiers keep the bounded restarts: a worker killed at every batch, and Ray's memory monitor)
    "test_worker_faults.py::test_a_lost_raylet_ends_the_stage_with_a_line_of_ours_and_the_run_resumes",
    "test_worker_faults.py::test_sigterm_mid_stage_ends_with_one_line_143_and_leaves_no_lock",
    "test_train.py::test_learns_then_extract_and_evaluate",
    "test_train.py::test_kill_and_resume",
}
# Per-test limits (pytest-timeout; setup, call and teardown together): generous, so that only a hung test hits
# one, even on a loaded machine. The ini's `timeout` (600 s, pyproject.toml) covers unit and stage tests.
E2E_TIMEOUT_S = 1800


def tier_of(item: pytest.Item) -> str:
    """The tier a test belongs to: the highest of its own marker and what it uses or is named as."""
    module = Path(str(item.path)).name
    name = f"{module}::{getattr(item, 'originalname', item.name)}"
    tiers = [t for t in TIERS if item.get_closest_marker(t)] or ["unit"]
    fixtures = set(getattr(item, "fixturenames", ()))
    if module in E2E or name in E2E or fixtures & E2E_FIXTURES:
        tiers.append("e2e")
    if module in STAGE or name in STAGE or fixtures & RAY_FIXTURES:
        tiers.append("stage")
    return max(tiers, key=TIERS.index)


def _check_named_tests(items: list[pytest.Item]) -> None:
    """Warn about entries of STAGE and E2E that name a test no longer defined (renamed or moved), since such a
    test would silently fall back to the unit tier."""
    folder = Path(__file__).parent
    for entry in sorted(STAGE | E2E):
        module, _, function = entry.partition("::")
        path = folder / module
        if not path.exists() or (function and f"def {function}(" not in path.read_text(encoding="utf-8")):
            warnings.warn(f"tests/conftest.py names {entry}, which is not defined: update STAGE or E2E",
                          pytest.PytestConfigWarning, stacklevel=1)


def shared_fixture_group(item: pytest.Item) -> str | None:
    """The group of a test that uses a fixture of this suite made once for several tests: the fixture's name for
    a session fixture (``nightly_baseline``), else the module for a module (or class) fixture. Under ``-n 2
    --dist loadgroup`` a group runs in one worker (see ``pytest_xdist_make_scheduler``), so such a fixture is
    made once, not once per worker; other tests go to whichever worker is free. The session's Ray is one per
    worker by design."""
    info = getattr(item, "_fixtureinfo", None)
    wider = {}
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        fixture = defs[-1]
        if fixture.scope != "function" and fixture.baseid and name not in SESSION_PER_WORKER:
            wider[name] = fixture.scope
    sessions = sorted(name for name, scope in wider.items() if scope == "session")
    if sessions:
        return "+".join(sessions)
    return Path(str(item.path)).name if wider else None



@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers, and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_named_tests(items)
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "e2e" and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
        group = shared_fixture_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    _share_groups(config, items)


# --- xdist: a group's tests in one worker ---------------------------------------------------------------------------
# xdist's own `--dist loadgroup` appends the group to the test's node id by assigning `item._nodeid`, which has no
# effect since pytest 9.2 builds node ids from a structured id: the groups were silently ignored, and a module's
# fixture was made in both workers. So here each worker writes the group of every test it collected to a file,
# and the controller schedules by that: `--dist loadgroup` as documented, marks given by hand included.

_GROUPS_DIR = "VB_XDIST_GROUPS"


def pytest_configure(config: pytest.Config) -> None:
    _interruptible()
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        import tempfile

        os.environ[_GROUPS_DIR] = tempfile.mkdtemp(prefix="vb-xdist-groups-")  # the workers inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get(_GROUPS_DIR)
    if folder and not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _share_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = os.environ.get(_GROUPS_DIR)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if not folder or not worker:
        return
    import json

    groups = {}
    for item in items:
        marks = [m.args[0] if m.args else m.kwargs.get("name", "default") for m in item.iter_markers("xdist_group")]
        if marks:
            groups[item.nodeid] = "_".join(sorted(set(map(str, marks))))
    path = Path(folder) / f"{worker}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups), encoding="utf-8")
    path.with_suffix(".tmp").replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    folder = os.environ.get(_GROUPS_DIR)
    if config.getoption("dist", "no") != "loadgroup" or not folder:
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's load-by-scope scheduling, where a test's scope is its group (as its workers wrote it), else
        the test alone."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once every worker has collected (the scheduling starts then)
                files = sorted(Path(folder).glob("*.json"))
                self.groups = json.loads(files[0].read_text(encoding="utf-8")) if files else {}
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return GroupScheduling(config, log)


# --- interrupts: Ctrl-C (and SIGTERM) end the run with pytest's summary --------------------------------------------
# Python raises KeyboardInterrupt on SIGINT only if SIGINT was not ignored when it started, and a process
# started in the background by a non-interactive shell (`pytest ... &` in a script, as agents and CI wrappers
# do) starts with SIGINT ignored: Ctrl-C or `kill -INT` then does nothing. SIGTERM had no handler of pytest's
# (the process died with no summary) or, once a test started Ray in this process, Ray's own, which calls sys.exit
# in the middle of whatever test runs. Both raise KeyboardInterrupt here, so
# pytest stops, runs the fixtures' teardowns (the session's Ray is shut down) and prints its summary. The
# handlers are set again before every test, since each `ray.init` in this process sets Ray's.


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


def _interruptible() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is not _interrupted:
        signal.signal(signal.SIGTERM, _interrupted)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _interruptible()  # after the fixtures' setup, which may have started Ray


# --- the tier audit (VB_TIER_AUDIT=FILE) -------------------------------------------------------------------------


class _RayWatch:
    """Notes whether a Ray started during one test: `ray.init` in this process, or a Ray (its GCS server) among
    this process's descendants, polled while the test runs."""

    def __init__(self):
        self.started = False
        self._stop = threading.Event()
        self._before = self._gcs_pids()
        self._inproc = self._ray_up()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @staticmethod
    def _ray_up() -> bool:
        ray = sys.modules.get("ray")
        return bool(ray and ray.is_initialized())

    @staticmethod
    def _gcs_pids() -> set[int]:
        import psutil

        pids = set()
        for child in psutil.Process().children(recursive=True):
            try:
                if child.name().startswith("gcs_server"):
                    pids.add(child.pid)
            except psutil.Error:
                pass
        return pids

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            if self._gcs_pids() - self._before:
                self.started = True
                return

    def done(self) -> bool:
        self._stop.set()
        self._thread.join()
        return self.started or (self._ray_up() and not self._inproc) or bool(self._gcs_pids() - self._before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    audit = os.environ.get("VB_TIER_AUDIT")
    watch = _RayWatch() if audit else None
    yield
    if watch is not None and watch.done():
        with open(audit, "a", encoding="utf-8") as out:
            out.write(f"{tier_of(item)} {item.nodeid}\n")


def _ensure_local_ray():
    import ray

    from verbatim_batch.engine.ray_env import init_ray

    if not ray.is_initialized():
        os.environ.pop("RAY_ADDRESS", None)
        # a local Ray (RAY_ADDRESS unset), retried with backoff when a loaded machine is slow to start it
        init_ray(num_cpus=2, log_to_driver=False)
    return ray


@pytest.fixture(scope="session")
def _ray_session():
    """A real local Ray (2 CPUs, like CI), shared by all pipeline tests, shut down at the end."""
    ray = _ensure_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """The session's local Ray, started again if a module before this one shut it down (the multi-node tests
    stop it so that their clusters get the CPUs), so no module depends on the order the modules run in."""
    return _ensure_local_ray()


@pytest.fixture(scope="session")
def nightly_baseline(tmp_path_factory):
    """One uninterrupted `verbatim-batch nightly` (run id r1) over six bundled papers and four queries, made
    once per session: the reference that killed, resumed, cluster and object-store runs of the same night
    must equal. Tests that change the corpus copy it first (``corpus`` is shared)."""
    from helpers import PAPERS, make_corpus, nightly

    tmp = tmp_path_factory.mktemp("baseline")
    corpus = make_corpus(tmp / "corpus", PAPERS[:6])
    root = tmp / "baseline"
    nightly(root, corpus, "r1")
    return {"tmp": tmp, "corpus": corpus, "root": root}
