"""Dense vector index (FAISS), built by streaming over the embeddings.

Vectors are L2-normalised and the metric is inner product (cosine scores). Kinds: ``flat`` (exact,
``IndexFlatIP``), ``ivf_flat`` (searches ``nprobe`` of ``nlist`` lists) and ``ivf_pq`` (8-bit codes, ``pq_m`` bytes
per vector, approximate). ``build_dense`` never holds the whole stream: for IVF, pass 1 collects a seeded uniform
sample to train on, pass 2 adds the vectors in shards; index row ``i`` is the stream's ``i``-th vector.

Auto settings (``resolve_spec``; ``benchmarks/bench_index.py``):

* ``nlist = 4 * sqrt(N)`` clipped to ``[16, 65536]`` and ``N // 39``: the low end of FAISS's 4..16 * sqrt(N),
  because the coarse quantizer costs ``O(nlist)`` per vector and dominates CPU builds;
* ``train_size = min(N, max(40 * nlist, 65536))``: k-means warns below 39 points per centroid, and 65,536 trains
  the 256-centroid PQ codebooks fully;
* ``nprobe = min(nlist, 128)``: with nlist ~ sqrt(N) the nprobe a recall target needs stays about constant
  (1M x 384, nlist 4000: recall@10 0.956 at 16, 0.991 at 64, 0.996 at 128);
* ``pq_m = dim // 8`` rounded to a divisor of ``dim``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verbatim_batch.core import limits
from verbatim_batch.core.options import option

if TYPE_CHECKING:
    import faiss  # imported where an index is built or read: the jobs' options (DenseSpec) need no FAISS

KINDS = ("auto", "flat", "ivf_flat", "ivf_pq")
GPU_CHOICES = ("auto", "yes", "no")
DENSE_FILE = "dense.faiss"
SHARD_ROWS = 65_536
NLIST_MIN, NLIST_MAX = 16, 65_536
MIN_POINTS_PER_LIST = 39  # FAISS k-means warns below this many training points per centroid
TRAIN_PER_LIST = 40
TRAIN_MIN = 65_536
PQ_NBITS = 8
NPROBE_AUTO = 128
MMAP_AUTO_BYTES = 2 << 30


@dataclass(frozen=True)
class DenseSpec:
    """How to build the dense index; ``resolve_spec`` fills every ``None`` (0 where a setting does not apply to
    the kind, which is why this is not ``Declared``); ``build_dense`` turns ``use_gpu`` "auto" into "yes"/"no"."""

    kind: str = option("auto", "auto: exact Flat below 1M vectors, IVF-Flat up to 20M, IVF-PQ above",
                       choices=KINDS)
    nlist: int | None = option(None, "IVF lists", low=1, high=limits.ROWS, default_help="4 x sqrt(vectors)")
    pq_m: int | None = option(None, "IVF-PQ sub-quantizers", low=1, high=limits.DIMS, default_help="by dimension")
    nprobe: int | None = option(None, "IVF lists to probe at search time", low=1,
                                high=limits.ROWS, default_help="by nlist")
    train_size: int | None = None
    flat_max: int = 1_000_000
    pq_min: int = 20_000_000
    use_gpu: str = "auto"
    seed: int = 0


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def auto_nlist(n: int) -> int:
    nlist = int(round(4 * math.sqrt(n)))
    nlist = min(max(nlist, NLIST_MIN), NLIST_MAX, n // MIN_POINTS_PER_LIST)
    return max(nlist, 1)


def auto_nprobe(nlist: int) -> int:
    return min(nlist, NPROBE_AUTO)


def auto_pq_m(dim: int) -> int:
    """The divisor of ``dim`` closest to ``dim / 8`` (ties: the larger, i.e. more bytes)."""
    target = dim / 8
    divisors = [m for m in range(1, dim + 1) if dim % m == 0]
    return min(divisors, key=lambda m: (abs(m - target), -m))


def resolve_spec(spec: DenseSpec, n: int, dim: int) -> DenseSpec:
    """``spec`` with every ``None`` filled and ``kind`` concrete; ``ValueError`` on bad values."""
    if not _is_int(n) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not _is_int(dim) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    if spec.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {spec.kind!r}")
    if spec.use_gpu not in GPU_CHOICES:
        raise ValueError(f"use_gpu must be one of {GPU_CHOICES}, got {spec.use_gpu!r}")
    for name in ("flat_max", "pq_min"):
        value = getattr(spec, name)
        if not _is_int(value) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if spec.flat_max > spec.pq_min:
        raise ValueError(f"flat_max ({spec.flat_max}) must not exceed pq_min ({spec.pq_min})")
    if not _is_int(spec.seed) or spec.seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {spec.seed!r}")
    for name in ("nlist", "pq_m", "nprobe", "train_size"):
        value = getattr(spec, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")

    kind = spec.kind
    if kind == "auto":
        kind = "flat" if n < spec.flat_max else ("ivf_pq" if n >= spec.pq_min else "ivf_flat")
    if kind == "flat":
        return replace(spec, kind="flat", nlist=0, pq_m=0, nprobe=0, train_size=0)

    if n < 1:
        raise ValueError(f"{kind} needs at least one vector to train on (n=0); use kind='flat'")
    nlist = spec.nlist if spec.nlist is not None else auto_nlist(n)
    if nlist > n:
        raise ValueError(f"{kind}: nlist={nlist} is larger than the number of vectors n={n}")
    nprobe = spec.nprobe if spec.nprobe is not None else auto_nprobe(nlist)
    if nprobe > nlist:
        raise ValueError(f"{kind}: nprobe={nprobe} is larger than nlist={nlist}")
    train_size = spec.train_size if spec.train_size is not None else min(n, max(TRAIN_PER_LIST * nlist, TRAIN_MIN))
    if train_size > n:
        raise ValueError(f"{kind}: train_size={train_size} is larger than n={n}")
    if train_size < nlist:
        raise ValueError(f"{kind}: train_size={train_size} is smaller than nlist={nlist}")
    pq_m = 0
    if kind == "ivf_pq":
        pq_m = spec.pq_m if spec.pq_m is not None else auto_pq_m(dim)
        if dim % pq_m:
            raise ValueError(f"ivf_pq: pq_m={pq_m} must divide dim={dim}")
        if train_size < 1 << PQ_NBITS:
            raise ValueError(
                f"ivf_pq: needs at least {1 << PQ_NBITS} training vectors for its {PQ_NBITS}-bit codebooks, "
                f"got train_size={train_size}"
            )
    return replace(spec, kind=kind, nlist=nlist, pq_m=pq_m, nprobe=nprobe, train_size=train_size)


# ---------------------------------------------------------------------------- streaming


def _checked(batches: Iterable[np.ndarray], n: int, dim: int, pass_name: str) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(first_row, float32 C-contiguous batch)``; raise on bad shape, non-finite values, wrong count."""
    row = 0
    for pos, batch in enumerate(batches):
        arr = np.asarray(batch)
        if arr.ndim != 2 or arr.shape[1] != dim:
            raise ValueError(
                f"{pass_name}: batch {pos} (starting at row {row}) has shape {arr.shape}, expected (rows, {dim})"
            )
        if arr.dtype != np.float32:
            if arr.dtype.kind != "f":
                raise ValueError(f"{pass_name}: batch {pos} (starting at row {row}) has dtype {arr.dtype}, not float")
            arr = arr.astype(np.float32)
        arr = np.ascontiguousarray(arr)
        if len(arr) == 0:
            continue
        finite = np.isfinite(arr).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise ValueError(
                f"{pass_name}: batch {pos} (starting at row {row}) has {len(bad)} row(s) with NaN/inf values "
                f"(first: row {row + int(bad[0])})"
            )
        if row + len(arr) > n:
            raise ValueError(
                f"{pass_name}: the stream has more than n={n} rows (batch {pos} ends at row {row + len(arr)})"
            )
        yield row, arr
        row += len(arr)
    if row != n:
        raise ValueError(f"{pass_name}: the stream has {row} rows, expected n={n}")


def _shards(stream: Iterator[tuple[int, np.ndarray]], dim: int, shard_rows: int = SHARD_ROWS) -> Iterator[np.ndarray]:
    """Checked batches regrouped into ``shard_rows`` rows, each valid until the next (one buffer is reused)."""
    buf = None
    fill = 0
    for _, arr in stream:
        start = 0
        while start < len(arr):
            if fill == 0 and len(arr) - start >= shard_rows:
                yield arr[start : start + shard_rows]
                start += shard_rows
                continue
            if buf is None:
                buf = np.empty((shard_rows, dim), dtype=np.float32)
            take = min(shard_rows - fill, len(arr) - start)
            buf[fill : fill + take] = arr[start : start + take]
            fill += take
            start += take
            if fill == shard_rows:
                yield buf  # consumed (copied by index.add) before the generator resumes and refills it
                fill = 0
    if fill:
        yield buf[:fill]


def _train_sample(batches: Callable[[], Iterable[np.ndarray]], n: int, dim: int, spec: DenseSpec) -> np.ndarray:
    """Pass 1: the rows of a seeded uniform sample of ``train_size`` row ids, in row order."""
    rng = np.random.default_rng(spec.seed)
    rows = np.sort(rng.choice(n, size=spec.train_size, replace=False))
    sample = np.empty((spec.train_size, dim), dtype=np.float32)
    for first, arr in _checked(batches(), n, dim, "pass 1 (training sample)"):
        lo, hi = np.searchsorted(rows, [first, first + len(arr)])
        if hi > lo:
            sample[lo:hi] = arr[rows[lo:hi] - first]
    return sample


def _new_index(spec: DenseSpec, dim: int) -> faiss.Index:
    import faiss

    if spec.kind == "flat":
        return faiss.IndexFlatIP(dim)
    quantizer = faiss.IndexFlatIP(dim)
    if spec.kind == "ivf_flat":
        index = faiss.IndexIVFFlat(quantizer, dim, spec.nlist, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexIVFPQ(quantizer, dim, spec.nlist, spec.pq_m, PQ_NBITS, faiss.METRIC_INNER_PRODUCT)
        index.pq.cp.seed = spec.seed
    index.cp.seed = spec.seed
    index.nprobe = spec.nprobe
    return index


def _num_gpus() -> int:
    import faiss

    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def build_dense(
    batches: Callable[[], Iterable[np.ndarray]],
    n: int,
    dim: int,
    spec: DenseSpec = DenseSpec(),  # noqa: B008 (frozen dataclass)
) -> tuple[faiss.Index, DenseSpec]:
    """Build the index over ``batches()`` (once for flat, twice for IVF): a CPU index and its resolved spec."""
    spec = resolve_spec(spec, n, dim)
    gpus = _num_gpus() if spec.use_gpu != "no" else 0
    if spec.use_gpu == "yes" and gpus == 0:
        raise ValueError("use_gpu='yes' but faiss sees no GPU (no CUDA device, or faiss-cpu: GPU nodes need the gpu "
                         "extra, pip install 'verbatim-batch[gpu]')")
    # Flat gains nothing from a GPU build: adding is a copy.
    on_gpu = gpus > 0 and spec.kind != "flat"
    spec = replace(spec, use_gpu="yes" if on_gpu else "no")

    index = _new_index(spec, dim)
    if on_gpu:
        _train_add_gpu(index, spec, batches, n, dim)
        return index, spec
    if spec.kind != "flat":
        sample = _train_sample(batches, n, dim, spec)
        index.train(sample)
        del sample
    else:
        _reserve_flat(index, n)
    for shard in _shards(_checked(batches(), n, dim, "add pass"), dim, min(SHARD_ROWS, max(n, 1))):
        index.add(shard)
    return index, spec


def _reserve_flat(index: faiss.Index, n: int) -> None:
    """Size the flat index's storage once, so adding shards never reallocates (and briefly doubles) it."""
    with contextlib.suppress(AttributeError, RuntimeError):  # a faiss whose IndexFlat hides its storage
        index.codes.resize(n * index.code_size)
        index.codes.resize(0)  # the capacity stays


def _train_add_gpu(index: faiss.Index, spec: DenseSpec, batches, n: int, dim: int) -> None:
    """IVF on GPU: only k-means and the coarse assignment move; the index stays in CPU memory (as FAISS's own bench)."""
    import faiss

    sample = _train_sample(batches, n, dim, spec)
    ivf = faiss.extract_index_ivf(index)
    # SWIG does not keep the Python objects alive through the C++ pointers: hold them here.
    clustering = faiss.index_cpu_to_all_gpus(faiss.IndexFlatIP(dim))
    ivf.clustering_index = clustering
    try:
        index.train(sample)
    finally:
        ivf.clustering_index = None
    del clustering, sample
    cpu_quantizer = ivf.quantizer
    gpu_quantizer = faiss.index_cpu_to_all_gpus(cpu_quantizer)
    ivf.quantizer = gpu_quantizer
    try:
        for shard in _shards(_checked(batches(), n, dim, "add pass"), dim, min(SHARD_ROWS, max(n, 1))):
            index.add(shard)
    finally:
        ivf.quantizer = cpu_quantizer
    del gpu_quantizer


# ---------------------------------------------------------------------------- save, load, search


def save_dense(index: faiss.Index, folder: str | Path) -> None:
    """Write ``folder/dense.faiss`` (the folder is created if missing)."""
    import faiss

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(folder / DENSE_FILE))


def _mmap_flags(path: Path) -> int:
    import faiss

    with open(path, "rb") as f:
        fourcc = f.read(4)
    if fourcc.startswith(b"Iw"):  # IVF: inverted lists mapped as read-only on-disk lists
        return faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
    ifc = getattr(faiss, "IO_FLAG_MMAP_IFC", None)  # flat codes mapped in place (faiss >= 1.9)
    return (ifc if ifc is not None else faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY


def load_dense(folder: str | Path, mmap: bool | str = "auto", nprobe: int | None = None) -> faiss.Index:
    """Read ``folder/dense.faiss``, mapped when over 2 GiB (``mmap="auto"``); ``nprobe`` overrides the saved value."""
    import faiss

    path = Path(folder) / DENSE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no dense index at {path}")
    if mmap == "auto":
        mmap = path.stat().st_size > MMAP_AUTO_BYTES
    elif not isinstance(mmap, bool):
        raise ValueError(f"mmap must be True, False or 'auto', got {mmap!r}")
    index = faiss.read_index(str(path), _mmap_flags(path) if mmap else 0)
    if nprobe is not None:
        set_nprobe(index, nprobe)
    return index


def _ivf_or_none(index: faiss.Index):
    import faiss

    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def set_nprobe(index: faiss.Index, nprobe: int) -> None:
    """Set ``nprobe`` on an IVF index (``ValueError`` outside 1..nlist); a no-op for flat indexes."""
    ivf = _ivf_or_none(index)
    if ivf is None:
        return
    if not _is_int(nprobe) or not 1 <= nprobe <= ivf.nlist:
        raise ValueError(f"nprobe must be an integer in 1..nlist={ivf.nlist}, got {nprobe!r}")
    ivf.nprobe = int(nprobe)


def search_dense(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows per query: ``(scores float32 (q, k), rows int64 (q, k))``, row -1 where none."""
    if not _is_int(k) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    q = np.asarray(queries)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] != index.d:
        raise ValueError(f"queries have shape {np.shape(queries)}, expected (q, {index.d})")
    q = np.ascontiguousarray(q, dtype=np.float32)
    if not np.isfinite(q).all():
        raise ValueError("queries contain NaN/inf values")
    if len(q) == 0 or index.ntotal == 0:
        return np.zeros((len(q), k), np.float32), np.full((len(q), k), -1, np.int64)
    scores, rows = index.search(q, int(k))
    scores = np.asarray(scores, dtype=np.float32)
    rows = np.asarray(rows, dtype=np.int64)
    scores[rows < 0] = 0.0  # faiss pads with -inf / -3.4e38 for inner product
    return scores, rows


def best_window(scores: np.ndarray, rows: np.ndarray, owners: np.ndarray | None, k: int) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """Top-``k`` chunks per query from a vector search over windows: each chunk scored by its best window
    (``owners``: vector row -> chunk row; None: one vector per chunk). Rows -1 where none."""
    if owners is None:
        return scores[:, :k], rows[:, :k]
    out_s = np.zeros((len(rows), k), np.float32)
    out_r = np.full((len(rows), k), -1, np.int64)
    for q in range(len(rows)):
        valid = rows[q] >= 0
        chunks = owners[rows[q][valid]]
        _, first = np.unique(chunks, return_index=True)  # the first hit of a chunk is its best window
        keep = np.sort(first)[:k]
        out_s[q, : len(keep)] = scores[q][valid][keep]
        out_r[q, : len(keep)] = chunks[keep]
    return out_s, out_r

