"""Incremental updates of a dense index for nightly runs: remove rows, append new vectors.

Row ``i`` of the index is row ``i`` of ``ids.parquet``, rows contiguous ``0..n-1``; after ``update_dense`` they
are the kept old rows in order, then the new vectors (the caller rewrites ``ids.parquet`` and BM25 alike). FAISS's
own incremental operations reuse the trained quantizer and codebooks, which is sound only while the corpus has not
drifted far: ``plan_update`` decides when to rebuild instead.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

from verbatim_batch.retrieval.index.dense import _is_int


def plan_update(n_old: int, n_removed: int, n_added: int, max_drift: float) -> tuple[str, float]:
    """Update in place or rebuild: ``(action, drift)``, ``drift = (n_removed + n_added) / max(n_old, 1)``;
    ``"unchanged"``, ``"rebuilt"`` past ``max_drift`` or from empty, else ``"added"``. New vectors go under the old
    centroids whatever they look like, so with drift recall at a fixed ``nprobe`` drops; pass ``n_old`` at the last
    rebuild and the changes since. A flat index is exact at any drift (``math.inf``)."""
    for name, value in (("n_old", n_old), ("n_removed", n_removed), ("n_added", n_added)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if n_removed > n_old:
        raise ValueError(f"n_removed ({n_removed}) is larger than n_old ({n_old})")
    if isinstance(max_drift, bool) or not isinstance(max_drift, (int, float, np.integer, np.floating)):
        raise ValueError(f"max_drift must be a number, got {max_drift!r}")
    if math.isnan(max_drift) or max_drift < 0:
        raise ValueError(f"max_drift must be >= 0 (math.inf for 'never rebuild'), got {max_drift!r}")
    drift = (n_removed + n_added) / max(n_old, 1)
    if n_removed == 0 and n_added == 0:
        return "unchanged", 0.0
    if n_old == 0 or drift > max_drift:
        return "rebuilt", drift
    return "added", drift


# ---------------------------------------------------------------------------- update_dense


def _check_removed(removed_rows, n_old: int) -> np.ndarray:
    rows = np.asarray(removed_rows)
    if rows.size == 0:
        return np.empty(0, dtype=np.int64)
    if rows.ndim != 1:
        raise ValueError(f"removed_rows must be 1-D, got shape {rows.shape}")
    if rows.dtype == np.bool_ or rows.dtype.kind not in "iu":
        raise ValueError(f"removed_rows must hold integer row numbers (not a mask), got dtype {rows.dtype}")
    bad = (rows < 0) | (rows >= n_old)
    if bad.any():
        raise ValueError(
            f"removed_rows: {int(bad.sum())} row(s) outside 0..{n_old - 1} (the index has {n_old} rows), "
            f"first: {rows[bad][0]}"
        )
    rows = rows.astype(np.int64)
    uniq = np.unique(rows)
    if len(uniq) != len(rows):
        sorted_rows = np.sort(rows)
        dup = sorted_rows[1:][sorted_rows[1:] == sorted_rows[:-1]]
        raise ValueError(f"removed_rows has {len(rows) - len(uniq)} duplicate(s), first: {dup[0]}")
    return uniq


def _check_new(new_vectors, dim: int) -> np.ndarray:
    x = np.asarray(new_vectors)
    if x.ndim != 2 or x.shape[1] != dim:
        if x.size == 0 and x.ndim <= 2:
            return np.empty((0, dim), dtype=np.float32)
        raise ValueError(f"new_vectors has shape {x.shape}, expected (m, {dim})")
    if x.dtype.kind != "f":
        raise ValueError(f"new_vectors has dtype {x.dtype}, not float")
    x = np.ascontiguousarray(x, dtype=np.float32)
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(f"new_vectors has {len(bad)} row(s) with NaN/inf values (first: row {int(bad[0])})")
    return x


def _list_ids(invlists, list_no: int) -> np.ndarray:
    """The ids of one inverted list as a writable view into the index (ArrayInvertedLists only)."""
    size = invlists.list_size(list_no)
    if size == 0:
        return np.empty(0, dtype=np.int64)
    return faiss.rev_swig_ptr(invlists.get_ids(list_no), size)


def _array_invlists(ivf: faiss.IndexIVF):
    """The index's lists as ``ArrayInvertedLists`` held in memory; ``ValueError`` otherwise."""
    invlists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(invlists, faiss.ArrayInvertedLists):
        kind = type(invlists).__name__
        hint = (
            " (the index was loaded memory-mapped: load it with load_dense(..., mmap=False) to update it)"
            if kind == "OnDiskInvertedLists"
            else ""
        )
        raise ValueError(f"update_dense needs an IVF index whose lists are in memory, got {kind}{hint}")
    for list_no in range(invlists.nlist):
        if not invlists.codes.at(list_no).is_owned:  # views into a file mapped with IO_FLAG_MMAP_IFC
            raise ValueError(
                "update_dense: the IVF index's lists are mapped read-only from its file: "
                "load it with load_dense(..., mmap=False) to update it"
            )
    return invlists


def _check_rows_contiguous(invlists, n_old: int) -> None:
    """The ids stored in the lists must be exactly the rows ``0..n_old-1`` (as ``build_dense`` makes them)."""
    seen = np.zeros(n_old, dtype=bool)
    for list_no in range(invlists.nlist):
        ids = _list_ids(invlists, list_no)
        if len(ids) == 0:
            continue
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_old:
            raise ValueError(
                f"update_dense: inverted list {list_no} holds id {lo if lo < 0 else hi} outside the rows "
                f"0..{n_old - 1}; the index's ids are not contiguous rows"
            )
        seen[ids] = True
    if int(seen.sum()) != n_old:
        raise ValueError("update_dense: the index's ids are not the contiguous rows 0..n-1 (some repeat)")


def update_dense(index: faiss.Index, removed_rows: np.ndarray, new_vectors: np.ndarray) -> faiss.Index:
    """Remove ``removed_rows`` (unique, any order) and append ``new_vectors`` (finite ``(m, d)``), in place: the kept
    old rows first in order, then the new. IVF ids are rewritten in place to their new rows; a direct map is rebuilt.
    All is checked first, so on ``ValueError``/``TypeError`` the index is untouched (a memory-mapped one is refused)."""
    is_flat = isinstance(index, faiss.IndexFlat)
    is_ivf = isinstance(index, faiss.IndexIVF)
    if not (is_flat or is_ivf):
        raise TypeError(f"update_dense supports IndexFlat and IndexIVF indexes, got {type(index).__name__}")
    if not index.is_trained:
        raise ValueError("update_dense: the IVF index is not trained")
    n_old = int(index.ntotal)
    removed = _check_removed(removed_rows, n_old)
    new = _check_new(new_vectors, index.d)
    n_kept = n_old - len(removed)

    if is_flat:
        if not index.codes.is_owned:  # mapped from its file (IO_FLAG_MMAP_IFC): writing would crash the process
            raise ValueError(
                "update_dense: the flat index's vectors are mapped read-only from its file: "
                "load it with load_dense(..., mmap=False) to update it"
            )
        if len(removed):
            index.remove_ids(faiss.IDSelectorBatch(removed))
        if len(new):
            index.add(new)
        return index

    invlists = _array_invlists(index)
    _check_rows_contiguous(invlists, n_old)
    map_type = index.direct_map.type
    if map_type != faiss.DirectMap.NoMap:
        index.set_direct_map_type(faiss.DirectMap.NoMap)  # an Array map cannot remove; rebuilt below
    if len(removed):
        n_gone = index.remove_ids(faiss.IDSelectorBatch(removed))
        if n_gone != len(removed):
            raise RuntimeError(f"update_dense: faiss removed {n_gone} of {len(removed)} rows")
        new_row = np.full(n_old, -1, dtype=np.int64)
        keep = np.ones(n_old, dtype=bool)
        keep[removed] = False
        new_row[keep] = np.arange(n_kept, dtype=np.int64)
        del keep
        for list_no in range(invlists.nlist):
            ids = _list_ids(invlists, list_no)
            if len(ids):
                relabelled = new_row[ids]
                if relabelled.min() < 0:
                    raise RuntimeError(f"update_dense: a removed row is still in inverted list {list_no}")
                ids[:] = relabelled
    if len(new):
        index.add_with_ids(new, np.arange(n_kept, n_kept + len(new), dtype=np.int64))
    if map_type != faiss.DirectMap.NoMap:
        index.set_direct_map_type(map_type)
    return index
