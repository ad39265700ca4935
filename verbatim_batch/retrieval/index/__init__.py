"""Index layer: FAISS dense index (with incremental updates), BM25 full-text index and rank fusion (no Ray).

The names below are imported from their module when first asked for (``from verbatim_batch.retrieval.index import
Bm25Index``), so that importing ``index.dense`` for ``DenseSpec`` (the index job's options) imports neither FAISS
nor bm25s and SciPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verbatim_batch.retrieval.index.bm25 import STOPWORDS, TOKENIZER_VERSION, Bm25Index, tokenize
    from verbatim_batch.retrieval.index.dense import (
        DENSE_FILE,
        DenseSpec,
        best_window,
        build_dense,
        load_dense,
        resolve_spec,
        save_dense,
        search_dense,
        set_nprobe,
    )
    from verbatim_batch.retrieval.index.fusion import rrf
    from verbatim_batch.retrieval.index.update import plan_update, update_dense

_MODULE_OF = {
    "STOPWORDS": "bm25", "TOKENIZER_VERSION": "bm25", "Bm25Index": "bm25", "tokenize": "bm25",
    "DENSE_FILE": "dense", "DenseSpec": "dense", "best_window": "dense", "build_dense": "dense",
    "load_dense": "dense", "resolve_spec": "dense", "save_dense": "dense", "search_dense": "dense",
    "set_nprobe": "dense", "rrf": "fusion", "plan_update": "update", "update_dense": "update",
}
__all__ = [
    "DENSE_FILE",
    "STOPWORDS",
    "TOKENIZER_VERSION",
    "Bm25Index",
    "DenseSpec",
    "best_window",
    "build_dense",
    "load_dense",
    "plan_update",
    "resolve_spec",
    "rrf",
    "save_dense",
    "search_dense",
    "set_nprobe",
    "tokenize",
    "update_dense",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
