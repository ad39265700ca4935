"""Run directories: staged writes, manifests and the atomic commit.

A run writes into a hidden staging folder next to its output folder. Only when
every table is written does it add ``manifest.json`` and rename the staging
folder to the output path, so an output folder is either complete, with a
manifest, or absent. A killed run leaves only a hidden ``.<name>.staging-*``
folder, which the next run of the same output removes.

Outputs may be local paths or object-store URIs (``storage``). On an object store
the rename is a copy with ``manifest.json`` last, so a commit cut short leaves an
output without a manifest: it is not a run, and the next run of that output
removes it (the staging folder is kept until the copy is done, so a resumed run
loses nothing).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import platform
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from . import __version__, storage
from .faults import fault_point
from .tables import MANIFEST, SCHEMA_VERSION, config_hash, stable_hash

log = logging.getLogger(__name__)
MANIFEST_FILE = "manifest.json"
WRITES_DIR = "_writes"  # one JSON record per completed write, in the staging folder until commit


class OutputExistsError(FileExistsError):
    pass


class RunDir:
    """A staging folder that becomes ``output`` on ``commit``.

    With a ``run_id`` the staging folder is named after it, so a rerun with the same
    id finds the work a killed run left there: ``resume=True`` keeps it (stages
    whose sink records completed writes, see ``pipeline.StageTableSink``), otherwise
    it is emptied. Staging folders of other ids are removed either way.
    """

    def __init__(self, output: str, overwrite: bool = False, run_id: str | None = None, resume: bool = False) -> None:
        self.output = storage.normalize(output)
        self.overwrite = overwrite
        parent, name = storage.split(self.output)
        staging_dirs = [d for d in storage.listdir(parent) if d.startswith(f".{name}.staging-")]
        if (storage.is_remote(self.output) and staging_dirs and storage.exists(self.output)
                and not storage.exists(storage.join(self.output, MANIFEST_FILE))):
            log.warning("%s has no manifest (a commit to an object store cut short): removing it", self.output)
            storage.rmtree(self.output)
        if storage.exists(self.output) and not overwrite:
            raise OutputExistsError(f"{self.output} exists; pass --overwrite to replace it")
        storage.makedirs(parent)
        token = safe_run_id(run_id) if run_id else uuid.uuid4().hex[:12]
        self.staging = storage.join(parent, f".{name}.staging-{token}")
        for stale in staging_dirs:  # leftovers of killed runs of this output
            path = storage.join(parent, stale)
            if path != self.staging or not resume:
                storage.rmtree(path)
        self.resumed = storage.isdir(self.staging)
        storage.makedirs(self.staging)

    def commit(self, manifest: Mapping[str, Any]) -> str:
        """Write the manifest, then move the staging folder into place."""
        validate_manifest(manifest)
        fault_point("commit")
        storage.write_text(storage.join(self.staging, MANIFEST_FILE), json.dumps(manifest, indent=2, sort_keys=True))
        try:  # the report is derived from the run; it never stops a commit
            from .report import write_report

            write_report(self.staging, dict(manifest))
        except Exception as exc:  # noqa: BLE001
            log.warning("could not write the run report for %s: %s", self.output, exc)
        old = None
        if storage.exists(self.output):
            if not self.overwrite:
                raise OutputExistsError(f"{self.output} appeared while the run was going")
            if storage.is_remote(self.output):  # no rename to make it atomic: the old run goes first
                storage.rmtree(self.output)
            else:
                old = self.staging.replace(".staging-", ".old-")
                storage.move_dir(self.output, old)
        storage.move_dir(self.staging, self.output, skip=(WRITES_DIR,))  # a run is tables + manifest
        if old:
            storage.rmtree(old)
        return self.output

    def abort(self) -> None:
        storage.rmtree(self.staging)


def safe_run_id(run_id: str) -> str:
    if not run_id or any(c in run_id for c in "/\\\0?#%") or run_id.startswith("."):
        raise ValueError(f"run id {run_id!r} must be a plain name (no slashes, ?, # or %, not starting with a dot)")
    return run_id


def record_write(staging: str, name: str, record: dict[str, Any]) -> None:
    """Mark one write as complete (its table files must already be in place)."""
    folder = storage.join(staging, WRITES_DIR)
    storage.makedirs(folder)
    storage.write_text(storage.join(folder, f"{name}.json"), json.dumps(record, sort_keys=True))


def read_writes(staging: str) -> list[dict[str, Any]]:
    folder = storage.join(staging, WRITES_DIR)
    return [json.loads(storage.read_text(storage.join(folder, name)))
            for name in storage.listdir(folder) if name.endswith(".json")]


def completed_keys(staging: str) -> set[str]:
    """Row keys covered by completed writes; files of writes that never completed are removed."""
    records = read_writes(staging)
    keep = {p.replace("\\", "/") for rec in records for p in rec["files"].values()}
    for rel in storage.walk_files(staging):
        if rel.split("/", 1)[0] != WRITES_DIR and rel not in keep:  # a write killed part-way, or a temp file
            storage.remove(storage.join(staging, rel))
    return {k for rec in records for k in rec.get("keys", [])}


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
    try:
        return json.loads(storage.read_text(storage.join(storage.normalize(run_dir), MANIFEST_FILE)))
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{run_dir} has no {MANIFEST_FILE}: not a committed run") from None


def load_manifests(run_dirs: list[str]) -> pa.Table:
    """Manifests of several runs as one table with the MANIFEST schema."""
    return pa.Table.from_pylist([_as_arrow_row(read_manifest(d)) for d in run_dirs], schema=MANIFEST)


def read_table(run_dir: str, table: str, columns: list[str] | None = None) -> pa.Table:
    """One table of a committed run, e.g. ``read_table(out, "chunks")``."""
    read_manifest(run_dir)
    return storage.read_parquet(storage.join(storage.normalize(run_dir), table), columns=columns)


# --- a root of runs with a `current` pointer (nightly) --------------------------------------

RUNS_DIR = "runs"
CURRENT_FILE = "CURRENT"  # the current run's id, for object stores and scripts
CURRENT_LINK = "current"  # symlink to runs/<id>: pd.read_parquet("ROOT/current/spans/spans")


def current_run(root: str) -> str | None:
    """The id of the run ``root``'s ``current`` pointer names (None before the first commit)."""
    try:
        return storage.read_text(storage.join(storage.normalize(root), CURRENT_FILE)).strip() or None
    except FileNotFoundError:
        return None


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
    stage = stage or {"spans": "spans", "pairs": "spans", "rejects": "spans", "papers": "chunks",
                      "chunks": "chunks", "quarantine": "chunks", "embeddings": "embeddings",
                      "retrieval": "retrieval"}.get(table, table)
    return read_table(storage.join(storage.normalize(root), RUNS_DIR, run_id, stage), table, columns)


def _started(run_dir: str) -> float:
    """When an unfinished run started: its plan file's time (object stores keep no folder times)."""
    for loc in (storage.join(run_dir, "plan.json"), run_dir):
        if storage.exists(loc) and (t := storage.mtime(loc)) is not None:
            return t
    return 0.0


def prune_runs(root: str, keep: int, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete committed runs beyond the ``keep`` newest and unfinished runs older than the newest commit.

    The current run and ``protect`` are never deleted. Returns the ids removed.
    """
    runs_dir = storage.join(storage.normalize(root), RUNS_DIR)
    current = current_run(root)
    committed, unfinished = [], []
    for name in storage.listdir(runs_dir):
        path = storage.join(runs_dir, name)
        if name.startswith(".") or not storage.isdir(path):
            continue
        try:
            committed.append((read_manifest(path)["created_at"], name))
        except FileNotFoundError:
            unfinished.append((_started(path), name))
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
