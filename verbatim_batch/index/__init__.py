"""Index layer: FAISS dense index, BM25 full-text index and rank fusion (pure library code, no Ray)."""

from .bm25 import STOPWORDS, TOKENIZER_VERSION, Bm25Index, tokenize
from .dense import (
    DENSE_FILE,
    DenseSpec,
    build_dense,
    load_dense,
    resolve_spec,
    save_dense,
    search_dense,
    set_nprobe,
)
from .fusion import rrf

__all__ = [
    "DENSE_FILE",
    "STOPWORDS",
    "TOKENIZER_VERSION",
    "Bm25Index",
    "DenseSpec",
    "build_dense",
    "load_dense",
    "resolve_spec",
    "rrf",
    "save_dense",
    "search_dense",
    "set_nprobe",
    "tokenize",
]
