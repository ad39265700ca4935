"""Index layer: FAISS dense index, BM25 and reciprocal rank fusion."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import bm25s
import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verbatim_batch.retrieval.index import (
    Bm25Index,
    DenseSpec,
    build_dense,
    load_dense,
    resolve_spec,
    rrf,
    save_dense,
    search_dense,
    set_nprobe,
    tokenize,
)
from verbatim_batch.retrieval.index.dense import DENSE_FILE, auto_pq_m

# ---------------------------------------------------------------------------- helpers


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(n: int, dim: int, seed: int, n_centres: int = 100, noise: float = 1.5, centres_seed: int = 0):
    """L2-normalised Gaussian-mixture vectors like benchmarks/bench_index.py's (smaller).

    Offsets from the centres have expected norm ``noise`` and a power-law spectrum
    (variance of the i-th direction ~ 1/i, randomly rotated), so clusters overlap
    and near neighbours are meaningful, as with real embeddings.
    """
    rng0 = np.random.default_rng(centres_seed)
    centres = unit(rng0.standard_normal((n_centres, dim)))
    spectrum = np.arange(1, dim + 1) ** -0.5
    spectrum /= np.sqrt((spectrum**2).sum())
    rotation = np.linalg.qr(rng0.standard_normal((dim, dim)))[0]
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, n_centres, n)] + (rng.standard_normal((n, dim)) * spectrum) @ rotation * noise
    return unit(x)


def factory(x: np.ndarray, batch: int = 1000, calls: list | None = None):
    def batches():
        if calls is not None:
            calls.append(1)
        for start in range(0, len(x), batch):
            yield x[start : start + batch]

    return batches


def brute_force(x: np.ndarray, q: np.ndarray, k: int):
    sims = q @ x.T
    rows = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, rows, axis=1), rows


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(f[f >= 0], t)) / len(t) for f, t in zip(found, truth, strict=True)]))


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    """FAISS's OpenMP threads spin when the CPUs are shared (CI, parallel test runs): one thread is
    both faster and steadier there for these small indexes."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def data20k():
    x = clustered(20_000, 64, seed=1)
    q = clustered(200, 64, seed=2)
    return x, q


@pytest.fixture(scope="module")
def flat20k(data20k):
    x, q = data20k
    index, spec = build_dense(factory(x), len(x), 64, DenseSpec(kind="flat"))
    return index, search_dense(index, q, 10)


@pytest.fixture(scope="module")
def ivf20k(data20k):
    x, _ = data20k
    return build_dense(factory(x, batch=3000), len(x), 64, DenseSpec(kind="ivf_flat"))


# ---------------------------------------------------------------------------- dense: search quality


def test_flat_exact_topk():
    x = unit(np.random.default_rng(0).standard_normal((3000, 32)))
    q = unit(np.random.default_rng(1).standard_normal((50, 32)))
    index, spec = build_dense(factory(x, batch=700), len(x), 32, DenseSpec(kind="flat"))
    assert spec.kind == "flat" and index.ntotal == 3000
    scores, rows = search_dense(index, q, 10)
    want_scores, want_rows = brute_force(x, q, 10)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (50, 10)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


def test_flat_accepts_float16_and_empty_batches():
    x = unit(np.random.default_rng(0).standard_normal((500, 16)))
    x16 = x.astype(np.float16)

    def batches():
        yield x16[:0]
        yield x16[:200]
        yield x16[200:0:-1][:0]
        yield x16[200:]

    index, _ = build_dense(batches, 500, 16, DenseSpec(kind="flat"))
    _, rows = search_dense(index, x16[:5].astype(np.float32), 1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_search_pads_with_minus_one():
    x = unit(np.random.default_rng(0).standard_normal((3, 8)))
    index, _ = build_dense(factory(x), 3, 8, DenseSpec(kind="flat"))
    scores, rows = search_dense(index, x[:2], 5)
    assert rows.shape == (2, 5) and (rows[:, 3:] == -1).all() and (scores[:, 3:] == 0).all()
    assert rows[0, 0] == 0 and rows[1, 0] == 1
    empty, _ = build_dense(lambda: iter(()), 0, 8, DenseSpec())
    scores, rows = search_dense(empty, x[:1], 3)
    assert (rows == -1).all() and (scores == 0).all()
    with pytest.raises(ValueError, match="shape"):
        search_dense(index, np.zeros((2, 9), np.float32), 1)
    with pytest.raises(ValueError, match="k must"):
        search_dense(index, x[:1], 0)


def test_ivf_flat_recall_and_exact_with_all_lists(data20k, flat20k, ivf20k):
    x, q = data20k
    _, (flat_scores, flat_rows) = flat20k
    index, spec = ivf20k
    assert spec.kind == "ivf_flat" and spec.nlist == 512 and spec.nprobe == 128 and spec.train_size == 20_000
    _, rows = search_dense(index, q, 10)
    assert recall(rows, flat_rows) >= 0.95
    set_nprobe(index, spec.nlist)
    scores, rows = search_dense(index, q, 10)
    np.testing.assert_allclose(scores, flat_scores, atol=1e-5)
    # same rows, except where two candidates score the same up to float rounding
    near_tie = np.zeros_like(flat_rows, dtype=bool)
    near_tie[:, 1:] |= np.abs(np.diff(flat_scores, axis=1)) < 1e-5
    near_tie[:, :-1] |= near_tie[:, 1:].copy()
    assert ((rows == flat_rows) | near_tie).all()
    set_nprobe(index, spec.nprobe)


def test_ivf_pq_recall(data20k, flat20k):
    x, q = data20k
    _, (_, flat_rows) = flat20k
    # 16 bytes for 64 dims (the auto pq_m, 8, gives ~0.55 here, like 48 bytes for 384 dims at 1M);
    # a small training sample keeps PQ's 16 x 256-centroid k-means quick
    spec = DenseSpec(kind="ivf_pq", pq_m=16, nlist=128, train_size=6000)
    index, spec = build_dense(factory(x, batch=4096), len(x), 64, spec)
    assert spec.kind == "ivf_pq" and spec.pq_m == 16 and isinstance(index, faiss.IndexIVFPQ)
    _, rows = search_dense(index, q, 10)
    assert recall(rows, flat_rows) >= 0.6


# ---------------------------------------------------------------------------- dense: spec


def test_resolve_spec_picks_kind_by_size():
    spec = DenseSpec(flat_max=1000, pq_min=5000)
    assert resolve_spec(spec, 999, 64).kind == "flat"
    assert resolve_spec(spec, 1000, 64).kind == "ivf_flat"
    assert resolve_spec(spec, 4999, 64).kind == "ivf_flat"
    assert resolve_spec(spec, 5000, 64).kind == "ivf_pq"
    assert resolve_spec(DenseSpec(), 999_999, 384).kind == "flat"
    assert resolve_spec(DenseSpec(), 1_000_000, 384).kind == "ivf_flat"
    assert resolve_spec(DenseSpec(), 20_000_000, 384).kind == "ivf_pq"
    flat = resolve_spec(DenseSpec(), 10, 8)
    assert (flat.nlist, flat.pq_m, flat.nprobe, flat.train_size) == (0, 0, 0, 0)


def test_resolve_spec_auto_values():
    r = resolve_spec(DenseSpec(kind="ivf_flat"), 1_000_000, 384)
    assert r.nlist == 4000 and r.nprobe == 128 and r.train_size == 160_000 and r.pq_m == 0
    assert r.use_gpu == "auto"  # decided where the index is built
    r = resolve_spec(DenseSpec(kind="ivf_pq"), 100_000_000, 768)
    assert r.nlist == 40_000 and r.pq_m == 96 and r.nprobe == 128 and r.train_size == 1_600_000
    assert resolve_spec(DenseSpec(kind="ivf_flat"), 10**12, 64).nlist == 65_536
    small = resolve_spec(DenseSpec(kind="ivf_flat"), 1000, 64)
    assert small.nlist == 1000 // 39 and small.train_size == 1000 and small.nprobe == small.nlist
    assert resolve_spec(DenseSpec(kind="ivf_flat"), 20, 8).nlist == 1
    assert [auto_pq_m(d) for d in (384, 768, 1024, 64, 100, 7)] == [48, 96, 128, 8, 10, 1]


def test_resolve_spec_honours_overrides():
    spec = DenseSpec(kind="ivf_pq", nlist=100, pq_m=16, nprobe=7, train_size=5000, seed=3)
    r = resolve_spec(spec, 50_000, 64)
    assert (r.kind, r.nlist, r.pq_m, r.nprobe, r.train_size, r.seed) == ("ivf_pq", 100, 16, 7, 5000, 3)
    assert resolve_spec(DenseSpec(kind="flat"), 10**8, 64).kind == "flat"


@pytest.mark.parametrize(
    ("spec", "n", "dim", "match"),
    [
        (DenseSpec(kind="hnsw"), 100, 8, "kind"),
        (DenseSpec(kind="ivf_flat", nlist=200), 100, 8, "nlist=200 is larger"),
        (DenseSpec(kind="ivf_flat", nlist=0), 100, 8, "nlist must"),
        (DenseSpec(kind="ivf_flat", nlist=10, nprobe=11), 1000, 8, "nprobe=11"),
        (DenseSpec(kind="ivf_flat", train_size=2000), 1000, 8, "train_size=2000"),
        (DenseSpec(kind="ivf_flat", nlist=20, train_size=10), 1000, 8, "smaller than nlist"),
        (DenseSpec(kind="ivf_pq", pq_m=5), 10_000, 64, "pq_m=5 must divide"),
        (DenseSpec(kind="ivf_pq"), 200, 64, "at least 256"),
        (DenseSpec(kind="ivf_flat"), 0, 8, "at least one vector"),
        (DenseSpec(use_gpu="maybe"), 100, 8, "use_gpu"),
        (DenseSpec(flat_max=10, pq_min=5), 100, 8, "flat_max"),
        (DenseSpec(nprobe=2.5), 100, 8, "nprobe must"),
        (DenseSpec(nlist=True), 100, 8, "nlist must"),
        (DenseSpec(), -1, 8, "n must"),
        (DenseSpec(), 10, 0, "dim must"),
    ],
)
def test_resolve_spec_rejects(spec, n, dim, match):
    with pytest.raises(ValueError, match=match):
        resolve_spec(spec, n, dim)


def test_use_gpu_yes_without_gpu_fails():
    if faiss.get_num_gpus() > 0:
        pytest.skip("this machine has a GPU")
    x = clustered(2000, 16, seed=0)
    with pytest.raises(ValueError, match="no GPU"):
        build_dense(factory(x), 2000, 16, DenseSpec(kind="ivf_flat", use_gpu="yes"))
    _, spec = build_dense(factory(x), 2000, 16, DenseSpec(kind="ivf_flat"))
    assert spec.use_gpu == "no"


@pytest.mark.parametrize("kind", ["ivf_flat", "ivf_pq"])
def test_gpu_path_logic_with_cpu_stand_ins(monkeypatch, kind):
    """The GPU build path, with CPU copies standing in for GPU indexes: same index as the CPU path."""
    import verbatim_batch.retrieval.index.dense as dense

    x = clustered(4000, 16, seed=4)
    spec = DenseSpec(kind=kind, nlist=32, pq_m=4, train_size=2000)
    cpu_index, cpu_spec = build_dense(factory(x), len(x), 16, spec)
    moved = []

    def to_gpus(index):
        moved.append(type(index).__name__)
        return faiss.clone_index(index)

    monkeypatch.setattr(dense, "_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_gpus)
    gpu_index, gpu_spec = build_dense(factory(x), len(x), 16, spec)
    assert len(moved) == 2  # the k-means assignment index, then the add-time quantizer
    assert (cpu_spec.use_gpu, gpu_spec.use_gpu) == ("no", "yes")
    ivf = faiss.extract_index_ivf(gpu_index)
    assert ivf.quantizer.ntotal == 32 and type(gpu_index) is type(cpu_index)
    assert faiss.serialize_index(gpu_index).tobytes() == faiss.serialize_index(cpu_index).tobytes()
    flat, flat_spec = build_dense(factory(x), len(x), 16, DenseSpec(kind="flat"))
    assert flat_spec.use_gpu == "no" and len(moved) == 2  # flat never goes to the GPU


# ---------------------------------------------------------------------------- dense: streaming


def test_ivf_streams_twice_without_holding_all_vectors():
    n, dim = 300_000, 16
    calls: list = []

    def batches():  # generated on the fly: nothing holds the whole stream
        calls.append(1)
        for i in range(n // 5000):
            yield clustered(5000, dim, seed=1000 + i, n_centres=64)

    full_bytes = n * dim * 4
    tracemalloc.start()
    try:
        index, spec = build_dense(batches, n, dim, DenseSpec(kind="ivf_flat", nlist=64, train_size=4000, seed=7))
        _, peak = tracemalloc.get_traced_memory()  # numpy buffers; faiss's own storage is not traced
    finally:
        tracemalloc.stop()
    assert len(calls) == 2 and index.ntotal == n and index.is_trained
    assert spec.train_size == 4000
    assert peak < full_bytes / 2, f"python-side peak {peak} vs stream {full_bytes}"
    calls.clear()
    flat, _ = build_dense(batches, n, dim, DenseSpec(kind="flat"))
    assert len(calls) == 1 and flat.ntotal == n


def test_train_sample_is_seeded_and_uniform():
    from verbatim_batch.retrieval.index.dense import _train_sample

    x = np.arange(10_000 * 4, dtype=np.float32).reshape(10_000, 4)
    spec = resolve_spec(DenseSpec(kind="ivf_flat", nlist=10, train_size=500, seed=5), 10_000, 4)
    a = _train_sample(factory(x, batch=333), 10_000, 4, spec)
    b = _train_sample(factory(x, batch=4096), 10_000, 4, spec)
    np.testing.assert_array_equal(a, b)  # independent of batching
    rows = (a[:, 0] / 4).astype(int)
    assert len(set(rows)) == 500 and (np.diff(rows) > 0).all()
    assert 3500 < rows.mean() < 6500  # spread over the whole stream, not a prefix
    other_seed = resolve_spec(DenseSpec(kind="ivf_flat", nlist=10, train_size=500), 10_000, 4)
    c = _train_sample(factory(x), 10_000, 4, other_seed)
    assert not np.array_equal(a, c)


def test_same_seed_same_index():
    x = clustered(5000, 16, seed=3)
    spec = DenseSpec(kind="ivf_flat", nlist=32, train_size=2000, seed=1)
    a, _ = build_dense(factory(x), len(x), 16, spec)
    b, _ = build_dense(factory(x, batch=777), len(x), 16, spec)
    assert faiss.serialize_index(a).tobytes() == faiss.serialize_index(b).tobytes()


@pytest.mark.parametrize("kind", ["flat", "ivf_flat"])
def test_stream_validation(kind):
    x = clustered(3000, 16, seed=0)
    spec = DenseSpec(kind=kind, nlist=8)

    def wrong_dim():
        yield x[:1000]
        yield x[1000:2000]
        yield np.zeros((5, 17), np.float32)

    with pytest.raises(ValueError, match=r"batch 2 \(starting at row 2000\) has shape \(5, 17\)"):
        build_dense(wrong_dim, 2005, 16, spec)

    def with_nan():
        bad = x[1000:2000].copy()
        bad[[3, 10], 5] = np.nan
        bad[20, 0] = np.inf
        yield x[:1000]
        yield bad

    with pytest.raises(ValueError, match=r"batch 1 .* 3 row\(s\) with NaN/inf .*first: row 1003"):
        build_dense(with_nan, 2000, 16, spec)
    with pytest.raises(ValueError, match="has 3000 rows, expected n=3001"):
        build_dense(factory(x), 3001, 16, spec)
    with pytest.raises(ValueError, match="more than n=2999 rows"):
        build_dense(factory(x), 2999, 16, spec)
    with pytest.raises(ValueError, match="dtype int64"):
        build_dense(lambda: iter([np.zeros((3000, 16), np.int64)]), 3000, 16, spec)


def test_second_pass_must_match_first():
    x = clustered(3000, 16, seed=0)
    calls = []

    def shrinking():
        calls.append(1)
        return iter([x if len(calls) == 1 else x[:2500]])

    with pytest.raises(ValueError, match="add pass: the stream has 2500 rows"):
        build_dense(shrinking, 3000, 16, DenseSpec(kind="ivf_flat", nlist=8))


# ---------------------------------------------------------------------------- dense: save / load


def test_save_load_round_trip(tmp_path: Path, data20k, ivf20k, flat20k):
    x, q = data20k
    cases = {"ivf": ivf20k[0], "flat": flat20k[0]}
    pq, _ = build_dense(factory(x[:5000]), 5000, 64, DenseSpec(kind="ivf_pq", nlist=16, pq_m=8, train_size=1000))
    cases["pq"] = pq
    for name, index in cases.items():
        folder = tmp_path / name
        save_dense(index, folder)
        assert (folder / DENSE_FILE).is_file()
        want = search_dense(index, q, 10)
        for mmap in (False, True, "auto"):
            loaded = load_dense(folder, mmap=mmap)
            got = search_dense(loaded, q, 10)
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"{name} mmap={mmap}")
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"{name} mmap={mmap}")
    with pytest.raises(ValueError, match="mmap"):
        load_dense(tmp_path / "flat", mmap="yes")
    with pytest.raises(FileNotFoundError):
        load_dense(tmp_path / "missing")


def test_load_applies_nprobe(tmp_path: Path, data20k, ivf20k):
    _, q = data20k
    index, spec = ivf20k
    save_dense(index, tmp_path)
    assert faiss.extract_index_ivf(load_dense(tmp_path)).nprobe == spec.nprobe == 128  # saved with the index
    for mmap in (False, True):
        loaded = load_dense(tmp_path, mmap=mmap, nprobe=3)
        assert faiss.extract_index_ivf(loaded).nprobe == 3
        set_nprobe(index, 3)
        np.testing.assert_array_equal(search_dense(loaded, q, 10)[1], search_dense(index, q, 10)[1])
        set_nprobe(index, spec.nprobe)
    with pytest.raises(ValueError, match="nprobe"):
        load_dense(tmp_path, nprobe=spec.nlist + 1)


# ---------------------------------------------------------------------------- bm25

DOCS = [
    "The Transformer achieves 45.3 BLEU on the WMT14 English-German benchmark.",
    "We fine-tune BERT on SQuAD and report exact match and F1.",
    "",
    "The zygomorphic flowers of orchids are studied with BERT embeddings.",
    "Our model improves BLEU by 2.1 points over the transformer baseline.",
    "   ",
    "Dropout and weight decay regularise the transformer model.",
]


@pytest.fixture(scope="module")
def bm25():
    return Bm25Index.build(DOCS)


def test_tokenize():
    assert tokenize("The Model's F1 is 45.3% (vs. 44,1) on WMT14; e.g. BERT-base") == [
        "model", "f1", "45.3", "vs", "44", "1", "wmt14", "e", "g", "bert", "base",
    ]  # fmt: skip
    assert tokenize("") == [] and tokenize("the of and") == []
    assert tokenize("ﬁne-tuning ÉCOLE Straße") == ["fine", "tuning", "école", "strasse"]  # NFKC + casefold
    assert tokenize("version 1.2.3, under_score") == ["version", "1.2.3", "under", "score"]


def test_bm25_rare_term_first(bm25):
    assert bm25.n_docs == len(DOCS)
    scores, rows = bm25.search(["zygomorphic", "orchids flowers", "BLEU transformer"], 3)
    assert rows[0].tolist() == [3, -1, -1] and scores[0, 0] > 0 and (scores[0, 1:] == 0).all()
    assert rows[1, 0] == 3
    assert set(rows[2, :2].tolist()) == {0, 4}  # both terms
    assert rows[2, 2] == 6  # one term
    assert (np.diff(scores, axis=1) <= 0).all()


def test_bm25_unknown_and_empty_queries(bm25):
    scores, rows = bm25.search(["qwertyuiop", "", "the of and", "qwertyuiop zygomorphic"], 4)
    assert (rows[:3] == -1).all() and (scores[:3] == 0).all()
    assert rows[3].tolist() == [3, -1, -1, -1]
    scores, rows = bm25.search([], 5)
    assert scores.shape == (0, 5) and rows.shape == (0, 5)
    with pytest.raises(ValueError, match="list of strings"):
        bm25.search("transformer", 3)
    with pytest.raises(ValueError, match="k must"):
        bm25.search(["transformer"], 0)


def test_bm25_matches_bm25s_scores(bm25):
    reference = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    reference.index([tokenize(d) for d in DOCS], show_progress=False)
    for query in ["transformer BLEU model", "bert embeddings bert", "weight decay dropout"]:
        toks = tokenize(query)
        want = reference.get_scores(toks)
        scores, rows = bm25.search([query], len(DOCS))
        got = np.zeros(len(DOCS), np.float32)
        got[rows[0][rows[0] >= 0]] = scores[0][rows[0] >= 0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_bm25_tie_break_by_row():
    index = Bm25Index.build(["apple pie", "banana", "apple pie", "pie apple", "apple pie", "cherry"])
    for k in (2, 3, 4, 10):
        scores, rows = index.search(["apple"], k)
        want = [0, 2, 3, 4][:k]
        assert rows[0, : len(want)].tolist() == want
        assert len(set(scores[0, : len(want)].tolist())) == 1
        assert (rows[0, len(want) :] == -1).all()


def test_bm25_empty_corpora():
    for docs in ([], ["", " ", "the"]):
        index = Bm25Index.build(docs)
        assert index.n_docs == len(docs)
        scores, rows = index.search(["anything", "the"], 3)
        assert (rows == -1).all() and (scores == 0).all()


def test_bm25_save_load_round_trip(tmp_path: Path, bm25):
    bm25.save(tmp_path)
    params = json.loads((tmp_path / "bm25_params.json").read_text())
    assert params["tokenizer"] == "vb-simple-1" and params["n_docs"] == len(DOCS)
    queries = ["transformer BLEU", "bert", "zygomorphic orchids", "nothing here qq"]
    want = bm25.search(queries, 5)
    for mmap in (False, True):
        loaded = Bm25Index.load(tmp_path, mmap=mmap)
        assert loaded.n_docs == len(DOCS)
        got = loaded.search(queries, 5)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    # bm25s itself reads the files too
    assert bm25s.BM25.load(str(tmp_path), show_progress=False).scores["num_docs"] == len(DOCS)
    params["tokenizer"] = "other"
    (tmp_path / "bm25_params.json").write_text(json.dumps(params))
    with pytest.raises(ValueError, match="tokenizer"):
        Bm25Index.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        Bm25Index.load(tmp_path / "missing")


def test_bm25_deterministic(tmp_path: Path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    docs = [" ".join(rng.choice(words, size=rng.integers(0, 40))) for _ in range(2000)]
    a, b = Bm25Index.build(docs), Bm25Index.build(iter(docs))
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    for name in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    queries = [" ".join(rng.choice(words, size=3)) for _ in range(50)]
    ra, rb = a.search(queries, 20), b.search(queries, 20)
    np.testing.assert_array_equal(ra[1], rb[1])
    # against a brute-force ordering of the same scores: score desc, then row asc
    full_scores, full_rows = a.search(queries, 2000)
    for qi in range(len(queries)):
        hit = full_rows[qi] >= 0
        order = np.lexsort((full_rows[qi][hit], -full_scores[qi][hit]))
        np.testing.assert_array_equal(full_rows[qi][hit][order][:20], ra[1][qi][ra[1][qi] >= 0])


def test_bm25_search_budget_split(monkeypatch, bm25):
    want = bm25.search(["transformer BLEU", "bert", "model", "dropout"], 4)
    monkeypatch.setattr("verbatim_batch.retrieval.index.bm25.SEARCH_BUDGET", 1)
    got = bm25.search(["transformer BLEU", "bert", "model", "dropout"], 4)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


def test_bm25_rejects_bad_input():
    with pytest.raises(ValueError, match="document 1"):
        Bm25Index.build(["ok", None])
    with pytest.raises(ValueError, match="k1"):
        Bm25Index.build(["ok"], k1=-1)
    with pytest.raises(ValueError, match="b must"):
        Bm25Index.build(["ok"], b=1.5)


# ---------------------------------------------------------------------------- fusion


def test_rrf_hand_computed():
    ranked = {"dense": [[1, 2, 3]], "bm25": [[3, 1, 4]]}
    out = rrf(ranked, weights={"dense": 1.0, "bm25": 0.5}, k=10, rrf_k=60)
    assert len(out) == 1
    rows = [r for r, _, _ in out[0]]
    assert rows == [1, 3, 2, 4]
    expected = {
        1: 1 / 61 + 0.5 / 62,  # 0.016393443 + 0.008064516 = 0.024457959
        3: 1 / 63 + 0.5 / 61,  # 0.015873016 + 0.008196721 = 0.024069737
        2: 1 / 62,  # 0.016129032
        4: 0.5 / 63,  # 0.007936508
    }
    for row, score, _ in out[0]:
        assert score == pytest.approx(expected[row], rel=1e-12)
    assert out[0][0][1] == pytest.approx(0.02445795875, rel=1e-9)
    assert {r: ranks for r, _, ranks in out[0]} == {
        1: {"dense": 1, "bm25": 2},
        3: {"dense": 3, "bm25": 1},
        2: {"dense": 2, "bm25": None},
        4: {"dense": None, "bm25": 3},
    }
    assert [r for r, _, _ in rrf(ranked, weights={"dense": 1.0, "bm25": 0.5}, k=2)[0]] == [1, 3]


def test_rrf_tie_breaks():
    # equal scores and equal best rank: lower row first
    out = rrf({"dense": [[7, 5]], "bm25": [[5, 7]]})
    assert [r for r, _, _ in out[0]] == [5, 7] and out[0][0][1] == out[0][1][1]
    # equal scores (0.5), different best ranks: best individual rank first, whatever the row id
    out = rrf({"dense": [[7, 3]], "bm25": [[9]]}, weights={"dense": 1.0, "bm25": 0.5}, rrf_k=0)
    assert [(r, s) for r, s, _ in out[0]] == [(7, 1.0), (9, 0.5), (3, 0.5)]
    # deterministic whatever the method order
    a = rrf({"dense": [[1, 2, 3, 4]], "bm25": [[4, 3, 2, 1]]})
    b = rrf({"bm25": [[4, 3, 2, 1]], "dense": [[1, 2, 3, 4]]})
    assert [r for r, _, _ in a[0]] == [r for r, _, _ in b[0]] == [1, 4, 2, 3]


def test_rrf_edge_cases():
    out = rrf({"dense": [[], [3, 3, 1]], "bm25": [[], []]}, k=5)
    assert out[0] == []
    assert [(r, ranks["dense"]) for r, _, ranks in out[1]] == [(3, 1), (1, 3)]  # repeated row keeps its best rank
    # a zero-weight method brings no candidates but reports ranks
    out = rrf({"dense": [[1]], "bm25": [[2, 1]]}, weights={"bm25": 0.0})
    assert out == [[(1, 1 / 61, {"dense": 1, "bm25": 2})]]


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({"dense": -1.0}, "finite number >= 0"),
        ({"dense": 0.0, "bm25": 0.0}, "at least one weight"),
        ({"sparse": 1.0}, "unknown methods"),
        ({"dense": float("nan")}, "finite"),
        ({"dense": "1"}, "finite"),
    ],
)
def test_rrf_rejects_bad_weights(weights, match):
    with pytest.raises(ValueError, match=match):
        rrf({"dense": [[1]], "bm25": [[2]]}, weights=weights)


def test_rrf_rejects_bad_input():
    with pytest.raises(ValueError, match="number of queries"):
        rrf({"dense": [[1]], "bm25": [[2], [3]]})
    with pytest.raises(ValueError, match="negative row"):
        rrf({"dense": [[1, -1]]})
    with pytest.raises(ValueError, match="non-empty"):
        rrf({})
    with pytest.raises(ValueError, match="k must"):
        rrf({"dense": [[1]]}, k=0)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 30), max_size=12, unique=True), min_size=2, max_size=2),
    st.floats(0.01, 5.0),
    st.integers(0, 100),
)
def test_rrf_scores_follow_formula(lists, weight, rrf_k):
    out = rrf({"a": [lists[0]], "b": [lists[1]]}, weights={"a": 1.0, "b": weight}, k=100, rrf_k=rrf_k)[0]
    assert {r for r, _, _ in out} == set(lists[0]) | set(lists[1])
    for row, score, ranks in out:
        want = 0.0
        if row in lists[0]:
            assert ranks["a"] == lists[0].index(row) + 1
            want += 1.0 / (rrf_k + ranks["a"])
        if row in lists[1]:
            assert ranks["b"] == lists[1].index(row) + 1
            want += weight / (rrf_k + ranks["b"])
        assert score == pytest.approx(want)
    assert all(out[i][1] >= out[i + 1][1] for i in range(len(out) - 1))


def test_rrf_fill_missing_counts_an_unlisted_row_just_past_the_list():
    """With fill_missing a row one method did not list counts at that method's len(list) + 1: BM25's top hit,
    below dense's candidate depth, is not scored as if dense had never looked (reported rank stays None)."""
    ranked = {"dense": [[5, 6, 7]], "bm25": [[1, 5]]}
    out = rrf(ranked, weights={"dense": 0.2, "bm25": 1.0}, k=10, rrf_k=5, fill_missing=True)[0]
    score = {r: s for r, s, _ in out}
    assert score[1] == pytest.approx(1.0 / 6 + 0.2 / (5 + 4))  # dense: past its 3 rows
    assert score[5] == pytest.approx(1.0 / 7 + 0.2 / 6)
    assert score[6] == pytest.approx(1.0 / (5 + 3) + 0.2 / 7)  # bm25: past its 2 rows
    assert [r for r, _, _ in out] == [1, 5, 6, 7]
    assert {r: ranks for r, _, ranks in out}[1] == {"dense": None, "bm25": 1}
    plain = {r: s for r, s, _ in rrf(ranked, weights={"dense": 0.2, "bm25": 1.0}, rrf_k=5)[0]}
    assert plain[1] == pytest.approx(1.0 / 6) and plain[6] == pytest.approx(0.2 / 7)
