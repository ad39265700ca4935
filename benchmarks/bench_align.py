"""Alignment throughput: LLM-style span strings mapped back onto their chunks.

    .venv/bin/python benchmarks/bench_align.py --papers 120 --json benchmarks/results-align.json

Chunks come from synthetic papers (``synth.generate_paper``) cut by ``chunk_markdown``.
Spans are the chunks' own sentences (``sentence_segments``), turned into four kinds of
model answer:

* exact (60%): the sentence as it stands;
* altered (20%): case and/or whitespace changed (lower, upper, re-flowed lines);
* edited (10%): one word replaced by a word from elsewhere in the corpus;
* invented (10%): a sentence from another paper that does not occur in this chunk.

Each category is timed on its own (spans grouped by chunk, one ``align_spans`` call
per chunk, so each chunk's fold is paid once per category) and all of them together
(mixed and shuffled within each chunk, as a model answer would be). Figures are the
median of ``--runs`` runs, timed with ``time.perf_counter``; single process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rapidfuzz  # noqa: E402

from verbatim_batch.corpus.chunker import chunk_markdown  # noqa: E402
from verbatim_batch.extract.align import ChunkIndex, align_spans  # noqa: E402
from verbatim_batch.extract.sentences import sentence_segments  # noqa: E402
from verbatim_synth.corpus import generate_paper  # noqa: E402

CATEGORIES = ("exact", "altered", "edited", "invented")
WEIGHTS = (0.6, 0.2, 0.1, 0.1)


def corpus(seed: int, n_papers: int) -> list[tuple[str, list[str]]]:
    """(chunk text, its sentences) for every chunk with at least one sentence."""
    out = []
    for i in range(n_papers):
        for chunk in chunk_markdown(generate_paper(seed, i).markdown):
            sents = [chunk.text[s:e] for s, e in sentence_segments(chunk.text)]
            sents = [s for s in sents if len(s) >= 12]
            if sents:
                out.append((chunk.text, sents))
    return out


def alter(s: str, rng: random.Random) -> str:
    """Case and/or whitespace changes."""
    kind = rng.randrange(4)
    if kind == 0:
        return s.lower()
    if kind == 1:
        return s.upper()
    words = s.split()
    if kind == 2:  # re-flowed: line breaks and doubled spaces between words
        return "".join(w + rng.choice([" ", "  ", "\n", " \n"]) for w in words).strip()
    return " ".join(words).swapcase()


def edit(s: str, vocab: list[str], rng: random.Random) -> str:
    """One word (3+ letters, when there is one) replaced by another word."""
    words = s.split(" ")
    slots = [i for i, w in enumerate(words) if len(w) >= 3] or list(range(len(words)))
    i = rng.choice(slots)
    choice = rng.choice(vocab)
    while choice == words[i]:
        choice = rng.choice(vocab)
    words[i] = choice
    return " ".join(words)


def make_spans(data: list[tuple[str, list[str]]], seed: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per chunk: (chunk, [(category, span string), ...])."""
    rng = random.Random(seed)
    all_sents = [s for _, sents in data for s in sents]
    vocab = sorted({w for s in all_sents[:20000] for w in s.split() if w.isalpha() and len(w) >= 3})
    out = []
    for chunk, sents in data:
        spans = []
        for s in sents:
            cat = rng.choices(CATEGORIES, WEIGHTS)[0]
            if cat == "exact":
                spans.append((cat, s))
            elif cat == "altered":
                spans.append((cat, alter(s, rng)))
            elif cat == "edited":
                spans.append((cat, edit(s, vocab, rng)))
            else:
                for _ in range(20):
                    other = rng.choice(all_sents)
                    if other not in chunk:
                        break
                spans.append((cat, other))
        out.append((chunk, spans))
    return out


def run_once(work: list[tuple[str, list[str]]]) -> tuple[float, int, Counter]:
    """Seconds to align every chunk's spans (fresh index per chunk), span count, outcome counts."""
    outcomes: Counter = Counter()
    n = 0
    t = time.perf_counter()
    for chunk, spans in work:
        found, rejects = align_spans(chunk, spans)
        n += len(spans)
        for a in found:
            outcomes[a.method] += 1
        for _, reason in rejects:
            outcomes[reason.split(" ", 1)[0]] += 1
    return time.perf_counter() - t, n, outcomes


def bench(work: list[tuple[str, list[str]]], runs: int) -> dict:
    times, n, outcomes = [], 0, Counter()
    for _ in range(runs):
        secs, n, outcomes = run_once(work)
        times.append(secs)
    med = statistics.median(times)
    # Duplicate alignments within a chunk are dropped, so outcomes may sum to a little under n.
    return {"spans": n, "s_median": round(med, 3), "spans_per_s": round(n / med),
            "runs_s": [round(x, 3) for x in times], "outcomes": dict(sorted(outcomes.items()))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--papers", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write results here too")
    args = ap.parse_args()

    t0 = time.perf_counter()
    data = corpus(args.seed, args.papers)
    per_chunk = make_spans(data, args.seed)
    setup = time.perf_counter() - t0

    results: dict = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "rapidfuzz": rapidfuzz.__version__,
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),  # the machine may be shared: read figures with it
        "corpus": {"papers": args.papers, "seed": args.seed, "chunks": len(data),
                   "chunk_chars_mean": round(statistics.mean(len(c) for c, _ in data)),
                   "setup_s": round(setup, 1)},
        "runs": args.runs,
        "defaults": {"fuzzy_threshold": 0.8, "min_fuzzy_chars": 20},
    }

    # Folding alone: what a chunk costs the first time a span misses the exact step.
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        for chunk, _ in data:
            ChunkIndex(chunk).normalized()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    results["fold_chunks"] = {"chunks_per_s": round(len(data) / med),
                              "MB_per_s": round(sum(len(c.encode()) for c, _ in data) / med / 1e6, 1)}

    by_cat = {}
    for cat in CATEGORIES:
        work = [(chunk, [s for c, s in spans if c == cat]) for chunk, spans in per_chunk]
        work = [(chunk, spans) for chunk, spans in work if spans]
        by_cat[cat] = bench(work, args.runs)
        print(f"{cat:9s} {by_cat[cat]['spans']:7d} spans  {by_cat[cat]['spans_per_s']:9d} spans/s  "
              f"{by_cat[cat]['outcomes']}", flush=True)
    results["by_category"] = by_cat

    rng = random.Random(args.seed + 1)
    mixed = []
    for chunk, spans in per_chunk:
        strings = [s for _, s in spans]
        rng.shuffle(strings)
        mixed.append((chunk, strings))
    results["overall"] = bench(mixed, args.runs)
    overall = results["overall"]
    print(f"overall   {overall['spans']:7d} spans  {overall['spans_per_s']:9d} spans/s", flush=True)
    results["total_s"] = round(time.perf_counter() - t0, 1)

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
