"""Metadata tables (``--metadata``): a Parquet, JSON-lines or CSV table joined to papers by paper id.

``load_metadata`` gives each id's ``(title, authors, year, venue, url, language)``; ``metadata_stats`` counts what
it left out (rows without a usable id, ids with several rows, fields of the wrong type or over their size), which
the chunk stage records in its manifest. The file itself is read once per version (size and modification time).
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections import Counter
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from verbatim_batch.corpus.readers import ID_COLUMNS, _is_local, _lines, _one_line, _pick, paper_id_of, resolve

META_FIELDS = ("title", "authors", "year", "venue", "url", "language")
_VENUE_ALIASES = ("venue", "booktitle", "journal", "event")
# The longest value kept per field (characters); a longer one is ignored (null) and counted, never cut: a 5 MB
# "title" is not a title, and every chunk's context, the papers table and each report would carry it.
MAX_FIELD_CHARS = {"title": 2_000, "venue": 500, "url": 2_048, "language": 64}
MAX_AUTHORS, MAX_AUTHOR_CHARS = 1_000, 300
DUPLICATES_NAMED = 20  # ids with several metadata rows named in the manifest (all are counted)


def load_metadata(uri: str) -> dict[str, tuple]:
    """Metadata rows keyed by paper id: ``(title, authors, year, venue, url, language)``.

    A file that is no table with an id column is one ``ValueError`` line (the job stops before it starts); inside
    one, a bad value never stops a job: a field of the wrong type or over its size is null for that row, a row
    without a usable id is skipped, and of an id's rows the first wins (``metadata_stats`` counts each)."""
    return dict(_load_metadata_cached(uri, _stamp(uri))[0])


def metadata_stats(uri: str) -> dict[str, Any]:
    """What ``load_metadata`` left out of ``uri``: ``{"rows", "rows_skipped", "duplicate_ids", "duplicate_rows",
    "duplicates" (the first ``DUPLICATES_NAMED``), "fields_wrong_type", "fields_too_long"}``."""
    return dict(_load_metadata_cached(uri, _stamp(uri))[1])


def _stamp(uri: str) -> tuple:
    """Size and modification time of a file (empty when unknown), so a long-lived process rereads an edited file."""
    try:
        fs, path = resolve(uri)
        info = fs.get_file_info(path)
        return (info.size, info.mtime_ns)
    except (OSError, ValueError):
        return ()


@lru_cache(maxsize=4)
def _load_metadata_cached(uri: str, stamp: tuple) -> tuple[tuple[tuple[str, tuple], ...], tuple]:
    fs, path = resolve(uri)
    lower = path.lower()
    if not lower.endswith((".parquet", ".jsonl", ".json", ".ndjson", ".csv")):
        raise ValueError(f"metadata must be .parquet, .jsonl or .csv: {uri}")
    if _is_local(fs) and os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"metadata {uri}: not a regular file")
    try:
        names, n, column = _read_metadata_table(fs, path, lower)
    except FileNotFoundError:
        raise FileNotFoundError(f"metadata not found: {uri}") from None
    except (OSError, ValueError, RecursionError, pa.ArrowException) as exc:
        raise ValueError(f"metadata {uri}: cannot read it as a table ({_one_line(exc, 200)})") from None
    id_col = _pick(names, (*ID_COLUMNS, "id"), "id", f"metadata {uri}")
    venue_col = next((c for c in _VENUE_ALIASES if c in names), None)

    cols = {name: column(name) for name in META_FIELDS}
    venues = column(venue_col)
    stats: Counter = Counter()
    seen: dict[str, int] = {}
    out = []
    for k, value in enumerate(column(id_col)):
        pid, bad = paper_id_of(value)
        if pid is None or bad or not pid.strip():
            stats["rows_skipped"] += 1
            continue
        pid = pid.strip()
        if pid in seen:  # the first row of an id wins
            seen[pid] += 1
            continue
        seen[pid] = 1
        out.append((pid, (_text(cols["title"][k], "title", stats), _authors(cols["authors"][k], stats),
                           _year(cols["year"][k], stats), _text(venues[k], "venue", stats),
                           _text(cols["url"][k], "url", stats), _text(cols["language"][k], "language", stats))))
    repeated = [pid for pid, c in seen.items() if c > 1]
    summary = {"rows": n, "rows_skipped": stats["rows_skipped"], "duplicate_ids": len(repeated),
               "duplicate_rows": sum(seen[p] - 1 for p in repeated), "duplicates": repeated[:DUPLICATES_NAMED],
               "fields_wrong_type": stats["wrong_type"], "fields_too_long": stats["too_long"]}
    return tuple(out), tuple(summary.items())


def _read_metadata_table(fs: pafs.FileSystem, path: str, lower: str):
    """``(column names, number of rows, column(name) -> list of values)``. JSON lines are parsed one by one
    (fields may change type from row to row; a line that is not a JSON object is skipped)."""
    if lower.endswith((".parquet", ".csv")):
        if lower.endswith(".parquet"):
            table = pq.read_table(path, filesystem=fs)
        else:
            import pyarrow.csv as pacsv

            with fs.open_input_stream(path) as stream:
                table = pacsv.read_csv(stream)
        n = table.num_rows

        def column(name: str | None) -> list:
            if name is None or name not in table.column_names:
                return [None] * n
            try:
                return table.column(name).to_pylist()
            except (pa.ArrowException, ValueError, OverflowError):  # a type Python cannot hold: ignore it
                return [None] * n

        return table.column_names, n, column
    rows = []
    with fs.open_input_stream(path) as stream:
        for lineno, line in enumerate(_lines(stream), start=1):
            if lineno == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                rows.append(obj)
    return list(dict.fromkeys(k for r in rows for k in r)), len(rows), lambda name: [r.get(name) for r in rows]


def _text(value, field: str, stats: Counter) -> str | None:
    """A text field: a string within ``MAX_FIELD_CHARS[field]``; anything else (a number, ``NaN``, a list, an
    object) is ignored and counted, as is a string over the size."""
    if value is None:
        return None
    if not isinstance(value, str):
        stats["wrong_type"] += 1
        return None
    value = value.strip()
    if len(value) > MAX_FIELD_CHARS[field]:
        stats["too_long"] += 1
        return None
    return value or None


def _authors(value, stats: Counter | None = None) -> list[str] | None:
    """Authors from ``"A; B"``, ``"A and B"``, a list of names or of ``{"name": ...}``; None otherwise (counted
    as a wrong type), and None for more than ``MAX_AUTHORS`` names or a name over ``MAX_AUTHOR_CHARS``."""
    stats = Counter() if stats is None else stats
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > MAX_AUTHORS * (MAX_AUTHOR_CHARS + 5):
            stats["too_long"] += 1
            return None
        parts = re.split(r"\s*;\s*|\s+and\s+", value)
    elif isinstance(value, (list, tuple)):
        parts = [a.get("name") if isinstance(a, dict) else a for a in value]
        parts = [p for p in parts if isinstance(p, str)]
    else:  # a number, a bool, an object: not a list of authors
        stats["wrong_type"] += 1
        return None
    names = [p.strip() for p in parts if p and p.strip()]
    if len(names) > MAX_AUTHORS or any(len(p) > MAX_AUTHOR_CHARS for p in names):
        stats["too_long"] += 1
        return None
    return names


def _year(value, stats: Counter | None = None) -> int | None:
    """A year from an integer, a whole float or a text starting with one; anything else ignored (counted)."""
    if value is None:
        return None
    year = None
    if not isinstance(value, (bool, list, tuple, dict)):
        try:
            year = int(str(value).strip()[:4])
        except ValueError:
            year = None
    if year is None or not -9999 <= year <= 9999:
        if stats is not None:
            stats["wrong_type"] += 1
        return None
    return year
