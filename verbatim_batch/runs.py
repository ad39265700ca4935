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
from .tables import MANIFEST, SCHEMA_VERSION, config_hash, stable_hash

log = logging.getLogger(__name__)
MANIFEST_FILE = "manifest.json"


class OutputExistsError(FileExistsError):
    pass


def _local(path: str) -> str:
    if "://" in path and not path.startswith("file://"):
        raise NotImplementedError(
            f"{path}: run outputs must be local or mounted paths for now (remote commit lands later)"
        )
    return os.path.abspath(os.path.expanduser(path.removeprefix("file://")))


class RunDir:
    """A staging folder that becomes ``output`` on ``commit``."""

    def __init__(self, output: str, overwrite: bool = False) -> None:
        self.output = _local(output)
        self.overwrite = overwrite
        if os.path.exists(self.output) and not overwrite:
            raise OutputExistsError(f"{self.output} exists; pass --overwrite to replace it")
        parent, name = os.path.split(self.output)
        os.makedirs(parent, exist_ok=True)
        for stale in os.listdir(parent):  # leftovers of killed runs of this output
            if stale.startswith(f".{name}.staging-"):
                shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
        self.staging = os.path.join(parent, f".{name}.staging-{uuid.uuid4().hex[:12]}")
        os.makedirs(self.staging)

    def commit(self, manifest: Mapping[str, Any]) -> str:
        """Write the manifest, then move the staging folder into place."""
        validate_manifest(manifest)
        tmp = os.path.join(self.staging, MANIFEST_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(self.staging, MANIFEST_FILE))
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


@contextmanager
def staged(output: str, overwrite: bool = False) -> Iterator[RunDir]:
    """``with staged(out) as run: ... run.commit(manifest)``; the staging folder goes if anything fails."""
    run = RunDir(output, overwrite=overwrite)
    try:
        yield run
    except BaseException:
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
