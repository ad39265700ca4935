"""A root of runs with a ``current`` pointer (nightly): ``ROOT/runs/<id>/``, ``CURRENT``, ``current``."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import uuid
from dataclasses import dataclass

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.core.runs.folder import BINDING_FILE, _read_json, lock_holder, replaceable, safe_run_id
from verbatim_batch.core.runs.manifest import MANIFEST_FILE, holding, read_manifest, read_table

log = logging.getLogger(__name__)

RUNS_DIR = "runs"
CURRENT_FILE = "CURRENT"  # the current run's id, for object stores and scripts
CURRENT_LINK = "current"  # symlink to runs/<id>: resolve it once (os.path.realpath) before reading through it


def current_run(root: str) -> str | None:
    """The run id ``root``'s ``CURRENT`` names; None before the first commit and for one that is no plain run id
    (a damaged or edited pointer never leads outside ``runs/``)."""
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


# what a folder a command is given is (``what_folder``): the one resolver every command's folders go through
MISSING, RUN, CHAIN, NIGHTLY_ROOT, STAGES, OTHER = "missing", "run", "chain", "nightly root", "stages", "other"
CORPUS_HELP = "your papers (a folder of .md or .txt files, or a Parquet/JSONL file or folder)"


@dataclass(frozen=True)
class Folder:
    """What a folder is: ``kind`` (``RUN``: a stage's committed run; ``CHAIN``: a chain's or a night's;
    ``NIGHTLY_ROOT``; ``STAGES``: committed stage runs without a manifest of their own, the demo's output;
    ``OTHER``: a corpus, say), its manifest's ``command``, and for a night's folder its nightly ``root``."""

    path: str
    kind: str
    command: str | None = None
    root: str | None = None

    def describe(self) -> str:
        """The folder in a user's words, for a one-line refusal."""
        if self.kind == RUN:
            return f"a run folder of stage {self.command}"
        if self.kind == CHAIN:
            return (f"a committed night of the nightly root {self.root}" if self.root else
                    f"a chain folder (a committed `{self.command}` run)")
        if self.kind == NIGHTLY_ROOT:
            return "a nightly root"
        if self.kind == STAGES:
            return "a folder of committed stage runs (a demo's output)"
        return "not found" if self.kind == MISSING else "not a run folder (no manifest.json)"


def _night_root(path: str) -> str | None:
    """The nightly root ``path`` lies in as ``ROOT/runs``, ``ROOT/runs/<id>`` or a night's stage, if it does."""
    up = path if storage.is_remote(path) else os.path.realpath(path)
    for _ in range(3):
        if storage.is_remote(up) and "/" not in up.split("://", 1)[1].strip("/"):
            return None  # a bucket's root: no folder above it
        parent, name = storage.split(up)
        if name == RUNS_DIR and storage.exists(storage.join(parent, CURRENT_FILE)):
            return parent
        up = parent
    return None


def what_folder(path: str) -> Folder:
    """What ``path`` is, from what it holds, read before any work so that a folder of the wrong kind is refused."""
    path = storage.normalize(path)
    if not storage.exists(path):
        return Folder(path, MISSING)
    if storage.exists(storage.join(path, MANIFEST_FILE)):
        try:
            manifest = read_manifest(path)
        except (OSError, ValueError):
            return Folder(path, OTHER)
        chain = isinstance(manifest.get("stages"), dict) and bool(manifest["stages"])
        return Folder(path, CHAIN if chain else RUN, manifest["command"], _night_root(path) if chain else None)
    if storage.exists(storage.join(path, CURRENT_FILE)):
        return Folder(path, NIGHTLY_ROOT)
    if storage.isdir(path) and any(not name.startswith(".") and storage.exists(storage.join(path, name, MANIFEST_FILE))
                                   for name in storage.listdir(path)[:64]):
        return Folder(path, STAGES)
    return Folder(path, OTHER, root=_night_root(path))


def run_of(path: str) -> str:
    """``path`` itself, or a nightly root's current run folder."""
    path = storage.normalize(path)
    if what_folder(path).kind == NIGHTLY_ROOT and (run_id := current_run(path)):
        return storage.join(path, RUNS_DIR, run_id)
    return path


def committed_folder(path: str, option: str) -> str:
    """The committed run a command reads from ``path`` (a run or chain folder, a nightly root's current night);
    anything else refused with one line naming what ``option`` takes."""
    folder = what_folder(path)
    root = _night_root(folder.path) if folder.kind in (STAGES, OTHER) else None
    if folder.kind in (RUN, CHAIN) or (folder.kind == STAGES and root is None):
        return folder.path
    if folder.kind == NIGHTLY_ROOT:
        if (run_id := current_run(folder.path)) is None:
            raise FileNotFoundError(f"{option}: {path} is a nightly root with no committed night yet")
        return storage.join(folder.path, RUNS_DIR, run_id)
    if folder.kind == MISSING:
        raise FileNotFoundError(f"{option}: {path} not found")
    if storage.exists(storage.join(folder.path, MANIFEST_FILE)):
        read_manifest(folder.path)  # a manifest not of ours: its own line says what is wrong with it
    if root is not None:
        raise ValueError(f"{option}: {path} is inside the nightly root {root}, not a run: give {root} (its current "
                         f"night) or one night's folder {storage.join(root, RUNS_DIR, '<run id>')}")
    raise ValueError(f"{path} has no manifest.json: not a committed run ({option} takes a run folder, a chain "
                     "folder or a nightly root)")


def expect_tables(run_dir: str, option: str, tables: tuple[str, ...]) -> str:
    """The run folder holding ``tables`` in what ``run_dir`` names (``committed_folder``), else one line naming
    what ``option`` expects and what it holds: an input is what it holds, not which command made it."""
    found_in = committed_folder(run_dir, option)
    if what_folder(found_in).kind == STAGES:  # the demo's output: its last stage run holding them
        subs = [storage.join(found_in, n) for n in sorted(storage.listdir(found_in)) if not n.startswith(".")]
        runs = [(str(read_manifest(s).get("created_at") or ""), s) for s in subs
                if what_folder(s).kind == RUN and holding(s, tables) is not None]
        if runs:
            return max(runs)[1]
        raise ValueError(f"{option} expects a committed run holding {' and '.join(tables)}; {run_dir} holds "
                         "stage runs, none of them holding it")
    manifest = read_manifest(found_in)
    found = holding(found_in, tables, manifest)
    if found is None:
        held = manifest.get("tables") if isinstance(manifest.get("tables"), dict) else {}
        raise ValueError(f"{option} expects a committed run holding {' and '.join(tables)}; {run_dir} is a "
                         f"{manifest['command']} run holding {', '.join(sorted(held)) or 'no tables'}")
    return found


def expect_corpus(path: str, option: str = "--input") -> None:
    """Refuse a run, chain folder or nightly root given as a corpus (its Parquet would be read as papers)."""
    folder = what_folder(path)
    if folder.kind in (RUN, CHAIN, NIGHTLY_ROOT, STAGES):
        raise ValueError(f"{option} {path} is {folder.describe()}, not a corpus: give {option} {CORPUS_HELP}")


def expect_nightly_root(path: str) -> None:
    """Refuse a run or chain folder, or one inside a nightly root, given as ``--root`` (a night would start from
    scratch inside it), in one line naming the right folder."""
    folder = what_folder(path)
    root = folder.root or (_night_root(folder.path) if folder.kind in (RUN, STAGES) else None)
    if root is not None:
        what = folder.describe() if folder.kind == CHAIN else f"inside the nightly root {root}"
        raise ValueError(f"--root {path} is {what}: give --root {root}")
    if folder.kind in (RUN, CHAIN, STAGES):
        raise ValueError(f"--root {path} is {folder.describe()}, not a nightly root: give --root a folder of its "
                         "own (new, or one an earlier nightly made: it holds runs/ and CURRENT)")


def set_current(root: str, run_id: str) -> None:
    """Point ``CURRENT`` (and, locally, the ``current`` symlink) at a committed run, each replaced atomically."""
    root = storage.normalize(root)
    target = storage.join(RUNS_DIR, run_id)
    read_manifest(storage.join(root, target))  # only committed runs become current
    if not storage.is_remote(root):
        tmp_link = os.path.join(root, f".{CURRENT_LINK}.tmp-{uuid.uuid4().hex[:8]}")
        os.symlink(target, tmp_link)
        os.replace(tmp_link, os.path.join(root, CURRENT_LINK))
    storage.write_text(storage.join(root, CURRENT_FILE), run_id + "\n")


def current_table(root: str, table: str, stage: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """A table of the current run, e.g. ``current_table(root, "spans")`` (also where symlinks do not work)."""
    run_id = current_run(root)
    if run_id is None:
        raise FileNotFoundError(f"{root} has no current run yet")
    run_dir = storage.join(storage.normalize(root), RUNS_DIR, run_id)
    if stage is not None:
        return read_table(storage.join(run_dir, stage), table, columns)
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
        return storage.regular_file(where) and (_read_json(where) or {}).get("run_id") == name
    except OSError:
        return False


def prune_runs(root: str, keep: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete committed runs beyond the ``keep`` newest and unfinished runs older than the newest commit; returns
    the ids removed. Only runs this tool wrote (a valid manifest, or our binding file with its own id) are
    candidates; never the current run, ``protect``, a run whose lock a live night holds, or that night's base."""
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
    """Move ``current`` to a run unless a newer one is current, then prune (safe to repeat); the ids pruned."""
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
