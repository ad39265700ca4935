"""Where run folders live: a local path or a URI (``s3://``, ``gs://``, any pyarrow or fsspec file system).

Every read and write of a run folder goes through these helpers; credentials come from the store's usual
environment (Ray workers need the same). An object store has no atomic folder rename, so ``move_dir`` copies
(``manifest.json`` last) and then deletes; readers go by the manifest, never by what a folder lists.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from verbatim_batch.core.faults import fault_point

if TYPE_CHECKING:
    import pyarrow.dataset as pads  # imported where used: 0.5 CPU-s more than pyarrow.parquet

LOCAL = pafs.LocalFileSystem()
LAST_FILES = ("manifest.json",)  # copied after everything else by move_dir: the commit marker


def is_remote(loc: str) -> bool:
    return "://" in loc and not loc.startswith("file://")


def refuse_special(loc: str) -> None:
    """Refuse an existing local path that is no regular file or folder (a pipe or device can block forever)."""
    if is_remote(loc):
        return
    try:
        mode = os.stat(normalize(loc)).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"{loc} is not a regular file or a folder (a pipe, device or socket is never read)")


def normalize(loc: str) -> str:
    """An absolute local path, or the URI without a trailing slash."""
    if is_remote(loc):
        return loc.rstrip("/")
    return os.path.abspath(os.path.expanduser(loc.removeprefix("file://")))


def _one_line(exc: BaseException) -> str:
    """An object store's error (often several lines of AWS detail) as one line of at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__


@lru_cache(maxsize=32)
def _filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The file system of ``scheme://netloc`` and the path prefix its keys get (cached: S3 resolves a region)."""
    try:
        return pafs.FileSystem.from_uri(root + "/")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass  # a scheme pyarrow does not know: fsspec's, below
    except OSError as exc:  # e.g. S3 resolving the bucket's region with no network, or no such bucket
        raise ConnectionError(f"cannot reach {root}: {_one_line(exc)}") from None
    try:
        import fsspec
    except ImportError as exc:
        raise ValueError(f"{root}: pyarrow does not know this file system and fsspec is not installed") from exc
    fs, path = fsspec.core.url_to_fs(root + "/")
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _parts(loc: str) -> tuple[str, str]:
    """``("scheme://netloc", key)``: split by hand, so ``#`` and ``?`` stay part of a key, as a store keeps them."""
    scheme, _, rest = loc.partition("://")
    netloc, _, key = rest.partition("/")
    return f"{scheme}://{netloc}", unquote(key.strip("/"))


_OPTIONS = re.compile(r"\?[A-Za-z_]+=[^/?#]*(&[A-Za-z_]+=[^/?#]*)*$")  # ?region=eu-west-1&scheme=http


def resolve(loc: str) -> tuple[pafs.FileSystem, str]:
    """``(file system, path in it)`` for a location. A URI with options (``s3://b/x?region=eu-west-1``)
    goes to pyarrow as it is (inputs only: options cannot be joined onto)."""
    if not is_remote(loc):
        return LOCAL, normalize(loc)
    if _OPTIONS.search(loc):
        return pafs.FileSystem.from_uri(loc)
    root, key = _parts(loc)
    fs, prefix = _filesystem(root)
    base = prefix.rstrip("/")
    if not base:
        return fs, "/" + key
    return fs, f"{base}/{key}" if key else base


def join(loc: str, *parts: str) -> str:
    return posixpath.join(loc, *parts) if is_remote(loc) else os.path.join(loc, *parts)


def split(loc: str) -> tuple[str, str]:
    """``(parent, name)``."""
    loc = normalize(loc)
    if is_remote(loc) and not _parts(loc)[1]:
        raise ValueError(f"{loc}: a run folder on an object store is a prefix inside the bucket "
                         "(s3://bucket/runs/name), not the bucket itself")
    return posixpath.split(loc) if is_remote(loc) else os.path.split(loc)


def file_info(loc: str) -> pafs.FileInfo:
    """What the file system knows of ``loc``."""
    fs, path = resolve(loc)
    try:
        return fs.get_file_info(path)
    except OSError as exc:
        if not is_remote(loc) or type(exc) is not OSError:  # a local error, or one already of its kind
            raise
        # a store that cannot be reached or refuses: one line; an OSError still, for callers that tolerate one
        raise ConnectionError(f"cannot read {loc}: {_one_line(exc)}") from None


def exists(loc: str) -> bool:
    return file_info(loc).type != pafs.FileType.NotFound


def isdir(loc: str) -> bool:
    return file_info(loc).type == pafs.FileType.Directory


def isfile(loc: str) -> bool:
    return file_info(loc).type == pafs.FileType.File


def mtime(loc: str) -> float | None:
    """Last modification time (seconds since the epoch), None where the store does not keep one."""
    info = file_info(loc)
    return info.mtime.timestamp() if info.mtime is not None else None


def makedirs(loc: str) -> None:
    if is_remote(loc):  # object stores have no folders: a key's prefix exists once a file is under it
        return
    os.makedirs(normalize(loc), exist_ok=True)


def listdir(loc: str) -> list[str]:
    """Names of the files and folders directly in ``loc`` (sorted; empty when it does not exist)."""
    if not is_remote(loc):
        path = normalize(loc)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    fs, path = resolve(loc)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted({posixpath.basename(i.path.rstrip("/")) for i in infos})


def _files(loc: str) -> list[tuple[str, int]]:
    """``(relative path, size)`` of every file under ``loc``, sorted."""
    fs, path = resolve(loc)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    base = path.rstrip("/") + "/"
    return sorted((i.path[len(base):], i.size) for i in infos
                  if i.type == pafs.FileType.File and i.path.startswith(base))


def walk_files(loc: str) -> list[str]:
    """Relative (``/``-separated) paths of every file under ``loc``."""
    return [rel for rel, _ in _files(loc)]


def read_bytes(loc: str) -> bytes:
    fs, path = resolve(loc)
    with fs.open_input_stream(path) as fh:
        return fh.read()


def read_text(loc: str) -> str:
    return read_bytes(loc).decode("utf-8")


class TooLargeError(ValueError):
    """A file over the size its reader allows (``read_bytes_bounded``)."""


def read_bytes_bounded(loc: str, max_bytes: int) -> bytes:
    """The bytes of a file of at most ``max_bytes``, else ``TooLargeError`` (never reading more than one byte over)."""
    fs, path = resolve(loc)
    with fs.open_input_stream(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLargeError(f"{loc} is over {max_bytes:,} bytes")
    return data


def read_text_bounded(loc: str, max_bytes: int) -> str:
    return read_bytes_bounded(loc, max_bytes).decode("utf-8")


def _own_mode(loc: str) -> int:
    """The mode of a local path itself, never of what a link points to (0 when absent)."""
    try:
        return os.lstat(normalize(loc)).st_mode
    except OSError:
        return 0


def regular_file(loc: str) -> bool:
    """Whether ``loc`` is a plain file: locally a regular file, not a symbolic link (a run folder holds none:
    one there may lead anywhere); on a store an object."""
    return isfile(loc) if is_remote(loc) else stat.S_ISREG(_own_mode(loc))


def real_dir(loc: str) -> bool:
    """Whether ``loc`` is a folder and not a symbolic link to one (locally; on a store, a prefix)."""
    return isdir(loc) if is_remote(loc) else stat.S_ISDIR(_own_mode(loc))


def write_bytes(loc: str, data: bytes) -> None:
    """Readers see the old content or the whole new one (temp file + rename, or one object); parents made."""
    if is_remote(loc):
        fs, path = resolve(loc)
        with fs.open_output_stream(path) as fh:
            fh.write(data)
        return
    path = normalize(loc)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_text(loc: str, text: str) -> None:
    write_bytes(loc, text.encode("utf-8"))


def write_parquet(table: pa.Table, loc: str, **kwargs) -> None:
    """A Parquet file written whole or not at all (see ``write_bytes``)."""
    kwargs.setdefault("compression", "zstd")
    fs, path = resolve(loc)
    if is_remote(loc):
        pq.write_table(table, path, filesystem=fs, **kwargs)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    pq.write_table(table, tmp, **kwargs)
    os.replace(tmp, path)


def write_parquet_digest(table: pa.Table, loc: str) -> dict[str, int | str]:
    """Write ``table`` as one Parquet file (whole or not at all); its ``{"bytes", "digest"}`` of the bytes written."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_rows(table))
    data = sink.getvalue().to_pybytes()
    write_bytes(loc, data)
    return {"bytes": len(data), "digest": bytes_digest(data)}


ROW_GROUP_BYTES = 32 << 20  # in memory: a reader (verify, a night's carry) holds a few row groups, never a file


def row_group_rows(table: pa.Table) -> int:
    """Rows per Parquet row group so that a group is about ``ROW_GROUP_BYTES`` in memory."""
    if not table.num_rows:
        return 1
    return max(1, int(table.num_rows * ROW_GROUP_BYTES / max(1, table.nbytes)))


def bytes_digest(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def file_digest(loc: str) -> str:
    """The ``bytes_digest`` of a file, read in blocks."""
    h = hashlib.blake2b(digest_size=16)
    fs, path = resolve(loc)
    with fs.open_input_stream(path) as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return "blake2b:" + h.hexdigest()


def link_file(src: str, dst: str) -> str:
    """Put ``src`` at ``dst`` without rewriting it: a hard link locally (outlives ``src``), a server-side copy on
    a store, else a plain copy. Returns which."""
    if not is_remote(src) and not is_remote(dst):
        s, d = normalize(src), normalize(dst)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        tmp = f"{d}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            os.link(s, tmp)
            how = "link"
        except OSError:
            shutil.copyfile(s, tmp)
            how = "copy"
        os.replace(tmp, d)
        return how
    src_fs, src_path = resolve(src)
    dst_fs, dst_path = resolve(dst)
    if src_fs.type_name == dst_fs.type_name and _parts(src)[0] == _parts(dst)[0]:
        src_fs.copy_file(src_path, dst_path)  # one request: the store copies, nothing passes through here
        return "server_copy"
    write_bytes(dst, read_bytes(src))
    return "copy"


def read_parquet_schema(loc: str) -> pa.Schema:
    """The schema of one Parquet file (its footer only)."""
    fs, path = resolve(loc)
    return pq.read_schema(path, filesystem=fs)


def read_parquet(loc: str, columns: list[str] | None = None, filter=None) -> pa.Table:
    """A Parquet file or a folder of them."""
    fs, path = resolve(loc)
    return pq.read_table(path, filesystem=fs, columns=columns, filters=filter)


def dataset(loc: str) -> pads.Dataset:
    import pyarrow.dataset as pads
    fs, path = resolve(loc)
    return pads.dataset(path, filesystem=fs, format="parquet")


def parquet_file(loc: str) -> pq.ParquetFile:
    fs, path = resolve(loc)
    return pq.ParquetFile(fs.open_input_file(path))


def remove(loc: str) -> None:
    fs, path = resolve(loc)
    fs.delete_file(path)


def rmtree(loc: str) -> None:
    """Delete a folder or file, if it exists. ``manifest.json`` goes first: a delete cut short leaves a folder
    that is not a run, never a run with tables missing."""
    if not is_remote(loc) and os.path.islink(normalize(loc)):  # the link goes, never what it points to
        os.unlink(normalize(loc))
        return
    fs, path = resolve(loc)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.NotFound:
        return
    if kind == pafs.FileType.File:
        fs.delete_file(path)
        return
    for name in LAST_FILES:
        marker = f"{path.rstrip('/')}/{name}"
        if fs.get_file_info(marker).type == pafs.FileType.File:
            fs.delete_file(marker)
    fault_point("storage.rmtree")  # the manifest is gone, the tables not yet
    if is_remote(loc):
        try:
            fs.delete_dir(path)
        except FileNotFoundError:  # a prefix that held only the manifest is gone with it
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


# S3 copies an object server-side in one request only up to 5 GiB; larger files (a flat FAISS index of
# the whole corpus is several GB) are streamed through a multipart upload instead.
SERVER_COPY_MAX_BYTES = 4 * 1024**3
STREAM_CHUNK_BYTES = 64 * 1024**2


def copytree(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
    """Copy every file under ``src`` (but the top-level names in ``skip``) to ``dst``, ``LAST_FILES`` last, across
    any two file systems; FileNotFoundError when ``src`` does not exist."""
    if not exists(src):
        raise FileNotFoundError(f"{src} does not exist")
    if not is_remote(src) and not is_remote(dst) and not skip:
        shutil.copytree(normalize(src), normalize(dst), dirs_exist_ok=True)
        return
    src_fs, src_path = resolve(src)
    dst_fs, dst_path = resolve(dst)
    base = src_path.rstrip("/") + "/"
    files = [(rel, size) for rel, size in _files(src) if rel.split("/", 1)[0] not in skip]
    files.sort(key=lambda f: f[0] in LAST_FILES)
    for rel, size in files:
        fault_point("storage.copy")
        source, target = base + rel, f"{dst_path.rstrip('/')}/{rel}"
        if dst_fs is LOCAL:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        if src_fs is dst_fs and src_fs is not LOCAL and size > SERVER_COPY_MAX_BYTES:
            with src_fs.open_input_stream(source) as fin, dst_fs.open_output_stream(target) as fout:
                while chunk := fin.read(STREAM_CHUNK_BYTES):
                    fout.write(chunk)
        else:
            pafs.copy_files(source, target, source_filesystem=src_fs, destination_filesystem=dst_fs)


def move_dir(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
    """Move a folder to a path that does not exist. Local: one atomic rename. Object stores: copy the files
    (``manifest.json`` last), then delete the source; a move cut short leaves the source whole."""
    if not is_remote(src) and not is_remote(dst):
        for name in skip:
            path = os.path.join(normalize(src), name)
            if os.path.isfile(path) or os.path.islink(path):
                os.remove(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        os.rename(normalize(src), normalize(dst))
        return
    copytree(src, dst, skip=skip)
    fault_point("storage.moved")  # copied, the source not yet deleted
    rmtree(src)


@contextmanager
def local_dir(loc: str) -> Iterator[str]:
    """A local folder whose files end up at ``loc`` (uploaded on a clean exit), for libraries that write paths."""
    if not is_remote(loc):
        os.makedirs(normalize(loc), exist_ok=True)
        yield normalize(loc)
        return
    with tempfile.TemporaryDirectory(prefix="verbatim-upload-") as tmp:
        yield tmp
        copytree(tmp, loc)


def local_copy(loc: str, version: str, keep: int = 3) -> str:
    """A local folder holding what ``loc`` holds, for libraries that read paths (memory-mapped indexes). A remote
    folder is downloaded once per ``version`` (committed runs never change) into ``VERBATIM_BATCH_CACHE`` (default
    ``~/.cache/verbatim-batch``), which keeps the ``keep`` folders used last so nights do not fill a disk."""
    if not is_remote(loc):
        return normalize(loc)
    from verbatim_batch.core.tables import stable_hash

    cache = os.path.join(os.environ.get("VERBATIM_BATCH_CACHE")
                         or os.path.join(os.path.expanduser("~"), ".cache", "verbatim-batch"), "remote")
    target = os.path.join(cache, stable_hash(normalize(loc), version, size=16))
    if not os.path.isdir(target):
        if not walk_files(loc):
            raise FileNotFoundError(f"{loc} holds no files to copy")
        tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        copytree(loc, tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process on this node got there first
            shutil.rmtree(tmp, ignore_errors=True)
    os.utime(target)  # last used: what the pruning below goes by
    entries = sorted((os.path.getmtime(p), p) for p in (os.path.join(cache, n) for n in os.listdir(cache))
                     if p != target)
    stale = [p for t, p in entries if ".tmp-" in p and t < time.time() - 3600]  # downloads that died
    done = [p for _, p in entries if ".tmp-" not in p]
    for old in stale + done[: max(0, len(done) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return target
