"""Digests of every table a chain run wrote, for the before/after-refactor check (tests/test_multinode.py).

A table's check has two parts:

* an **exact digest** ``[rows, sha256]`` over its rows in a canonical order, with every value hashed exactly
  except floats: text, ids, offsets, ranks, counts, flags, nulls and list lengths must not drift at all. A float
  is hashed only as "a finite float is here" (``nan``/``inf`` by name), so where floats are, and which are null,
  is exact too, but not their values;
* a **float fingerprint** per float column (scores, probabilities, vectors): sum, sum of squares, min, max and
  three projections on pseudo-random +-1 weights keyed by each row's exact content (so a vector or score
  moved to another row changes them), compared with ``FLOAT_ATOL + FLOAT_RTOL * |expected|``.

Float values are not hashed because they come out of float32 maths whose last bits depend on the CPU kernels
torch dispatches to (AVX-512, AVX2 and the scalar ``default`` kernels sum in different orders; issue 27):
the demo's vectors differ by up to 1.3e-7 per element between AVX2 and ``default``, and rounding before
hashing does not help, since a value next to a rounding boundary flips. Left out altogether: what
legitimately differs between two runs of the same inputs (run ids, creation times, latencies, the corpus path).

Regenerate ``DEMO_DIGESTS``/``DEMO_FLOATS`` after an intended change of the demo's outputs with
``python tests/chain_digest.py <demo output folder>`` (the folder ``verbatim-batch demo --output`` wrote).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Left out: run ids, times, and ``source`` (the corpus path differs from machine to machine).
VOLATILE = {"run_id", "created_at", "latency_ms", "source"}

# Float fingerprints agree when |got - want| <= FLOAT_ATOL + FLOAT_RTOL * |want|, per statistic. Measured on the
# demo (AVX2 vs ATEN_CPU_CAPABILITY=default, the same machine): vector elements differ by <= 1.3e-7, scores and
# relevances by <= 2.2e-7, the fingerprints' statistics by <= 2e-5. A real change (another model, pooling or
# text, a vector on the wrong row, one value off by 1e-2) moves a statistic by far more than 1e-3.
FLOAT_ATOL = 1e-3
FLOAT_RTOL = 1e-6
N_PROJECTIONS = 3
_FLOAT_STATS = ("sum", "sumsq", "min", "max")


def _is_float_type(t: pa.DataType) -> bool:
    if pa.types.is_floating(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _is_float_type(t.value_type)
    if pa.types.is_struct(t):
        return any(_is_float_type(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _is_float_type(t.key_type) or _is_float_type(t.item_type)
    return False


def _canon(value: Any) -> Any:
    """The exact part of a value: everything but float values (a finite float becomes ``"<f>"``)."""
    if isinstance(value, float):
        return "<f>" if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def _floats(value: Any, out: list[float]) -> list[float]:
    """The finite floats in ``value``, in order (nested lists and dicts included)."""
    if isinstance(value, float):
        if math.isfinite(value):
            out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _floats(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floats(v, out)
    return out


def _read(path: str) -> pa.Table:
    table = pq.read_table(path)
    return table.drop_columns([c for c in table.column_names if c in VOLATILE])


def _keyed_rows(table: pa.Table) -> list[tuple[str, dict]]:
    """``(exact JSON, row)`` per row, sorted by the exact JSON (ties keep no meaningful order and need none)."""
    rows = [(json.dumps(_canon(r), sort_keys=True, ensure_ascii=False), r) for r in table.to_pylist()]
    rows.sort(key=lambda kr: kr[0])
    return rows


def _exact_digest(keyed: list[tuple[str, dict]]) -> tuple[int, str]:
    h = hashlib.sha256()
    for key, _ in keyed:
        h.update(key.encode())
        h.update(b"\n")
    return len(keyed), h.hexdigest()


def _float_fingerprint(keyed: list[tuple[str, dict]], column: str) -> dict[str, Any]:
    """Sum, sum of squares, min, max and ``N_PROJECTIONS`` row-keyed +-1 projections of ``column``'s floats.

    The weights of a row come from its exact JSON, so rows with equal exact parts get equal weights and the
    fingerprint does not depend on their order; a float moved to another row changes the projections."""
    total = sumsq = 0.0
    lo, hi = math.inf, -math.inf
    proj = np.zeros(N_PROJECTIONS)
    n = 0
    for key, row in keyed:
        values = np.asarray(_floats(row[column], []), dtype=np.float64)
        if not values.size:
            continue
        n += values.size
        total += float(values.sum())
        sumsq += float(values @ values)
        lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
        seed = int.from_bytes(hashlib.sha256(f"{column}\0{key}".encode()).digest()[:8], "little")
        weights = np.random.default_rng(seed).integers(0, 2, size=(N_PROJECTIONS, values.size)) * 2 - 1
        proj += weights @ values
    if not n:
        return {"n": 0}
    return {"n": n, "sum": total, "sumsq": sumsq, "min": lo, "max": hi, "proj": [float(p) for p in proj]}


def table_check(path: str) -> tuple[tuple[int, str], dict[str, dict]]:
    """``((rows, sha256 of the exact part), {float column: fingerprint})`` of the Parquet table at ``path``
    (a file or a folder of files)."""
    table = _read(path)
    keyed = _keyed_rows(table)
    floats = {f.name: _float_fingerprint(keyed, f.name) for f in table.schema if _is_float_type(f.type)}
    return _exact_digest(keyed), floats


def table_digest(path: str) -> tuple[int, str]:
    """``(rows, sha256)`` of the exact part of the Parquet table at ``path``."""
    return table_check(path)[0]


def _tables(root: str) -> dict[str, str]:
    """``{"<run>/<table>": path}`` for every table of every run folder under ``root``."""
    out: dict[str, str] = {}
    for run in sorted(os.listdir(root)):
        run_dir = os.path.join(root, run)
        if not os.path.isfile(os.path.join(run_dir, "manifest.json")):
            continue
        for name in sorted(os.listdir(run_dir)):
            path = os.path.join(run_dir, name)
            is_table = (os.path.isdir(path) and any(f.endswith(".parquet") for f in os.listdir(path))) or (
                name.endswith(".parquet") and os.path.isfile(path))
            if is_table:
                out[f"{run}/{name}"] = path
    return out


def chain_checks(root: str) -> tuple[dict[str, list], dict[str, dict[str, dict]]]:
    """``({"<run>/<table>": [rows, sha256]}, {"<run>/<table>": {float column: fingerprint}})`` under ``root``
    (tables without float columns have no fingerprint entry)."""
    digests: dict[str, list] = {}
    floats: dict[str, dict[str, dict]] = {}
    for name, path in _tables(root).items():
        digest, fingerprints = table_check(path)
        digests[name] = list(digest)
        if fingerprints:
            floats[name] = fingerprints
    return digests, floats


def chain_digests(root: str) -> dict[str, list]:
    """``{"<run>/<table>": [rows, sha256]}`` (exact parts) for every table of every run folder under ``root``."""
    return chain_checks(root)[0]


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= FLOAT_ATOL + FLOAT_RTOL * abs(want)


def float_mismatches(got: dict[str, dict], want: dict[str, dict]) -> dict[str, Any]:
    """``{"column": (got, want)}`` for the columns whose fingerprints differ: another set of columns, another
    count of floats, or a statistic off by more than the tolerance."""
    wrong: dict[str, Any] = {}
    for column in sorted(set(got) | set(want)):
        g, w = got.get(column), want.get(column)
        if g is None or w is None or g["n"] != w["n"]:
            wrong[column] = (g, w)
            continue
        stats_ok = all(_close(g[s], w[s]) for s in _FLOAT_STATS if s in w)
        gp, wp = g.get("proj", []), w.get("proj", [])
        proj_ok = len(gp) == len(wp) and all(_close(a, b) for a, b in zip(gp, wp, strict=True))
        if not (stats_ok and proj_ok):
            wrong[column] = (g, w)
    return wrong


# The demo chain (``cli.commands.demo_chain``). Exact parts: chunks, embeddings (ids, token counts), index ids
# and retrieval as the pre-refactor main (c9146f5) wrote them; the refactored code wrote all nine tables identical
# to it, extract included, when run with that commit's offline extractor (checked before the architecture commit
# 1239cce). The offline extractor then changed on purpose (issue 16: new scoring and defaults, f62c71d), so
# spans/pairs and spans/spans hold that extractor's output. The old digests (floats rounded to 4 decimals and
# hashed) were taken on an AVX-512 machine; on an AVX2 one (issue 27) and with ATEN_CPU_CAPABILITY=default all
# of them but the embeddings' came out the same, retrieval included: the demo's ranks do not flip across these
# kernels. The new digests and the fingerprints were taken on AVX2 (AMD EPYC) and checked with
# ATEN_CPU_CAPABILITY=default. Issue 24 then changed the hybrid retrieval on purpose (100 candidates per method,
# weights dense 0.2 : BM25 1, rrf_k 5, missing ranks counted past the pool), so retrieval/retrieval (deeper
# dense_rank/bm25_rank, hybrid rows and scores), spans/pairs (other hybrid top-5 pairs) and spans/spans (43 -> 62
# spans) were regenerated (AVX2, AMD EPYC; chunks, embeddings and index ids unchanged). Issue 35 then changed the
# offline extractor on purpose (unit kinds: no evidence from reference lists, TOC lines, author blocks or bare
# headings; context signal, margin, a bound of 6 spans a pair; new defaults), so spans/pairs (relevances; config
# hash) and spans/spans (62 -> 42 spans) were regenerated (AVX2, AMD EPYC); every other table came out unchanged.
#
# Issue 35 item 2 then embedded chunks in windows (a vector per 256-token window, the index scoring a chunk by its
# best one; a reference list one window), so embeddings/embeddings (new columns windows, window_vectors; n_tokens
# over all windows; truncated now means text left after the last window), index/ids (unchanged rows),
# retrieval/retrieval (dense ranks and scores) and spans/pairs and spans/spans (other hybrid top-5 pairs) were
# regenerated (AVX2, AMD EPYC, 2026-11-27).
#
# Ranks stay exact. One near-tie could legitimately flip on some CPU: query q-dafb812637d6, dense candidates 44
# and 45 score 3.0e-7 apart on AVX2 (windows, MaxP), while dense scores move by up to 2.2e-7 between kernels
# (AVX2 vs the default ones, issue 27). A flip would show as retrieval/retrieval's digest differing (dense_rank 44
# in that query's bm25 and hybrid rows; the hybrid order and the extract pairs would stay). Every other gap in the
# 16 queries' dense top 101 is >= 2.2e-6; BM25 ones >= 1.8e-5 apart from exact ties (equal scores, ordered by
# chunk id on every machine).
DEMO_DIGESTS = {
    'chunks/chunks': [361, '8496024c64a5400e9b7a6e32a59f5321a248b04d2abca1b46bd31b34191a9798'],
    'chunks/papers': [24, 'eecd89608ad587013e2f0c2365265b770d766614bcd86427b48fc1696236cfc8'],
    'chunks/quarantine': [0, 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'],
    'embeddings/embeddings': [361, '7c15939dbf2113ea50f1d1a11766c81d13f51e4e992a6eb44c6985912a76fab9'],
    'index/ids.parquet': [361, '97d530702240c9ede7feb281380302e0cbb034810adb9075539f9c811db78b1a'],
    'retrieval/retrieval': [480, '94392885efbb61464150f2a516592b2041ecf4b3608725b9a4e286a4b20a3a9b'],
    'spans/pairs': [80, '04fdc0814f9e78e85487fad681eaf9b83d5e0aa91eb98e850d7e5941c40ba75f'],
    'spans/rejects': [0, 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'],
    'spans/spans': [42, '7b7d3d613e81af845c81be31526bce5d749496f0bfdf2eed3254138d668bdb37'],
}

DEMO_FLOATS: dict[str, dict[str, dict]] = {
    'embeddings/embeddings': {
        'vector': {'n': 138624, 'sum': 47.3350963, 'sumsq': 361.0000025, 'min': -0.2433271, 'max': 0.2150572,
                   'proj': [-1.846943, -18.8480183, 47.1487679]},
        'window_vectors': {'n': 274944, 'sum': 45.1692057, 'sumsq': 715.9999941, 'min': -0.2395274, 'max': 0.2267256,
                           'proj': [22.3388881, -26.0409187, -16.3060958]},
    },
    'retrieval/retrieval': {
        'score': {'n': 480, 'sum': 1124.4481091, 'sumsq': 8122.4594583, 'min': 0.0685535, 'max': 18.758049,
                  'proj': [-45.9245261, -74.2229619, -43.5241537]},
    },
    'spans/pairs': {
        'relevance': {'n': 80, 'sum': 35.8448383, 'sumsq': 20.7478477, 'min': 0.0, 'max': 0.8932737,
                      'proj': [3.6096259, 1.3785103, 1.4379957]},
    },
    'spans/spans': {
        'score': {'n': 42, 'sum': 27.4690534, 'sumsq': 18.5969219, 'min': 0.4615586, 'max': 0.8932737,
                  'proj': [-8.2234702, 8.1038973, 2.0640476]},
    },
}

_NEAR_TIE = ("retrieval/retrieval", "a known dense near-tie may have flipped (q-dafb812637d6, dense ranks 44/45: "
                                    "see tests/chain_digest.py)")


def assert_demo_digests(root: str) -> None:
    """Every table of a demo chain under ``root`` equals what the pre-refactor code wrote: exact parts equal,
    float fingerprints within the tolerance."""
    digests, floats = chain_checks(root)
    assert set(digests) == set(DEMO_DIGESTS), (sorted(digests), sorted(DEMO_DIGESTS))
    wrong = {k: (digests[k], DEMO_DIGESTS[k]) for k in digests if digests[k] != DEMO_DIGESTS[k]}
    note = f" ({_NEAR_TIE[1]})" if _NEAR_TIE[0] in wrong else ""
    assert not wrong, f"tables differ from the pre-refactor run{note}: {wrong}"
    assert set(floats) == set(DEMO_FLOATS), (sorted(floats), sorted(DEMO_FLOATS))
    drift = {k: m for k in floats if (m := float_mismatches(floats[k], DEMO_FLOATS[k]))}
    assert not drift, (f"float columns differ from the pre-refactor run by more than {FLOAT_ATOL} + "
                       f"{FLOAT_RTOL} * |value|: {drift}")


def _literal(root: str) -> str:
    """``DEMO_DIGESTS`` and ``DEMO_FLOATS`` for the chain under ``root``, as Python source."""
    digests, floats = chain_checks(root)
    lines = ["DEMO_DIGESTS = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in digests.items()]
    lines += ["}", "", "DEMO_FLOATS: dict[str, dict[str, dict]] = {"]
    for table, columns in floats.items():
        lines.append(f"    {table!r}: {{")
        for column, fp in columns.items():
            stats = ", ".join(f"{s!r}: {round(v, 7) if isinstance(v, float) else v!r}" for s, v in fp.items()
                              if s != "proj")
            lines.append(f"        {column!r}: {{{stats},")
            if "proj" in fp:
                lines.append(f"        {' ' * len(repr(column))}   'proj': {[round(x, 7) for x in fp['proj']]!r}}},")
            else:
                lines[-1] = lines[-1][:-1] + "},"
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(_literal(sys.argv[1]))
