"""Corpus readers: md folders and Parquet/JSONL tables, as raw records (metadata tables: ``metadata``).

Readers never decode or judge text: they hand over the stored bytes with an id and a source locator, so the
ingest stage quarantines a bad paper with a reason instead of a reader crashing the job. Formats: ``md``, a folder
of ``*.md``, ``*.markdown`` or ``*.txt`` files searched recursively, ``paper_id`` the stem (other files are named
by ``skipped_files``); ``parquet`` / ``jsonl``, rows with ``anthology_id`` (or ``paper_id``) and ``markdown``.
"""

from __future__ import annotations

import codecs
import errno
import html
import json
import os
import re
import stat
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from verbatim_batch.core import storage
from verbatim_batch.core.tables import RAW_RECORDS, QuarantineReason

FORMATS = ("md", "parquet", "jsonl")
ID_COLUMNS = ("anthology_id", "paper_id")
TEXT_COLUMNS = ("markdown", "text")
_EXTENSIONS = {"md": (".md", ".markdown", ".txt"), "parquet": (".parquet",),
               "jsonl": (".jsonl", ".json", ".ndjson")}
BLOCK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    path: str  # filesystem path (no scheme), as pyarrow.fs wants it
    size: int
    # "reason: detail" for an input path that must not be opened (a FIFO, a device, a dangling symlink,
    # a symlinked folder already read); readers turn it into one error record, never read it
    problem: str | None = None
    mtime: float | None = None  # seconds since the epoch, when the listing knows it


resolve = storage.resolve  # (file system, path) for a local path or a URI


def detect_format(uri: str) -> str:
    """``md``, ``parquet`` or ``jsonl`` from a file's extension or a folder's contents."""
    fs, path = resolve(uri)
    names = [f.path for f in (_walk_local(path, None) if _is_local(fs) else _remote_files(fs, path, uri))]
    for fmt in FORMATS:
        if any(n.lower().endswith(_EXTENSIONS[fmt]) for n in names):
            return fmt
    raise ValueError(f"no .md, .txt, .parquet or .jsonl files under {uri}")


def list_sources(uri: str, fmt: str) -> tuple[pafs.FileSystem, list[SourceFile]]:
    """Input paths of one format (hidden ones too), sorted by path (the order that decides duplicates); one that
    must not be opened, or a symlinked folder not followed, comes with its ``problem`` (a quarantine row)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; expected one of {FORMATS}")
    fs, path = resolve(uri)
    if _is_local(fs):
        files = _walk_local(path, _EXTENSIONS[fmt])
    else:
        files = [SourceFile(f.path, f.size or 0, mtime=f.mtime.timestamp() if f.mtime else None)
                 for f in _remote_files(fs, path, uri) if f.path.lower().endswith(_EXTENSIONS[fmt])]
    if not files:
        raise ValueError(f"no {fmt} files under {uri}")
    return fs, sorted(files, key=lambda f: f.path)


def _remote_files(fs: pafs.FileSystem, path: str, uri: str) -> list[pafs.FileInfo]:
    """The files at a URI: itself, or every file under it; FileNotFoundError when nothing is there."""
    info = storage.file_info(uri)  # an object store that cannot be reached: one line
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"input not found: {uri}")
    infos = [info] if info.type == pafs.FileType.File else fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return [f for f in infos if f.type == pafs.FileType.File]


def _is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes come back from the OS as lone surrogates
        return False
    return True


def _walk_local(root: str, extensions: tuple[str, ...] | None) -> list[SourceFile]:
    """Input paths under a local ``root`` (a file or a folder), by ``stat`` alone: nothing is opened.

    A wanted path that is no regular file gets ``not_a_regular_file``, a dangling symlink ``broken_symlink``, an
    unlistable folder ``read_error``. A symlinked folder is followed once per real folder when it leads outside
    ``root``; one leading to a folder already read gets ``symlink_loop`` (an ancestor) or ``duplicate_path``, so
    a loop never repeats the walk. ``extensions=None`` lists every regular file (format detection)."""
    root = os.path.abspath(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        if os.path.islink(root):
            return [SourceFile(root, 0, f"{QuarantineReason.BROKEN_SYMLINK}: links to missing "
                                        f"{os.readlink(root)}")]
        raise FileNotFoundError(f"input not found: {root}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return [SourceFile(root, 0, f"{QuarantineReason.SYMLINK_LOOP}: {exc.strerror}")]
        raise
    if not stat.S_ISDIR(st.st_mode):
        if stat.S_ISREG(st.st_mode):
            return [SourceFile(root, st.st_size, mtime=st.st_mtime)]
        return [SourceFile(root, 0, f"{QuarantineReason.NOT_A_REGULAR_FILE}: {_kind(st.st_mode)}, not read")]
    real_root = os.path.realpath(root)
    walked = {real_root}
    out: list[SourceFile] = []

    def wanted(name: str) -> bool:
        return extensions is None or name.lower().endswith(extensions)

    def walk(folder: str, real: str) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            if folder != root:
                out.append(SourceFile(folder, 0, f"{QuarantineReason.READ_ERROR}: cannot list folder: "
                                                 f"{exc.strerror or exc}"))
                return
            raise
        for e in entries:
            path = os.path.join(folder, e.name)
            if not _utf8(e.name):  # never opened: its name cannot be a paper id or a table value
                if wanted(e.name) or e.is_dir(follow_symlinks=False):
                    shown = os.fsencode(path).decode("utf-8", "backslashreplace")
                    out.append(SourceFile(shown, 0, f"{QuarantineReason.UNDECODABLE_NAME}: the name is not UTF-8; "
                                                    "not read (rename it to read it)"))
                continue
            try:
                if e.is_symlink():
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        if wanted(e.name) or extensions is not None and "." not in e.name:
                            out.append(SourceFile(path, 0, f"{QuarantineReason.BROKEN_SYMLINK}: links to missing "
                                                           f"{os.readlink(path)}"))
                        continue
                    except OSError as exc:
                        if exc.errno == errno.ELOOP:
                            out.append(SourceFile(path, 0, f"{QuarantineReason.SYMLINK_LOOP}: {exc.strerror}"))
                            continue
                        raise
                    if stat.S_ISDIR(st.st_mode):
                        target = os.path.realpath(path)
                        inside = target == real_root or target.startswith(real_root + os.sep)
                        if target in walked or inside:
                            if real == target or real.startswith(target + os.sep):
                                out.append(SourceFile(path, 0, f"{QuarantineReason.SYMLINK_LOOP}: links to "
                                                               f"{target}, a folder that contains it; not followed"))
                            else:
                                out.append(SourceFile(path, 0, f"{QuarantineReason.DUPLICATE_PATH}: links to "
                                                               f"{target}, which is read under its own path; "
                                                               "not followed"))
                            continue
                        walked.add(target)
                        walk(path, target)
                        continue
                elif e.is_dir(follow_symlinks=False):
                    walk(path, os.path.join(real, e.name))
                    continue
                else:
                    st = e.stat(follow_symlinks=False)
                if not wanted(e.name):
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append(SourceFile(path, st.st_size, mtime=st.st_mtime))
                else:
                    out.append(SourceFile(path, 0, f"{QuarantineReason.NOT_A_REGULAR_FILE}: "
                                                   f"{_kind(st.st_mode)}, not read"))
            except OSError as exc:
                if wanted(e.name):
                    out.append(SourceFile(path, 0, f"{QuarantineReason.READ_ERROR}: {exc.strerror or exc}"))

    walk(root, real_root)
    return out


def _not_regular(fs: pafs.FileSystem, path: str) -> str | None:
    """A ``problem`` for a local path that is not (or no longer) a regular file; checked before opening it."""
    if not _is_local(fs):
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{QuarantineReason.READ_ERROR}: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{QuarantineReason.NOT_A_REGULAR_FILE}: {_kind(st.st_mode)}, not read"
    return None


def source_order(source: str) -> tuple[str, int]:
    """Sort key of a source locator: path, then row/line number as an integer."""
    path, _, frag = source.partition("#")
    return path, int(frag.split("=", 1)[1]) if "=" in frag else -1


def _records(ids: list, sources: list, raws: list, sizes: list, errors: list) -> pa.Table:
    columns = {"paper_id": ids, "source": sources, "raw": raws, "n_bytes": sizes, "error": errors}
    return pa.Table.from_pydict(columns, schema=RAW_RECORDS)


def _error(f: SourceFile, problem: str, source: str | None = None) -> pa.Table:
    """One error record for a whole input path."""
    return _records([None], [source or f.path], [None], [f.size], [problem])


def read_md_files(
    fs: pafs.FileSystem, files: list[SourceFile], max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for md files; files larger than ``max_bytes`` are not read at all, and paths that are not
    regular files are never opened."""
    batch: tuple[list, list, list, list, list] = ([], [], [], [], [])
    held = 0
    for f in files:
        raw, error, pid = None, f.problem, None if f.problem else md_paper_id(f.path)
        if error is None and not pid.strip():
            error = f"{QuarantineReason.MISSING_ID}: file name {os.path.basename(f.path)!r} has no stem to use as id"
        elif error is None and f.size > max_bytes:
            error = f"{QuarantineReason.TOO_LARGE}: {f.size} bytes > max_paper_bytes {max_bytes}"
        elif error is None and not ids_only:
            error = _not_regular(fs, f.path)
            if error is None:
                try:
                    with fs.open_input_stream(f.path) as stream:
                        raw = stream.read(max_bytes + 1)  # a file that grew since it was listed stays bounded
                    if len(raw) > max_bytes:
                        error = f"{QuarantineReason.TOO_LARGE}: over max_paper_bytes {max_bytes}"
                        raw = None
                except OSError as exc:
                    error = f"{QuarantineReason.READ_ERROR}: {exc}"
        if error is not None:
            pid = None if f.problem else pid
        for col, value in zip(batch, (pid, f.path, raw, f.size, error), strict=True):
            col.append(value)
        held += len(raw or b"")
        if held >= BLOCK_BYTES:
            yield _records(*batch)
            batch, held = ([], [], [], [], []), 0
    if batch[0]:
        yield _records(*batch)


def md_paper_id(path: str) -> str:
    """A text file's paper id: its name without the extension (``2023.acl-long.1.txt`` -> ``2023.acl-long.1``)."""
    name = os.path.basename(path)
    for ext in _EXTENSIONS["md"]:
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


def extensions(fmt: str) -> tuple[str, ...]:
    """The file name endings format ``fmt`` reads."""
    return _EXTENSIONS[fmt]


def skipped_files(uri: str, fmt: str, limit: int = 20, ignore: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """``(count, the first limit paths)`` of the files under a corpus folder ``fmt`` does not read (a ``.pdf``),
    by name alone; ``ignore``: paths the run reads otherwise (its metadata file)."""
    fs, path = resolve(uri)
    if _is_local(fs):
        if not os.path.isdir(path):
            return 0, []
        names = [f.path for f in _walk_local(path, None) if f.problem is None]
    else:
        info = storage.file_info(uri)  # an object store that cannot be reached: one line
        if info.type != pafs.FileType.Directory:
            return 0, []
        names = [f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                 if f.type == pafs.FileType.File]
    skipped = sorted(n for n in names if not n.lower().endswith(_EXTENSIONS[fmt]) and n not in ignore)
    return len(skipped), skipped[:limit]


def _pick(names: Iterable[str], wanted: tuple[str, ...], what: str, where: str) -> str:
    names = list(names)
    for w in wanted:
        if w in names:
            return w
    raise ValueError(f"{where}: no {what} column (expected one of {wanted}, found {names})")


def paper_id_of(value) -> tuple[str | None, str | None]:
    """``(id, None)`` for a usable id value (a string or an integer; None when absent), else
    ``(None, "invalid_record: ...")``: a boolean, float, list or object is never turned into a string."""
    if value is None or (isinstance(value, str) and not isinstance(value, bool)):
        return value, None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return None, f"{QuarantineReason.INVALID_RECORD}: paper id is a {type(value).__name__} ({shown}), not a string"


def _base_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _id_type_ok(t: pa.DataType) -> bool:
    t = _base_type(t)
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t) or pa.types.is_null(t)
            or str(t) == "string_view")


def _text_type_ok(t: pa.DataType) -> bool:
    t = _base_type(t)
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_null(t) or str(t) in ("string_view", "binary_view"))


def read_parquet_file(
    fs: pafs.FileSystem, f: SourceFile, max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for one Parquet file, in row batches, text as bytes. A file that cannot be opened, is empty or
    lacks a usable id or text column is one error record (in ``ids_only`` mode too); rows failing part-way one each."""
    problem = f.problem or _not_regular(fs, f.path)
    if problem:
        yield _error(f, problem)
        return
    try:
        pf = pq.ParquetFile(f.path, filesystem=fs)
        total = pf.metadata.num_rows
        schema = pf.schema_arrow
    except Exception as exc:  # noqa: BLE001 - any unreadable file costs one record, not the job
        yield _error(f, f"{QuarantineReason.READ_ERROR}: not a readable Parquet file ({_one_line(exc)})")
        return
    if total == 0:
        yield _error(f, f"{QuarantineReason.EMPTY}: Parquet file with no rows")
        return
    try:
        id_col = _pick(schema.names, ID_COLUMNS, "id", os.path.basename(f.path))
        text_col = _pick(schema.names, TEXT_COLUMNS, "text", os.path.basename(f.path))
    except ValueError as exc:
        yield _error(f, f"{QuarantineReason.INVALID_RECORD}: {exc}; {total} rows not read")
        return
    for col, ok, what in ((id_col, _id_type_ok, "text or integer"), (text_col, _text_type_ok, "text")):
        col_type = schema.field(col).type
        if not ok(col_type):
            yield _error(f, f"{QuarantineReason.INVALID_RECORD}: column {col!r} is {col_type}, not {what}; "
                            f"{total} rows not read")
            return
    row = 0
    try:
        columns = [id_col] if ids_only else [id_col, text_col]
        for rb in pf.iter_batches(batch_size=1024, columns=columns):
            ids = rb.column(id_col).cast(pa.string()).to_pylist()
            n = len(ids)
            sources = [f"{f.path}#row={row + k}" for k in range(n)]
            if ids_only:
                out = _records(ids, sources, [None] * n, [None] * n, [None] * n)
            else:
                col = rb.column(text_col)
                if pa.types.is_dictionary(col.type):
                    col = col.dictionary_decode()
                col = col.cast(pa.large_binary())  # no UTF-8 assumptions here
                raws = col.to_pylist()
                sizes = [None if r is None else len(r) for r in raws]
                errors = [None] * n
                for k, size in enumerate(sizes):
                    if size is not None and size > max_bytes:
                        raws[k] = None
                        errors[k] = f"{QuarantineReason.TOO_LARGE}: {size} bytes > max_paper_bytes {max_bytes}"
                out = _records(ids, sources, raws, sizes, errors)
            row += n
            yield out
    except Exception as exc:  # noqa: BLE001 - the rest of the file: one error record per row, so counts hold
        detail = f"{QuarantineReason.READ_ERROR}: row unreadable ({_one_line(exc)})"
        for start in range(row, total, 1024):
            n = min(1024, total - start)
            yield _records([None] * n, [f"{f.path}#row={start + k}" for k in range(n)], [None] * n, [None] * n,
                           [detail] * n)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_jsonl_file(
    fs: pafs.FileSystem, f: SourceFile, max_bytes: int, ids_only: bool = False
) -> Iterator[pa.Table]:
    """Raw records for one JSONL file; a malformed line becomes an error record, a file without any
    JSON line one ``empty`` record."""
    problem = f.problem or _not_regular(fs, f.path)
    if problem:
        yield _error(f, problem)
        return
    batch: tuple[list, list, list, list, list] = ([], [], [], [], [])
    held = 0
    n_records = 0
    try:
        with fs.open_input_stream(f.path) as stream:
            for lineno, line in enumerate(_lines(stream), start=1):
                if lineno == 1 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8):]
                if not line.strip():
                    continue
                pid, raw, size, error = _parse_jsonl_line(line, max_bytes)
                if ids_only:
                    raw, size = None, None
                for col, value in zip(batch, (pid, f"{f.path}#line={lineno}", raw, size, error), strict=True):
                    col.append(value)
                n_records += 1
                held += len(raw or b"")
                if held >= BLOCK_BYTES:
                    yield _records(*batch)
                    batch, held = ([], [], [], [], []), 0
    except OSError as exc:
        for col, value in zip(batch, (None, f.path, None, f.size, f"{QuarantineReason.READ_ERROR}: {exc}"),
                              strict=True):
            col.append(value)
        n_records += 1
    if not n_records:
        yield _error(f, f"{QuarantineReason.EMPTY}: {f.size} bytes, no JSON lines")
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


def _parse_jsonl_line(line: bytes, max_bytes: int) -> tuple:
    """``(paper_id, raw text, n_bytes, error)`` of one JSON line."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, None, len(line), f"{QuarantineReason.INVALID_RECORD}: line is not valid JSON ({exc})"
    except RecursionError:
        return None, None, len(line), f"{QuarantineReason.INVALID_RECORD}: line is nested too deeply to parse"
    if not isinstance(obj, dict):
        return None, None, len(line), f"{QuarantineReason.INVALID_RECORD}: line is not a JSON object"
    pid, error = paper_id_of(next((obj[c] for c in ID_COLUMNS if obj.get(c) is not None), None))
    if error:
        return None, None, len(line), error
    text = next((obj[c] for c in TEXT_COLUMNS if obj.get(c) is not None), None)
    if text is not None and not isinstance(text, str):
        return pid, None, len(line), f"{QuarantineReason.INVALID_RECORD}: text field is {type(text).__name__}"
    # JSON strings may carry lone surrogates (\ud800); keep them detectable downstream.
    raw = None if text is None else text.encode("utf-8", "surrogatepass")
    if raw is not None and len(raw) > max_bytes:
        return pid, None, len(raw), f"{QuarantineReason.TOO_LARGE}: {len(raw)} bytes > max_paper_bytes {max_bytes}"
    return pid, raw, None if raw is None else len(raw), None


READERS = {"md": read_md_files, "parquet": read_parquet_file, "jsonl": read_jsonl_file}


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
        return None, f"{QuarantineReason.NUL_BYTES}: {raw.count(0)} NUL bytes, first at byte {nul}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = raw[:4096]
        binary = sum(32 <= b < 127 or b in (9, 10, 13) for b in head) < 0.7 * len(head)
        kind = QuarantineReason.BINARY if binary else QuarantineReason.INVALID_UTF8
        return None, f"{kind}: {exc.reason} at byte {exc.start}"
    if raw.startswith(b"\xef\xbb\xbf") and (len(raw) == 3 or raw[3:].isspace()):
        return None, f"{QuarantineReason.EMPTY}: {len(raw)} bytes, a byte-order mark and no visible text"
    n_ctrl = len(raw.translate(None, _NOT_CTRL_BYTES))  # C speed; UTF-8 never uses these bytes otherwise
    if n_ctrl > max(2, max_control_ratio * len(text)):
        first = _CTRL_RE.search(text).start()
        return None, f"{QuarantineReason.BINARY}: {n_ctrl} control characters, first at char {first}"
    return text, None


def normalize_text(text: str, ops: tuple[str, ...] | list[str]) -> str:
    """Apply opt-in normalisations in a fixed order; the result is the text every offset refers to."""
    if unknown := set(ops) - set(NORMALIZATIONS):
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
