"""Full-text BM25 index over chunk texts, stored in bm25s's format.

Tokenisation (``tokenize``) is the same for documents and queries: NFKC, casefold, dotted numbers (``45.3``) or
letter-digit runs (``bert2``), a small English stopword list, no stemming. Scores are bm25s's "lucene" BM25
(``idf * tf / (tf + k1 * (1 - b + b * len / avg_len))``, ``idf = log(1 + (N - df + 0.5) / (df + 0.5))``, repeated
query tokens count again); the doc-by-term score matrix is built with vectorised numpy (bm25s's builder loops per
document) and saved so ``bm25s.BM25.load`` reads it too. Search is a batched sparse product: the documents sharing
a token with the query are its hits.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from array import array
from collections.abc import Iterable
from pathlib import Path

import bm25s
import numpy as np
import scipy.sparse as sp

TOKENIZER_VERSION = "vb-simple-1"
FORMAT = "verbatim_batch.bm25"
FORMAT_VERSION = 1
PARAMS_FILE = "bm25_params.json"
# Upper bound on (query, document) score entries materialised at once while searching.
SEARCH_BUDGET = 1 << 25

# Lucene's English stop set plus common pronouns, auxiliaries and clitic leftovers ("s", "t").
STOPWORDS = frozenset(
    """
    a an and are as at be but by for if in into is it no not of on or such that the their then there these
    they this to was will with
    i me my we our us you your he him his she her its them those what which who whom when where why how
    been being have has had do does did were would should could can from than so also s t
    """.split()
)

_TOKEN_RE = re.compile(r"\d+(?:\.\d+)+|[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Tokens of ``text``: NFKC, casefold, numbers like ``45.3`` or alphanumeric runs, no stopwords."""
    if not text:
        return []
    text = unicodedata.normalize("NFKC", text).casefold()
    return [tok for tok in _TOKEN_RE.findall(text) if tok not in STOPWORDS]


class Bm25Index:
    """BM25 over documents in row order (row ``i`` is the ``i``-th text given to ``build``)."""

    def __init__(self, retriever: bm25s.BM25, params: dict):
        self._bm25 = retriever
        self.params = params
        self.vocab: dict[str, int] = retriever.vocab_dict
        scores = retriever.scores
        data, indices, indptr = scores["data"], scores["indices"], scores["indptr"]
        self._n_docs = int(scores["num_docs"])
        n_vocab = len(indptr) - 1
        if len(self.vocab) != n_vocab:
            raise ValueError(f"bm25 index is inconsistent: {len(self.vocab)} vocabulary entries, {n_vocab} columns")
        # int32 index arrays keep scipy from copying (or widening) possibly memory-mapped arrays.
        if len(data) < 2**31 - 1:
            indptr = np.asarray(indptr, dtype=np.int32)
            indices = indices if indices.dtype == np.int32 else np.asarray(indices, dtype=np.int32)
        self._df = np.diff(np.asarray(indptr, dtype=np.int64))
        # term-by-document (CSR) view of the stored document-by-term CSC matrix; no copy
        self._term_doc = sp.csr_matrix((data, indices, indptr), shape=(n_vocab, self._n_docs), copy=False)

    # ------------------------------------------------------------------ build

    @classmethod
    def build(cls, texts: Iterable[str], k1: float = 1.2, b: float = 0.75) -> Bm25Index:
        if not (isinstance(k1, (int, float)) and math.isfinite(k1) and k1 >= 0):
            raise ValueError(f"k1 must be a finite number >= 0, got {k1!r}")
        if not (isinstance(b, (int, float)) and 0 <= b <= 1):
            raise ValueError(f"b must be in [0, 1], got {b!r}")
        vocab: dict[str, int] = {}
        token_ids = array("i")
        doc_lens = array("q")
        for pos, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"document {pos} is {type(text).__name__}, not str")
            toks = tokenize(text)
            token_ids.extend([vocab.setdefault(tok, len(vocab)) for tok in toks])
            doc_lens.append(len(toks))
        n_docs, n_vocab = len(doc_lens), len(vocab)
        lens = np.frombuffer(doc_lens, dtype=np.int64) if n_docs else np.zeros(0, np.int64)
        ids = np.frombuffer(token_ids, dtype=np.int32) if len(token_ids) else np.zeros(0, np.int32)

        if len(ids):
            docs = np.repeat(np.arange(n_docs, dtype=np.int64), lens)
            # sorted unique (term, doc) pairs = CSC order (by column = term, then row = doc)
            keys, tf = np.unique(ids.astype(np.int64) * n_docs + docs, return_counts=True)
            del docs
            terms, rows = np.divmod(keys, n_docs)
            del keys
            df = np.bincount(terms, minlength=n_vocab)
            idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
            avg_len = float(lens.mean())
            norm = k1 * ((1.0 - b) + b * lens[rows] / avg_len)
            data = (idf[terms] * (tf / (tf + norm))).astype(np.float32)
            del terms, norm
            indices = rows.astype(np.int32)
        else:
            df = np.zeros(n_vocab, dtype=np.int64)
            data, indices = np.zeros(0, np.float32), np.zeros(0, np.int32)
            avg_len = 0.0
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])

        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}
        retriever.vocab_dict = vocab
        retriever.unique_token_ids_set = set(vocab.values())
        retriever.nonoccurrence_array = None
        params = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tokenizer": TOKENIZER_VERSION,
            "method": "lucene",
            "k1": float(k1),
            "b": float(b),
            "n_docs": n_docs,
            "n_vocab": n_vocab,
            "n_postings": len(data),
            "avg_doc_len": avg_len,
            "bm25s_version": bm25s.__version__,
        }
        return cls(retriever, params)

    # ------------------------------------------------------------------ io

    def save(self, folder: str | Path) -> None:
        """Write bm25s's files and ``bm25_params.json`` into ``folder`` (created if missing)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(folder), show_progress=False)
        (folder / PARAMS_FILE).write_text(json.dumps(self.params, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | Path, mmap: bool = False) -> Bm25Index:
        """Read an index written by ``save``; ``mmap=True`` maps the score arrays read-only."""
        folder = Path(folder)
        params_path = folder / PARAMS_FILE
        if not params_path.is_file():
            raise FileNotFoundError(f"no bm25 index at {folder} ({PARAMS_FILE} missing)")
        params = json.loads(params_path.read_text())
        if params.get("format") != FORMAT or params.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{params_path}: not a {FORMAT} v{FORMAT_VERSION} index")
        if params.get("tokenizer") != TOKENIZER_VERSION:
            raise ValueError(
                f"{params_path}: built with tokenizer {params.get('tokenizer')!r}, this code uses "
                f"{TOKENIZER_VERSION!r}; rebuild the index"
            )
        retriever = bm25s.BM25.load(str(folder), mmap=bool(mmap), show_progress=False)
        if retriever.scores["num_docs"] != params["n_docs"]:
            raise ValueError(f"{folder}: bm25s files and {PARAMS_FILE} disagree on the number of documents")
        return cls(retriever, params)

    # ------------------------------------------------------------------ search

    @property
    def n_docs(self) -> int:
        return self._n_docs

    def query_term_ids(self, query: str) -> list[int]:
        """Vocabulary ids of the query's tokens that the index knows (repeats kept)."""
        vocab = self.vocab
        return [vocab[tok] for tok in tokenize(query) if tok in vocab]

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: ``(scores float32 (q, k), rows int64 (q, k))``, rows -1 (score 0) past the matching
        documents, equal scores to the lower row."""
        if isinstance(queries, str):
            raise ValueError("queries must be a list of strings, not one string")
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = list(queries)
        q = len(queries)
        out_scores = np.zeros((q, k), dtype=np.float32)
        out_rows = np.full((q, k), -1, dtype=np.int64)
        if q == 0 or self._n_docs == 0:
            return out_scores, out_rows
        term_ids = [self.query_term_ids(text) for text in queries]
        costs = [int(self._df[np.unique(np.asarray(t, dtype=np.int64))].sum()) if t else 0 for t in term_ids]
        start = 0
        while start < q:
            stop, budget = start, 0
            while stop < q and (stop == start or budget + costs[stop] <= SEARCH_BUDGET):
                budget += costs[stop]
                stop += 1
            self._search_block(term_ids[start:stop], k, out_scores[start:stop], out_rows[start:stop])
            start = stop
        return out_scores, out_rows

    def _search_block(self, term_ids: list[list[int]], k: int, out_scores: np.ndarray, out_rows: np.ndarray) -> None:
        n_vocab = self._term_doc.shape[0]
        qrows = np.repeat(np.arange(len(term_ids)), [len(t) for t in term_ids])
        qcols = np.fromiter((t for ts in term_ids for t in ts), dtype=np.int64, count=len(qrows))
        weights = np.ones(len(qrows), dtype=np.float32)
        # duplicates (a repeated query token) are summed by the constructor
        qmat = sp.csr_matrix((weights, (qrows, qcols)), shape=(len(term_ids), n_vocab))
        hits = (qmat @ self._term_doc).tocsr()
        for i in range(len(term_ids)):
            lo, hi = hits.indptr[i], hits.indptr[i + 1]
            if hi == lo:
                continue
            docs = hits.indices[lo:hi]
            scores = hits.data[lo:hi]
            if hi - lo > k:
                kth = np.partition(scores, hi - lo - k)[hi - lo - k]
                keep = scores >= kth
                docs, scores = docs[keep], scores[keep]
            order = np.lexsort((docs, -scores))[:k]
            out_rows[i, : len(order)] = docs[order]
            out_scores[i, : len(order)] = scores[order]
