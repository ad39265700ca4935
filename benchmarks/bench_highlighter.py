"""Highlighter throughput: batched extraction vs one pair per forward pass, same model, same run.

    .venv/bin/python benchmarks/bench_highlighter.py --small                 # 4 x 256 ModernBERT, minutes on 2 CPUs
    .venv/bin/python benchmarks/bench_highlighter.py --small --threads 1     # steadier on a shared machine
    .venv/bin/python benchmarks/bench_highlighter.py --pairs 8 --group 8 --budgets 2048 16384   # ModernBERT-base
    .venv/bin/python benchmarks/bench_highlighter.py --tiny --pairs 16 --gpu-target   # CPU check of the GPU path
    python benchmarks/bench_highlighter.py --gpu-target --device cuda --dtype bfloat16  # on one GPU, no Ray

The model is ``ModernBertForTokenClassification(num_labels=2)`` with random weights in the
ModernBERT-base shape (``ModernBertConfig`` defaults: hidden 768, 22 layers, 12 heads,
intermediate 1152, sliding-window attention in two layers of three, 8,192 positions), or a
smaller shape with ``--small`` (4 x 256) / ``--tiny`` (2 x 64). There is no model hub here, so the
tokenizer is the BERT WordPiece tokenizer of the bundled all-MiniLM-L6-v2 (vocabulary 30,522;
the model's vocabulary and pad/cls/sep ids are set to match). Model and tokenizer are saved to
a temp dir and loaded through the real ``Highlighter(HighlighterConfig(model=dir))``.

Pairs are realistic: chunks of synthetic papers (``synth.generate_paper`` + ``chunk_markdown``,
500-5,000 characters), sampled at random from a pool, each with a keyword query made from one
of its sentences (``labelled.keywords``; from another chunk of the same paper when it has no
prose). ``--gpu-target`` instead builds pairs of about ``--target-tokens`` (1,500) tokens: the
query plus a run of paper text cut to fill the rest.

Two ways to run the same pairs through the same model instance:

* **batched** - ``Highlighter.extract(queries, chunks)``: the pairs of a group tokenised in one call,
  their windows sorted by length and packed into forward passes of at most ``token_budget`` padded
  tokens, once per ``--budgets`` value (only the budget is switched between runs).
* **reference** - the way the paper's released highlighters run (``process()`` of the model code
  shipped with ``KRLabsOrg/verbatim-rag-modern-bert-v2`` and ``KRLabsOrg/acl-verbatim-modernbert``,
  called once per search result by ``ModelSpanExtractor`` in ``KRLabsOrg/verbatim-rag``):
  tokenise one (question, context) pair with overflow windows (``max_length`` 8192, stride
  256, ``padding=True``, so padded only to its own longest window, never to ``max_length``), one
  forward pass, softmax, spans; then the next pair. Chunks here fit one window, so this is one
  unpadded pass per pair.

``host_only_batched_path`` re-runs the batched path with the model call replaced by stored random
probabilities: tokenisation, window bookkeeping and span post-processing only. On a GPU that is
the part left on the CPU, so n / its time is a ceiling on pairs/s for one process.

Both sides use the same scoring of context tokens and the same post-processing
(per-window ``spans.runs_above`` + ``spans.postprocess`` through ``Highlighter.spans_from_scores``), so the
spans must agree: the script checks that and reports the largest token-probability difference.

Timing: pairs go to each method in groups of ``--group`` (64, what one extract-job actor call
gets by default; 512 with ``--gpu-target``), so the batched path packs within a group. Every
method is warmed up. Then, group by group, each method runs on the group, in an order that
rotates every group, so slow spells of a shared machine hit all methods alike. A repeat is one
pass over all groups; the median of ``--repeats`` repeats counts. pairs/s and tokens/s (real
tokens of all windows) come from that median. Process CPU time (all threads) is recorded too.
Host time (tokenisation + span post-processing: wall minus forward passes) is reported per
pair, as it bounds pairs/s however fast the device is.

Prints JSON; ``--json PATH`` also writes it (with ``--key NAME``, under that key of the file, so
several runs share one file).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verbatim_batch.corpus.chunker import chunk_markdown  # noqa: E402
from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig  # noqa: E402
from verbatim_batch.extract.highlighter_spans import TokenScores  # noqa: E402
from verbatim_synth import corpus as synth  # noqa: E402
from verbatim_synth.labelled import candidate_sentences, keywords  # noqa: E402

SHAPES = {
    "base": {},  # ModernBertConfig defaults = ModernBERT-base
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 384},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 96},
}


def make_model(path: Path, shape: str) -> str:
    """A random-weight ModernBERT token classifier of ``shape`` plus the MiniLM tokenizer, saved to ``path``."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    tok.model_max_length = 8192
    cfg = ModernBertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                           sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                           num_labels=2, **SHAPES[shape])
    torch.manual_seed(0)
    ModernBertForTokenClassification(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


def _query_for(paper_chunks: list[str], k: int, rng: random.Random) -> str:
    """A 4-6 keyword query from a sentence of chunk ``k`` (else of the nearest chunk of the paper that has prose)."""
    for j in sorted(range(len(paper_chunks)), key=lambda j: (abs(j - k), j)):
        sentences = candidate_sentences(paper_chunks[j])
        if sentences:
            q = keywords(rng.choice(sentences), rng.randint(4, 6), rng)
            if len(q.split()) >= 3:
                return q
    return "results of the proposed method"


def build_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` (query, chunk) pairs drawn at random from the chunks of enough synthetic papers."""
    rng = random.Random(f"bench-highlighter:{seed}")
    pool: list[tuple[int, int]] = []
    papers: list[list[str]] = []
    i = 0
    while len(pool) < max(4 * n, 200):
        chunks = [c.text for c in chunk_markdown(synth.generate_paper(seed, i).markdown)]
        papers.append(chunks)
        pool += [(i, k) for k in range(len(chunks))]
        i += 1
    picked = rng.sample(pool, n)
    return [_query_for(papers[p], k, rng) for p, k in picked], [papers[p][k] for p, k in picked]


def build_fixed_length_pairs(n: int, seed: int, tokenizer, target: int) -> tuple[list[str], list[str]]:
    """``n`` pairs of about ``target`` tokens: a query plus paper text cut to fill the window."""
    rng = random.Random(f"bench-highlighter-fixed:{seed}")
    queries, contexts = [], []
    i = 0
    while len(queries) < n:
        paper = synth.generate_paper(seed, i)
        i += 1
        chunks = chunk_markdown(paper.markdown)
        texts = [c.text for c in chunks]
        for k, c in enumerate(chunks):
            if len(queries) >= n:
                break
            q = _query_for(texts, k, rng)
            room = target - 3 - len(tokenizer(q, add_special_tokens=False)["input_ids"])
            tail = paper.markdown[c.start:c.start + 12 * target]
            offsets = tokenizer(tail, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) < room:
                continue  # too close to the end of the paper
            queries.append(q)
            contexts.append(tail[: offsets[room - 1][1]])
    return queries, contexts


def reference_loop(hl: Highlighter, queries, chunks, timing: dict) -> list:
    """One pair per forward pass, the way the paper's released ``process()`` runs; same post-processing as ours."""
    tok, model, dev = hl.tokenizer, hl.model, hl.device
    out = []
    for q, c in zip(queries, chunks, strict=True):
        t0 = time.perf_counter()
        enc = tok(q, c, return_offsets_mapping=True, max_length=hl.max_length, truncation="only_second",
                  stride=hl.config.stride, return_overflowing_tokens=True, padding=True, return_tensors="pt")
        t1 = time.perf_counter()
        with torch.inference_mode():
            logits = model(input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev)).logits
            pos = torch.softmax(logits.float(), dim=-1)[..., 1:].sum(dim=-1).cpu().numpy()
        t2 = time.perf_counter()
        windows = []
        for w in range(pos.shape[0]):
            ctx = np.array([sid == 1 for sid in enc.sequence_ids(w)], dtype=bool)
            offsets = enc["offset_mapping"][w].numpy().astype(np.int64)
            windows.append((offsets[ctx], pos[w][ctx].astype(np.float32)))
        scores = TokenScores(windows)
        out.append((scores, hl.spans_from_scores(scores, c)))
        timing["tokenize_s"] += t1 - t0
        timing["forward_s"] += t2 - t1
        timing["tokens"] += int(enc["attention_mask"].sum())
        timing["padded_tokens"] += int(enc["attention_mask"].numel())
    return out


def pct(values, qs=(0, 10, 50, 90, 100)) -> dict:
    return {f"p{q}": float(np.percentile(values, q)) for q in qs} | {"mean": float(np.mean(values))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="4 layers x hidden 256 instead of ModernBERT-base")
    size.add_argument("--tiny", action="store_true", help="2 layers x hidden 64 (code-path checks)")
    ap.add_argument("--pairs", type=int, default=None, help="default: 24 base, 240 small, 64 tiny; GPU target 2048")
    ap.add_argument("--budgets", type=int, nargs="+", default=None,
                    help="token budgets of the batched path (default 2048 8192 16384 32768; "
                    "GPU target 32768 65536 131072)")
    ap.add_argument("--max-batch-rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.5, help="span threshold (random weights: p is near 0.5)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--gpu-target", action="store_true", help="pairs of --target-tokens tokens; report pairs/s")
    ap.add_argument("--target-tokens", type=int, default=1500)
    ap.add_argument("--baseline-pairs", type=int, default=None,
                    help="run the one-pair loop on only the first N pairs (default: all; GPU target: 256)")
    ap.add_argument("--group", type=int, default=None,
                    help="pairs per extract call (default 64, the extract job's --batch-rows; GPU target 512); "
                    "0: all pairs in one call")
    ap.add_argument("--check-pairs", type=int, default=16, help="pairs whose spans and probabilities are compared")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--key", default=None, help="store the result under this key of the --json file (kept: other keys)")
    args = ap.parse_args(argv)

    shape = "small" if args.small else "tiny" if args.tiny else "base"
    n = args.pairs or (2048 if args.gpu_target else {"base": 24, "small": 240, "tiny": 64}[shape])
    budgets = args.budgets or ([32768, 65536, 131072] if args.gpu_target else [2048, 8192, 16384, 32768])
    if args.device == "cpu":
        torch.set_num_threads(args.threads)

    model_dir = make_model(Path(tempfile.mkdtemp(prefix="bench-highlighter-")), shape)
    base_cfg = HighlighterConfig(model=model_dir, device=args.device, dtype=args.dtype, threshold=args.threshold,
                                 token_budget=budgets[0], max_batch_rows=args.max_batch_rows)
    hl = Highlighter(base_cfg)
    t0 = time.perf_counter()
    if args.gpu_target:
        queries, chunks = build_fixed_length_pairs(n, args.seed, hl.tokenizer, args.target_tokens)
    else:
        queries, chunks = build_pairs(n, args.seed)
    build_s = time.perf_counter() - t0
    enc = hl.tokenizer(queries, chunks, truncation="only_second", max_length=hl.max_length)
    lengths = [len(x) for x in enc["input_ids"]]
    n_base = min(n, args.baseline_pairs or (256 if args.gpu_target else n))

    def batched(b: int, qs, cs):
        hl.config = dataclasses.replace(base_cfg, token_budget=b)  # same weights, only the packing changes
        before = dict(hl.stats)
        t, c = time.perf_counter(), time.process_time()
        res = hl.extract(qs, cs)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        d = {k: hl.stats[k] - before[k] for k in ("tokens", "padded_tokens", "forwards", "tokenize_s", "forward_s")}
        return res, wall, {**d, "cpu_s": cpu}

    def reference(qs, cs):
        timing = {"tokenize_s": 0.0, "forward_s": 0.0, "tokens": 0, "padded_tokens": 0}
        t, c = time.perf_counter(), time.process_time()
        res = reference_loop(hl, qs, cs, timing)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        return res, wall, {**timing, "forwards": len(qs), "cpu_s": cpu}

    # Warm-up (allocator, oneDNN / cuBLAS plans) on a few pairs of every method.
    w = min(4, n)
    reference(queries[:w], chunks[:w])
    for b in budgets:
        batched(b, queries[:w], chunks[:w])

    # Agreement: token probabilities and spans of the batched path (first budget) vs the one-pair loop.
    hl.config = base_cfg
    n_check = min(n_base, args.check_pairs)
    ours_scores = hl.token_scores(queries, chunks)[:n_check]  # all pairs, so they are packed as in the timed runs
    ref_out = reference_loop(hl, queries[:n_check], chunks[:n_check], {"tokenize_s": 0.0, "forward_s": 0.0,
                                                                       "tokens": 0, "padded_tokens": 0})
    max_diff, same_segments, same_spans, near = 0.0, 0, 0, 0
    for s_ours, (s_ref, r_ref), c in zip(ours_scores, ref_out, chunks, strict=False):
        if s_ours.segments == s_ref.segments:
            same_segments += 1
            max_diff = max(max_diff, float(np.abs(s_ours.probs - s_ref.probs).max()))
        r_ours = hl.spans_from_scores(s_ours, c)
        if [(x.start, x.end) for x in r_ours.spans] == [(x.start, x.end) for x in r_ref.spans]:
            same_spans += 1
        else:  # a flip must come from a token sitting on the threshold
            near += int(np.min(np.abs(s_ref.probs - args.threshold)) < 1e-4)
    agreement = {"pairs": n_check, "same_token_segments": same_segments, "same_spans": same_spans,
                 "mismatches_with_a_token_within_1e-4_of_threshold": near, "max_abs_prob_diff": max_diff,
                 "spans_per_pair": float(np.mean([len(r.spans) for _, r in ref_out]))}
    print(f"agreement: {agreement}", file=sys.stderr, flush=True)

    methods = {"reference_one_pair_per_forward": None, **{f"batched_budget_{b}": b for b in budgets}}
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    names = list(methods)
    group = (512 if args.gpu_target else 64) if args.group is None else (args.group or n)
    groups = [(s, min(n, s + group)) for s in range(0, n, group)]
    keys = ("wall_s", "cpu_s", "pairs", "tokens", "padded_tokens", "forwards", "tokenize_s", "forward_s")
    for rep in range(args.repeats):
        acc = {name: dict.fromkeys(keys, 0) for name in names}
        for gi, (s, e) in enumerate(groups):
            k = rep * len(groups) + gi  # rotate the order every group, so slow spells of a shared machine hit all
            for name in names[k % len(names):] + names[: k % len(names)]:
                b = methods[name]
                stop = min(e, n_base) if b is None else e  # the one-pair loop may cover only the first n_base
                if stop <= s:
                    continue
                if b is None:
                    _, wall, d = reference(queries[s:stop], chunks[s:stop])
                else:
                    _, wall, d = batched(b, queries[s:stop], chunks[s:stop])
                for key, v in {"wall_s": wall, "pairs": stop - s, **d}.items():
                    acc[name][key] += v
        for name in names:
            a = acc[name]
            runs[name].append({**a, "load1_after": os.getloadavg()[0]})
            print(f"[rep {rep}] {name}: {a['wall_s']:.2f} s ({a['cpu_s']:.1f} CPU-s), "
                  f"{a['pairs'] / a['wall_s']:.2f} pairs/s, {a['tokens'] / a['wall_s']:.0f} tok/s, "
                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)

    summary = {}
    for name, rs in runs.items():
        med = statistics.median(r["wall_s"] for r in rs)
        r0 = rs[0]
        summary[name] = {
            "token_budget": methods[name], "pairs": r0["pairs"], "median_wall_s": med,
            "walls_s": [r["wall_s"] for r in rs], "load1_after": [r["load1_after"] for r in rs],
            "pairs_per_s": r0["pairs"] / med, "tokens_per_s": r0["tokens"] / med,
            "cpu_s_per_pair": statistics.median(r["cpu_s"] / r["pairs"] for r in rs),
            "cpu_s": [r["cpu_s"] for r in rs],
            "forwards": r0["forwards"], "padding_fraction": 1 - r0["tokens"] / r0["padded_tokens"],
            "forward_share": statistics.median(r["forward_s"] / r["wall_s"] for r in rs),
            "host_ms_per_pair": 1000 * statistics.median((r["wall_s"] - r["forward_s"]) / r["pairs"] for r in rs),
            "tokenize_ms_per_pair": 1000 * statistics.median(r["tokenize_s"] / r["pairs"] for r in rs),
        }
    # Host-side ceiling: the batched path with the model call replaced by stored random probabilities, so
    # only tokenisation, window bookkeeping and span post-processing remain (what a GPU cannot speed up).
    noise = np.random.default_rng(0).random(hl.max_length + 1).astype(np.float32)
    hl.forward_probs = lambda ids, lengths: (np.concatenate([noise[:n] for n in lengths]) if len(lengths)
                                             else np.zeros(0, np.float32))
    host_walls = []
    try:
        for _ in range(args.repeats):
            t = time.perf_counter()
            for s, e in groups:
                hl.extract(queries[s:e], chunks[s:e])
            host_walls.append(time.perf_counter() - t)
    finally:
        del hl.forward_probs  # the method again
    host_only = {"pairs": n, "walls_s": host_walls, "ms_per_pair": 1000 * statistics.median(host_walls) / n,
                 "best_ms_per_pair": 1000 * min(host_walls) / n,
                 "pairs_per_s_ceiling": n / statistics.median(host_walls), "best_pairs_per_s": n / min(host_walls)}
    print(f"host only: {host_only}", file=sys.stderr, flush=True)

    ref = summary["reference_one_pair_per_forward"]
    for s in summary.values():
        s["speedup_vs_reference"] = s["pairs_per_s"] / ref["pairs_per_s"]
        s["cpu_time_ratio_vs_reference"] = ref["cpu_s_per_pair"] / s["cpu_s_per_pair"]
    best = max((k for k in summary if k.startswith("batched")), key=lambda k: summary[k]["pairs_per_s"])

    mconf = hl.model.config
    result = {
        "benchmark": "bench_highlighter",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python" if args.device == "cpu" else "python", *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": _cpu_name(), "cpus": os.cpu_count(),
                    "lscpu": _lscpu(), "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
                    "load_avg_at_end": list(os.getloadavg())},
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"),
                     "python": platform.python_version()},
        "model": {"shape": shape, "hidden": mconf.hidden_size, "layers": mconf.num_hidden_layers,
                  "heads": mconf.num_attention_heads, "intermediate": mconf.intermediate_size,
                  "vocab": mconf.vocab_size, "params_m": sum(p.numel() for p in hl.model.parameters()) / 1e6,
                  "weights": "random", "dtype": str(hl.torch_dtype).removeprefix("torch."),
                  "attn_implementation": hl.attn_implementation, "device": str(hl.device)},
        "pairs": {"n": n, "mode": f"fixed ~{args.target_tokens} tokens" if args.gpu_target else "synthetic chunks",
                  "build_s": build_s, "chunk_chars": pct([len(c) for c in chunks]),
                  "tokens_per_pair": pct(lengths), "total_tokens": int(sum(lengths)),
                  "windows_over_max_length": int(sum(x > hl.max_length for x in lengths))},
        "threshold": args.threshold, "repeats": args.repeats, "group": group,
        "agreement": agreement,
        "methods": summary,
        "host_only_batched_path": host_only,
        "best_batched": best,
        "speedup_best_vs_reference": summary[best]["speedup_vs_reference"],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        path = Path(args.json)
        if args.key:
            merged = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
            merged[args.key] = result
            text = json.dumps(merged, indent=2)
        path.write_text(text + "\n", encoding="utf-8")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _lscpu() -> dict:
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "L2 cache", "L3 cache", "Flags")
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    info = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keep:
            v = v.strip()
            if k.strip() == "Flags":
                v = " ".join(f for f in v.split() if f.startswith(("avx512", "amx", "avx2")))
            info[k.strip()] = v
    return info


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
