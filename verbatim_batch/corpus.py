"""Corpus readers: md folders, Parquet/JSONL tables and metadata, as raw records.

Readers never decode or judge text: they hand over the stored bytes with an id
and a source locator, so the ingest stage can quarantine bad papers with a
reason instead of a reader crashing the job. Paths may be local or any URI that
``pyarrow.fs`` understands (``s3://``, ``gs://``).

Formats:
  * ``md``: a folder of ``*.md`` files (searched recursively); ``paper_id`` is the stem.
  * ``parquet`` / ``jsonl``: rows with ``anthology_id`` (or ``paper_id``) and
    ``markdown``, the layout of the acl-anthology-md full-text release.
"""

from __future__ import annotations

import html
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import storage
from .tables import RAW_RECORDS, QuarantineReason

FORMATS = ("md", "parquet", "jsonl")
ID_COLUMNS = ("anthology_id", "paper_id")
TEXT_COLUMNS = ("markdown", "text")
_EXTENSIONS = {"md": (".md",), "parquet": (".parquet",), "jsonl": (".jsonl", ".json", ".ndjson")}
BLOCK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    path: str  # filesystem path (no scheme), as pyarrow.fs wants it
    size: int


resolve = storage.resolve  # (file system, path) for a local path or a URI


def detect_format(uri: str) -> str:
    """``md``, ``parquet`` or ``jsonl`` from a file's extension or a folder's contents."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"input not found: {uri}")
    names = [path] if info.type == pafs.FileType.File else [
        f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if f.type == pafs.FileType.File
    ]
    for fmt in FORMATS:
        if any(n.lower().endswith(_EXTENSIONS[fmt]) for n in names):
            return fmt
    raise ValueError(f"no .md, .parquet or .jsonl files under {uri}")


def list_sources(uri: str, fmt: str) -> tuple[pafs.FileSystem, list[SourceFile]]:
    """Input files of one format, sorted by path (the order that decides duplicates)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; expected one of {FORMATS}")
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"input not found: {uri}")
    if info.type == pafs.FileType.File:
        infos = [info]
    else:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = [
        SourceFile(f.path, f.size or 0)
        for f in infos
        if f.type == pafs.FileType.File
        and f.path.lower().endswith(_EXTENSIONS[fmt])
        and not os.path.basename(f.path).startswith((".", "_"))
    ]
    if not files:
        raise ValueError(f"no {fmt} files under {uri}")
    return fs, sorted(files, key=lambda f: f.path)


def source_order(source: str) -> tuple[str, int]:
    """Sort key of a source locator: path, then row/line number as an integer."""
    path, _, frag = source.partition("#")
    return path, int(frag.split("=", 1)[1]) if "=" in frag else -1


def _records(ids: list, sources: list, raws: list, sizes: list, errors: list) -> pa.Table:
    return pa.Table.from_pydict(
        {"paper_id": ids, "source": sources, "raw": raws, "n_bytes": sizes, "error": errors},
        schema=RAW_RECORDS,
    )


def read_md_files(
    fs: pafs.FileSystem, files: list[SourceFile], max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for md files; files larger than ``max_bytes`` are not read at all."""
    batch: tuple[list, list, list, list, list] = ([], [], [], [], [])
    held = 0
    for f in files:
        raw, error = None, None
        if f.size > max_bytes:
            error = f"{QuarantineReason.TOO_LARGE}: {f.size} bytes > max_paper_bytes {max_bytes}"
        elif not ids_only:
            try:
                with fs.open_input_stream(f.path) as stream:
                    raw = stream.readall()
            except OSError as exc:
                error = f"{QuarantineReason.READ_ERROR}: {exc}"
        for col, value in zip(batch, (md_paper_id(f.path), f.path, raw, f.size, error), strict=True):
            col.append(value)
        held += len(raw or b"")
        if held >= BLOCK_BYTES:
            yield _records(*batch)
            batch, held = ([], [], [], [], []), 0
    if batch[0]:
        yield _records(*batch)


def md_paper_id(path: str) -> str:
    name = os.path.basename(path)
    return name[: -len(".md")] if name.lower().endswith(".md") else name


def _pick(names: Iterable[str], wanted: tuple[str, ...], what: str, where: str) -> str:
    names = list(names)
    for w in wanted:
        if w in names:
            return w
    raise ValueError(f"{where}: no {what} column (expected one of {wanted}, found {names})")


def read_parquet_file(
    fs: pafs.FileSystem, f: SourceFile, max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for one Parquet file, read in row batches; text kept as bytes."""
    try:
        pf = pq.ParquetFile(f.path, filesystem=fs)
        names = pf.schema_arrow.names
        id_col = _pick(names, ID_COLUMNS, "id", f.path)
        text_col = id_col if ids_only else _pick(names, TEXT_COLUMNS, "text", f.path)
        row = 0
        for rb in pf.iter_batches(batch_size=1024, columns=list(dict.fromkeys([id_col, text_col]))):
            ids = rb.column(id_col).cast(pa.string()).to_pylist()
            n = len(ids)
            sources = [f"{f.path}#row={row + k}" for k in range(n)]
            row += n
            if ids_only:
                yield _records(ids, sources, [None] * n, [None] * n, [None] * n)
                continue
            col = rb.column(text_col)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                col = col.cast(pa.large_binary())  # no UTF-8 assumptions here
            raws = col.to_pylist()
            sizes = [None if r is None else len(r) for r in raws]
            errors = [None] * n
            for k, size in enumerate(sizes):
                if size is not None and size > max_bytes:
                    raws[k] = None
                    errors[k] = f"{QuarantineReason.TOO_LARGE}: {size} bytes > max_paper_bytes {max_bytes}"
            yield _records(ids, sources, raws, sizes, errors)
    except (OSError, ValueError, pa.ArrowException) as exc:
        yield _records([None], [f.path], [None], [f.size], [f"{QuarantineReason.READ_ERROR}: {exc}"])


def read_jsonl_file(
    fs: pafs.FileSystem, f: SourceFile, max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for one JSONL file; a malformed line becomes an error record."""
    batch: tuple[list, list, list, list, list] = ([], [], [], [], [])
    held = 0
    try:
        with fs.open_input_stream(f.path) as stream:
            buffered = _lines(stream)
            for lineno, line in enumerate(buffered, start=1):
                if not line.strip():
                    continue
                pid, raw, size, error = _parse_jsonl_line(line, max_bytes, ids_only)
                for col, value in zip(batch, (pid, f"{f.path}#line={lineno}", raw, size, error), strict=True):
                    col.append(value)
                held += len(raw or b"")
                if held >= BLOCK_BYTES:
                    yield _records(*batch)
                    batch, held = ([], [], [], [], []), 0
    except OSError as exc:
        batch[0].append(None)
        batch[1].append(f.path)
        batch[2].append(None)
        batch[3].append(f.size)
        batch[4].append(f"{QuarantineReason.READ_ERROR}: {exc}")
    if batch[0]:
        yield _records(*batch)


def _lines(stream, chunk: int = 16 * 1024 * 1024) -> Iterator[bytes]:
    rest = b""
    while True:
        data = stream.read(chunk)
        if not data:
            break
        parts = (rest + data).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def _parse_jsonl_line(line: bytes, max_bytes: int, ids_only: bool) -> tuple:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, None, len(line), f"{QuarantineReason.INVALID_RECORD}: line is not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return None, None, len(line), f"{QuarantineReason.INVALID_RECORD}: line is not a JSON object"
    pid = next((obj[c] for c in ID_COLUMNS if c in obj), None)
    pid = None if pid is None else str(pid)
    if ids_only:
        return pid, None, None, None
    text = next((obj[c] for c in TEXT_COLUMNS if c in obj), None)
    if text is not None and not isinstance(text, str):
        return pid, None, len(line), f"{QuarantineReason.INVALID_RECORD}: text field is {type(text).__name__}"
    # JSON strings may carry lone surrogates (\ud800); keep them detectable downstream.
    raw = None if text is None else text.encode("utf-8", "surrogatepass")
    if raw is not None and len(raw) > max_bytes:
        return pid, None, len(raw), f"{QuarantineReason.TOO_LARGE}: {len(raw)} bytes > max_paper_bytes {max_bytes}"
    return pid, raw, None if raw is None else len(raw), None


READERS = {"md": read_md_files, "parquet": read_parquet_file, "jsonl": read_jsonl_file}


# --- decoding, validation, normalisation ---------------------------------------------

NORMALIZATIONS = ("crlf", "html_unescape", "collapse_whitespace", "nfc")
_CTRL_RE = re.compile("[\x01-\x08\x0e-\x1f\x7f]")
_CTRL_BYTES = bytes([*range(1, 9), *range(14, 32), 127])
_NOT_CTRL_BYTES = bytes(b for b in range(256) if b not in _CTRL_BYTES)
_HSPACE_RE = re.compile(r"[ \t]+")
_TRAILING_RE = re.compile(r"[ \t]+\n")
_BLANKS_RE = re.compile(r"\n{3,}")


def decode_paper(raw: bytes | None, max_control_ratio: float = 0.001) -> tuple[str | None, str | None]:
    """``(text, None)`` for a usable paper, else ``(None, "reason: detail")``."""
    if raw is None:
        return None, f"{QuarantineReason.MISSING_TEXT}: no text"
    if not raw or raw.isspace():
        return None, f"{QuarantineReason.EMPTY}: {len(raw)} bytes, no visible text"
    nul = raw.find(b"\x00")
    if nul >= 0:
        n_nul = raw.count(b"\x00")
        return None, f"{QuarantineReason.NUL_BYTES}: {n_nul} NUL bytes, first at byte {nul}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = QuarantineReason.INVALID_UTF8
        if _looks_binary(raw):
            kind = QuarantineReason.BINARY
        return None, f"{kind}: {exc.reason} at byte {exc.start}"
    n_ctrl = len(raw.translate(None, _NOT_CTRL_BYTES))  # C speed; UTF-8 never uses these bytes otherwise
    if n_ctrl > max(2, max_control_ratio * len(text)):
        first = _CTRL_RE.search(text).start()
        return None, f"{QuarantineReason.BINARY}: {n_ctrl} control characters, first at char {first}"
    return text, None


def _looks_binary(raw: bytes, sample: int = 4096) -> bool:
    head = raw[:sample]
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in head)
    return printable < 0.7 * len(head)


def normalize_text(text: str, ops: tuple[str, ...] | list[str]) -> str:
    """Apply opt-in normalisations in a fixed order. They change offsets: the result is
    the text every offset refers to, and the op names are recorded on every row."""
    unknown = set(ops) - set(NORMALIZATIONS)
    if unknown:
        raise ValueError(f"unknown normalization(s) {sorted(unknown)}; choose from {NORMALIZATIONS}")
    if "crlf" in ops:
        text = text.replace("\r\n", "\n")
    if "html_unescape" in ops:
        text = html.unescape(text)
    if "nfc" in ops:
        text = unicodedata.normalize("NFC", text)
    if "collapse_whitespace" in ops:
        text = _HSPACE_RE.sub(" ", text)
        text = _TRAILING_RE.sub("\n", text)
        text = _BLANKS_RE.sub("\n\n", text)
    return text


def normalization_label(ops: tuple[str, ...] | list[str]) -> str:
    return ",".join(op for op in NORMALIZATIONS if op in ops) or "none"


# --- metadata -------------------------------------------------------------------------

META_FIELDS = ("title", "authors", "year", "venue", "url", "language")
_VENUE_ALIASES = ("venue", "booktitle", "journal", "event")


def load_metadata(uri: str) -> dict[str, tuple]:
    """Metadata rows keyed by paper id: ``(title, authors, year, venue, url, language)``."""
    return dict(_load_metadata_cached(uri))


@lru_cache(maxsize=4)
def _load_metadata_cached(uri: str) -> tuple[tuple[str, tuple], ...]:
    fs, path = resolve(uri)
    lower = path.lower()
    if lower.endswith(".parquet"):
        table = pq.read_table(path, filesystem=fs)
    elif lower.endswith((".jsonl", ".json", ".ndjson")):
        import pyarrow.json as pajson

        with fs.open_input_stream(path) as stream:
            table = pajson.read_json(stream)
    elif lower.endswith(".csv"):
        import pyarrow.csv as pacsv

        with fs.open_input_stream(path) as stream:
            table = pacsv.read_csv(stream)
    else:
        raise ValueError(f"metadata must be .parquet, .jsonl or .csv: {uri}")
    id_col = _pick(table.column_names, (*ID_COLUMNS, "id"), "id", uri)
    venue_col = next((c for c in _VENUE_ALIASES if c in table.column_names), None)
    n = table.num_rows
    cols = {
        name: table.column(name).to_pylist() if name in table.column_names else [None] * n
        for name in META_FIELDS
    }
    venues = table.column(venue_col).to_pylist() if venue_col else [None] * n
    out = []
    for k, pid in enumerate(table.column(id_col).to_pylist()):
        if pid is None:
            continue
        out.append(
            (
                str(pid),
                (
                    _str_or_none(cols["title"][k]),
                    _authors(cols["authors"][k]),
                    _year(cols["year"][k]),
                    _str_or_none(venues[k]),
                    _str_or_none(cols["url"][k]),
                    _str_or_none(cols["language"][k]),
                ),
            )
        )
    return tuple(out)


def _str_or_none(value) -> str | None:
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def _authors(value) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        parts = re.split(r"\s*;\s*|\s+and\s+", value)
    else:
        parts = [a.get("name", "") if isinstance(a, dict) else str(a) for a in value]
    return [p.strip() for p in parts if p and p.strip()]


def _year(value) -> int | None:
    try:
        return int(str(value).strip()[:4]) if value is not None else None
    except ValueError:
        return None
