"""The highlighter: a ModernBERT token classifier that marks evidence tokens in a chunk.

The input is the pair (query, chunk), tokenised as a sentence pair. Pairs longer than
``max_length`` are cut into windows over the chunk that overlap by ``stride`` tokens
(the tokenizer's own overflow handling, so every window repeats the query).

Post-processing is that of the released students' ``process()`` (the model card code of
``KRLabsOrg/acl-verbatim-modernbert``), so the same weights give the same spans:

1. a token's positive probability is the sum of its non-zero labels' softmax probabilities
   (``P(label 1)`` for the binary students);
2. in each window separately, runs of consecutive context tokens (non-empty offsets) at or
   above ``threshold`` become character ranges: from the first token's start offset to
   the last token's end offset, scored by their highest probability; any other token
   (below the threshold, a special or query token, an empty offset) ends a run;
3. the runs of all windows are sorted and merged when one starts at most ``merge_gap``
   characters after the previous one ends (runs of overlapping windows overlap, so they
   merge), and only then are spans shorter than ``min_chars`` dropped (``spans.postprocess``).

One addition: each final span is trimmed of leading and trailing whitespace (byte-level BPE
offsets include a token's leading space). Trimming comes after the length test, so it changes
nothing but that whitespace. The pair's ``relevance`` is the highest probability of any of
its context tokens, so callers can abstain.

Many pairs go through at once: all windows of a batch are sorted by length and packed into
forward passes under a token budget, in bfloat16 on GPU. Packing changes which windows share
a forward pass, never which tokens a window holds, so it cannot change a span (beyond float
rounding of a probability that sits exactly on the threshold).

The work is split in three parts so that a GPU's process runs only the model (issue 25):
``HighlighterTokenizer.encode`` cuts the windows of a batch of pairs into flat arrays (a private copy of the
Rust tokenizer, checked against the transformers call), ``Highlighter.forward_probs`` runs the forward passes,
and ``ContextScores.results`` builds every pair's spans with numpy over the whole batch (``spans.flat_runs`` and
``spans.merge_runs``: the per-token rules above, no Python object per token). ``extract`` runs the three in
this process; the extract job runs them as a CPU tokenize stage, the model actors and a CPU span stage
(``encode_table``, ``forward_table``, ``spans_table``).

The paper's students (``KRLabsOrg/acl-verbatim-modernbert``,
``KRLabsOrg/verbatim-rag-modern-bert-v2``) ship configs that point at custom code
while their weights are a plain ``ModernBertForTokenClassification``; they load here
with ``trust_remote_code`` off.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from .. import tables
from ..models import fingerprint, load_model, resolve_device, resolve_dtype, resolve_model_dir, safetensors_files
from .registry import ExtractorKind
from .spans import PairResult, Span, flat_runs, merge_runs, trimmed_spans

HIGHLIGHTER_VERSION = "2"  # 2: merge-then-drop per-window runs, as the released process()
PAPER_STUDENT = "KRLabsOrg/acl-verbatim-modernbert"
_RUNTIME_FIELDS = ("device", "token_budget", "max_batch_rows")


@dataclass(frozen=True)
class HighlighterConfig:
    """Settings of the highlighter. ``hash`` covers everything that can change a span."""

    kind: ClassVar[str] = "highlighter"

    model: str = PAPER_STUDENT  # hub id or local directory
    revision: str | None = None
    threshold: float = 0.2
    min_chars: int = 10
    merge_gap: int = 20
    max_length: int = 8192  # tokens per window, query included
    stride: int = 256  # tokens shared by neighbouring windows
    max_query_tokens: int | None = None  # None: min(512, max_length // 4); longer queries are error rows
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    attn_implementation: str = "auto"
    token_budget: int = 32768  # padded tokens per forward pass
    max_batch_rows: int = 128
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.min_chars < 0 or self.merge_gap < 0:
            raise ValueError("min_chars and merge_gap must be >= 0")
        if self.max_length < 16:
            raise ValueError(f"max_length must be >= 16, got {self.max_length}")
        if not 0 <= self.stride < self.max_length // 2:
            raise ValueError(f"stride must be in [0, max_length / 2), got {self.stride}")
        if self.max_query_tokens is None:
            object.__setattr__(self, "max_query_tokens", min(512, self.max_length // 4))
        if not 0 < self.max_query_tokens < self.max_length - self.stride - 8:
            raise ValueError("max_query_tokens must leave room for the stride and some context in each window")
        if self.token_budget <= 0 or self.max_batch_rows <= 0:
            raise ValueError("token_budget and max_batch_rows must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def hash(self) -> str:
        from ..embedding import portable_model_id

        d = {k: v for k, v in self.to_dict().items() if k not in _RUNTIME_FIELDS}
        d["model"] = portable_model_id(self.model)
        return tables.config_hash({"highlighter_version": HIGHLIGHTER_VERSION, **d})


@dataclass
class TokenScores:
    """Positive probabilities of a pair's context tokens, window by window.

    ``windows`` holds, for each window of the pair in order, the character offsets
    (``(n, 2)`` int64) and probabilities (``(n,)`` float32) of its context tokens in token
    order, empty-offset tokens included (they end a run).
    """

    windows: list[tuple[np.ndarray, np.ndarray]]

    @property
    def n_windows(self) -> int:
        return len(self.windows)

    def _merged(self) -> tuple[np.ndarray, np.ndarray]:
        parts = [np.column_stack([o, p.astype(np.float64)]) for o, p in self.windows if len(p)]
        if not parts:
            return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.float32)
        rows = np.concatenate(parts)
        rows = rows[rows[:, 1] > rows[:, 0]]
        if not len(rows):
            return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.float32)
        rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
        starts = np.flatnonzero(np.r_[True, (np.diff(rows[:, 0]) != 0) | (np.diff(rows[:, 1]) != 0)])
        return rows[starts, :2].astype(np.int64), np.maximum.reduceat(rows[:, 2], starts).astype(np.float32)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """Each distinct non-empty context token once, in chunk order (for inspection)."""
        return [(int(a), int(b)) for a, b in self._merged()[0]]

    @property
    def probs(self) -> np.ndarray:
        """The probability of each of ``segments``: its highest over the windows that hold it."""
        return self._merged()[1]

    @property
    def relevance(self) -> float:
        best = [float(p[o[:, 1] > o[:, 0]].max()) for o, p in self.windows if (o[:, 1] > o[:, 0]).any()]
        return max(best) if best else 0.0

    def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets (n, 2), probs (n,), window_first (n,))``: the windows one after another."""
        if not self.windows:
            return np.zeros((0, 2), np.int64), np.zeros(0, np.float32), np.zeros(0, bool)
        offsets = np.concatenate([np.asarray(o).reshape(-1, 2) for o, _ in self.windows])
        probs = np.concatenate([np.asarray(p, dtype=np.float32) for _, p in self.windows])
        first = np.zeros(len(probs), dtype=bool)
        sizes = np.array([len(p) for _, p in self.windows], dtype=np.int64)
        first[(np.cumsum(sizes) - sizes)[sizes > 0]] = True
        return offsets, probs, first

    def runs(self, threshold: float) -> list[Span]:
        """The runs at ``threshold`` of every window (unsorted, unmerged, untrimmed).

        Probabilities are compared in float64 (float32 values widened exactly), so a
        threshold is never rounded to float32 first.
        """
        _, start, end, score = flat_runs(*self.flat(), threshold)
        return [Span(s, e, c) for s, e, c in zip(start.tolist(), end.tolist(), score.tolist(), strict=True)]


def highlight_spans(scores: TokenScores, chunk: str, threshold: float, min_chars: int, merge_gap: int) -> list[Span]:
    """A pair's spans from its token probabilities: per-window runs, merged, short ones dropped, trimmed."""
    _, start, end, score = flat_runs(*scores.flat(), threshold)
    _, start, end, score = merge_runs(np.zeros(len(start), np.int64), start, end, score, min_chars, merge_gap)
    return trimmed_spans(chunk, start, end, score)


# --- the host side: windows in, spans out, as flat arrays over a whole batch of pairs --------------------


@dataclass
class EncodedPairs:
    """A batch of pairs cut into windows, as flat arrays: what the tokenize stage hands the model.

    Windows follow one another (the windows of pair 0, then of pair 1, ...); a pair that was not encoded
    (``errors``) has none.
    """

    errors: list[str | None]  # per pair: why it was not encoded (query_too_long), else None
    ids: np.ndarray  # int32 (T,): the tokens of every window, window after window
    window_lengths: np.ndarray  # int64 (W,)
    window_pair: np.ndarray  # int64 (W,): the pair (index in the batch) of each window
    context: np.ndarray  # int64 (C,): positions in ``ids`` of the context (chunk) tokens
    offsets: np.ndarray  # int64 (C, 2): their character offsets in the chunk
    context_counts: np.ndarray  # int64 (W,): context tokens per window

    @property
    def n_pairs(self) -> int:
        return len(self.errors)

    def scores(self, token_probs: np.ndarray) -> ContextScores:
        """The context tokens' scores, given the probability of every token of ``ids``."""
        probs = np.asarray(token_probs, dtype=np.float32)[self.context] if len(self.context) else \
            np.zeros(0, np.float32)
        return ContextScores(list(self.errors), self.offsets, probs, self.context_counts, self.window_pair)


@dataclass
class ContextScores:
    """The context tokens of a batch of pairs with their positive probabilities, flat (what the span stage
    reads): ``offsets``/``probs`` window after window, ``context_counts`` and ``window_pair`` per window."""

    errors: list[str | None]
    offsets: np.ndarray  # (C, 2)
    probs: np.ndarray  # float32 (C,)
    context_counts: np.ndarray  # (W,)
    window_pair: np.ndarray  # (W,)

    @property
    def n_pairs(self) -> int:
        return len(self.errors)

    def pair(self, i: int) -> TokenScores:
        """Pair ``i``'s windows as ``TokenScores``."""
        bounds = np.r_[0, np.cumsum(self.context_counts)]
        return TokenScores([(self.offsets[bounds[w]:bounds[w + 1]], self.probs[bounds[w]:bounds[w + 1]])
                            for w in np.flatnonzero(self.window_pair == i)])

    def results(self, chunks: Sequence[str | None], threshold: float, min_chars: int,
                merge_gap: int) -> list[PairResult]:
        """Every pair's spans and relevance (``highlight_spans`` and ``TokenScores.relevance`` of each pair,
        computed over the whole batch at once); an error pair gets its error."""
        n = self.n_pairs
        counts = np.asarray(self.context_counts, dtype=np.int64)
        token_pair = np.repeat(np.asarray(self.window_pair, dtype=np.int64), counts)
        first = np.zeros(len(token_pair), dtype=bool)
        first[(np.cumsum(counts) - counts)[counts > 0]] = True
        first_token, start, end, score = flat_runs(self.offsets, self.probs, first, threshold)
        group, start, end, score = merge_runs(token_pair[first_token], start, end, score, min_chars, merge_gap)
        bounds = np.searchsorted(group, np.arange(n + 1))
        relevance = _pair_max(self.offsets, self.probs, token_pair, n)
        out = []
        for i in range(n):
            if self.errors[i]:
                out.append(PairResult([], None, self.errors[i]))
                continue
            a, b = bounds[i], bounds[i + 1]
            spans = trimmed_spans(chunks[i], start[a:b], end[a:b], score[a:b]) if b > a else []
            out.append(PairResult(spans, relevance[i]))
        return out


def _pair_max(offsets: np.ndarray, probs: np.ndarray, token_pair: np.ndarray, n: int) -> list[float]:
    """Per pair, the highest probability of a non-empty context token (0.0 when it has none)."""
    best = np.full(n, -np.inf)
    counts = np.bincount(token_pair, minlength=n)  # token_pair is sorted: each pair's tokens are one run
    has = counts > 0
    if has.any():
        masked = np.where(offsets[:, 1] > offsets[:, 0], probs.astype(np.float64), -np.inf)
        best[has] = np.maximum.reduceat(masked, (np.cumsum(counts) - counts)[has])
    return [b if b != -np.inf else 0.0 for b in best.tolist()]


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
    """The host side of the highlighter: its tokenizer and window settings, no model (a CPU stage loads
    this alone; ``Highlighter`` holds one too, so both cut the same windows).

    ``windows`` is the reference tokenizer call (transformers' overflow windows). ``encode`` gives the same
    windows as flat arrays, straight from a private copy of the Rust tokenizer set up by that very call
    (checked on a probe at load; where the copy is not usable, it reads the reference call's encodings).
    """

    def __init__(self, config: HighlighterConfig, model_dir: Path | None = None, model_config: Any = None) -> None:
        from transformers import AutoTokenizer

        from ..embedding import portable_model_id

        self.config = config
        model_dir = model_dir or resolve_model_dir(config.model, config.revision, "highlighter model")
        mconf = model_config if model_config is not None else _classifier_config(model_dir, config.trust_remote_code)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=config.trust_remote_code)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{portable_model_id(config.model)}: a fast tokenizer (with offsets) is required")
        positions = getattr(mconf, "max_position_embeddings", None)
        self.max_length = min(config.max_length, positions or config.max_length)
        if self.max_length - config.stride - config.max_query_tokens < 8:
            raise ValueError(f"max_length {self.max_length} leaves no room for context after the query")
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._backends = self._private_backends()

    def windows(self, queries: Sequence[str], chunks: Sequence[str]):
        """Tokenise pairs into overlapping windows; returns the ok pairs, the encodings and per-pair query errors."""
        q_lens = [len(ids) for ids in self.tokenizer(list(queries), add_special_tokens=False)["input_ids"]]
        ok = [i for i, n in enumerate(q_lens) if n <= self.config.max_query_tokens]
        enc = self.tokenizer(
            [queries[i] for i in ok], [chunks[i] for i in ok], truncation="only_second",
            max_length=self.max_length, stride=self.config.stride, return_overflowing_tokens=True,
            return_offsets_mapping=True, padding=False,
        ) if ok else None
        too_long = {i: f"query_too_long: {q_lens[i]} tokens > {self.config.max_query_tokens}"
                    for i in range(len(queries)) if q_lens[i] > self.config.max_query_tokens}
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
        limit = self.config.max_query_tokens
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
    """Loads one token classifier; ``extract`` maps (query, chunk) pairs to spans.

    Three parts, each usable alone (the extract job runs them as three stages: ``HighlighterTokenizer.encode``
    on CPU, ``forward_probs`` on the model's device, ``ContextScores.results`` on CPU); ``extract`` runs all
    three in this process.
    """

    name = "highlighter"

    def __init__(self, config: HighlighterConfig | None = None) -> None:
        import torch
        from transformers import AutoModelForTokenClassification, ModernBertForTokenClassification

        from ..embedding import portable_model_id

        self.config = config = config or HighlighterConfig()
        self.device = resolve_device(config.device)
        self.torch_dtype = resolve_dtype(config.dtype, self.device)
        model_dir = resolve_model_dir(config.model, config.revision, "highlighter model")
        weights = safetensors_files(model_dir)
        self.model_id = portable_model_id(config.model)
        self.model_revision = fingerprint(weights)
        mconf = _classifier_config(model_dir, config.trust_remote_code)
        cls = ModernBertForTokenClassification if mconf.model_type == "modernbert" else AutoModelForTokenClassification
        self.model, self.attn_implementation = load_model(
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
        """Positive probability (float32) of every token of every window, flat like ``ids``; windows are
        sorted by length and packed into forward passes under the token budget."""
        from ..embedding import plan_batches

        torch = self._torch
        lengths = np.asarray(window_lengths, dtype=np.int64)
        starts = np.zeros(len(lengths), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        out = np.empty(int(lengths.sum()), np.float32)
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
        self.stats["windows"] += len(lengths)
        return out

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


# --- the three stages over Arrow batches (the extract job's split placement) -------------------------------
# A batch of ``PAIR_INPUT`` rows travels with internal list columns, one row per pair:
#   tokenize stage -> _hl_ids (tokens of all its windows), _hl_wlen (window lengths), _hl_ctx (positions of the
#                     context tokens in _hl_ids), _hl_off (their offsets, two per token), _hl_cnum (context
#                     tokens per window), _hl_invalid (validate_pair's reason), _hl_error (extractor error),
#                     _hl_ms (host and model milliseconds spent on the pair so far)
#   forward stage  -> drops _hl_ids, _hl_wlen and _hl_ctx; adds _hl_p (the context tokens' probabilities)
#   span stage     -> the packed spans/pairs/rejects block (``stage.pack``)

TOKEN_COLUMNS = ("_hl_ids", "_hl_wlen", "_hl_ctx")


def _flat(column: pa.ChunkedArray | pa.Array, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (flat numpy) and each row's list length."""
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)


def _lists(values: np.ndarray, counts: np.ndarray, type_: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = np.asarray(values).astype(type_.to_pandas_dtype(), copy=False)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, type_))


def encode_table(host: HighlighterTokenizer, batch: pa.Table, max_chunk_chars: int,
                 max_query_chars: int) -> pa.Table:
    """The tokenize stage: ``PAIR_INPUT`` rows -> the same rows with their windows (see above). A pair that
    fails validation or tokenisation gets its reason; the others are tokenised together."""
    from .stage import _error_reason, validate_pair

    t0 = time.perf_counter()
    rows = batch.select(["query", "chunk", "input_error"]).to_pylist()
    n = len(rows)
    invalid = [validate_pair(r, max_chunk_chars, max_query_chars) for r in rows]
    errors: list[str | None] = [None] * n
    todo = [i for i, e in enumerate(invalid) if e is None]
    try:
        enc = host.encode([rows[i]["query"] for i in todo], [rows[i]["chunk"] for i in todo])
    except Exception:  # noqa: BLE001 - find the pair that fails, tokenise the others together
        for i in todo:
            try:
                host.encode([rows[i]["query"]], [rows[i]["chunk"]])
            except Exception as exc:  # noqa: BLE001 - a per-pair error row, the batch goes on
                errors[i] = _error_reason(exc)
        todo = [i for i in todo if errors[i] is None]
        enc = host.encode([rows[i]["query"] for i in todo], [rows[i]["chunk"] for i in todo])
    for k, i in enumerate(todo):
        errors[i] = enc.errors[k]
    row = np.asarray(todo, dtype=np.int64)[enc.window_pair] if len(enc.window_pair) else np.zeros(0, np.int64)
    win_per_row = np.bincount(row, minlength=n)
    tok_per_row = np.bincount(row, weights=enc.window_lengths, minlength=n).astype(np.int64)
    ctx_per_row = np.bincount(row, weights=enc.context_counts, minlength=n).astype(np.int64)
    row_start = np.cumsum(tok_per_row) - tok_per_row
    local_ctx = enc.context - np.repeat(row_start, ctx_per_row)
    ms = 1000.0 * (time.perf_counter() - t0) / max(1, len(todo))
    columns = {
        "_hl_ids": _lists(enc.ids, tok_per_row, pa.int32()),
        "_hl_wlen": _lists(enc.window_lengths, win_per_row, pa.int32()),
        "_hl_ctx": _lists(local_ctx, ctx_per_row, pa.int32()),
        "_hl_off": _lists(enc.offsets.reshape(-1), 2 * ctx_per_row, pa.int32()),
        "_hl_cnum": _lists(enc.context_counts, win_per_row, pa.int32()),
        "_hl_invalid": pa.array(invalid, pa.string()),
        "_hl_error": pa.array(errors, pa.string()),
        "_hl_ms": pa.array([ms if e is None else 0.0 for e in invalid], pa.float64()),
    }
    for name, col in columns.items():
        batch = batch.append_column(name, col)
    return batch


def forward_table(hl: Highlighter, batch: pa.Table) -> pa.Table:
    """The forward stage: the model over every window of the batch (packed under the token budget), nothing
    else; the context tokens' probabilities come back as ``_hl_p``. If the batch fails, each pair alone."""
    from .stage import _error_reason

    t0 = time.perf_counter()
    ids, tok_per_row = _flat(batch["_hl_ids"], np.int32)
    lengths, win_per_row = _flat(batch["_hl_wlen"], np.int64)
    ctx, ctx_per_row = _flat(batch["_hl_ctx"], np.int64)
    errors = batch["_hl_error"].to_pylist()
    row_start = np.cumsum(tok_per_row) - tok_per_row
    try:
        probs = hl.forward_probs(ids, lengths)
    except Exception:  # noqa: BLE001 - isolate the failing pair below
        probs = np.zeros(len(ids), np.float32)
        win_start = np.cumsum(win_per_row) - win_per_row
        for r in np.flatnonzero(win_per_row):
            a, b = row_start[r], row_start[r] + tok_per_row[r]
            try:
                probs[a:b] = hl.forward_probs(ids[a:b], lengths[win_start[r]:win_start[r] + win_per_row[r]])
            except Exception as exc:  # noqa: BLE001 - a per-pair error row, the batch goes on
                errors[r] = _error_reason(exc)
    p = probs[ctx + np.repeat(row_start, ctx_per_row)] if len(ctx) else np.zeros(0, np.float32)
    done = np.asarray([e is None for e in batch["_hl_invalid"].to_pylist()])
    ms = batch["_hl_ms"].to_numpy(zero_copy_only=False) + np.where(
        done, 1000.0 * (time.perf_counter() - t0) / max(1, int(done.sum())), 0.0)
    out = batch.drop_columns([*TOKEN_COLUMNS, "_hl_error", "_hl_ms"])
    return (out.append_column("_hl_p", _lists(p, ctx_per_row, pa.float32()))
            .append_column("_hl_error", pa.array(errors, pa.string()))
            .append_column("_hl_ms", pa.array(ms, pa.float64())))


def failed_forward_table(batch: pa.Table, error: str) -> pa.Table:
    """What the forward stage hands on for a batch it gave up on: the same columns as ``forward_table``'s, every
    row with ``error`` (zero probabilities, never read)."""
    _, ctx_per_row = _flat(batch["_hl_ctx"], np.int64)
    n = batch.num_rows
    out = batch.drop_columns([*TOKEN_COLUMNS, "_hl_error", "_hl_ms"])
    return (out.append_column("_hl_p", _lists(np.zeros(int(ctx_per_row.sum())), ctx_per_row, pa.float32()))
            .append_column("_hl_error", pa.array([error] * n, pa.string()))
            .append_column("_hl_ms", pa.array([0.0] * n, pa.float64())))


def scores_of(batch: pa.Table) -> ContextScores:
    """The span stage's view of a forward stage's batch."""
    offsets, _ = _flat(batch["_hl_off"], np.int64)
    probs, _ = _flat(batch["_hl_p"], np.float32)
    counts, win_per_row = _flat(batch["_hl_cnum"], np.int64)
    errors = [a or b for a, b in zip(batch["_hl_invalid"].to_pylist(), batch["_hl_error"].to_pylist(), strict=True)]
    window_pair = np.repeat(np.arange(batch.num_rows, dtype=np.int64), win_per_row)
    return ContextScores(errors, offsets.reshape(-1, 2), probs, counts, window_pair)


def spans_table(batch: pa.Table, stage: Any, config: HighlighterConfig) -> dict[str, pa.Table]:
    """The span stage: spans (runs, merge, drop, trim) of every pair of a forward stage's batch, then the
    verbatim gate and the rows (``PairExtractor.tables`` of ``stage``)."""
    from ..tables import PAIR_INPUT

    t0 = time.perf_counter()
    results = scores_of(batch).results(batch["chunk"].to_pylist(), config.threshold, config.min_chars,
                                       config.merge_gap)
    invalid = batch["_hl_invalid"].to_pylist()
    done = [i for i, e in enumerate(invalid) if e is None]
    ms = 1000.0 * (time.perf_counter() - t0) / max(1, len(done))
    latency = [v + ms for v in batch["_hl_ms"].to_pylist()]
    rows = batch.select(PAIR_INPUT.names).to_pylist()
    return stage.tables(rows, {i: results[i] for i in done}, invalid, latency)


class HighlighterRows:
    """The highlighter as the span stage sees it (``PairExtractor`` needs a name and ``describe``): no model,
    the figures its rows carry, computed once by the driver (``host_describe``)."""

    name = "highlighter"

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = dict(info)

    def describe(self) -> dict[str, Any]:
        return dict(self.info)

    def extract(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        raise RuntimeError("the span stage builds spans from model outputs; it runs no model")


def host_describe(config: HighlighterConfig) -> dict[str, Any]:
    """What ``Highlighter.describe`` puts into rows (model id, weights hash, config hash), without loading it."""
    from ..embedding import portable_model_id

    return {"extractor": "highlighter", "model_id": portable_model_id(config.model),
            "model_revision": _fingerprint(config), "config_hash": config.hash}


def _fingerprint(config: HighlighterConfig) -> str:
    return fingerprint(safetensors_files(resolve_model_dir(config.model, config.revision, "highlighter model")))


EXTRACTOR = ExtractorKind("highlighter", HighlighterConfig, build=lambda config: Highlighter(config),
                          fingerprint=_fingerprint)
