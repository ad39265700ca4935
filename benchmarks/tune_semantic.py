"""Choose the semantic extractor's threshold and margin on labelled pairs built from generated papers.

Superseded for the defaults: this tunes the v1 extractor (unit similarity only) on synthetic papers,
and those settings did not transfer to real text. The defaults now come from real papers, see
``bench_offline_extractor.py`` (BENCHMARKS.md, "Offline extractor on real text"). Kept to
reproduce the synthetic sweep.

    .venv/bin/python benchmarks/tune_semantic.py
    .venv/bin/python benchmarks/tune_semantic.py --papers 80 --picks 150 --json benchmarks/results-semantic-tuning.json

The labelled set comes only from data this project generates (``synth.generate_paper``), never
from an external benchmark's gold:

* ``--papers`` synthetic papers (seed ``--seed``) are chunked with ``chunk_markdown``'s defaults.
* A *pick* is one sentence of one chunk: a unit of ``sentence_segments(chunk)`` whose text is also
  one of ``labelled.candidate_sentences(chunk)`` (prose, 8-45 words, no tables, captions or
  code) and occurs once in the chunk. Its offsets are the gold span (checked: ``chunk[s:e] ==
  sentence``). Chunks under a References heading are not picked from (they may still be
  negatives). At most ``--per-paper`` picks per paper, each from a different chunk.
* Every pick gives two queries:
  - ``keywords``: ``labelled.keywords`` with 4-6 of the sentence's content words, in order;
  - ``partial`` (harder): only 2-3 of the sentence's content words, plus 1-2 content words of
    the chunk's section heading (its last heading-path entry; where that has none, the
    paper-level words are simply left out). It is a query that names the section and a few
    terms of the answer, not the answer itself.
* Positive pair: (query, its chunk), gold = the sentence. Negative pair: (the same query, a
  chunk of a *different* paper drawn at random), gold = nothing. One negative per positive, so
  the set is half relevant, close to the paper's 47/53 split.
* Papers are split in two halves (seeded shuffle): pairs of the first half tune, the second is
  held out. A negative's chunk comes from a paper of the same half, so the halves share no
  paper.

The unit similarities are computed once (``SemanticExtractor.unit_scores``); each
(threshold, margin) of the grid then only re-runs ``spans_from_scores`` and ``metrics.evaluate``.
The best setting is the one with the highest word micro-F1 on the tune half (ties: higher
macro-F1, then higher threshold); its figures on the held-out half are reported, next to those
of the placeholder defaults it replaced (0.55 / 0.12). Abstention = a pair with no span: wanted on negatives, a miss on
positives.

Prints a compact table; ``--json PATH`` writes everything.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verbatim_batch.corpus.chunker import chunk_markdown  # noqa: E402
from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor  # noqa: E402
from verbatim_batch.extract.sentences import sentence_segments  # noqa: E402
from verbatim_batch.quality.metrics import EvalRow, evaluate  # noqa: E402
from verbatim_synth import corpus as synth  # noqa: E402
from verbatim_synth.labelled import _WORD_RE, STOPWORDS, candidate_sentences, keywords  # noqa: E402

THRESHOLDS = [round(0.30 + 0.05 * i, 2) for i in range(11)]  # 0.30 .. 0.80
# the v1 extractor this script tuned: unit similarity only (no lexical or paragraph signal, no paragraph fill)
UNIT_ONLY = {"lexical_weight": 0.0, "paragraph_weight": 0.0, "paragraph_fill": 1.0}
MARGINS = [0.05, 0.10, 0.15, 0.20, 1.0]  # 1.0: no margin (cosine <= 1, threshold >= 0.3)
# Reported as an edge check but never chosen: margin 0 keeps only the chunk's best unit, which suits this
# set (its gold is always exactly one sentence) better than real evidence, often several sentences.
EDGE_MARGINS = [0.0]
STYLES = ("keywords", "partial")
PLACEHOLDERS = (0.55, 0.12)  # the defaults before this tuning


def content_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` that are not stopwords, numbers or very short."""
    words = [w.lower() for w in _WORD_RE.findall(text)]
    return [w for w in words if w not in STOPWORDS and not w.isdigit() and len(w) > 2]


def partial_query(sentence: str, heading: str, rng: random.Random) -> str:
    """2-3 content words of the sentence (in order) plus 1-2 content words of the section heading."""
    words = content_words(sentence)
    k = min(len(words), rng.randint(2, 3))
    picked = [words[i] for i in sorted(rng.sample(range(len(words)), k))]
    head = [w for w in dict.fromkeys(content_words(heading)) if w not in picked]
    if head:
        picked += rng.sample(head, min(len(head), rng.randint(1, 2)))
    return " ".join(picked)


def build_set(n_papers: int, n_picks: int, per_paper: int, seed: int) -> tuple[list[dict], dict]:
    """Labelled pairs (see the module docs) and a summary of how they were drawn."""
    rng = random.Random(f"tune-semantic:{seed}")
    papers = []  # (paper_id, [chunk dicts])
    for i in range(n_papers):
        p = synth.generate_paper(seed, i)
        chunks = [{"text": c.text, "heading": c.heading_path[-1] if c.heading_path else "", "index": c.index,
                   "refs": any(w in h.lower() for h in c.heading_path for w in ("reference", "bibliograph"))}
                  for c in chunk_markdown(p.markdown)]
        papers.append((p.paper_id, chunks))
    order = list(range(n_papers))
    rng.shuffle(order)
    half_of = {order[k]: ("tune" if k % 2 == 0 else "heldout") for k in range(n_papers)}  # alternate

    picks = []
    for pi in order:
        pid, chunks = papers[pi]
        cidx = list(range(len(chunks)))
        rng.shuffle(cidx)
        taken = 0
        for ci in cidx:
            if taken >= per_paper:
                break
            if chunks[ci]["refs"]:
                continue  # reference lists are not evidence anyone asks for
            text = chunks[ci]["text"]
            cands = set(candidate_sentences(text))
            units = [(s, e) for s, e in sentence_segments(text) if text[s:e] in cands and text.count(text[s:e]) == 1]
            if not units:
                continue
            s, e = rng.choice(units)
            sentence = text[s:e]
            assert text[s:e] == sentence and text.find(sentence) == s
            queries = {"keywords": keywords(sentence, rng.randint(4, 6), rng),
                       "partial": partial_query(sentence, chunks[ci]["heading"], rng)}
            if any(len(q.split()) < 3 for q in queries.values()):
                continue
            picks.append({"paper": pi, "chunk": ci, "gold": (s, e), "queries": queries})
            taken += 1
        if len(picks) >= n_picks:
            break
    picks = picks[:n_picks]

    pairs = []
    for k, pk in enumerate(picks):
        half = half_of[pk["paper"]]
        others = [q for q in range(n_papers) if half_of[q] == half and q != pk["paper"] and papers[q][1]]
        neg_paper = rng.choice(others)
        neg_chunk = rng.randrange(len(papers[neg_paper][1]))
        for style in STYLES:
            q = pk["queries"][style]
            pairs.append({"pick": k, "style": style, "half": half, "relevant": True, "query": q,
                          "chunk": papers[pk["paper"]][1][pk["chunk"]]["text"], "gold": [pk["gold"]],
                          "paper_id": papers[pk["paper"]][0]})
            pairs.append({"pick": k, "style": style, "half": half, "relevant": False, "query": q,
                          "chunk": papers[neg_paper][1][neg_chunk]["text"], "gold": [],
                          "paper_id": papers[neg_paper][0]})
    summary = {
        "papers": n_papers, "picks": len(picks), "pairs": len(pairs),
        "by_half": {h: {"pairs": sum(p["half"] == h for p in pairs),
                        "positives": sum(p["half"] == h and p["relevant"] for p in pairs),
                        "negatives": sum(p["half"] == h and not p["relevant"] for p in pairs),
                        "papers": sum(v == h for v in half_of.values())} for h in ("tune", "heldout")},
        "mean_chunk_chars": float(np.mean([len(p["chunk"]) for p in pairs])),
        "mean_gold_chars": float(np.mean([p["gold"][0][1] - p["gold"][0][0] for p in pairs if p["gold"]])),
        "mean_query_words": {s: float(np.mean([len(p["query"].split()) for p in pairs if p["style"] == s]))
                             for s in STYLES},
        "examples": [{"style": p["style"], "query": p["query"],
                      "gold": p["chunk"][p["gold"][0][0]:p["gold"][0][1]]}
                     for p in pairs[:8] if p["relevant"]],
    }
    return pairs, summary


def score(pairs: list[dict], results: list, idx: list[int]) -> dict:
    """metrics.evaluate over the pairs ``idx`` plus abstention rates and a few headline figures."""
    rows = [EvalRow(pairs[i]["chunk"], pairs[i]["gold"], [(sp.start, sp.end) for sp in results[i].spans],
                    pairs[i]["relevant"], key=(i,)) for i in idx]
    ev = evaluate(rows)
    pos = [i for i in idx if pairs[i]["relevant"]]
    neg = [i for i in idx if not pairs[i]["relevant"]]
    return {
        "micro_f1": ev["word"]["micro_f1"], "micro_p": ev["word"]["micro_p"], "micro_r": ev["word"]["micro_r"],
        "macro_f1": ev["word"]["macro_f1"], "iou50_f1": ev["iou"]["0.5"]["f1"],
        "containment_0.8": ev["containment"]["0.8"], "coverage_0.8": ev["coverage"]["0.8"],
        "coverage_1.0": ev["coverage"]["1.0"],
        "abstain_neg": sum(not results[i].spans for i in neg) / max(1, len(neg)),
        "abstain_pos": sum(not results[i].spans for i in pos) / max(1, len(pos)),
        "spans_per_pos": sum(len(results[i].spans) for i in pos) / max(1, len(pos)),
        "n": len(idx), "full": ev,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--papers", type=int, default=80)
    ap.add_argument("--picks", type=int, default=150, help="sentences; each gives 2 styles x (pos + neg) pairs")
    ap.add_argument("--per-paper", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    pairs, summary = build_set(args.papers, args.picks, args.per_paper, args.seed)
    build_s = time.perf_counter() - t0

    base = SemanticExtractor(SemanticConfig(device="cpu"))
    t0 = time.perf_counter()
    scored = base.unit_scores([p["query"] for p in pairs], [p["chunk"] for p in pairs])
    embed_s = time.perf_counter() - t0
    errors = [s for s in scored if isinstance(s, str)]
    if errors:
        raise RuntimeError(f"{len(errors)} pairs could not be scored: {errors[:3]}")

    halves = {h: [i for i, p in enumerate(pairs) if p["half"] == h] for h in ("tune", "heldout")}
    by_style = {(h, s): [i for i in halves[h] if pairs[i]["style"] == s] for h in halves for s in STYLES}

    def run(threshold: float, margin: float) -> list:
        ex = SemanticExtractor(SemanticConfig(threshold=threshold, margin=margin, device="cpu", **UNIT_ONLY),
                               embedder=base.embedder)
        return [ex.spans_from_scores(s, p["chunk"]) for s, p in zip(scored, pairs, strict=True)]

    t0 = time.perf_counter()
    grid = []
    for t in THRESHOLDS:
        for m in MARGINS:
            res = run(t, m)
            grid.append({"threshold": t, "margin": m,
                         **{h: score(pairs, res, idx) for h, idx in halves.items()}})
    edge = []
    for t in THRESHOLDS:
        for m in EDGE_MARGINS:
            res = run(t, m)
            edge.append({"threshold": t, "margin": m, **{h: score(pairs, res, idx) for h, idx in halves.items()}})
    sweep_s = time.perf_counter() - t0

    best = max(grid, key=lambda g: (round(g["tune"]["micro_f1"], 6), round(g["tune"]["macro_f1"], 6),
                                    g["threshold"]))
    current = SemanticConfig(threshold=0.40, margin=0.05)  # the v1 defaults this sweep chose
    compare = {"chosen": (best["threshold"], best["margin"]), "placeholders": PLACEHOLDERS}
    if (current.threshold, current.margin) not in compare.values():
        compare["config_defaults"] = (current.threshold, current.margin)
    report = {}
    for name, (t, m) in compare.items():
        res = run(t, m)
        report[name] = {h: score(pairs, res, idx) for h, idx in halves.items()}
        report[name]["heldout_by_style"] = {s: score(pairs, res, by_style[("heldout", s)]) for s in STYLES}

    # Similarity distribution: best unit of positives vs negatives, and the gold unit's rank.
    best_sim = {"pos": [], "neg": []}
    gold_is_top = []
    for sc, p in zip(scored, pairs, strict=True):
        segs, sims = sc.segments, sc.unit
        best_sim["pos" if p["relevant"] else "neg"].append(float(sims.max()) if len(sims) else 0.0)
        if p["relevant"]:
            g = segs.index(tuple(p["gold"][0]))
            gold_is_top.append(bool(sims[g] >= sims.max()))

    def q(v: list[float]) -> dict:
        return {k: float(np.quantile(v, x)) for k, x in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}

    for g in grid + edge:
        for h in halves:
            g[h].pop("full")
    result = {
        "benchmark": "tune_semantic",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "model": base.describe()["model_id"],
        "set": summary,
        "timing_s": {"build_set": build_s, "unit_scores": embed_s, "sweep": sweep_s},
        "unit_stats": dict(base.stats),
        "best_unit_similarity": {k: q(v) for k, v in best_sim.items()},
        "gold_unit_is_top_share": float(np.mean(gold_is_top)),
        "grid_thresholds": THRESHOLDS, "grid_margins": MARGINS,
        "selection": "max word micro-F1 on the tune half (ties: macro-F1, then higher threshold)",
        "chosen": {"threshold": best["threshold"], "margin": best["margin"]},
        "compared": {k: {"threshold": t, "margin": m} for k, (t, m) in compare.items()},
        "report": report,
        "grid": grid,
        "edge_check_not_selectable": edge,
    }

    print(f"set: {summary['pairs']} pairs ({summary['by_half']}); build {build_s:.1f}s, "
          f"unit scores {embed_s:.1f}s, sweep {sweep_s:.1f}s", file=sys.stderr)
    hdr = (f"{'thr':>5} {'margin':>6} | {'tune F1':>7} {'macro':>6} {'IoU.5':>6} {'abs-':>5} {'abs+':>5} | "
           f"{'held F1':>7}")
    print(hdr, file=sys.stderr)
    for g in grid:
        tu, ho = g["tune"], g["heldout"]
        print(f"{g['threshold']:>5.2f} {g['margin']:>6.2f} | {tu['micro_f1']:>7.3f} {tu['macro_f1']:>6.3f} "
              f"{tu['iou50_f1']:>6.3f} {tu['abstain_neg']:>5.2f} {tu['abstain_pos']:>5.2f} | {ho['micro_f1']:>7.3f}",
              file=sys.stderr)
    best_edge = max(edge, key=lambda g: g["tune"]["micro_f1"])
    print(f"edge check (not selectable): margin {best_edge['margin']} threshold {best_edge['threshold']}: "
          f"tune {best_edge['tune']['micro_f1']:.3f} held-out {best_edge['heldout']['micro_f1']:.3f}", file=sys.stderr)
    print(f"chosen: threshold {best['threshold']}, margin {best['margin']}", file=sys.stderr)
    for name in report:
        for h in ("tune", "heldout"):
            r = report[name][h]
            print(f"  {name:<17} {h:<8} micro-F1 {r['micro_f1']:.3f} macro-F1 {r['macro_f1']:.3f} "
                  f"IoU.5 {r['iou50_f1']:.3f} cont.8 {r['containment_0.8']:.3f} cov.8 {r['coverage_0.8']:.3f} "
                  f"abstain neg {r['abstain_neg']:.2f} pos {r['abstain_pos']:.2f}", file=sys.stderr)
    for name in report:
        for h in ("tune", "heldout"):
            report[name][h].pop("full")
        for s in STYLES:
            report[name]["heldout_by_style"][s].pop("full")
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
