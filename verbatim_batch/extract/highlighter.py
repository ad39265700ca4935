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

The paper's students (``KRLabsOrg/acl-verbatim-modernbert``,
``KRLabsOrg/verbatim-rag-modern-bert-v2``) ship configs that point at custom code
while their weights are a plain ``ModernBertForTokenClassification``; they load here
with ``trust_remote_code`` off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import tables
from ..models import fingerprint, load_model, resolve_device, resolve_dtype, resolve_model_dir, safetensors_files
from .registry import ExtractorKind
from .spans import PairResult, Span, postprocess, runs_above

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

    def runs(self, threshold: float) -> list[Span]:
        """The runs at ``threshold`` of every window (unsorted, unmerged, untrimmed).

        Probabilities are compared as Python floats (float32 values widened exactly), so a
        threshold is never rounded to float32 first.
        """
        return [r for o, p in self.windows for r in runs_above(o.tolist(), p.tolist(), threshold)]


def highlight_spans(scores: TokenScores, chunk: str, threshold: float, min_chars: int, merge_gap: int) -> list[Span]:
    """A pair's spans from its token probabilities: per-window runs, merged, short ones dropped, trimmed."""
    return postprocess(scores.runs(threshold), min_chars, merge_gap, chunk)


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


class Highlighter:
    """Loads one token classifier; ``extract`` maps (query, chunk) pairs to spans."""

    name = "highlighter"

    def __init__(self, config: HighlighterConfig | None = None) -> None:
        import torch
        from transformers import AutoModelForTokenClassification, AutoTokenizer, ModernBertForTokenClassification

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
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=config.trust_remote_code)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(f"{self.model_id}: a fast tokenizer (with offsets) is required")
        positions = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(config.max_length, positions or config.max_length)
        if self.max_length - config.stride - config.max_query_tokens < 8:
            raise ValueError(f"max_length {self.max_length} leaves no room for context after the query")
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
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

    def _forward(self, windows: list[list[int]]) -> list[np.ndarray]:
        """Positive probability of every token of every window, batched by length."""
        from ..embedding import plan_batches

        torch = self._torch
        lengths = np.array([len(w) for w in windows])
        out: list[np.ndarray] = [np.empty(0)] * len(windows)
        for idx in plan_batches(lengths, self.config.token_budget, self.config.max_batch_rows):
            width = int(lengths[idx].max())
            ids = np.full((len(idx), width), self.pad_token_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                ids[r, : lengths[i]] = windows[i]
                mask[r, : lengths[i]] = 1
            t0 = time.perf_counter()
            with torch.inference_mode():
                logits = self.model(input_ids=torch.from_numpy(ids).to(self.device),
                                    attention_mask=torch.from_numpy(mask).to(self.device)).logits
                pos = torch.softmax(logits.float(), dim=-1)[..., 1:].sum(dim=-1).cpu().numpy()
            self.stats["forward_s"] += time.perf_counter() - t0
            self.stats["forwards"] += 1
            self.stats["tokens"] += int(lengths[idx].sum())
            self.stats["padded_tokens"] += len(idx) * width
            if not np.isfinite(pos).all():
                raise FloatingPointError("the highlighter produced NaN/inf probabilities")
            for r, i in enumerate(idx):
                out[i] = pos[r, : lengths[i]]
        return out

    def token_scores(self, queries: Sequence[str], chunks: Sequence[str]) -> list[TokenScores | str]:
        """Per pair, the context tokens' positive probabilities (or an error string)."""
        t0 = time.perf_counter()
        ok, enc, errors = self._windows(queries, chunks)
        self.stats["tokenize_s"] += time.perf_counter() - t0
        results: list[TokenScores | str] = [errors.get(i, "") for i in range(len(queries))]
        if enc is None:
            return results
        windows = enc["input_ids"]
        owners = enc["overflow_to_sample_mapping"]
        probs = self._forward(windows)
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {k: [] for k in range(len(ok))}
        for w, owner in enumerate(owners):
            context = np.array([sid == 1 for sid in enc.sequence_ids(w)], dtype=bool)
            offsets = np.asarray(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
            parts[owner].append((offsets[context], probs[w][context].astype(np.float32)))
        for k, i in enumerate(ok):
            results[i] = TokenScores(parts[k])
        self.stats["pairs"] += len(ok)
        self.stats["windows"] += len(windows)
        return results

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
        scored = self.token_scores(queries, chunks)
        out: dict[float, list[PairResult]] = {}
        for t in thresholds:
            out[t] = [PairResult([], None, s) if isinstance(s, str) else self.spans_from_scores(s, c, t)
                      for s, c in zip(scored, chunks, strict=True)]
        return out

    def __call__(self, queries: Sequence[str], chunks: Sequence[str]) -> list[PairResult]:
        return self.extract(queries, chunks)


def _fingerprint(config: HighlighterConfig) -> str:
    return fingerprint(safetensors_files(resolve_model_dir(config.model, config.revision, "highlighter model")))


EXTRACTOR = ExtractorKind("highlighter", HighlighterConfig, build=lambda config: Highlighter(config),
                          fingerprint=_fingerprint)
