"""The highlighter: a ModernBERT token classifier that marks evidence tokens in a chunk.

A (query, chunk) pair longer than ``max_length`` is cut into windows over the chunk overlapping by ``stride``
tokens (each repeats the query). Post-processing is the released students' ``process()`` (``highlighter_spans``),
so the same weights give the same spans, plus a trim of edge whitespace. The work is three parts, so a GPU's
process runs only the model (issue 25): ``HighlighterTokenizer.encode`` (flat windows), ``Highlighter.forward_probs``
(packed by length under a token budget) and ``ContextScores.results``; the extract job runs them as stages
(``highlighter_stages``). The paper's students ship configs naming custom code over plain
``ModernBertForTokenClassification`` weights; they load with ``trust_remote_code`` off.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from verbatim_batch.core import limits, models
from verbatim_batch.core.options import Declared, option, runtime
from verbatim_batch.extract.highlighter_spans import (
    ContextScores,
    TokenScores,
    default_query_tokens,
    highlight_spans,
    window_problem,
)
from verbatim_batch.extract.kind import ExtractorKind
from verbatim_batch.extract.spans import PairResult

HIGHLIGHTER_VERSION = "2"  # 2: merge-then-drop per-window runs, as the released process()
PAPER_STUDENT = "KRLabsOrg/acl-verbatim-modernbert"


@dataclass(frozen=True)
class HighlighterConfig(Declared):
    """Settings of the highlighter. ``hash`` covers everything that can change a span."""

    kind: ClassVar[str] = "highlighter"

    model: str = option(PAPER_STUDENT, "the extractor's model: hub id or local path; for an LLM, the name the "
                        "endpoint serves")
    revision: str | None = option(None, "model revision (hub)")
    threshold: float = option(0.2, "keep tokens / sentences scoring at least this", low=0, high=1)
    min_chars: int = option(10, "drop spans shorter than this", low=0, high=limits.CHARS)
    merge_gap: int = option(20, "merge spans at most this many characters apart", low=0, high=limits.CHARS)
    max_length: int = option(8192, "tokens per window, query included", low=16, high=limits.TOKENS)
    stride: int = option(256, "tokens shared by neighbouring windows", low=0, high=limits.TOKENS)
    max_query_tokens: int | None = None  # None: min(512, max_length // 4); longer queries are error rows
    device: str = runtime("auto")
    dtype: str = option("auto", "weights' type (auto: bfloat16 on CUDA, float32 on CPU)",
                        choices=("auto", "float32", "bfloat16", "float16"))
    attn_implementation: str = "auto"
    token_budget: int = option(32768, "padded tokens per forward pass", low=1, high=limits.TOKENS, runtime=True)
    max_batch_rows: int = runtime(128, low=1)
    trust_remote_code: bool = option(False, "allow model code from the hub (off by default)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if problem := window_problem(self.max_length, self.stride, self.max_query_tokens):
            raise ValueError(problem)
        if self.max_query_tokens is None:
            object.__setattr__(self, "max_query_tokens", default_query_tokens(self.max_length))

    @property
    def hash(self) -> str:
        from verbatim_batch.retrieval.embedder import model_config_hash

        return model_config_hash(self, highlighter_version=HIGHLIGHTER_VERSION)


# --- the host side: a batch of pairs cut into windows, as flat arrays ------------------------------------


@dataclass
class EncodedPairs:
    """A batch of pairs cut into windows, as flat arrays (pair 0's windows, then pair 1's, ...; none for an error)."""

    errors: list[str | None]  # per pair: why it was not encoded (query_too_long), else None
    ids: np.ndarray  # int32 (T,): the tokens of every window, window after window
    window_lengths: np.ndarray  # int64 (W,)
    window_pair: np.ndarray  # int64 (W,): the pair (index in the batch) of each window
    context: np.ndarray  # int64 (C,): positions in ``ids`` of the context (chunk) tokens
    offsets: np.ndarray  # int64 (C, 2): their character offsets in the chunk
    context_counts: np.ndarray  # int64 (W,): context tokens per window

    def scores(self, token_probs: np.ndarray) -> ContextScores:
        """The context tokens' scores, given the probability of every token of ``ids``."""
        probs = np.asarray(token_probs, dtype=np.float32)[self.context] if len(self.context) else \
            np.zeros(0, np.float32)
        return ContextScores(list(self.errors), self.offsets, probs, self.context_counts, self.window_pair)


def _classifier_config(model_dir: Path, trust_remote_code: bool):
    """The model config; a ModernBERT config that names custom code is read as plain ModernBERT."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as exc:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        names = [str(raw.get("model_type", ""))] + [str(a) for a in raw.get("architectures") or []]
        if not any("modernbert" in n.lower() for n in names):
            raise ValueError(f"{model_dir}: cannot read the model config without remote code: {exc}") from exc
        from transformers import ModernBertConfig

        clean = {k: v for k, v in raw.items() if k not in ("auto_map", "model_type", "architectures")}
        return ModernBertConfig(**clean)


def _check_head_loaded(model, weights: list[Path]) -> None:
    """Refuse a checkpoint whose classifier head is missing (it would be random weights)."""
    from safetensors import safe_open

    keys: set[str] = set()
    for f in weights:
        with safe_open(str(f), framework="pt") as fh:
            keys.update(fh.keys())
    head = [k for k in model.state_dict() if k.startswith("classifier.")]
    missing = [k for k in head if k not in keys]
    if missing:
        raise ValueError(f"the checkpoint has no token-classification head ({', '.join(missing)}): "
                         "it is not a trained token classifier")


class HighlighterTokenizer:
    """The highlighter's tokenizer and window settings, no model (a CPU stage loads this alone): ``windows`` is the
    reference call (transformers' overflow windows), ``encode`` the same windows as flat arrays from a private copy of
    the Rust tokenizer (checked on a probe at load)."""

    def __init__(self, config: HighlighterConfig, model_dir: Path | None = None, model_config: Any = None) -> None:
        from transformers import AutoTokenizer

        from verbatim_batch.retrieval.embedder import portable_model_id

        self.config = config
        model_dir = model_dir or models.resolve_model_dir(config.model, config.revision, "highlighter model")
        mconf = model_config if model_config is not None else _classifier_config(model_dir, config.trust_remote_code)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=config.trust_remote_code)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{portable_model_id(config.model)}: a fast tokenizer (with offsets) is required")
        positions = getattr(mconf, "max_position_embeddings", None)
        self.max_length = min(config.max_length, positions or config.max_length)
        self.stride, self.max_query_tokens = config.stride, config.max_query_tokens
        if self.max_length - self.stride - self.max_query_tokens < 8 and self.max_length < config.max_length:
            # the model's position limit is below the configured window: stride and query share shrink with it
            self.stride = min(self.stride, self.max_length // 8)
            self.max_query_tokens = min(self.max_query_tokens, self.max_length // 4)
        if self.max_length - self.stride - self.max_query_tokens < 8:
            raise ValueError(f"max_length {self.max_length} leaves no room for context after a query of up to "
                             f"{self.max_query_tokens} tokens and a stride of {self.stride}: lower --stride")
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._backends = self._private_backends()

    def windows(self, queries: Sequence[str], chunks: Sequence[str]):
        """Tokenise pairs into overlapping windows; returns the ok pairs, the encodings and per-pair query errors."""
        q_lens = [len(ids) for ids in self.tokenizer(list(queries), add_special_tokens=False)["input_ids"]]
        ok = [i for i, n in enumerate(q_lens) if n <= self.max_query_tokens]
        enc = self.tokenizer(
            [queries[i] for i in ok], [chunks[i] for i in ok], truncation="only_second",
            max_length=self.max_length, stride=self.stride, return_overflowing_tokens=True,
            return_offsets_mapping=True, padding=False,
        ) if ok else None
        too_long = {i: f"query_too_long: {q_lens[i]} tokens > {self.max_query_tokens}"
                    for i in range(len(queries)) if q_lens[i] > self.max_query_tokens}
        return ok, enc, too_long

    def _private_backends(self):
        """Copies of the Rust tokenizer as the reference call sets it up (queries: no truncation; pairs: overflow
        windows), or None when they do not reproduce that call on a probe."""
        from tokenizers import Tokenizer

        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        probe_q = ["Probe query, naïve café — 3.5%?", "x"]
        probe_c = ["A probe chunk: café, naïve, 3.5% of A/B tests [SEP] e.g. (2020). " * 4, "Short."]
        try:
            self.tokenizer(probe_q, add_special_tokens=False)  # sets the backend up as the query call does
            queries = Tokenizer.from_str(backend.to_str())
            ok, enc, too_long = self.windows(probe_q, probe_c)  # ... and as the pair call does
            pairs = Tokenizer.from_str(backend.to_str())
            for tok in (queries, pairs):
                if hasattr(backend, "encode_special_tokens"):
                    tok.encode_special_tokens = backend.encode_special_tokens
            got = self._from_backends((queries, pairs), probe_q, probe_c)
            want = self._from_reference(ok, enc, too_long, len(probe_q))
        except Exception:  # noqa: BLE001 - a backend that cannot be copied: read the reference call's encodings
            return None
        same = got.errors == want.errors and all(np.array_equal(getattr(got, f), getattr(want, f)) for f in (
            "ids", "window_lengths", "window_pair", "context", "offsets", "context_counts"))
        return (queries, pairs) if same else None

    def encode(self, queries: Sequence[str], chunks: Sequence[str]) -> EncodedPairs:
        """The windows of every pair as flat arrays (see ``EncodedPairs``); the same windows as ``windows``."""
        if self._backends is not None:
            return self._from_backends(self._backends, queries, chunks)
        ok, enc, too_long = self.windows(queries, chunks)
        return self._from_reference(ok, enc, too_long, len(queries))

    def _from_backends(self, backends, queries: Sequence[str], chunks: Sequence[str]) -> EncodedPairs:
        q_tok, pair_tok = backends
        limit = self.max_query_tokens
        q_lens = [len(e) for e in q_tok.encode_batch(list(queries), add_special_tokens=False)]
        errors = [f"query_too_long: {n} tokens > {limit}" if n > limit else None for n in q_lens]
        ok = [i for i, e in enumerate(errors) if e is None]
        encs = pair_tok.encode_batch([(queries[i], chunks[i]) for i in ok], add_special_tokens=True) if ok else []
        windows, owners = [], []
        for i, e in zip(ok, encs, strict=True):
            more = e.overflowing
            windows.append(e)
            windows.extend(more)
            owners.extend([i] * (1 + len(more)))
        return _flatten(errors, windows, owners)

    def _from_reference(self, ok, enc, too_long: dict[int, str], n: int) -> EncodedPairs:
        errors = [too_long.get(i) for i in range(n)]
        if enc is None:
            return _flatten(errors, [], [])
        return _flatten(errors, list(enc.encodings), [ok[k] for k in enc["overflow_to_sample_mapping"]])


def _flatten(errors: list[str | None], windows: list, owners: list[int]) -> EncodedPairs:
    """``EncodedPairs`` from tokenizers ``Encoding`` windows (in pair order) and the pair of each."""
    lengths = np.fromiter((len(w) for w in windows), dtype=np.int64, count=len(windows))
    ids = np.fromiter(itertools.chain.from_iterable(w.ids for w in windows), dtype=np.int32, count=int(lengths.sum()))
    spans, positions = [], []  # per window: the context tokens' range, or their positions when not one range
    for w in windows:
        seq = w.sequence_ids
        try:
            lo = seq.index(1)
        except ValueError:
            spans.append((0, 0))
            continue
        hi = len(seq) - seq[::-1].index(1)
        if seq.count(1) != hi - lo:  # not one range (no pair template does this): list them
            spans.append(None)
            positions.append([t for t, sid in enumerate(seq) if sid == 1])
        else:
            spans.append((lo, hi))
    starts = np.zeros(len(windows), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    if all(sp is not None for sp in spans):
        lo = np.array([sp[0] for sp in spans], dtype=np.int64)
        counts = np.array([sp[1] - sp[0] for sp in spans], dtype=np.int64)
        context = np.repeat(starts + lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        picked = (w.offsets[a:b] for w, (a, b) in zip(windows, spans, strict=True))
    else:
        it = iter(positions)
        local = [list(range(*sp)) if sp is not None else next(it) for sp in spans]
        counts = np.array([len(x) for x in local], dtype=np.int64)
        context = np.fromiter((s + t for s, x in zip(starts.tolist(), local, strict=True) for t in x), dtype=np.int64,
                              count=int(counts.sum()))
        picked = ([w.offsets[t] for t in x] for w, x in zip(windows, local, strict=True))
    n_ctx = int(counts.sum())
    offsets = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(picked)), dtype=np.int64,
                          count=2 * n_ctx).reshape(-1, 2)
    return EncodedPairs(errors, ids, lengths, np.asarray(owners, dtype=np.int64), context, offsets, counts)


class Highlighter:
    """Loads one token classifier; ``extract`` maps (query, chunk) pairs to spans (the three parts in-process)."""

    name = "highlighter"

    def __init__(self, config: HighlighterConfig | None = None) -> None:
        import torch
        from transformers import AutoModelForTokenClassification, ModernBertForTokenClassification

        from verbatim_batch.retrieval.embedder import portable_model_id

        self.config = config = config or HighlighterConfig()
        self.device = models.resolve_device(config.device)
        self.torch_dtype = models.resolve_dtype(config.dtype, self.device)
        model_dir = models.resolve_model_dir(config.model, config.revision, "highlighter model")
        weights = models.safetensors_files(model_dir)
        self.model_id = portable_model_id(config.model)
        self.model_revision = models.fingerprint(weights)
        mconf = _classifier_config(model_dir, config.trust_remote_code)
        cls = ModernBertForTokenClassification if mconf.model_type == "modernbert" else AutoModelForTokenClassification
        self.model, self.attn_implementation = models.load_model(
            cls, model_dir, device=self.device, torch_dtype=self.torch_dtype, config=mconf,
            attn_implementation=config.attn_implementation, trust_remote_code=config.trust_remote_code,
        )
        self.model.eval().requires_grad_(False)
        _check_head_loaded(self.model, weights)
        self.host = HighlighterTokenizer(config, model_dir, self.model.config)
        self.tokenizer = self.host.tokenizer
        self.max_length = self.host.max_length
        self.pad_token_id = self.host.pad_token_id
        self.stats: dict[str, Any] = dict(pairs=0, windows=0, tokens=0, padded_tokens=0, forwards=0,
                                          tokenize_s=0.0, forward_s=0.0)
        self._torch = torch

    def describe(self) -> dict[str, Any]:
        """What was loaded and how it is set, for manifests and span rows."""
        return {
            "extractor": self.name, "model_id": self.model_id, "model_revision": self.model_revision,
            "config_hash": self.config.hash, "device": str(self.device),
            "dtype": str(self.torch_dtype).removeprefix("torch."), "attn_implementation": self.attn_implementation,
            "max_length": self.max_length, "threshold": self.config.threshold,
            "min_chars": self.config.min_chars, "merge_gap": self.config.merge_gap,
        }

    # --- scoring --------------------------------------------------------------------

    def _windows(self, queries: Sequence[str], chunks: Sequence[str]):
        """Tokenise pairs into overlapping windows; returns encodings and per-pair query errors."""
        return self.host.windows(queries, chunks)

    def encode(self, queries: Sequence[str], chunks: Sequence[str]) -> EncodedPairs:
        t0 = time.perf_counter()
        enc = self.host.encode(queries, chunks)
        self.stats["tokenize_s"] += time.perf_counter() - t0
        return enc

    def forward_probs(self, ids: np.ndarray, window_lengths: np.ndarray) -> np.ndarray:
        """Positive probability (float32) of every token of every window, flat like ``ids``, packed by length."""
        from verbatim_batch.retrieval.embedder import plan_batches

        torch = self._torch
        lengths = np.asarray(window_lengths, dtype=np.int64)
        starts = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        out = np.empty(int(lengths.sum()), np.float32)
        self.live_done, self.live_total = 0, len(lengths)  # windows of this call, for the progress line
        for idx in plan_batches(lengths, self.config.token_budget, self.config.max_batch_rows):
            lens = lengths[idx]
            width = int(lens.max())
            valid = np.arange(width)[None, :] < lens[:, None]
            where = (starts[idx][:, None] + np.arange(width)[None, :])[valid]
            batch = np.full((len(idx), width), self.pad_token_id, dtype=np.int64)
            batch[valid] = ids[where]
            t0 = time.perf_counter()
            with torch.inference_mode():
                logits = self.model(input_ids=torch.from_numpy(batch).to(self.device),
                                    attention_mask=torch.from_numpy(valid.astype(np.int64)).to(self.device)).logits
                pos = torch.softmax(logits.float(), dim=-1)[..., 1:].sum(dim=-1).cpu().numpy()
            self.stats["forward_s"] += time.perf_counter() - t0
            self.stats["forwards"] += 1
            self.stats["tokens"] += int(lens.sum())
            self.stats["padded_tokens"] += len(idx) * width
            if not np.isfinite(pos).all():
                raise FloatingPointError("the highlighter produced NaN/inf probabilities")
            out[where] = pos[valid]
            self.live_done += len(idx)
        self.stats["windows"] += len(lengths)
        return out

    @property
    def live_fraction(self) -> float | None:
        """How much of the current ``forward_probs`` call has been through the model (``pipeline.live``)."""
        total = getattr(self, "live_total", 0)
        return self.live_done / total if total else None

    def context_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> ContextScores:
        """Tokenise and score a batch of pairs: the context tokens' probabilities, flat."""
        enc = self.encode(queries, chunks)
        scores = enc.scores(self.forward_probs(enc.ids, enc.window_lengths))
        self.stats["pairs"] += sum(e is None for e in enc.errors)
        return scores

    def token_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> list[TokenScores | str]:
        """Per pair, the context tokens' positive probabilities (or an error string)."""
        scores = self.context_scores(queries, chunks)
        return [err if err else scores.pair(i) for i, err in enumerate(scores.errors)]

    def spans_from_scores(self, scores: TokenScores, chunk: str, threshold: float | None = None) -> PairResult:
        """Spans of one pair at a threshold (default: the configured one); see the module docs."""
        cfg = self.config
        t = cfg.threshold if threshold is None else threshold
        return PairResult(highlight_spans(scores, chunk, t, cfg.min_chars, cfg.merge_gap), scores.relevance)

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        """Spans for each (query, chunk) pair."""
        return self.sweep(queries, chunks, [self.config.threshold])[self.config.threshold]

    def sweep(self, queries: Sequence[str], chunks: Sequence[str],
              thresholds: Sequence[float]) -> dict[float, list[PairResult]]:
        """Spans at several thresholds from one forward pass per window."""
        scores = self.context_scores(queries, chunks)
        cfg = self.config
        return {t: scores.results(chunks, t, cfg.min_chars, cfg.merge_gap) for t in thresholds}

    def __call__(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        return self.extract(queries, chunks)


def host_describe(config: HighlighterConfig) -> dict[str, Any]:
    """What ``Highlighter.describe`` puts into rows (model id, weights hash, config hash), without loading it."""
    from verbatim_batch.retrieval.embedder import portable_model_id

    return {"extractor": "highlighter", "model_id": portable_model_id(config.model),
            "model_revision": _fingerprint(config), "config_hash": config.hash}


def _fingerprint(config: HighlighterConfig) -> str:
    model_dir = models.resolve_model_dir(config.model, config.revision, "highlighter model")
    return models.fingerprint(models.safetensors_files(model_dir))


EXTRACTOR = ExtractorKind("highlighter", HighlighterConfig, build=lambda config: Highlighter(config),
                          fingerprint=_fingerprint)
