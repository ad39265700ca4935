"""A root of runs with a ``current`` pointer (nightly): ``ROOT/runs/<id>/``, ``CURRENT``, ``current``."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import uuid

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.core.runs.folder import BINDING_FILE, lock_holder, replaceable, safe_run_id
from verbatim_batch.core.runs.manifest import MANIFEST_FILE, read_manifest, read_table

log = logging.getLogger(__name__)

RUNS_DIR = "runs"
CURRENT_FILE = "CURRENT"  # the current run's id, for object stores and scripts
CURRENT_LINK = "current"  # symlink to runs/<id>: resolve it once (os.path.realpath) before reading through it


def current_run(root: str) -> str | None:
    """The id of the run ``root``'s ``current`` pointer names (None before the first commit, and when the
    pointer is not a run id this tool writes: a damaged or edited ``CURRENT`` never leads outside ``runs/``)."""
    path = storage.join(storage.normalize(root), CURRENT_FILE)
    try:
        if not storage.is_remote(path) and os.path.exists(path) and not storage.regular_file(path):
            raise ValueError("not a regular file")
        run_id = storage.read_text_bounded(path, 4096).strip()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s): no current run", path, str(exc)[:200])
        return None
    try:
        return safe_run_id(run_id) if run_id else None
    except ValueError:
        log.warning("%s does not hold a run id: no current run", path)
        return None


def run_of(path: str) -> str:
    """``path`` itself, or for a nightly root (no manifest of its own, a ``current`` pointer) its current run's
    folder: what a command that reads a run is given either way."""
    path = storage.normalize(path)
    if storage.exists(storage.join(path, MANIFEST_FILE)):
        return path
    run_id = current_run(path)
    return storage.join(path, RUNS_DIR, run_id) if run_id else path


def set_current(root: str, run_id: str) -> None:
    """Point ``current`` at a committed run: the id file (and, on local file systems, the symlink) are each
    replaced atomically."""
    root = storage.normalize(root)
    target = storage.join(RUNS_DIR, run_id)
    read_manifest(storage.join(root, target))  # only committed runs become current
    if not storage.is_remote(root):
        import os

        tmp_link = os.path.join(root, f".{CURRENT_LINK}.tmp-{uuid.uuid4().hex[:8]}")
        os.symlink(target, tmp_link)
        os.replace(tmp_link, os.path.join(root, CURRENT_LINK))
    storage.write_text(storage.join(root, CURRENT_FILE), run_id + "\n")


def current_table(root: str, table: str, stage: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """A table of the current run, e.g. ``current_table(root, "spans")`` (works where symlinks do not:
    object stores, Windows)."""
    run_id = current_run(root)
    if run_id is None:
        raise FileNotFoundError(f"{root} has no current run yet")
    run_dir = storage.join(storage.normalize(root), RUNS_DIR, run_id)
    if stage is not None:
        return read_table(storage.join(run_dir, stage), table, columns)
    from verbatim_batch.core.runs.manifest import holding

    found = holding(run_dir, (table,))  # the stage folder that holds it (a chain's last, as the chain reads it)
    if found is None:
        raise FileNotFoundError(f"the current run {run_id} of {root} holds no {table} table")
    return read_table(found, table, columns)


def _started(run_dir: str) -> float:
    """When an unfinished run started: its binding file's time (object stores keep no folder times)."""
    for loc in (storage.join(run_dir, BINDING_FILE), run_dir):
        if storage.exists(loc) and (t := storage.mtime(loc)) is not None:
            return t
    return 0.0


def _ours_unfinished(path: str, name: str) -> bool:
    """A run folder this tool started and never committed: its binding file names this run id."""
    where = storage.join(path, BINDING_FILE)
    try:
        if not storage.regular_file(where):
            return False
        bound = json.loads(storage.read_text_bounded(where, 1 << 16))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(bound, dict) and bound.get("run_id") == name


def prune_runs(root: str, keep: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete committed runs beyond the ``keep`` newest and unfinished runs older than the newest commit.

    Only runs this tool wrote are candidates: a committed run has a valid manifest of ours, an unfinished
    one our binding file with its own id; anything else under ``runs/`` (a user's folder, a symlink, a run
    whose manifest is damaged or forged) is never touched. The current run and ``protect`` are never
    deleted, nor is an unfinished run whose lock is held by a live process (a night still going), nor the
    base that such a night builds on (the run it named as ``base`` in the root's lock). Returns the ids
    removed.
    """
    runs_dir = storage.join(storage.normalize(root), RUNS_DIR)
    current = current_run(root)
    committed, unfinished = [], []
    for name in storage.listdir(runs_dir):
        path = storage.join(runs_dir, name)
        if name.startswith(".") or not storage.isdir(path) or (
                not storage.is_remote(path) and os.path.islink(path)):
            continue  # not a run folder of ours (a symlink is never one: we write none)
        if replaceable(path) and storage.exists(storage.join(path, MANIFEST_FILE)):
            try:
                created = read_manifest(path)["created_at"]
                _dt.datetime.fromisoformat(created)
            except (OSError, ValueError, KeyError, TypeError):  # damaged or forged: not ours to judge, kept
                continue
            committed.append((created, name))
        elif _ours_unfinished(path, name):
            if lock_holder(path) is None:  # a night that is still going is never removed
                unfinished.append((_started(path), name))
        # anything else (a user's folder beside the runs) is never touched
    night = lock_holder(storage.join(storage.normalize(root), RUNS_DIR))  # a night going on this root
    if night is not None and isinstance(night.get("base"), str) and night.get("run_id") not in protect:
        protect = (*protect, night["base"])  # what another night reads (the pruning night's own base may go)
    committed.sort(reverse=True)
    newest = _dt.datetime.fromisoformat(committed[0][0]).timestamp() if committed else None
    doomed = [name for _, name in committed[max(keep, 1):]]
    doomed += [name for started, name in unfinished if newest is not None and started < newest]
    removed = []
    for name in doomed:
        if name in (current, *protect):
            continue
        storage.rmtree(storage.join(runs_dir, name))
        removed.append(name)
    return sorted(removed)


def publish(root: str, run_id: str, keep_runs: int) -> list[str]:
    """Move ``current`` to a committed run unless a newer run is already current, then apply retention;
    returns the run ids pruned. Safe to repeat: a rerun of a run killed after its commit calls it again."""
    current = current_run(root)
    if current != run_id:
        created = read_manifest(storage.join(root, RUNS_DIR, run_id))["created_at"]
        try:
            newer = current is not None and read_manifest(storage.join(root, RUNS_DIR, current))["created_at"] > created
        except (FileNotFoundError, ValueError):  # the current run is gone or damaged: a committed run replaces it
            newer = False
        if not newer:
            set_current(root, run_id)
    return prune_runs(root, keep_runs, protect=(run_id,))
