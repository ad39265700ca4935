"""Reranking retrieved chunks with a cross-encoder: the batch callable of the rerank stage.

``Reranker`` loads one cross-encoder (a sequence classifier with one output, or two: the score is then the
log-odds of the last label; safetensors only, ``models``). Pairs are tokenized once (the chunk cut to
``max_length`` tokens) and packed by length under ``token_budget`` (``embedder.plan_batches``). Called on a batch of
candidates (``CANDIDATE_COLUMNS``, every candidate of its queries), it returns ``tables.RERANKED`` rows: per query,
by score, ties by the earlier rank. No weights ship offline: the tests build a tiny random cross-encoder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from verbatim_batch.core import limits, models, tables
from verbatim_batch.core.options import Declared, option, runtime

RERANK_VERSION = 1
METHOD = "rerank"  # the ``method`` of reranked rows
CANDIDATE_COLUMNS = ("query_id", "query", "chunk_id", "paper_id", "chunk", "first_method", "first_rank",
                     "first_score", "dense_rank", "bm25_rank")
_KEPT = ("chunk_id", "paper_id", "dense_rank", "bm25_rank", "first_method", "first_rank", "first_score")


@dataclass(frozen=True)
class RerankerConfig(Declared):
    """Settings of the reranker. ``hash`` covers what can change a score."""

    model: str = option(help="the cross-encoder: hub id or local path (safetensors; a sequence classifier with 1 or "
                        "2 labels)")
    revision: str | None = option(None, "model revision (hub)")
    max_length: int = option(512, "tokens per (query, chunk) input; the chunk is cut to fit", low=8, high=limits.TOKENS)
    dtype: str = option("auto", "weights' type (auto: bfloat16 on CUDA, float32 on CPU)",
                        choices=("auto", "float32", "bfloat16", "float16"))
    device: str = runtime("auto")
    token_budget: int = option(16384, "padded tokens per forward pass", low=1, high=limits.TOKENS, runtime=True)
    max_batch_rows: int = runtime(256, low=1)
    trust_remote_code: bool = option(False, "allow model code from the hub (off by default)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValueError("a reranker needs a model (hub id or local path)")

    @property
    def hash(self) -> str:
        from verbatim_batch.retrieval.embedder import model_config_hash

        return model_config_hash(self, rerank_version=RERANK_VERSION)


def weights_fingerprint(config: RerankerConfig) -> str:
    """The weights' hash, without loading the model (a run records it, and carries only on a match)."""
    model_dir = models.resolve_model_dir(config.model, config.revision, "reranker model")
    return models.fingerprint(models.safetensors_files(model_dir))


class Reranker:
    """One cross-encoder; ``score`` maps (query, chunk) pairs to scores, ``__call__`` ranks candidate batches."""

    def __init__(self, config: RerankerConfig) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        from verbatim_batch.retrieval.embedder import portable_model_id

        self.config = config
        self.device = models.resolve_device(config.device)
        self.torch_dtype = models.resolve_dtype(config.dtype, self.device)
        model_dir = models.resolve_model_dir(config.model, config.revision, "reranker model")
        self.model_id = portable_model_id(config.model)
        self.model_revision = models.fingerprint(models.safetensors_files(model_dir))
        mconf = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=config.trust_remote_code)
        if mconf.num_labels not in (1, 2):
            raise ValueError(f"{config.model}: a cross-encoder has 1 or 2 output labels, this one has "
                             f"{mconf.num_labels}")
        self.model, self.attn_implementation = models.load_model(
            AutoModelForSequenceClassification, model_dir, device=self.device, torch_dtype=self.torch_dtype,
            config=mconf, trust_remote_code=config.trust_remote_code)
        self.model.eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=config.trust_remote_code)
        limits = [config.max_length, getattr(mconf, "max_position_embeddings", None) or config.max_length]
        if 0 < (self.tokenizer.model_max_length or 0) < 10**9:
            limits.append(self.tokenizer.model_max_length)
        self.max_length = min(limits)
        self.pad_token_id = self.tokenizer.pad_token_id or 0
        self.stats: dict[str, float] = dict(pairs=0, tokens=0, padded_tokens=0, truncated=0, forwards=0,
                                            tokenize_ms=0, forward_ms=0)
        self._torch = torch

    def describe(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "model_revision": self.model_revision, "config_hash": self.config.hash,
                "device": str(self.device), "dtype": str(self.torch_dtype).removeprefix("torch."),
                "max_length": self.max_length}

    def score(self, queries: list[str], chunks: list[str]) -> np.ndarray:
        """One float32 score per pair (higher: more relevant)."""
        torch = self._torch
        n = len(queries)
        if n == 0:
            return np.zeros(0, np.float32)
        from verbatim_batch.retrieval.embedder import plan_batches

        t0 = time.perf_counter()
        enc = self.tokenizer(queries, chunks, truncation="longest_first", max_length=self.max_length, padding=False)
        self.stats["tokenize_ms"] += round(1000 * (time.perf_counter() - t0))
        ids = enc["input_ids"]
        types = enc.get("token_type_ids")
        lengths = np.array([len(x) for x in ids], np.int64)
        self.stats["truncated"] += int((lengths >= self.max_length).sum())  # cut to fit (or exactly full)
        out = np.empty(n, np.float32)
        for idx in plan_batches(lengths, self.config.token_budget, self.config.max_batch_rows):
            width = int(lengths[idx].max())
            batch = np.full((len(idx), width), self.pad_token_id, np.int64)
            mask = np.zeros((len(idx), width), np.int64)
            type_ids = np.zeros((len(idx), width), np.int64) if types is not None else None
            for row, i in enumerate(idx):
                batch[row, : lengths[i]] = ids[i]
                mask[row, : lengths[i]] = 1
                if type_ids is not None:
                    type_ids[row, : lengths[i]] = types[i]
            inputs = {"input_ids": torch.from_numpy(batch).to(self.device),
                      "attention_mask": torch.from_numpy(mask).to(self.device)}
            if type_ids is not None:
                inputs["token_type_ids"] = torch.from_numpy(type_ids).to(self.device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                logits = self.model(**inputs).logits.float()
            scores = logits[:, 0] if logits.shape[-1] == 1 else logits[:, -1] - logits[:, 0]
            scores = scores.cpu().numpy()
            self.stats["forward_ms"] += round(1000 * (time.perf_counter() - t0))
            if not np.isfinite(scores).all():
                raise FloatingPointError("the reranker produced NaN/inf scores")
            out[idx] = scores
            self.stats["forwards"] += 1
            self.stats["tokens"] += int(lengths[idx].sum())
            self.stats["padded_tokens"] += len(idx) * width
        self.stats["pairs"] += n
        return out

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Candidates (every candidate of each query in the batch) -> ``RERANKED`` rows, ranked per query.
        A candidate whose chunk text is missing (not in the chunk table) keeps its place after the scored ones,
        with score -inf."""
        rows = batch.select(list(CANDIDATE_COLUMNS)).to_pylist()
        ok = [i for i, r in enumerate(rows) if isinstance(r["chunk"], str) and isinstance(r["query"], str)]
        scores = np.full(len(rows), -np.inf, np.float32)
        scores[ok] = self.score([rows[i]["query"] for i in ok], [rows[i]["chunk"] for i in ok])
        by_query: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_query.setdefault(r["query_id"], []).append(i)
        out = []
        for qid, members in by_query.items():
            members.sort(key=lambda i: (-float(scores[i]), rows[i]["first_rank"], rows[i]["chunk_id"]))
            for rank, i in enumerate(members, 1):
                out.append({k: rows[i][k] for k in _KEPT}
                           | {"query_id": qid, "rank": rank, "score": float(scores[i]), "method": METHOD})
        return pa.Table.from_pylist(out, schema=tables.RERANKED)
