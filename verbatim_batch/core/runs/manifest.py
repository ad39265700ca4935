"""Manifests: what a run did, written last into its folder (``manifest.json``), and reading runs back."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from verbatim_batch.core import __version__, storage
from verbatim_batch.core.redact import redact
from verbatim_batch.core.tables import MANIFEST, SCHEMA_VERSION, config_hash, stable_hash

MANIFEST_FILE = "manifest.json"


def new_run_id(command: str, config: Mapping[str, Any]) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{command}-{now}-{stable_hash(now, json.dumps(config, sort_keys=True), uuid.uuid4().hex, size=4)}"


def _ray_version() -> str:
    """Ray's version, read from its installed metadata: a run that needed no Ray does not import it for this."""
    import sys
    from importlib import metadata

    ray = sys.modules.get("ray")
    if ray is not None:
        return ray.__version__
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    return {
        "verbatim_batch": __version__,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "ray": _ray_version(),
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
    """A run's manifest, credentials in its config's and inputs' URLs redacted (it is shared with the run)."""
    config = redact(dict(config))
    return {
        "run_id": run_id,
        "command": command,
        "schema_version": SCHEMA_VERSION,
        "status": "committed",
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": json.dumps(config, sort_keys=True),
        "config_hash": config_hash(config),
        "inputs": redact(list(inputs)),
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


MAX_MANIFEST_BYTES = 64 << 20  # a manifest is kilobytes; a larger file is not one this tool wrote
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._=-]{0,199}")


def plain_relpath(name: Any) -> bool:
    """Whether ``name`` is a path inside a run folder as this tool writes them (``data/train``,
    ``papers/part-x.parquet``): plain names joined by ``/``; never absolute, ``..``, hidden or a backslash."""
    return (isinstance(name, str) and 0 < len(name) <= 1000
            and all(_PART.fullmatch(p) and p not in (".", "..") for p in name.split("/")))


def manifest_problems(manifest: Mapping[str, Any]) -> list[str]:
    """What makes a (forged or damaged) manifest unusable for reading its run; empty for one this tool wrote. A
    composite's stage names are checked where they are read (``verify.verify_composite``)."""
    problems: list[str] = []
    tables = manifest.get("tables", {})
    if not isinstance(tables, dict):
        problems.append("tables is not a mapping")
    else:
        for name, entry in tables.items():
            if not plain_relpath(name):
                problems.append(f"table {str(name)[:80]!r} is not a table name (it would lead outside the run)")
            elif not isinstance(entry, dict) or not all(
                    type(entry.get(k)) is int and 0 <= entry[k] < 1 << 62 for k in ("rows", "files")):
                problems.append(f"table {name!r}: rows and files are not counts")
    if "config" in manifest:
        try:
            if not isinstance(json.loads(manifest["config"]), dict):
                raise ValueError
        except (TypeError, ValueError, RecursionError):
            problems.append("config is not a JSON object")
    if "created_at" in manifest:
        try:
            _dt.datetime.fromisoformat(manifest["created_at"])
        except (TypeError, ValueError):
            problems.append("created_at is not a time")
    for key in ("counts", "timings_s"):
        if not isinstance(manifest.get(key, {}), dict):
            problems.append(f"{key} is not a mapping")
    return problems


def read_manifest(run_dir: str, strict: bool = True) -> dict[str, Any]:
    """The manifest of a committed run; FileNotFoundError when there is none, ValueError when the file is not a run
    manifest or, when ``strict``, has ``manifest_problems`` (``verify`` reads with ``strict=False``)."""
    where = storage.join(storage.normalize(run_dir), MANIFEST_FILE)
    try:
        storage.refuse_special(where)
        text = storage.read_text_bounded(where, MAX_MANIFEST_BYTES)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise FileNotFoundError(f"{run_dir} has no {MANIFEST_FILE}: not a committed run") from None
    except storage.TooLargeError:
        raise ValueError(f"{run_dir}/{MANIFEST_FILE} is over {MAX_MANIFEST_BYTES >> 20} MiB: not a run manifest "
                         "this tool wrote") from None
    except UnicodeDecodeError:
        raise ValueError(f"{run_dir}/{MANIFEST_FILE} is not UTF-8: not a run this tool wrote") from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError(f"{run_dir}/{MANIFEST_FILE} is not valid JSON: not a run this tool wrote") from None
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), str) for k in ("run_id", "command")):
        raise ValueError(f"{run_dir}/{MANIFEST_FILE} is not a verbatim-batch run manifest (no run_id/command)")
    if strict and (problems := manifest_problems(manifest)):
        raise ValueError(f"{run_dir}/{MANIFEST_FILE} is damaged or forged: {problems[0]}"
                         + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""))
    return manifest


def holding(run_dir: str, tables: tuple[str, ...], manifest: dict[str, Any] | None = None) -> str | None:
    """The folder of a committed run holding every table of ``tables``: ``run_dir`` itself, else the last committed
    stage folder of a chain's folder that does (``reranked`` over ``retrieval``, as the chain wires them); or None."""
    manifest = manifest if manifest is not None else read_manifest(run_dir)
    stages = manifest.get("stages") if isinstance(manifest.get("stages"), dict) else {}
    held = manifest.get("tables") if isinstance(manifest.get("tables"), dict) else {}
    # a chain's own list names its stages' tables; a run that does not list one (hand-made, or older) holds it as
    # files: a folder of Parquet, or one Parquet file (an index's ids)
    if not stages and all(t in held or storage.isdir(storage.join(run_dir, t))
                          or storage.isfile(storage.join(run_dir, t + ".parquet")) for t in tables):
        return run_dir
    found = []
    for stage in stages:
        if not isinstance(stage, str) or not stage or "/" in stage or stage.startswith("."):
            continue  # a stage is a folder name of the run's own
        sub = storage.join(run_dir, stage)
        try:
            sub_manifest = read_manifest(sub)
        except (OSError, ValueError):
            continue
        sub_tables = sub_manifest.get("tables")
        if isinstance(sub_tables, dict) and all(t in sub_tables for t in tables):
            found.append((str(sub_manifest.get("created_at") or ""), stage, sub))
    return max(found)[2] if found else None  # the last committed: a chain commits its stages in order


def load_manifests(run_dirs: list[str]) -> pa.Table:
    """Manifests of several runs as one table with the MANIFEST schema."""
    return pa.Table.from_pylist([_as_arrow_row(read_manifest(d)) for d in run_dirs], schema=MANIFEST)


def read_table(run_dir: str, table: str, columns: list[str] | None = None) -> pa.Table:
    """One table of a committed run, e.g. ``read_table(out, "chunks")``."""
    read_manifest(run_dir)
    return storage.read_parquet(storage.join(storage.normalize(run_dir), table), columns=columns)


def read_readable(table_dir: str, columns: list[str] | None = None) -> tuple[pa.Table | None, list[str]]:
    """``(rows, unreadable)`` of a committed table: the rows of its readable files (None when none), and the names
    of the others (a link, pipe or device is never opened). For readers of a previous run, which redo the rest."""
    parts, bad = [], []
    for name in storage.listdir(table_dir):
        if not name.endswith(".parquet"):
            continue
        path = storage.join(table_dir, name)
        try:
            if not storage.regular_file(path):
                raise ValueError("not a regular file")
            parts.append(storage.read_parquet(path, columns=columns))
        except (OSError, ValueError, KeyError, pa.ArrowException):
            bad.append(name)
    if not parts:
        return None, bad
    return pa.concat_tables(parts, promote_options="default"), bad


def manifest_config(run_dir: str) -> dict[str, Any]:
    """The ``config`` a committed run recorded (a ValueError, one line, for a manifest that records none)."""
    manifest = read_manifest(run_dir)
    if "config" not in manifest:
        raise ValueError(f"{run_dir}: its manifest.json records no config: not a run this tool wrote")
    return json.loads(manifest["config"])


def committed_table_dir(run_dir: str, table: str) -> str:
    """``RUN_DIR/<table>`` of a committed run (raises if the run has no manifest or no such table)."""
    read_manifest(run_dir)
    path = storage.join(storage.normalize(run_dir), table)
    if not storage.isdir(path):
        raise FileNotFoundError(f"{run_dir} has no {table}/ table")
    return path


def jsonable(value):
    """Tuples -> lists, recursively (configs as their JSON form)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
