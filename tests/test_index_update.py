"""Incremental dense index updates (remove rows, append vectors) and the rebuild decision."""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np
import pytest

from verbatim_batch.retrieval.index import (
    DenseSpec,
    build_dense,
    load_dense,
    plan_update,
    save_dense,
    search_dense,
    update_dense,
)
from verbatim_batch.retrieval.index.dense import DENSE_FILE

DIM = 16
N_OLD = 600
NLIST = 8
SPECS = {
    "flat": DenseSpec(kind="flat"),
    "ivf_flat": DenseSpec(kind="ivf_flat", nlist=NLIST, nprobe=NLIST, train_size=400),
    "ivf_pq": DenseSpec(kind="ivf_pq", nlist=NLIST, nprobe=NLIST, pq_m=4, train_size=400),
}


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    """Old vectors, rows to remove, new vectors, queries, and the expected vectors in expected row order."""
    rng = np.random.default_rng(42)
    old = unit(rng.standard_normal((N_OLD, DIM)))
    removed = rng.choice(N_OLD, size=70, replace=False)  # unsorted on purpose
    new = unit(rng.standard_normal((90, DIM)))
    queries = unit(rng.standard_normal((40, DIM)))
    expected = np.concatenate([np.delete(old, removed, axis=0), new])
    return old, removed, new, queries, expected


def build(kind: str, x: np.ndarray) -> faiss.Index:
    index, _ = build_dense(lambda: [x], len(x), DIM, SPECS[kind])
    return index


def list_contents(index: faiss.Index) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per inverted list: (ids sorted, codes in the same order), copied out of the index."""
    invlists = index.invlists
    out = []
    for list_no in range(index.nlist):
        size = invlists.list_size(list_no)
        if size == 0:
            out.append((np.empty(0, np.int64), np.empty((0, invlists.code_size), np.uint8)))
            continue
        ids = faiss.rev_swig_ptr(invlists.get_ids(list_no), size).copy()
        codes = faiss.rev_swig_ptr(invlists.get_codes(list_no), size * invlists.code_size).copy()
        order = np.argsort(ids)
        out.append((ids[order], codes.reshape(size, -1)[order]))
    return out


def trained_state(index: faiss.Index) -> list[np.ndarray]:
    state = [index.quantizer.reconstruct_n(0, index.nlist)]
    if isinstance(index, faiss.IndexIVFPQ):
        state.append(faiss.vector_to_array(index.pq.centroids))
    return state


# ---------------------------------------------------------------------------- flat


def test_flat_matches_fresh_index(data):
    old, removed, new, queries, expected = data
    index = build("flat", old)
    assert update_dense(index, removed, new) is index
    assert index.ntotal == len(expected)
    np.testing.assert_array_equal(index.reconstruct_n(0, index.ntotal), expected)
    fresh = faiss.IndexFlatIP(DIM)
    fresh.add(expected)
    for q in (queries, expected[:25], old[removed]):
        got, want = search_dense(index, q, 10), search_dense(fresh, q, 10)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_flat_empty_index_and_remove_everything(data):
    old, _, new, queries, _ = data
    index = faiss.IndexFlatIP(DIM)
    update_dense(index, [], new)
    np.testing.assert_array_equal(index.reconstruct_n(0, index.ntotal), new)
    update_dense(index, np.arange(len(new)), np.empty((0, DIM), np.float32))
    assert index.ntotal == 0
    scores, rows = search_dense(index, queries, 3)
    assert (rows == -1).all()


# ---------------------------------------------------------------------------- IVF


@pytest.mark.parametrize("kind", ["ivf_flat", "ivf_pq"])
def test_ivf_matches_fresh_add_with_same_training(data, kind):
    """The updated index holds exactly what adding the expected vectors to the same trained index gives."""
    old, removed, new, queries, expected = data
    index = build(kind, old)
    reference = faiss.clone_index(index)
    reference.reset()  # keeps the trained quantizer and codebooks
    reference.add(expected)
    trained = trained_state(index)

    assert update_dense(index, removed, new) is index
    assert index.ntotal == len(expected)
    assert index.is_trained
    for before, after in zip(trained, trained_state(index), strict=True):
        np.testing.assert_array_equal(after, before)  # no retraining
    got_lists, want_lists = list_contents(index), list_contents(reference)
    all_ids = np.sort(np.concatenate([ids for ids, _ in got_lists]))
    np.testing.assert_array_equal(all_ids, np.arange(len(expected)))  # contiguous rows, removed ones gone
    for list_no, ((got_ids, got_codes), (want_ids, want_codes)) in enumerate(zip(got_lists, want_lists, strict=True)):
        np.testing.assert_array_equal(got_ids, want_ids, err_msg=f"list {list_no}")
        np.testing.assert_array_equal(got_codes, want_codes, err_msg=f"list {list_no}")
    for nprobe in (1, 3, NLIST):
        index.nprobe = reference.nprobe = nprobe
        got, want = search_dense(index, queries, 10), search_dense(reference, queries, 10)
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"nprobe={nprobe}")
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)


def test_ivf_flat_rows_found_and_removed_gone(data):
    old, removed, new, _, expected = data
    index = update_dense(build("ivf_flat", old), removed, new)
    index.nprobe = NLIST  # every list: exact search
    scores, rows = search_dense(index, expected, 1)
    np.testing.assert_array_equal(rows[:, 0], np.arange(len(expected)))
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    # A removed vector is no longer there: its best match is another vector (brute force over expected).
    scores, rows = search_dense(index, old[removed], 1)
    sims = old[removed] @ expected.T
    np.testing.assert_array_equal(rows[:, 0], sims.argmax(axis=1))
    assert (scores[:, 0] < 0.999).all()


@pytest.mark.parametrize("map_type", ["Array", "Hashtable"])
def test_ivf_direct_map_is_rebuilt(data, map_type):
    old, removed, new, _, expected = data
    index = build("ivf_flat", old)
    index.set_direct_map_type(getattr(faiss.DirectMap, map_type))
    update_dense(index, removed, new)
    assert index.direct_map.type == getattr(faiss.DirectMap, map_type)
    np.testing.assert_array_equal(index.reconstruct_n(0, index.ntotal), expected)  # IVF-Flat stores raw vectors


def test_ivf_remove_everything_then_add(data):
    old, _, new, _, _ = data
    index = build("ivf_flat", old)
    update_dense(index, np.arange(N_OLD), new)
    assert index.ntotal == len(new)
    scores, rows = search_dense(index, new, 1)
    np.testing.assert_array_equal(rows[:, 0], np.arange(len(new)))


@pytest.mark.parametrize("kind", ["flat", "ivf_flat", "ivf_pq"])
def test_nothing_to_do_keeps_index_equivalent(data, kind):
    old, _, _, queries, _ = data
    index = build(kind, old)
    want = search_dense(index, queries, 10)
    before = list_contents(index) if kind != "flat" else None
    for removed, new in (([], np.empty((0, DIM), np.float32)), (np.array([], np.int64), [])):
        assert update_dense(index, removed, new) is index
        assert index.ntotal == N_OLD
        got = search_dense(index, queries, 10)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
    if before is not None:
        for (a_ids, a_codes), (b_ids, b_codes) in zip(before, list_contents(index), strict=True):
            np.testing.assert_array_equal(a_ids, b_ids)
            np.testing.assert_array_equal(a_codes, b_codes)


def test_new_vectors_converted(data):
    old, removed, new, _, expected = data
    index = update_dense(build("flat", old), removed, new.astype(np.float64)[:, :])
    np.testing.assert_array_equal(index.reconstruct_n(0, index.ntotal), expected)
    strided = np.repeat(new, 2, axis=0)[::2]  # not contiguous
    index = update_dense(build("flat", old), removed, strided)
    np.testing.assert_array_equal(index.reconstruct_n(0, index.ntotal), expected)


# ---------------------------------------------------------------------------- save / load / mmap


@pytest.mark.parametrize("kind", ["flat", "ivf_flat", "ivf_pq"])
def test_updated_index_round_trip(tmp_path: Path, data, kind):
    old, removed, new, queries, expected = data
    index = update_dense(build(kind, old), removed, new)
    save_dense(index, tmp_path)
    want = search_dense(index, queries, 10)
    for mmap in (False, True):
        loaded = load_dense(tmp_path, mmap=mmap)
        assert loaded.ntotal == len(expected)
        got = search_dense(loaded, queries, 10)
        np.testing.assert_array_equal(got[1], want[1], err_msg=f"mmap={mmap}")
        np.testing.assert_array_equal(got[0], want[0], err_msg=f"mmap={mmap}")
    # A loaded (not mapped) index can be updated again.
    loaded = load_dense(tmp_path, mmap=False)
    update_dense(loaded, np.arange(len(new)), new[:5])
    assert loaded.ntotal == len(expected) - len(new) + 5


@pytest.mark.parametrize("kind", ["flat", "ivf_flat", "ivf_pq"])
def test_mapped_index_is_refused_and_left_intact(tmp_path: Path, data, kind):
    """A memory-mapped index is read-only: update_dense raises (FAISS itself would raise for IVF's
    OnDiskInvertedLists, but abort or segfault the process when writing a mapped flat index)."""
    old, removed, new, queries, _ = data
    save_dense(build(kind, old), tmp_path)
    mapped = [load_dense(tmp_path, mmap=True)]
    ifc = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    if ifc is not None and kind != "flat":  # IVF lists mapped in place as ArrayInvertedLists views
        mapped.append(faiss.read_index(str(tmp_path / DENSE_FILE), ifc | faiss.IO_FLAG_READ_ONLY))
    for index in mapped:
        want = search_dense(index, queries, 5)
        with pytest.raises(ValueError, match="mmap=False"):
            update_dense(index, removed, new)
        assert index.ntotal == N_OLD
        got = search_dense(index, queries, 5)
        np.testing.assert_array_equal(got[1], want[1])


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("removed", "new", "match"),
    [
        ([1, 2], np.zeros((3, DIM + 1), np.float32), r"shape \(3, 17\)"),
        ([1, 2], np.zeros(DIM, np.float32), r"shape \(16,\)"),
        ([1, 2], np.zeros((3, DIM), np.int64), "dtype int64"),
        ([1, 2], np.full((3, DIM), np.nan, np.float32), "NaN/inf"),
        ([1, 2], np.array([[0.0] * (DIM - 1) + [np.inf]], np.float32), "NaN/inf"),
        ([N_OLD], None, "outside 0..599"),
        ([-1], None, "outside 0..599"),
        ([5, 7, 5], None, "duplicate.*first: 5"),
        (np.zeros(N_OLD, bool), None, "not a mask"),
        ([1.0, 2.0], None, "integer row numbers"),
        ([[1, 2]], None, "1-D"),
    ],
)
@pytest.mark.parametrize("kind", ["flat", "ivf_flat"])
def test_bad_input_rejected_before_any_change(data, kind, removed, new, match):
    old, _, good_new, queries, _ = data
    index = build(kind, old)
    want = search_dense(index, queries, 5)
    with pytest.raises(ValueError, match=match):
        update_dense(index, removed, good_new if new is None else new)
    assert index.ntotal == N_OLD
    got = search_dense(index, queries, 5)
    np.testing.assert_array_equal(got[1], want[1])


def test_unsupported_or_untrained_or_relabelled_indexes(data):
    old, removed, new, _, _ = data
    with pytest.raises(TypeError, match="IndexHNSWFlat"):
        update_dense(faiss.IndexHNSWFlat(DIM, 8), [], new)
    with pytest.raises(TypeError, match="IndexIDMap"):
        update_dense(faiss.IndexIDMap(faiss.IndexFlatIP(DIM)), [], new)
    untrained = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, NLIST, faiss.METRIC_INNER_PRODUCT)
    with pytest.raises(ValueError, match="not trained"):
        update_dense(untrained, [], new)
    # IVF ids that are not the rows 0..n-1 (added with custom ids): refused, index untouched.
    index = build("ivf_flat", old[:400])
    index.add_with_ids(old[400:], np.arange(1000, 1000 + N_OLD - 400))
    with pytest.raises(ValueError, match="not contiguous"):
        update_dense(index, removed[removed < 400], new)
    assert index.ntotal == N_OLD


# ---------------------------------------------------------------------------- plan_update


@pytest.mark.parametrize(
    ("args", "action", "drift"),
    [
        ((100, 0, 0, 0.2), "unchanged", 0.0),
        ((0, 0, 0, 0.2), "unchanged", 0.0),
        ((100, 5, 10, 0.2), "added", 0.15),
        ((100, 10, 10, 0.2), "added", 0.2),  # at the bound: still added
        ((100, 11, 10, 0.2), "rebuilt", 0.21),
        ((100, 0, 1, 0.0), "rebuilt", 0.01),
        ((0, 0, 5, 10.0), "rebuilt", 5.0),  # nothing to update: build
        ((100, 100, 500, math.inf), "added", 6.0),  # flat: never needs a rebuild
        ((1000, 0, 300, 0.25), "rebuilt", 0.3),  # growth is bounded by the drift too
    ],
)
def test_plan_update(args, action, drift):
    got_action, got_drift = plan_update(*args)
    assert got_action == action
    assert got_drift == pytest.approx(drift)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 0, 0, 0.1), "n_old"),
        ((10, -1, 0, 0.1), "n_removed"),
        ((10, 0, 1.5, 0.1), "n_added"),
        ((10, 11, 0, 0.1), "larger than n_old"),
        ((10, 1, 1, -0.1), "max_drift"),
        ((10, 1, 1, math.nan), "max_drift"),
        ((10, 1, 1, "0.1"), "max_drift"),
        ((True, 1, 1, 0.1), "n_old"),
    ],
)
def test_plan_update_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        plan_update(*args)
