"""Run directories: staged writes, manifests and the atomic commit.

A run writes into a hidden staging folder next to its output folder. Only when
every table is written does it add ``manifest.json`` and rename the staging
folder to the output path, so an output folder is either complete, with a
manifest, or absent. A killed run leaves only a hidden ``.<name>.staging-*``
folder, which the next run of the same output removes.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .faults import fault_point
from .tables import MANIFEST, SCHEMA_VERSION, config_hash, stable_hash

log = logging.getLogger(__name__)
MANIFEST_FILE = "manifest.json"
WRITES_DIR = "_writes"  # one JSON record per completed write, in the staging folder until commit


class OutputExistsError(FileExistsError):
    pass


def _local(path: str) -> str:
    if "://" in path and not path.startswith("file://"):
        raise NotImplementedError(
            f"{path}: run outputs must be local or mounted paths for now (remote commit lands later)"
        )
    return os.path.abspath(os.path.expanduser(path.removeprefix("file://")))


class RunDir:
    """A staging folder that becomes ``output`` on ``commit``.

    With a ``run_id`` the staging folder is named after it, so a rerun with the same
    id finds the work a killed run left there: ``resume=True`` keeps it (stages
    whose sink records completed writes, see ``pipeline.StageTableSink``), otherwise
    it is emptied. Staging folders of other ids are removed either way.
    """

    def __init__(self, output: str, overwrite: bool = False, run_id: str | None = None, resume: bool = False) -> None:
        self.output = _local(output)
        self.overwrite = overwrite
        if os.path.exists(self.output) and not overwrite:
            raise OutputExistsError(f"{self.output} exists; pass --overwrite to replace it")
        parent, name = os.path.split(self.output)
        os.makedirs(parent, exist_ok=True)
        token = _safe_token(run_id) if run_id else uuid.uuid4().hex[:12]
        self.staging = os.path.join(parent, f".{name}.staging-{token}")
        for stale in os.listdir(parent):  # leftovers of killed runs of this output
            path = os.path.join(parent, stale)
            if stale.startswith(f".{name}.staging-") and (path != self.staging or not resume):
                shutil.rmtree(path, ignore_errors=True)
        self.resumed = os.path.isdir(self.staging)
        os.makedirs(self.staging, exist_ok=True)

    def commit(self, manifest: Mapping[str, Any]) -> str:
        """Write the manifest, then move the staging folder into place."""
        validate_manifest(manifest)
        fault_point("commit")
        shutil.rmtree(os.path.join(self.staging, WRITES_DIR), ignore_errors=True)  # a run is tables + manifest
        write_atomic(os.path.join(self.staging, MANIFEST_FILE), json.dumps(manifest, indent=2, sort_keys=True))
        try:  # the report is derived from the run; it never stops a commit
            from .report import write_report

            write_report(self.staging, dict(manifest))
        except Exception as exc:  # noqa: BLE001
            log.warning("could not write the run report for %s: %s", self.output, exc)
        old = None
        if os.path.exists(self.output):
            if not self.overwrite:
                raise OutputExistsError(f"{self.output} appeared while the run was going")
            old = self.staging.replace(".staging-", ".old-")
            os.rename(self.output, old)
        os.rename(self.staging, self.output)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return self.output

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _safe_token(run_id: str) -> str:
    if not run_id or any(c in run_id for c in "/\\\0") or run_id.startswith("."):
        raise ValueError(f"run id {run_id!r} must be a plain name (no slashes, not starting with a dot)")
    return run_id


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def record_write(staging: str, name: str, record: dict[str, Any]) -> None:
    """Mark one write as complete (its table files must already be in place)."""
    folder = os.path.join(staging, WRITES_DIR)
    os.makedirs(folder, exist_ok=True)
    write_atomic(os.path.join(folder, f"{name}.json"), json.dumps(record, sort_keys=True))


def read_writes(staging: str) -> list[dict[str, Any]]:
    folder = os.path.join(staging, WRITES_DIR)
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                out.append(json.load(fh))
    return out


def completed_keys(staging: str) -> set[str]:
    """Row keys covered by completed writes; files of writes that never completed are removed."""
    records = read_writes(staging)
    keep = {os.path.normpath(p) for rec in records for p in rec["files"].values()}
    for root, _, files in os.walk(staging):
        if os.path.basename(root) == WRITES_DIR:
            continue
        for f in files:
            rel = os.path.normpath(os.path.relpath(os.path.join(root, f), staging))
            if rel not in keep:  # a write killed part-way, or a temp file
                os.remove(os.path.join(staging, rel))
    return {k for rec in records for k in rec.get("keys", [])}


def committed_run(output: str, run_id: str | None) -> dict[str, Any] | None:
    """The manifest of ``output`` when it is already committed by run ``run_id`` (so a rerun can skip it)."""
    if not run_id:
        return None
    try:
        manifest = read_manifest(output)
    except FileNotFoundError:
        return None
    return manifest if manifest.get("run_id") == run_id else None


@contextmanager
def staged(output: str, overwrite: bool = False, run_id: str | None = None, resume: bool = False) -> Iterator[RunDir]:
    """``with staged(out) as run: ... run.commit(manifest)``.

    Without a run id the staging folder goes if anything fails. With one it stays, so a
    rerun with the same id can pick up the completed writes (a failed run is resumable).
    """
    run = RunDir(output, overwrite=overwrite, run_id=run_id, resume=resume)
    try:
        yield run
    except BaseException:
        if run_id is None:
            run.abort()
        raise


def new_run_id(command: str, config: Mapping[str, Any]) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{command}-{now}-{stable_hash(now, json.dumps(config, sort_keys=True), uuid.uuid4().hex, size=4)}"


def versions() -> dict[str, str]:
    import ray

    return {
        "verbatim_batch": __version__,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def build_manifest(
    *,
    run_id: str,
    command: str,
    config: Mapping[str, Any],
    inputs: list[str],
    tables: Mapping[str, Mapping[str, int]],
    counts: Mapping[str, int],
    timings_s: Mapping[str, float],
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "command": command,
        "schema_version": SCHEMA_VERSION,
        "status": "committed",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": json.dumps(config, sort_keys=True),
        "config_hash": config_hash(config),
        "inputs": list(inputs),
        "tables": {k: {"rows": int(v["rows"]), "files": int(v["files"])} for k, v in tables.items()},
        "counts": {k: int(v) for k, v in counts.items()},
        "timings_s": {k: round(float(v), 3) for k, v in timings_s.items()},
        "versions": versions(),
    }


def _as_arrow_row(manifest: Mapping[str, Any]) -> dict[str, Any]:
    row = dict(manifest)
    for key in ("tables", "counts", "timings_s", "versions"):
        row[key] = list(row[key].items())
    return row


def validate_manifest(manifest: Mapping[str, Any]) -> None:
    """Raise if the manifest does not fit ``tables.MANIFEST``."""
    missing = set(MANIFEST.names) - set(manifest)
    if missing:
        raise ValueError(f"manifest lacks {sorted(missing)}")
    pa.Table.from_pylist([_as_arrow_row(manifest)], schema=MANIFEST)


def read_manifest(run_dir: str) -> dict[str, Any]:
    path = os.path.join(_local(run_dir), MANIFEST_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} has no {MANIFEST_FILE}: not a committed run")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_manifests(run_dirs: list[str]) -> pa.Table:
    """Manifests of several runs as one table with the MANIFEST schema."""
    return pa.Table.from_pylist([_as_arrow_row(read_manifest(d)) for d in run_dirs], schema=MANIFEST)


def read_table(run_dir: str, table: str, columns: list[str] | None = None) -> pa.Table:
    """One table of a committed run, e.g. ``read_table(out, "chunks")``."""
    read_manifest(run_dir)
    return pq.read_table(os.path.join(_local(run_dir), table), columns=columns)


# --- a root of runs with a `current` pointer (nightly) --------------------------------------

RUNS_DIR = "runs"
CURRENT_FILE = "CURRENT"  # the current run's id, for object stores and scripts
CURRENT_LINK = "current"  # symlink to runs/<id>: pd.read_parquet("ROOT/current/spans/spans")


def current_run(root: str) -> str | None:
    """The id of the run ``root``'s ``current`` pointer names (None before the first commit)."""
    path = os.path.join(_local(root), CURRENT_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip() or None


def set_current(root: str, run_id: str) -> None:
    """Point ``current`` at a committed run: the id file and the symlink are each replaced atomically."""
    root = _local(root)
    target = os.path.join(RUNS_DIR, run_id)
    read_manifest(os.path.join(root, target))  # only committed runs become current
    tmp_link = os.path.join(root, f".{CURRENT_LINK}.tmp-{uuid.uuid4().hex[:8]}")
    os.symlink(target, tmp_link)
    os.replace(tmp_link, os.path.join(root, CURRENT_LINK))
    write_atomic(os.path.join(root, CURRENT_FILE), run_id + "\n")


def current_table(root: str, table: str, stage: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """A table of the current run, e.g. ``current_table(root, "spans")`` (works where symlinks do not)."""
    run_id = current_run(root)
    if run_id is None:
        raise FileNotFoundError(f"{root} has no current run yet")
    stage = stage or {"spans": "spans", "pairs": "spans", "rejects": "spans", "papers": "chunks",
                      "chunks": "chunks", "quarantine": "chunks", "embeddings": "embeddings",
                      "retrieval": "retrieval"}.get(table, table)
    return read_table(os.path.join(_local(root), RUNS_DIR, run_id, stage), table, columns)


def prune_runs(root: str, keep: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete committed runs beyond the ``keep`` newest and unfinished runs older than the newest commit.

    The current run and ``protect`` are never deleted. Returns the ids removed.
    """
    root = _local(root)
    runs_dir = os.path.join(root, RUNS_DIR)
    if not os.path.isdir(runs_dir):
        return []
    current = current_run(root)
    committed, unfinished = [], []
    for name in os.listdir(runs_dir):
        path = os.path.join(runs_dir, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        try:
            committed.append((read_manifest(path)["created_at"], name))
        except FileNotFoundError:
            unfinished.append((os.path.getmtime(path), name))
    committed.sort(reverse=True)
    newest = _dt.datetime.fromisoformat(committed[0][0]).timestamp() if committed else None
    doomed = [name for _, name in committed[max(keep, 1):]]
    doomed += [name for mtime, name in unfinished if newest is not None and mtime < newest]
    removed = []
    for name in doomed:
        if name in (current, *protect):
            continue
        shutil.rmtree(os.path.join(runs_dir, name), ignore_errors=True)
        removed.append(name)
    return sorted(removed)
