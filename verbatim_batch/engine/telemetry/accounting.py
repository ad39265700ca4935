"""A run's manifest -> its stage's samples: the one place manifest counts become metrics.

The block ``stage_metrics`` returns is written into the manifest (``manifest["metrics"]``) and is what the
session exports, so what Prometheus shows for a stage equals what its manifest says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.engine.telemetry.declare import OUTCOMES

# The runner's standard counts of a keyed stage, by outcome (``engine.runner.STANDARD_COUNTS``).
STANDARD = {"in": "rows_in", "written": "rows_new", "carried": "rows_carried", "resumed": "rows_resumed"}


def row_outcomes(counts: Mapping[str, int], declared: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Rows by outcome: the runner's standard counts and those a stage declares (``Stage.outcomes``); a stage without
    the standard counts declares ``in`` and ``written`` itself (the index: its chunks)."""
    out = {o: 0 for o in OUTCOMES}
    for outcome, key in STANDARD.items():
        out[outcome] = int(counts.get(key, 0) or 0)
    for outcome, keys in declared.items():
        if outcome not in out:
            raise ValueError(f"unknown row outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
        out[outcome] = sum(_count(counts, k) for k in keys)
    return out


def _count(counts: Mapping[str, int], key: str) -> int:
    """A count, or with ``prefix.*`` the sum of every count under the prefix (``dropped.*``)."""
    if key.endswith(".*"):
        return sum(int(v or 0) for k, v in counts.items() if k.startswith(key[:-1]))
    return int(counts.get(key, 0) or 0)


def stage_metrics(counts: Mapping[str, int], timings: Mapping[str, float], declared: Mapping[str, Iterable[str]],
                  read_bytes: int, written_bytes: int) -> dict[str, Any]:
    """The metrics block of a stage run's manifest."""
    return {
        "rows": row_outcomes(counts, declared),
        "duration_seconds": round(float(timings.get("total", 0.0) or 0.0), 3),
        # the work done: tokens of the rows this run put through the model, not of the rows it carried
        "model_tokens": max(0, int(counts.get("tokens", 0) or 0) - int(counts.get("carried.tokens", 0) or 0)),
        "model_batches": int(counts.get("batches", 0) or 0),
        "read_bytes": int(read_bytes),
        "written_bytes": int(written_bytes),
    }


def run_bytes(path: str) -> int | None:
    """Bytes of a committed run's tables (what its checked ``files.json`` validly lists) or of a file; None otherwise.
    Never raises: a figure is an account, never a reason to fail a run."""
    from verbatim_batch.core.runs.folder import read_files_index

    try:
        files, _ = read_files_index(path)
        if files is not None:
            return sum(int(f.get("bytes", 0) or 0) for table in files.values() for f in table.values())
        if storage.isfile(path):
            return _size(path)
    except Exception:  # noqa: BLE001 - any input is hostile; the count is left out
        return None
    return None


def _size(path: str) -> int:
    fs, p = storage.resolve(path)
    return int(fs.get_file_info(p).size or 0)


def read_bytes(counts: Mapping[str, int], inputs: Iterable[str]) -> int:
    """What a stage read: the papers' bytes (chunk), else its input runs' tables and input files."""
    if counts.get("papers_bytes"):
        return int(counts["papers_bytes"])
    return sum(b for path in inputs if path and (b := run_bytes(path)) is not None)


def written_bytes(staging: str) -> int:
    """Bytes of every file in a staging folder about to commit (its manifest and report come after)."""
    try:
        return sum(size for _, size in storage._files(staging))
    except OSError:
        return 0
