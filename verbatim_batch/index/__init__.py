"""Index layer: FAISS dense index (with incremental updates), BM25 full-text index and rank fusion (no Ray)."""

from .bm25 import STOPWORDS, TOKENIZER_VERSION, Bm25Index, tokenize
from .dense import (
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
from .fusion import rrf
from .update import plan_update, update_dense

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
