"""Reciprocal rank fusion (Cormack et al., 2009) of several ranked lists per query."""

from __future__ import annotations

import math


def rrf(
    ranked: dict[str, list[list[int]]],
    weights: dict[str, float] | None = None,
    k: int = 10,
    rrf_k: int = 60,
    tie_key=None,
    fill_missing: bool = False,
) -> list[list[tuple[int, float, dict[str, int | None]]]]:
    """Fuse per-method rankings; per query, the top ``k`` as ``(row, score, {method: rank or None})``.

    ``ranked[method][q]``: rows best first. Score ``sum(weights[m] / (rrf_k + rank_m))``, ties by best weighted-in rank,
    then row or ``tie_key(row)``; weight-0 methods bring no candidates. ``fill_missing``: a row a method did not list
    counts at ``len(list) + 1`` (it looked that deep)."""
    if not isinstance(ranked, dict) or not ranked:
        raise ValueError("ranked must be a non-empty dict: method -> per-query ranked rows")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if isinstance(rrf_k, bool) or not isinstance(rrf_k, (int, float)) or not math.isfinite(rrf_k) or rrf_k < 0:
        raise ValueError(f"rrf_k must be a finite number >= 0, got {rrf_k!r}")
    methods = list(ranked)
    if weights is None:
        weights = {}
    else:
        unknown = sorted(set(weights) - set(methods))
        if unknown:
            raise ValueError(f"weights for unknown methods {unknown}; methods are {sorted(methods)}")
    w: dict[str, float] = {}
    for m in methods:
        value = weights.get(m, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"weight for {m!r} must be a finite number >= 0, got {value!r}")
        w[m] = float(value)
    if not any(v > 0 for v in w.values()):
        raise ValueError("at least one weight must be positive")
    n_queries = {len(ranked[m]) for m in methods}
    if len(n_queries) != 1:
        raise ValueError(f"methods disagree on the number of queries: { {m: len(ranked[m]) for m in methods} }")

    out = []
    for qi in range(n_queries.pop()):
        ranks: dict[int, dict[str, int | None]] = {}
        for m in methods:
            for pos, row in enumerate(ranked[m][qi]):
                row = int(row)
                if row < 0:
                    raise ValueError(f"{m!r}, query {qi}: negative row {row} (drop -1 padding before fusing)")
                entry = ranks.get(row)
                if entry is None:
                    entry = ranks[row] = dict.fromkeys(methods)
                if entry[m] is None:
                    entry[m] = pos + 1
        fused = []
        past = {m: len(set(ranked[m][qi])) + 1 for m in methods}
        for row, entry in ranks.items():
            # sum in the fixed method order so equal inputs give bit-identical scores
            if fill_missing:
                score = sum(w[m] / (rrf_k + (past[m] if r is None else r)) for m, r in entry.items())
            else:
                score = sum(w[m] / (rrf_k + r) for m, r in entry.items() if r is not None)
            best = min((r for m, r in entry.items() if r is not None and w[m] > 0), default=None)
            if best is None:  # ranked only by zero-weight methods: not a candidate
                continue
            fused.append((-score, best, row if tie_key is None else tie_key(row), row, entry))
        fused.sort(key=lambda item: item[:3])
        out.append([(row, -neg, entry) for neg, _, _, row, entry in fused[:k]])
    return out
