"""Run directories: staged writes, manifests and the atomic commit.

A run writes into a hidden ``.<name>.staging-*`` folder beside its output, adds ``manifest.json`` last and renames
it into place, so an output is complete or absent; the next run of the output removes a killed run's leftovers.
On an object store the rename is a copy with ``manifest.json`` last: a commit cut short leaves an output without
a manifest, which is not a run (the staging folder is kept until the copy is done, so a resume loses nothing).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from verbatim_batch.core import storage
from verbatim_batch.core.faults import fault_point
from verbatim_batch.core.redact import redact
from verbatim_batch.core.runs.manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    plain_relpath,
    read_manifest,
    validate_manifest,
)

log = logging.getLogger(__name__)
WRITES_DIR = "_writes"  # one JSON record per completed write, in the staging folder until commit
CARRIED_PREFIX = "part-carried-"  # files a run copied from the run it builds on (``--previous``)
BINDING_FILE = "_run.json"  # the run id and the hash of the settings a staging folder was started with


class SettingsChangedError(ValueError):
    """A run id reused with other settings: resuming would mix rows of both."""


class OutputBusyError(FileExistsError):
    """Another run is writing the same output."""


def _read_json(path: str) -> dict[str, Any] | None:
    """A small JSON object file (a lock, a binding); None when unreadable or not an object."""
    try:
        value = json.loads(storage.read_text_bounded(path, 1 << 16))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _lock_path(output: str) -> str:
    parent, name = storage.split(output)
    return storage.join(parent, f".{name}.lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


LOCK_SETTLE_S = 0.5  # object stores: how long a writer waits before reading its lock back


def acquire_lock(output: str, run_id: str | None, info: Mapping[str, Any] | None = None) -> str:
    """Take the one-writer lock of ``output`` (``.<name>.lock`` beside it: pid, host, run id and ``info``, e.g. a
    night's base that retention keeps). A lock whose holder is gone (same host, no such process) is taken over;
    a live or other host's holder is ``OutputBusyError``. An object store has no atomic create: a writer writes
    its token, waits ``LOCK_SETTLE_S`` and reads it back, and the token found wins (two writers both pass only
    if one's check-then-write outlasts the settle time)."""
    path = _lock_path(output)
    me = {**(info or {}), "pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
          "since": round(time.time()), "token": uuid.uuid4().hex}
    for _ in range(3):
        if storage.is_remote(path):
            if not storage.exists(path):
                storage.write_text(path, json.dumps(me))
                time.sleep(LOCK_SETTLE_S)
                if (_read_json(path) or {}).get("token") == me["token"]:
                    return f"{path}#{me['token']}"
        else:
            storage.makedirs(os.path.dirname(path))
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as fh:
                    fh.write(json.dumps(me))
                return f"{path}#{me['token']}"
        held = _read_json(path) or {}
        if held.get("host") == me["host"] and isinstance(held.get("pid"), int) and not _alive(held["pid"]):
            log.warning("%s: taking over the lock of run %s (pid %s is gone)", output, held.get("run_id"),
                        held.get("pid"))
            storage.remove(path)
            continue
        raise OutputBusyError(
            f"{output} is being written by another run (run {held.get('run_id')}, pid {held.get('pid')} on "
            f"{held.get('host')}): wait for it, or choose another output; if no such run is going, delete {path}")
    raise OutputBusyError(f"{output}: could not take its lock {path}")


def lock_holder(output: str) -> dict[str, Any] | None:
    """The lock of ``output`` while its holder lives (or is on another host, which cannot be checked), else None."""
    held = _read_json(_lock_path(output))
    if held is None:
        return None
    if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int) and not _alive(held["pid"]):
        return None
    return held


def release_lock(lock: str) -> None:
    """Give back a lock ``acquire_lock`` returned (only if it is still ours)."""
    path, _, token = lock.rpartition("#")
    if (_read_json(path) or {}).get("token") == token:
        storage.remove(path)


def refuse_symlink(output: str) -> None:
    """Refuse an output that is a symbolic link: we would replace or delete what it points to."""
    if not storage.is_remote(output) and os.path.islink(storage.normalize(output).rstrip(os.sep)):
        raise OutputExistsError(f"{output} is a symbolic link (to {os.readlink(storage.normalize(output))}): "
                                "give the real path as the output")


def _bind(folder: str, run_id: str, settings_hash: str | None) -> None:
    """Refuse ``folder`` (a staging folder, a composite being resumed) started with other settings; bind a new one."""
    path = storage.join(folder, BINDING_FILE)
    if storage.exists(path):
        bound = _read_json(path) or {}
        if bound.get("settings_hash") != settings_hash:
            raise SettingsChangedError(
                f"run id {run_id!r} was started with other settings (settings {bound.get('settings_hash')}, now "
                f"{settings_hash}); resuming would mix rows of both: rerun with the same settings, or use a new "
                "--run-id")
        return
    storage.makedirs(folder)
    storage.write_text(path, json.dumps({"run_id": run_id, "settings_hash": settings_hash}, sort_keys=True))


class OutputExistsError(FileExistsError):
    pass


class RunDir:
    """A staging folder that becomes ``output`` on ``commit``.

    With a ``run_id`` the staging folder is named after it: ``resume=True`` keeps what a killed run of that id
    wrote, else it is emptied; other ids' staging folders are removed. A kept one is bound to its
    ``settings_hash``: resuming with other settings raises ``SettingsChangedError``."""

    def __init__(self, output: str, overwrite: bool = False, run_id: str | None = None, resume: bool = False,
                 settings_hash: str | None = None) -> None:
        self.output = storage.normalize(output)
        self.overwrite = overwrite
        refuse_symlink(self.output)
        parent, name = storage.split(self.output)
        if not storage.is_remote(parent) and os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write run folders in {parent}: permission denied (or a read-only file "
                                  "system)")
        self.lock = acquire_lock(self.output, run_id)  # before anything is removed or written
        try:
            self._prepare(parent, name, run_id, resume, settings_hash)
        except BaseException:
            release_lock(self.lock)
            raise

    def _prepare(self, parent: str, name: str, run_id: str | None, resume: bool, settings_hash: str | None) -> None:
        overwrite = self.overwrite
        staging_dirs = [d for d in storage.listdir(parent) if d.startswith(f".{name}.staging-")]
        if (storage.is_remote(self.output) and staging_dirs and storage.exists(self.output)
                and not storage.exists(storage.join(self.output, MANIFEST_FILE))):
            log.warning("%s has no manifest (a commit to an object store cut short): removing it", self.output)
            storage.rmtree(self.output)
        if storage.exists(self.output):
            if not overwrite:
                raise OutputExistsError(f"{self.output} exists; pass --overwrite to replace it")
            if not replaceable(self.output):
                raise OutputExistsError(f"{self.output} exists and is not a run folder written by verbatim-batch "
                                        "(no valid manifest.json): --overwrite only replaces runs; choose another "
                                        "--output")
        storage.makedirs(parent)
        token = safe_run_id(run_id) if run_id else uuid.uuid4().hex[:12]
        self.staging = storage.join(parent, f".{name}.staging-{token}")
        if resume and run_id and storage.isdir(self.staging):  # checked before anything is removed
            _bind(self.staging, run_id, settings_hash)
        for stale in staging_dirs:  # leftovers of killed runs of this output
            path = storage.join(parent, stale)
            if path != self.staging or not resume:
                storage.rmtree(path)
        _bind(self.staging, token, settings_hash)

    def commit(self, manifest: Mapping[str, Any],
               on_commit: Callable[[str, dict[str, Any]], None] | None = None) -> str:
        """Write the manifest (and what ``on_commit`` derives, e.g. the report), then move the staging folder in."""
        write_manifest(self.staging, manifest, on_commit)
        old = None
        if storage.exists(self.output):
            if not self.overwrite:
                raise OutputExistsError(f"{self.output} appeared while the run was going")
            if storage.is_remote(self.output):  # no rename to make it atomic: the old run goes first
                storage.rmtree(self.output)
            else:
                old = self.staging.replace(".staging-", ".old-")
                storage.move_dir(self.output, old)
        storage.move_dir(self.staging, self.output, skip=(WRITES_DIR, BINDING_FILE))  # a run is tables + manifest
        if old:
            storage.rmtree(old)
        return self.output

    def abort(self) -> None:
        storage.rmtree(self.staging)

    def release(self) -> None:
        release_lock(self.lock)


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def safe_run_id(run_id: str) -> str:
    """``run_id`` if it is a plain name usable in folder names everywhere; else ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        shown = run_id if len(str(run_id)) <= 60 else f"{str(run_id)[:60]}... ({len(str(run_id))} characters)"
        raise ValueError(f"run id {shown!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit")
    return run_id


# The deepest path a run writes inside its staging folder (a chain's stage staging folder, a table, a part file).
_DEEPEST_INSIDE = 400


def check_output_names(output: str, run_id: str | None = None) -> None:
    """Refuse, in one line and before anything is written, a local ``output`` whose name or path is too long once a
    run's staging folder and files are added (Errno 36 came mid-run and left a staging folder behind)."""
    if storage.is_remote(output):
        return
    path = os.path.abspath(output)
    parent, name = os.path.split(path)
    existing = parent
    while existing and not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        name_max = os.pathconf(existing or "/", "PC_NAME_MAX")
        path_max = os.pathconf(existing or "/", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    extra = len(".") + len(".staging-") + (len(run_id) if run_id else 12)  # .NAME.staging-RUN_ID beside it
    n_name = len(os.fsencode(name))
    if n_name + extra > name_max:
        raise ValueError(f"--output: the folder name is {n_name} bytes; at most {name_max - extra} fit (its "
                         f"staging folder adds {extra} bytes with this run id, to a name of at most {name_max} "
                         "bytes here)")
    for part in parent.split(os.sep):
        if len(os.fsencode(part)) > name_max:
            raise ValueError(f"--output: a folder name in its path is {len(os.fsencode(part))} bytes; at most "
                             f"{name_max} fit here")
    n_path = len(os.fsencode(path))
    if n_path + extra + _DEEPEST_INSIDE > path_max:
        raise ValueError(f"--output: the path is {n_path} bytes; at most {path_max - extra - _DEEPEST_INSIDE} "
                         f"fit (a run writes paths up to {extra + _DEEPEST_INSIDE} bytes longer, at most "
                         f"{path_max} here)")


def replaceable(path: str) -> bool:
    """Whether ``--overwrite`` may replace ``path``: an empty folder, or a run folder this tool wrote (a manifest
    with a run id, a command and a schema version). Anything else is a user's."""
    if not storage.isdir(path):
        return False
    names = storage.listdir(path)
    if not names:
        return True
    if MANIFEST_FILE not in names:
        return False
    try:
        manifest = json.loads(storage.read_text_bounded(storage.join(path, MANIFEST_FILE), MAX_MANIFEST_BYTES))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(manifest, dict) and all(isinstance(manifest.get(k), str)
                                              for k in ("run_id", "command", "schema_version"))


def record_write(staging: str, name: str, record: dict[str, Any], keys: pa.Array | None = None) -> None:
    """Mark one write as complete (its table files already in place). Its row keys are the record's ``keys``, or
    ``keys`` (a carried file's: up to millions) in a Parquet file beside it, written first."""
    folder = storage.join(staging, WRITES_DIR)
    storage.makedirs(folder)
    if keys is not None:
        record = record | {"keys_file": f"{name}.keys.parquet"}
        storage.write_parquet(pa.table({"key": keys.cast(pa.string())}), storage.join(folder, record["keys_file"]))
    storage.write_text(storage.join(folder, f"{name}.json"), json.dumps(record, sort_keys=True))


MAX_RECORD_BYTES = 256 << 20  # a write record lists a block's keys: megabytes at most
FILES_INDEX = "files.json"  # a committed run's files: table -> name -> rows, bytes, digest, counts
MAX_INDEX_BYTES = 256 << 20
_DIGEST = re.compile(r"blake2b:[0-9a-f]{32}")


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def _file_entry_ok(stats: Any) -> bool:
    """A file's stats as this tool records them: rows (and, when present, bytes) counts, a digest, counts."""
    digest = stats.get("digest") if isinstance(stats, dict) else None
    return (isinstance(stats, dict) and _count(stats.get("rows")) and _count(stats.get("bytes", 0))
            and (digest is None or (isinstance(digest, str) and _DIGEST.fullmatch(digest) is not None))
            and isinstance(stats.get("counts", {}), dict))


def _table_file(rel: Any) -> bool:
    """``table/name.parquet`` (a table may be nested: ``data/train/part-x.parquet``)."""
    return plain_relpath(rel) and "/" in rel and rel.endswith(".parquet")


def record_problem(record: Any) -> str | None:
    """Why a write record cannot be used (a forged, edited or damaged one), or None: every path it names is a
    table file inside the staging folder, every count a count, its keys strings or a keys file beside it."""
    if not isinstance(record, dict):
        return "not an object"
    stats = record.get("stats", {})
    if not isinstance(stats, dict) or not all(_table_file(p) and _file_entry_ok(st) and isinstance(st.get("table"), str)
                                              and p.rpartition("/")[0] == st["table"] for p, st in stats.items()):
        return "its files are not table files of the run, or their stats are not counts"
    files, rows = record.get("files", {}), record.get("rows", {})
    if not isinstance(files, dict) or not all(plain_relpath(t) and _table_file(p) for t, p in files.items()):
        return "its files are not table files of the run"
    if not isinstance(rows, dict) or not all(_count(v) for v in rows.values()):
        return "its rows are not counts"
    replaces = record.get("replaces", [])
    if not isinstance(replaces, list) or not all(_table_file(p) for p in replaces):
        return "what it replaces is not table files of the run"
    keys = record.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return "its keys are not strings"
    keys_file = record.get("keys_file")
    if keys_file is not None and not (plain_relpath(keys_file) and "/" not in keys_file
                                      and keys_file.endswith(".keys.parquet")):
        return "its keys file is not a file beside it"
    if not isinstance(record.get("counts", {}), dict):
        return "its counts are not a mapping"
    return None


def _write_records(staging: str) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, record)`` of every usable write record; an unusable one is logged and left out (never done)."""
    folder = storage.join(staging, WRITES_DIR)
    out = []
    for name in storage.listdir(folder):
        if not name.endswith(".json"):
            continue
        path = storage.join(folder, name)
        try:
            if not storage.regular_file(path):
                raise ValueError("not a regular file")
            record = json.loads(storage.read_text_bounded(path, MAX_RECORD_BYTES))
            problem = record_problem(record)
        except (OSError, ValueError, RecursionError) as exc:
            problem = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if problem:
            log.warning("%s: not a usable write record (%s): its write is done again", path, problem)
            continue
        out.append((name, record))
    return out


def read_writes(staging: str) -> list[dict[str, Any]]:
    """The usable write records of a staging folder (``record_problem``)."""
    return [record for _, record in _write_records(staging)]


def read_files_index(run_dir: str) -> tuple[dict[str, dict[str, dict[str, Any]]] | None, list[str]]:
    """``(files.json, problems)`` of a committed run (None without one). Entries this tool would not write are left
    out and listed in ``problems``; an unreadable file gives ``{}``: no file is known."""
    path = storage.join(storage.normalize(run_dir), FILES_INDEX)
    if not storage.exists(path):
        return None, []
    try:
        if not storage.regular_file(path):
            raise ValueError("not a regular file")
        index = json.loads(storage.read_text_bounded(path, MAX_INDEX_BYTES))
    except (OSError, ValueError, RecursionError) as exc:
        return {}, [f"{FILES_INDEX}: unreadable ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"]
    if not isinstance(index, dict):
        return {}, [f"{FILES_INDEX}: not an object"]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    problems: list[str] = []
    for table, files in index.items():
        if not plain_relpath(table) or not isinstance(files, dict):
            problems.append(f"{FILES_INDEX}: {str(table)[:80]!r} is not a table of the run")
            continue
        out[table] = {}
        for name, stats in files.items():
            if not (plain_relpath(name) and "/" not in name and name.endswith(".parquet")) \
                    or not _file_entry_ok(stats) or not isinstance(stats.get("digest"), str):
                problems.append(f"{FILES_INDEX}: {table}/{str(name)[:80]}: not a file entry this tool writes")
                continue
            out[table][name] = stats
    return out, problems


def file_stats(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{relpath: {"table", "rows", "bytes", "digest", "counts"}}`` of the files a write record made (from
    ``files`` and ``rows`` for a record older than per-file stats)."""
    if "stats" in record:
        return {p.replace("\\", "/"): s for p, s in record["stats"].items()}
    return {path.replace("\\", "/"): {"table": t, "rows": record.get("rows", {}).get(t, 0), "counts": {}}
            for t, path in record.get("files", {}).items()}


def live_files(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every recorded file of the staging folder less those a compaction replaced (it writes its merged file,
    then its record, then deletes: a kill leaves the old files or the merged one live, never both)."""
    files: dict[str, dict[str, Any]] = {}
    replaced: set[str] = set()
    for rec in records:
        files.update(file_stats(rec))
        replaced.update(rec.get("replaces", []))
    return {p: s for p, s in files.items() if p not in replaced}


def completed_keys(staging: str) -> pa.Array:
    """Distinct row keys of completed writes (an Arrow array: millions); files of writes never completed, or
    replaced, are removed, and so is a record whose keys file cannot be read (that write is done again)."""
    import pyarrow.compute as pc

    records, chunks = [], []
    for name, rec in _write_records(staging):
        if rec.get("keys_file"):
            try:
                keys = storage.read_parquet(storage.join(staging, WRITES_DIR, rec["keys_file"]))["key"]
                chunks.append(keys.combine_chunks().cast(pa.string()))
            except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
                log.warning("%s: the keys of write %s are unreadable (%s): it is done again", staging, name,
                            str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                storage.remove(storage.join(staging, WRITES_DIR, name))
                continue
        elif rec.get("keys"):
            chunks.append(pa.array(rec["keys"], pa.string()))
        records.append(rec)
    keep = set(live_files(records))
    for rel in storage.walk_files(staging):
        if rel.split("/", 1)[0] != WRITES_DIR and rel != BINDING_FILE and rel not in keep:  # a write cut short
            storage.remove(storage.join(staging, rel))
    return pc.unique(pa.chunked_array(chunks, pa.string())) if chunks else pa.array([], pa.string())


def record_keys(staging: str, records: list[dict[str, Any]]) -> pa.Array:
    """The distinct row keys of write records, as one Arrow array (never a Python object per key)."""
    import pyarrow.compute as pc

    chunks = [pa.array(rec["keys"], pa.string()) for rec in records if rec.get("keys")]
    chunks += [storage.read_parquet(storage.join(staging, WRITES_DIR, rec["keys_file"]))["key"].combine_chunks()
               for rec in records if rec.get("keys_file")]
    if not chunks:
        return pa.array([], pa.string())
    return pc.unique(pa.chunked_array(chunks, pa.string()))


def committed_run(output: str, run_id: str | None) -> dict[str, Any] | None:
    """The manifest of ``output`` when it is already committed by run ``run_id`` (so a rerun can skip it)."""
    if not run_id:
        return None
    try:
        manifest = read_manifest(output)
    except FileNotFoundError:
        return None
    if manifest.get("run_id") != run_id:
        return None
    parent, name = storage.split(output)  # an object-store move cut short after its copy leaves the source
    storage.rmtree(storage.join(parent, f".{name}.staging-{safe_run_id(run_id)}"))
    return manifest


def claim_composite(output: str, run_id: str, settings_hash: str, overwrite: bool = False) -> str:
    """Take ``output`` for a composite run (sub-runs committed in place, as they record each other's paths; the
    manifest last) and return it: absent or empty, bound to ``run_id`` and ``settings_hash``; started by this id,
    resumed (or ``SettingsChangedError``); started by another and never committed, removed and taken; committed,
    replaced only with ``overwrite`` when this tool wrote it; a user's folder is refused."""
    out = storage.normalize(output)
    refuse_symlink(out)
    if storage.exists(out) and not storage.isdir(out):
        raise OutputExistsError(f"{out} exists and is not a folder: choose another output")
    names = storage.listdir(out) if storage.isdir(out) else []
    if MANIFEST_FILE in names:
        if not overwrite:
            raise OutputExistsError(f"{out} exists; pass --overwrite to replace it")
        if not replaceable(out):
            raise OutputExistsError(f"{out} exists and is not a run folder written by verbatim-batch (no valid "
                                    "manifest.json): --overwrite only replaces runs; choose another output")
        storage.rmtree(out)
    elif BINDING_FILE in names:
        bound = _read_json(storage.join(out, BINDING_FILE)) or {}
        if bound.get("run_id") != run_id:
            log.warning("%s: removing the unfinished run %s to start %s", out, bound.get("run_id"), run_id)
            storage.rmtree(out)
    elif names:
        raise OutputExistsError(f"{out} exists and is not a run folder written by verbatim-batch: choose another "
                                "output")
    _bind(out, run_id, settings_hash)
    return out


@contextmanager
def staged(output: str, overwrite: bool = False, run_id: str | None = None, resume: bool = False,
           settings_hash: str | None = None) -> Iterator[RunDir]:
    """``with staged(out) as run: ... run.commit(manifest)``; without a run id a failed run's staging folder goes."""
    run = RunDir(output, overwrite=overwrite, run_id=run_id, resume=resume, settings_hash=settings_hash)
    try:
        yield run
    except BaseException:
        if run_id is None:
            run.abort()
        raise
    finally:
        run.release()


def write_manifest(run_dir: str, manifest: Mapping[str, Any],
                   on_commit: Callable[[str, dict[str, Any]], None] | None = None) -> None:
    """Validate and write ``manifest.json`` (credentials redacted), then ``on_commit``, whose failure is only logged."""
    manifest = redact(dict(manifest))
    validate_manifest(manifest)
    fault_point("commit")
    storage.write_text(storage.join(run_dir, MANIFEST_FILE), json.dumps(manifest, indent=2, sort_keys=True))
    if on_commit is not None:
        try:
            on_commit(run_dir, dict(manifest))
        except Exception as exc:  # noqa: BLE001
            log.warning("could not derive files from the manifest of %s: %s", run_dir, exc)
