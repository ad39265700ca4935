"""Host-side throughput of the GPU path, with the model stubbed out (issue 25).

    .venv/bin/python benchmarks/bench_host_feed.py                         # 256 pairs x 4 repeats + a 2-CPU Ray run
    .venv/bin/python benchmarks/bench_host_feed.py --pairs 128 --no-ray    # the in-process figures only
    .venv/bin/python benchmarks/bench_host_feed.py --json benchmarks/results-host-feed.json

What a GPU cannot speed up is the CPU work around its forward pass: tokenising, window bookkeeping, span
post-processing, the verbatim gate and the rows. This script times that work alone: the highlighter's and the
embedder's models are replaced by stubs whose forward returns fixed logits / hidden states of the right shape
(a view of a stored random tensor: no compute), so everything measured is host work.

Pairs are real text: the 25 seed papers of ``verbatim_batch/examples/corpus`` cut into (query, chunk) pairs of
``--target-tokens`` (1,500) tokens, the query from ``examples/queries.jsonl`` and the chunk a run of paper text
cut to fill the rest. There is no hub here, so the tokenizer is the bundled MiniLM's BERT WordPiece (as in
bench_highlighter.py); the model behind the stub is a 2-layer ModernBERT classifier loaded through the real
``Highlighter``. The stub's logits make probabilities that either look like evidence (``evidence``: a few runs of
10-60 tokens per window, threshold 0.2 as the model card) or are noise around the threshold (``noise``: uniform
probabilities, threshold 0.5: a run every few tokens, the worst case for post-processing).

Two ways through the same pairs, in one run, on the same stubbed model:

* **in-actor (before)**: the code of the extract actor before issue 25, kept here verbatim: the transformers
  tokenizer call, a per-window Python loop building each forward batch, a per-token loop over
  ``sequence_ids`` and offsets into per-pair ``TokenScores``, per-window ``runs_above`` and ``postprocess``, then
  ``PairExtractor.tables`` and ``pack``;
* **split (after)**: the three stages of the extract job's split placement: ``encode_table`` (tokenize stage),
  ``forward_table`` (the GPU actor's work), ``spans_table`` + ``pack`` (span stage).

Each is timed stage by stage in this process, single-threaded (``RAYON_NUM_THREADS=1``, one torch thread), as
process CPU seconds per pair: CPU-seconds per pair of a stage = how long one core needs for it, so one core
feeds 1 / that many pairs/s. The two paths must give identical rows (the script checks every pair and stops if
not). Groups of ``--group`` (64, the extract job's default ``--batch-rows``) pairs; the median of ``--repeats``.

With Ray (default), both paths also run as Ray Data pipelines on a local Ray with 2 CPUs (the model stage one
actor, as on a one-GPU node; the split's host stages as tasks on the other CPU): wall pairs/s of the whole
pipeline, as the extract job would run them.

The embedder likewise: chunks of the seed papers (the chunker's defaults), MiniLM's tokenizer, a stub forward
returning fixed hidden states; ``Embedder(batch)`` tokenizing in the actor vs ``EmbedTokenizer.tokenize_table``
on CPU then ``Embedder(batch)`` on the tokens: tokens/s per core of each part.

Prints JSON; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the Rust tokenizer on one core: CPU-seconds per core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verbatim_batch.extract.gate import PairExtractor, pack  # noqa: E402
from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig, host_describe  # noqa: E402
from verbatim_batch.extract.highlighter_spans import TokenScores  # noqa: E402
from verbatim_batch.extract.highlighter_stages import (  # noqa: E402
    HighlighterRows,
    encode_table,
    forward_table,
    scores_of,
    spans_table,
)
from verbatim_batch.extract.pairs import pairs_from_records  # noqa: E402
from verbatim_batch.extract.spans import PairResult, postprocess, runs_above  # noqa: E402
from verbatim_batch.retrieval.embedder import DEFAULT_MODEL, Embedder, EmbedderConfig, EmbedTokenizer, plan_batches  # noqa: E402

CORPUS = ROOT / "verbatim_batch" / "examples"


# --- the stubbed models ----------------------------------------------------------------------------------


class _Out:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class StubClassifier(torch.nn.Module):
    """A token classifier whose forward returns a view of stored logits: ``(rows, width, 2)``, no compute."""

    def __init__(self, pattern: str, max_rows: int = 512, max_width: int = 8192, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        if pattern == "noise":  # uniform probabilities
            p = rng.random((max_rows, max_width))
        else:  # evidence: runs of 10-60 tokens at p ~ 0.6-0.95 over a background of p ~ 0.01-0.1
            p = rng.uniform(0.01, 0.1, (max_rows, max_width))
            for r in range(max_rows):
                pos = 0
                while pos < max_width:
                    pos += int(rng.integers(150, 700))
                    n = int(rng.integers(10, 60))
                    p[r, pos:pos + n] = rng.uniform(0.6, 0.95, len(p[r, pos:pos + n]))
                    pos += n
        logit = np.log(p / (1 - p)).astype(np.float32)
        self.logits = torch.from_numpy(np.stack([np.zeros_like(logit), logit], axis=-1))

    def forward(self, input_ids, attention_mask=None):
        b, w = input_ids.shape
        return _Out(logits=self.logits[:b, :w])


class StubEncoder(torch.nn.Module):
    """An encoder whose forward returns a view of stored hidden states ``(rows, width, dim)``."""

    def __init__(self, dim: int, max_rows: int = 256, max_width: int = 512) -> None:
        super().__init__()
        self.hidden = torch.from_numpy(np.random.default_rng(0).standard_normal((max_rows, max_width, dim),
                                                                                  dtype=np.float32))

    def forward(self, input_ids, attention_mask=None):
        b, w = input_ids.shape
        return _Out(last_hidden_state=self.hidden[:b, :w])


def make_classifier_dir(path: Path) -> str:
    """A 2-layer ModernBERT token classifier with MiniLM's tokenizer, saved for the real loading code."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    tok.model_max_length = 8192
    cfg = ModernBertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=96, pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                           sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                           num_labels=2)
    torch.manual_seed(0)
    ModernBertForTokenClassification(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


def stubbed_highlighter(config: HighlighterConfig, pattern: str) -> Highlighter:
    hl = Highlighter(config)
    hl.model = StubClassifier(pattern, max_rows=max(512, config.max_batch_rows))
    return hl


# --- pairs and chunks of the seed papers ------------------------------------------------------------------


def seed_pairs(n: int, tokenizer, target: int, seed: int = 0) -> pa.Table:
    """``n`` ``PAIR_INPUT`` rows of about ``target`` tokens: a query plus a run of seed-paper text."""
    rng = random.Random(seed)
    queries = [json.loads(line)["query"] for line in (CORPUS / "queries.jsonl").read_text().splitlines() if line]
    papers = [Path(f).read_text(encoding="utf-8") for f in sorted(glob.glob(str(CORPUS / "corpus" / "*.md")))]
    cuts = []  # (paper, char start, char end) of runs of target tokens, every target // 2 tokens
    for p, text in enumerate(papers):
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        room = target - 3 - 12  # the query's share, about
        for s in range(0, len(offsets) - room, room // 2):
            cuts.append((p, offsets[s][0], offsets[s + room - 1][1]))
    records = []
    for i in range(n):
        p, a, b = cuts[i % len(cuts)] if i < len(cuts) else rng.choice(cuts)
        records.append({"query": queries[i % len(queries)], "chunk": papers[p][a:b], "paper_id": f"paper{p}",
                        "chunk_start": a, "chunk_index": i})
    return pairs_from_records(records)


def seed_chunks() -> pa.Table:
    from verbatim_batch.corpus.chunker import build_context, chunk_markdown

    rows = []
    for f in sorted(glob.glob(str(CORPUS / "corpus" / "*.md"))):
        for c in chunk_markdown(Path(f).read_text(encoding="utf-8")):
            rows.append({"chunk_id": f"{Path(f).stem}:{c.index}", "paper_id": Path(f).stem,
                         "context": build_context(None, c.heading_path), "text": c.text})
    return pa.Table.from_pylist(rows)


# --- the extract actor before issue 25, verbatim (what "in-actor" measures) ------------------------------


def legacy_forward(hl: Highlighter, windows: list[list[int]]) -> list[np.ndarray]:
    torch_ = hl._torch
    lengths = np.array([len(w) for w in windows])
    out: list[np.ndarray] = [np.empty(0)] * len(windows)
    for idx in plan_batches(lengths, hl.config.token_budget, hl.config.max_batch_rows):
        width = int(lengths[idx].max())
        ids = np.full((len(idx), width), hl.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for r, i in enumerate(idx):
            ids[r, : lengths[i]] = windows[i]
            mask[r, : lengths[i]] = 1
        t0 = time.perf_counter()
        with torch_.inference_mode():
            logits = hl.model(input_ids=torch_.from_numpy(ids).to(hl.device),
                              attention_mask=torch_.from_numpy(mask).to(hl.device)).logits
            pos = torch_.softmax(logits.float(), dim=-1)[..., 1:].sum(dim=-1).cpu().numpy()
        hl.stats["forward_s"] += time.perf_counter() - t0
        if not np.isfinite(pos).all():
            raise FloatingPointError("the highlighter produced NaN/inf probabilities")
        for r, i in enumerate(idx):
            out[i] = pos[r, : lengths[i]]
    return out


def legacy_extract(hl: Highlighter, queries, chunks, timing: dict) -> list[PairResult]:
    t0 = time.process_time()
    ok, enc, errors = hl._windows(queries, chunks)
    t1 = time.process_time()
    results = [errors.get(i, "") for i in range(len(queries))]
    windows = enc["input_ids"]
    owners = enc["overflow_to_sample_mapping"]
    probs = legacy_forward(hl, windows)
    t2 = time.process_time()
    parts: dict[int, list] = {k: [] for k in range(len(ok))}
    for w, owner in enumerate(owners):
        context = np.array([sid == 1 for sid in enc.sequence_ids(w)], dtype=bool)
        offsets = np.asarray(enc["offset_mapping"][w], dtype=np.int64).reshape(-1, 2)
        parts[owner].append((offsets[context], probs[w][context].astype(np.float32)))
    for k, i in enumerate(ok):
        results[i] = TokenScores(parts[k])
    cfg = hl.config
    out = []
    for s, c in zip(results, chunks, strict=True):
        if isinstance(s, str):
            out.append(PairResult([], None, s))
            continue
        runs = [r for o, p in s.windows for r in runs_above(o.tolist(), p.tolist(), cfg.threshold)]
        out.append(PairResult(postprocess(runs, cfg.min_chars, cfg.merge_gap, c), s.relevance))
    t3 = time.process_time()
    timing["tokenize"] += t1 - t0
    timing["forward_call"] += t2 - t1
    timing["post"] += t3 - t2
    return out


class _Legacy:
    """``PairExtractor``'s extractor: the legacy highlighter over a stubbed model."""

    name = "highlighter"

    def __init__(self, hl: Highlighter, timing: dict) -> None:
        self.hl, self.timing = hl, timing

    def describe(self):
        return self.hl.describe()

    def extract(self, queries, chunks):
        return legacy_extract(self.hl, queries, chunks, self.timing)


# --- in-process, stage by stage ------------------------------------------------------------------------


def rows_of(packed: pa.Table) -> list[dict]:
    keep = [c for c in packed.column_names if not c.startswith("_") and c != "latency_ms"]
    return packed.select(keep).to_pylist()


def run_in_actor(hl: Highlighter, groups: list[pa.Table]) -> tuple[dict, list]:
    timing = dict.fromkeys(("tokenize", "forward_call", "post", "gate", "total"), 0.0)
    stage = PairExtractor(_Legacy(hl, timing), "bench")
    out = []
    for g in groups:
        t0 = time.process_time()
        packed = pack(stage(g))
        timing["total"] += time.process_time() - t0
        out.append(packed)
    timing["gate"] = timing["total"] - timing["tokenize"] - timing["forward_call"] - timing["post"]
    return timing, out


def run_split(hl: Highlighter, groups: list[pa.Table], info: dict) -> tuple[dict, list]:
    timing = dict.fromkeys(("tokenize", "actor", "post", "gate"), 0.0)
    stage = PairExtractor(HighlighterRows(info), "bench")  # what the span stage builds from the driver's figures
    out = []
    for g in groups:
        t0 = time.process_time()
        tokens = encode_table(hl.host, g, 200_000, 2_000)
        t1 = time.process_time()
        scored = forward_table(hl, tokens)
        t2 = time.process_time()
        tables = spans_table(scored, stage, hl.config)
        packed = pack(tables)
        t3 = time.process_time()
        timing["tokenize"] += t1 - t0
        timing["actor"] += t2 - t1
        timing["span_stage"] = timing.get("span_stage", 0.0) + t3 - t2
        out.append(packed)
    # the span stage's parts: post-processing alone, timed again on the same inputs
    for g in groups:
        scored = forward_table(hl, encode_table(hl.host, g, 200_000, 2_000))
        t0 = time.process_time()
        scores_of(scored).results(scored["chunk"].to_pylist(), hl.config.threshold, hl.config.min_chars,
                                  hl.config.merge_gap)
        timing["post"] += time.process_time() - t0
    timing["gate"] = timing["span_stage"] - timing["post"]
    return timing, out


def highlighter_in_process(hl: Highlighter, pairs: pa.Table, group: int, repeats: int) -> dict:
    groups = [pairs.slice(s, group) for s in range(0, pairs.num_rows, group)]
    n = pairs.num_rows
    info = host_describe(hl.config)
    info["model_revision"] = hl.model_revision
    run_in_actor(hl, groups[:1])
    run_split(hl, groups[:1], info)  # warm-up
    _, before = run_in_actor(hl, groups)
    _, after = run_split(hl, groups, info)
    same = [rows_of(a) == rows_of(b) for a, b in zip(before, after, strict=True)]
    if not all(same):
        raise SystemExit("the split path's rows differ from the in-actor path's")
    spans = sum(len(r["spans"]) for b in after for r in rows_of(b))
    runs: dict[str, list] = {"in_actor": [], "split": []}
    for _ in range(repeats):
        runs["in_actor"].append(run_in_actor(hl, groups)[0])
        runs["split"].append(run_split(hl, groups, info)[0])
    ms = {path: {k: 1000 * statistics.median(r[k] for r in rs) / n for k in rs[0]} for path, rs in runs.items()}
    a, s = ms["in_actor"], ms["split"]
    # The stub's forward is free, so an actor's CPU time is all host work (the softmax of the stub's logits
    # included, which on a GPU runs on the device: an upper bound).
    host_after = s["tokenize"] + s["span_stage"] + s["actor"]
    return {
        "pairs": n, "group": group, "rows_identical": True, "spans_per_pair": spans / n,
        "cpu_ms_per_pair": ms,
        "in_actor": {"host_ms_per_pair": a["total"], "actor_ms_per_pair": a["total"], "post_ms_per_pair": a["post"],
                     "pairs_per_s_one_actor_process": 1000 / a["total"]},
        "split": {"host_ms_per_pair": host_after, "post_ms_per_pair": s["post"],
                  "tokenize_ms_per_pair": s["tokenize"], "span_stage_ms_per_pair": s["span_stage"],
                  "actor_ms_per_pair": s["actor"], "pairs_per_s_one_actor_process": 1000 / s["actor"],
                  "host_pairs_per_s_per_core": 1000 / host_after,
                  "host_cores_for_1000_pairs_per_s": host_after},
        "host_work_before_over_after": a["total"] / host_after,
    }


# --- Ray: the whole pipeline on 2 CPUs ----------------------------------------------------------------


class LegacyActor:
    """The extract actor before issue 25, over the stubbed model."""

    def __init__(self, config, pattern) -> None:
        torch.set_num_threads(1)
        self.stage = PairExtractor(_Legacy(stubbed_highlighter(config, pattern), {}), "bench")

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pack(self.stage(batch))


def ray_pipelines(config: HighlighterConfig, pattern: str, pairs: pa.Table, group: int, repeats: int) -> dict:
    import ray

    from verbatim_batch.engine.ray_env import init_ray
    from verbatim_batch.stages import extract as px

    class StubForwardActor(px.HighlightForwardActor):
        def __init__(self, config, pattern) -> None:
            super().__init__(config, threads=1, retries=0)
            self.highlighter.model = StubClassifier(pattern, max_rows=max(512, config.max_batch_rows))

    init_ray(address="local", num_cpus=2, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    info = host_describe(config)
    blocks = [pairs.slice(s, group) for s in range(0, pairs.num_rows, group)]

    def in_actor():
        return ray.data.from_arrow(blocks).map_batches(
            LegacyActor, batch_format="pyarrow", batch_size=group, compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=1, fn_constructor_kwargs={"config": config, "pattern": pattern})

    def split():
        ds = ray.data.from_arrow(blocks).map_batches(px._highlight_tokenize, batch_format="pyarrow", batch_size=None,
                                                      fn_kwargs={"config": config, "max_chunk_chars": None})
        ds = ds.map_batches(StubForwardActor, batch_format="pyarrow", batch_size=group,
                            compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1,
                            fn_constructor_kwargs={"config": config, "pattern": pattern})
        return ds.map_batches(px._highlight_spans, batch_format="pyarrow", batch_size=None,
                              fn_kwargs={"config": config, "run_id": "bench", "info": info, "max_chunk_chars": None})

    out: dict[str, list] = {"in_actor": [], "split": []}
    try:
        for rep in range(repeats + 1):  # the first round warms up (workers, actors, tokenizer loads)
            for name, build in (("in_actor", in_actor), ("split", split))[:: 1 if rep % 2 else -1]:
                t0 = time.perf_counter()
                n = sum(b.num_rows for b in build().iter_batches(batch_format="pyarrow", batch_size=None))
                wall = time.perf_counter() - t0
                assert n == pairs.num_rows
                if rep:
                    out[name].append(wall)
    finally:
        ray.shutdown()
    return {name: {"walls_s": w, "pairs_per_s": pairs.num_rows / statistics.median(w)} for name, w in out.items()}


# --- the embedder --------------------------------------------------------------------------------------


def embedder_in_process(chunks: pa.Table, group: int, repeats: int) -> dict:
    config = EmbedderConfig(device="cpu")
    emb = Embedder(config)
    emb.model = StubEncoder(emb.dim, max_rows=config.max_batch_rows, max_width=emb.max_length)
    host = EmbedTokenizer(config)
    groups = [chunks.slice(s, group) for s in range(0, chunks.num_rows, group)]
    tokens = int(sum(len(x) for x in emb.tokenizer([t for t in chunks["text"].to_pylist()], truncation=True,
                                                    max_length=emb.max_length)["input_ids"]))

    def in_actor():
        t0 = time.process_time()
        out = [emb(g) for g in groups]
        return {"actor": time.process_time() - t0}, out

    def split():
        t0 = time.process_time()
        toks = [host.tokenize_table(g) for g in groups]
        t1 = time.process_time()
        out = [emb(t) for t in toks]
        return {"tokenize": t1 - t0, "actor": time.process_time() - t1}, out

    in_actor()
    split()
    a, b = in_actor()[1], split()[1]
    if not all(x.equals(y) for x, y in zip(a, b, strict=True)):
        raise SystemExit("the split embedder's rows differ")
    runs = {"in_actor": [in_actor()[0] for _ in range(repeats)], "split": [split()[0] for _ in range(repeats)]}
    n_tok = int(sum(t.column("n_tokens").to_numpy().sum() for t in a))
    med = {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for p, rs in runs.items()}
    return {"chunks": chunks.num_rows, "tokens": n_tok, "tokens_untruncated": tokens, "group": group,
            "max_length": emb.max_length, "rows_identical": True,
            "cpu_s": med,
            "in_actor_tokens_per_s_per_core": n_tok / med["in_actor"]["actor"],
            "split_tokenize_tokens_per_s_per_core": n_tok / med["split"]["tokenize"],
            "split_actor_tokens_per_s_with_the_forward_stubbed": n_tok / med["split"]["actor"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--target-tokens", type=int, default=1500)
    ap.add_argument("--patterns", nargs="+", default=["evidence", "noise"])
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--ray-pairs", type=int, default=512)
    ap.add_argument("--ray-repeats", type=int, default=2)
    ap.add_argument("--no-embed", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    model_dir = make_classifier_dir(Path(tempfile.mkdtemp(prefix="bench-host-feed-")))
    base = HighlighterConfig(model=model_dir, device="cpu", dtype="float32")
    probe = Highlighter(base)
    pairs = seed_pairs(args.pairs, probe.tokenizer, args.target_tokens)
    lengths = [len(x) for x in probe.tokenizer(pairs["query"].to_pylist(), pairs["chunk"].to_pylist())["input_ids"]]
    result = {
        "benchmark": "bench_host_feed",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": _cpu_name(),
                    "load_avg_at_start": list(os.getloadavg())},
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"),
                     "tokenizers": _version("tokenizers"), "ray": _version("ray"), "numpy": np.__version__},
        "pairs": {"n": pairs.num_rows, "tokens_per_pair": {"min": min(lengths), "median": statistics.median(lengths),
                                                           "max": max(lengths)},
                  "chunk_chars_median": statistics.median(len(c) for c in pairs["chunk"].to_pylist())},
        "highlighter": {},
    }
    for pattern in args.patterns:
        threshold = 0.2 if pattern == "evidence" else 0.5
        config = HighlighterConfig(model=model_dir, device="cpu", dtype="float32", threshold=threshold)
        hl = stubbed_highlighter(config, pattern)
        r = highlighter_in_process(hl, pairs, args.group, args.repeats)
        r["threshold"] = threshold
        print(f"{pattern}: {json.dumps(r)}", file=sys.stderr, flush=True)
        result["highlighter"][pattern] = r
    if not args.no_embed:
        result["embedder"] = embedder_in_process(seed_chunks(), 256, args.repeats)
        print(f"embedder: {json.dumps(result['embedder'])}", file=sys.stderr, flush=True)
    if not args.no_ray:
        ray_pairs = seed_pairs(args.ray_pairs, probe.tokenizer, args.target_tokens, seed=1)
        config = HighlighterConfig(model=model_dir, device="cpu", dtype="float32", threshold=0.2)
        result["ray_2_cpus"] = ray_pipelines(config, "evidence", ray_pairs, args.group, args.ray_repeats)
        result["ray_2_cpus"]["pairs"] = ray_pairs.num_rows
        print(f"ray: {json.dumps(result['ray_2_cpus'])}", file=sys.stderr, flush=True)
    result["machine"]["load_avg_at_end"] = list(os.getloadavg())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
