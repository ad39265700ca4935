"""Semantic extractor defaults by cross-validation (issue 42): every candidate judged out of fold, with bootstrap
confidence intervals, on the four dev files (and their question twins) and beside them the held-out gold file that
is never tuned on.

    .venv/bin/python benchmarks/bench_defaults_cv.py --json benchmarks/results-defaults-cv.json

Data: the four hand-labelled dev files of ``../shared/devsets`` (four seed papers; a *minimal* and a *broad*
style) and ``benchmarks/gold/seeds-heldout.jsonl`` (our own questions on the same papers, marked minimal; see its
README). Retrieved files (``seeds-dev-retrieved*``: three rows per query in rank order; the held-out file: a
``rank`` per row) are extracted as the extract stage does for a retrieval run: each query's pairs together, with
their ranks (``SemanticExtractor.select``); ``seeds-dev`` (hand-picked pairs) pair by pair.

* **Both query styles**: each dev file also as its twin "(questions)": the same pairs and gold spans with each
  keyword query asked as a question (``benchmarks/gold/seeds-dev-questions.tsv``), so the query's phrasing is
  measured apart from the papers and the annotators. The rule picks on all eight.
* **What the signals allow** (``ceiling``): on relevant pairs, how often each signal ranks a gold unit first, and
  word F1 with perfect abstention: the ranking that every selection setting starts from.
* **Unit signals once**: the MiniLM signals of every pair are computed once (and once more with the non-body
  units kept, for that ablation); each setting re-runs only the selection.
* **Ablations of f84913e** (issue 35's change): the current default with one part of that change undone at a
  time (unit kinds: non-body units and table rows kept as plain units; margin off; context signal off with the
  old weights; paragraph select off; the span bound off), each scored on every file with a paired bootstrap
  interval of its difference to the current default.
* **Cross-validation**: a grid of selection settings (weights, threshold, margin, paragraph select, and the
  per-query selection: ``query_margin``, ``query_threshold``, ``rank_weight``). Leave one paper out: on the
  other three papers the rule picks the setting whose smallest gain over the current default across the eight
  dev files is largest (then the best mean); it predicts the held-out paper. The four held-out parts scored
  together are the CV figure of the *procedure*. A change of the default is accepted only when the CV figure
  beats the current default on every dev file.
* **Bootstrap**: 2,000 resamples of each file's queries (all rows of a query together; ``seeds-dev``: its rows),
  seeded; 95% percentile intervals of word micro-F1 and of paired differences.

Word micro-F1 as ``metrics.evaluate`` computes it (a word counts when it shares a character with a span).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import pickle
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from devsets import DEFAULT_DEVSETS, FILES, load_devsets  # noqa: E402

from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor, _unit_evidence  # noqa: E402
from verbatim_batch.quality.evaluate import load_gold  # noqa: E402
from verbatim_batch.quality.metrics import _covered_words, word_spans  # noqa: E402

HELDOUT = ROOT / "benchmarks" / "gold" / "seeds-heldout.jsonl"
QUESTIONS = ROOT / "benchmarks" / "gold" / "seeds-dev-questions.tsv"  # each dev query asked as a question
ASKED = " (questions)"  # suffix of a dev file's question form
DEV = FILES + tuple(f + ASKED for f in FILES)  # the files the rule picks on: both annotation and query styles
RETRIEVED = ("seeds-dev-retrieved", "seeds-dev-retrieved-broad", "seeds-dev-retrieved" + ASKED,
             "seeds-dev-retrieved-broad" + ASKED, "seeds-heldout")
DEFAULT = SemanticConfig(device="cpu")
BOOT = 2000
GRID = {
    "weights": ((0.4, 0.2, 0.3), (0.3, 0.4, 0.0), (0.45, 0.15, 0.3)),  # lexical, paragraph, context
    "threshold": (0.45, 0.5),
    "margin": (0.18, None),
    "paragraph_select": (0.75, 1.0),
    # query_margin, query_threshold, rank_weight, query_max_spans (the first: per pair, as before)
    "query": ((1.0, 0.5, 0.0, 0), (1.0, 0.5, 0.0, 4), (0.1, 0.45, 0.0, 0), (0.15, 0.45, 0.0, 0),
              (0.1, 0.42, 0.0, 0), (0.15, 0.42, 0.0, 0), (0.1, 0.45, 0.02, 0), (0.2, 0.45, 0.0, 0),
              (0.1, 0.5, 0.0, 0), (0.15, 0.45, 0.0, 4)),
}


def config_of(values: dict) -> SemanticConfig:
    lexical, paragraph, context = values["weights"]
    qm, qt, rw, qs = values["query"]
    rest = {k: v for k, v in values.items() if k not in ("weights", "query")}
    return dataclasses.replace(DEFAULT, lexical_weight=lexical, paragraph_weight=paragraph, context_weight=context,
                               query_margin=qm, query_threshold=qt, rank_weight=rw, query_max_spans=qs,
                               **rest)


def describe(c: SemanticConfig) -> dict:
    keys = ("threshold", "lexical_weight", "paragraph_weight", "context_weight", "unit_slack", "margin",
            "paragraph_fill", "paragraph_select", "max_spans", "keep_non_body", "row_gate", "query_margin",
            "query_threshold", "rank_weight", "query_max_spans")
    return {k: getattr(c, k) for k in keys}


def _counts(gold: set[int], predicted: set[int]) -> tuple[int, int, int]:
    """Word tp, fp, fn of one row."""
    return len(gold & predicted), len(predicted - gold), len(gold - predicted)


class Data:
    """Every file's rows as one list of distinct pairs, with per-row word sets, query groups and ranks."""

    def __init__(self, golds: dict[str, list[dict]], raw_ranks: dict[str, list[int | None]]):
        self.files = list(golds)
        self.golds = golds
        index: dict[tuple[str, str], int] = {}
        for f in self.files:
            for g in golds[f]:
                index.setdefault((g["query"], g["chunk"]), len(index))
        self.pairs = list(index)
        self.rows = {f: [index[(g["query"], g["chunk"])] for g in golds[f]] for f in self.files}
        words = {}
        for k, (_, chunk) in enumerate(self.pairs):
            ws = word_spans(chunk)
            words[k] = ([w[0] for w in ws], [w[1] for w in ws])
        self.words = words
        self.gold_words = {f: [_covered_words(*words[k], g["gold_spans"]) for k, g in zip(self.rows[f], golds[f],
                                                                                          strict=True)]
                           for f in self.files}
        self.papers = sorted({g["paper_id"] for f in self.files for g in golds[f]})
        self.paper = {f: np.array([self.papers.index(g["paper_id"]) for g in golds[f]]) for f in self.files}
        # retrieval mode: (query id, rank) of each pair when its file lists retrieved pairs, else None
        self.rank: dict[int, int | None] = {}
        for f in self.files:
            for k, r in zip(self.rows[f], raw_ranks[f], strict=True):
                if r is not None:
                    self.rank[k] = r
        # bootstrap units: a query's rows (retrieved files) or single rows
        self.units = {}
        for f in self.files:
            if f in RETRIEVED:
                qs = sorted({g["query"] for g in golds[f]})
                self.units[f] = np.array([qs.index(g["query"]) for g in golds[f]])
            else:
                self.units[f] = np.arange(len(golds[f]))

    def counts(self, preds: list[list[tuple[int, int]]]) -> dict[str, np.ndarray]:
        """Per file, an (rows, 3) array of word tp, fp, fn."""
        cover: dict[int, set[int]] = {}
        out = {}
        for f in self.files:
            arr = np.zeros((len(self.rows[f]), 3), dtype=np.int64)
            for i, (k, gw) in enumerate(zip(self.rows[f], self.gold_words[f], strict=True)):
                if k not in cover:
                    cover[k] = _covered_words(*self.words[k], preds[k])
                pw = cover[k]
                arr[i] = _counts(gw, pw)
            out[f] = arr
        return out


def f1(c: np.ndarray) -> float:
    tp, fp, fn = (int(x) for x in c)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def f1_rows(arr: np.ndarray, mask: np.ndarray | None = None) -> float:
    return f1(arr[mask].sum(0) if mask is not None else arr.sum(0))


def predict(ex: SemanticExtractor, config: SemanticConfig, scored: list, data: Data) -> list:
    ex.config = config
    ks = range(len(data.pairs))
    ranks = [data.rank.get(k) for k in ks]
    qids = [data.pairs[k][0] for k in ks]
    res = ex.select(scored, [c for _, c in data.pairs], None, qids, ranks)
    return [[(s.start, s.end) for s in r.spans] for r in res]


def boot_index(data: Data, seed: int = 0) -> dict[str, np.ndarray]:
    """Per file, ``BOOT`` resamples as boolean-free row index arrays (whole queries together)."""
    rng = np.random.default_rng(seed)
    out = {}
    for f in data.files:
        units = data.units[f]
        ids = np.unique(units)
        members = [np.flatnonzero(units == u) for u in ids]
        out[f] = [np.concatenate([members[j] for j in rng.integers(0, len(ids), len(ids))]) for _ in range(BOOT)]
    return out


def interval(arr: np.ndarray, boots: list[np.ndarray], base: np.ndarray | None = None) -> list[float]:
    """95% percentile interval of word F1 (or, with ``base``, of F1 minus base's F1) over the resamples."""
    vals = []
    for idx in boots:
        v = f1(arr[idx].sum(0))
        if base is not None:
            v -= f1(base[idx].sum(0))
        vals.append(v)
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


def abstention(data: Data, f: str, preds: list) -> float | None:
    irr = [k for k, g in zip(data.rows[f], data.golds[f], strict=True) if not g["gold_spans"]]
    return round(float(np.mean([not preds[k] for k in irr])), 4) if irr else None


def row_figures(name: str, data: Data, preds: list, boots: dict, base_counts: dict | None) -> dict:
    counts = data.counts(preds)
    out = {"name": name, "files": {}}
    for f in data.files:
        fig = {"word_f1": round(f1_rows(counts[f]), 4), "ci": interval(counts[f], boots[f]),
               "abstention_irrelevant": abstention(data, f, preds)}
        if base_counts is not None:
            fig["diff"] = round(fig["word_f1"] - f1_rows(base_counts[f]), 4)
            fig["diff_ci"] = interval(counts[f], boots[f], base_counts[f])
        out["files"][f] = fig
    n = [len(p) for p in preds]
    out["spans_max"] = max(n)
    return out


def pick(grid_counts: list[dict], base_counts: dict, data: Data, papers: list[int]) -> int:
    """On ``papers``, the setting whose smallest gain over the current default across the dev files (``DEV``: both
    annotation styles, each with its keyword queries and asked as questions) is largest; then the best mean F1."""
    best, best_key = 0, None
    masks = {f: np.isin(data.paper[f], papers) for f in DEV}
    base = {f: f1_rows(base_counts[f], masks[f]) for f in DEV}
    for i, counts in enumerate(grid_counts):
        figs = {f: f1_rows(counts[f], masks[f]) for f in DEV}
        key = (round(min(figs[f] - base[f] for f in DEV), 6), round(float(np.mean(list(figs.values()))), 6))
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


def questions(path: Path) -> dict[str, str]:
    """Keyword query -> the same information need asked as a question (``seeds-dev-questions.tsv``)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            query, question = line.split("\t")
            out[query] = question
    return out


def combined(s, config: SemanticConfig) -> np.ndarray:
    """A pair's unit scores as the extractor ranks them (``semantic._unit_evidence``), -inf where a unit may not be
    evidence."""
    score, eligible = _unit_evidence(s, config)
    return np.where(eligible, score, -np.inf)


def ceiling(ex: SemanticExtractor, data: Data, scored: list, config: SemanticConfig) -> dict[str, dict]:
    """What the signals leave a selection rule, per file, on its relevant pairs: how often each signal
    (and their mix) ranks a unit that overlaps a gold span first in its chunk; and word F1 with perfect abstention
    (nothing on irrelevant pairs) when a relevant pair gets (a) its best unit alone, (b) what the current selection
    gives it, (c) the best prefix of its units in score order (the number that gives the pair its highest F1, known
    from its gold): a bound on any selection that takes units in the order of their scores."""
    signals = ("unit", "lexical", "paragraph", "context")
    out = {}
    sel = predict(ex, config, scored, data)
    for f in data.files:
        hits: dict[str, list[bool]] = {n: [] for n in (*signals, "mixed")}
        top1: list = [[] for _ in data.pairs]
        with_sel: list = [[] for _ in data.pairs]
        prefix: list = [[] for _ in data.pairs]
        for k, g, gw in zip(data.rows[f], data.golds[f], data.gold_words[f], strict=True):
            s = scored[k]
            if not g["gold_spans"] or not s.segments:
                continue
            good = np.array([any(a < e and st < b for st, e in g["gold_spans"]) for a, b in s.segments])
            if not good.any():
                continue
            mixed = combined(s, config)
            for n in signals:
                arr = getattr(s, n) if getattr(s, n) is not None else s.unit
                hits[n].append(bool(good[int(np.argmax(np.where(np.isfinite(mixed), arr, -np.inf)))]))
            hits["mixed"].append(bool(good[int(np.argmax(mixed))]))
            top1[k] = [s.segments[int(np.argmax(mixed))]]
            with_sel[k] = sel[k]
            order = [s.segments[i] for i in np.argsort(-mixed, kind="stable") if np.isfinite(mixed[i])]
            prefix[k] = max((order[:n] for n in range(1, len(order) + 1)),
                            key=lambda segs: f1(np.array(_counts(gw, _covered_words(*data.words[k], segs)))))
        out[f] = {"relevant_pairs": len(hits["mixed"]),
                  "first_unit_in_gold": {n: round(float(np.mean(v)), 3) for n, v in hits.items()},
                  "perfect_abstention_best_unit_f1": round(f1_rows(data.counts(top1)[f]), 4),
                  "perfect_abstention_current_selection_f1": round(f1_rows(data.counts(with_sel)[f]), 4),
                  "perfect_abstention_best_prefix_f1": round(f1_rows(data.counts(prefix)[f]), 4)}
    return out


def fmt(r: dict, files) -> str:
    cells = []
    for f in files:
        x = r["files"][f]
        d = f", {x['diff']:+.3f} [{x['diff_ci'][0]:+.3f}, {x['diff_ci'][1]:+.3f}]" if "diff" in x else ""
        cells.append(f"{x['word_f1']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]{d}")
    return f"| {r['name']} | " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devsets", default=str(DEFAULT_DEVSETS), help="folder with the four seeds-dev*.jsonl files")
    ap.add_argument("--heldout", default=str(HELDOUT))
    ap.add_argument("--questions", default=str(QUESTIONS), help="each dev query and the same need asked as a "
                    "question (tab-separated)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-twins", metavar="DIR", default=None, help="only write each dev file's question twin "
                    "to DIR as <file>-questions.jsonl (the dev files' format), for `verbatim-batch evaluate --gold` "
                    "with any extractor, and stop")
    ap.add_argument("--cache", default=None, help="pickle of the unit signals: written on the first run, then read "
                    "(the selection grid reruns in seconds)")
    args = ap.parse_args(argv)
    golds = load_devsets(Path(args.devsets))
    if golds is None:
        return 2
    golds["seeds-heldout"] = load_gold(args.heldout)
    raw = {}
    asked = questions(Path(args.questions))
    for f in FILES:
        rows = [json.loads(line) for line in (Path(args.devsets) / f"{f}.jsonl").read_text().splitlines()
                if line.strip()]
        if args.write_twins:
            out = Path(args.write_twins)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{f}-questions.jsonl").write_text("".join(
                json.dumps(dict(row, query=asked[row["query"]]), ensure_ascii=False) + "\n" for row in rows),
                encoding="utf-8")
            continue
        if f in RETRIEVED:  # three consecutive rows per query, in rank order
            ranks, last, r = [], None, 0
            for row in rows:
                r = r + 1 if row["query"] == last else 1
                last = row["query"]
                ranks.append(r)
            raw[f] = ranks
        else:
            raw[f] = [None] * len(rows)
    if args.write_twins:
        print(f"wrote the question twins of {', '.join(FILES)} to {args.write_twins}")
        return 0
    raw["seeds-heldout"] = [json.loads(line).get("rank") for line in Path(args.heldout).read_text().splitlines()
                            if line.strip()]
    for f in FILES:  # the same pairs and gold spans, each query asked as a question
        golds[f + ASKED] = [dict(g, query=asked[g["query"]]) for g in golds[f]]
        raw[f + ASKED] = raw[f]
    golds = {f: golds[f] for f in (*DEV, "seeds-heldout")}
    data = Data(golds, raw)
    files = data.files
    timing = {}
    t0 = time.perf_counter()
    ex = SemanticExtractor(dataclasses.replace(DEFAULT, context_weight=max(DEFAULT.context_weight, 0.1)))
    cache = Path(args.cache) if args.cache else None
    if cache and cache.exists():  # the unit signals of these pairs, from an earlier run (same tree, same files)
        cached = pickle.loads(cache.read_bytes())
        assert cached["pairs"] == data.pairs, "the cache holds other pairs"
        scored, keep_scored = cached["scored"], cached["keep_scored"]
    else:
        scored = ex.unit_scores([q for q, _ in data.pairs], [c for _, c in data.pairs])
        keep_ex = SemanticExtractor(dataclasses.replace(DEFAULT, keep_non_body=True), embedder=ex.embedder)
        keep_scored = keep_ex.unit_scores([q for q, _ in data.pairs], [c for _, c in data.pairs])
        if cache:
            cache.write_bytes(pickle.dumps({"pairs": data.pairs, "scored": scored, "keep_scored": keep_scored}))
    if any(isinstance(s, str) for s in scored + keep_scored):
        raise SystemExit("some pairs could not be scored")
    timing["unit_scores_s"] = time.perf_counter() - t0
    boots = boot_index(data)

    t0 = time.perf_counter()
    base_preds = predict(ex, DEFAULT, scored, data)
    base_counts = data.counts(base_preds)
    rows = [row_figures("current default", data, base_preds, boots, None)]
    ablations = {
        "unit kinds undone (non-body kept, no row gate)": (dataclasses.replace(DEFAULT, keep_non_body=True,
                                                                               row_gate=False), keep_scored),
        "non-body kept only": (dataclasses.replace(DEFAULT, keep_non_body=True), keep_scored),
        "row gate off only": (dataclasses.replace(DEFAULT, row_gate=False), scored),
        "margin off": (dataclasses.replace(DEFAULT, margin=None), scored),
        "context signal off (weights 0.3/0.4/0)": (dataclasses.replace(DEFAULT, lexical_weight=0.3,
                                                                       paragraph_weight=0.4, context_weight=0.0),
                                                   scored),
        "paragraph select off": (dataclasses.replace(DEFAULT, paragraph_select=1.0), scored),
        "unit slack 0": (dataclasses.replace(DEFAULT, unit_slack=0.0), scored),
        "span bound off": (dataclasses.replace(DEFAULT, max_spans=0), scored),
        "threshold 0.45": (dataclasses.replace(DEFAULT, threshold=0.45), scored),
    }
    for name, (cfg, sc) in ablations.items():
        rows.append(row_figures(name, data, predict(ex, cfg, sc, data), boots, base_counts))
    timing["ablations_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    grid = [config_of(dict(zip(GRID, values, strict=True))) for values in itertools.product(*GRID.values())]
    grid_preds = [predict(ex, c, scored, data) for c in grid]
    grid_counts = [data.counts(p) for p in grid_preds]
    timing["grid_s"] = time.perf_counter() - t0
    all_papers = list(range(len(data.papers)))
    chosen = pick(grid_counts, base_counts, data, all_papers)
    folds = []
    cv_preds: list = [None] * len(data.pairs)
    paper_of = {}
    for f in files:
        for k, p in zip(data.rows[f], data.paper[f], strict=True):
            paper_of[k] = int(p)
    for held in all_papers:
        i = pick(grid_counts, base_counts, data, [p for p in all_papers if p != held])
        folds.append({"held_out": data.papers[held], "config": describe(grid[i])})
        for k in range(len(data.pairs)):
            if paper_of[k] == held:
                cv_preds[k] = grid_preds[i][k]
    cv = row_figures("CV: the rule's pick, leave one paper out", data, cv_preds, boots, base_counts)
    pick_row = row_figures("the rule's pick on all four papers (in sample)", data, grid_preds[chosen], boots,
                           base_counts)
    rows += [pick_row, cv]
    accepted = all(cv["files"][f]["diff"] > 0 for f in DEV)
    # the per-query selection alone, on the current default otherwise (each grid point of it)
    query_rows = []
    for qm, qt, rw, qs in GRID["query"][1:]:
        cfg = dataclasses.replace(DEFAULT, query_margin=qm, query_threshold=qt, rank_weight=rw, query_max_spans=qs)
        query_rows.append(row_figures(f"per query: margin {qm}, floor {qt}, rank weight {rw}, spans {qs}", data,
                                      predict(ex, cfg, scored, data), boots, base_counts))

    print("word micro-F1 [95% bootstrap CI]; for changes: difference to the current default [paired 95% CI]")
    print("| setting | " + " | ".join(files) + " |")
    print("|---|" + "---|" * len(files))
    for r in rows + query_rows:
        print(fmt(r, files))
    print("abstention on irrelevant pairs, current default / CV: " + ", ".join(
        f"{f} {rows[0]['files'][f]['abstention_irrelevant']} / {cv['files'][f]['abstention_irrelevant']}"
        for f in files))
    limits = ceiling(ex, data, scored, DEFAULT)
    print("\nwhat the signals allow, relevant pairs: the first unit overlaps gold (unit / lexical / paragraph / "
          "context / mixed); word F1 with perfect abstention: best unit alone, current selection, best prefix")
    for f, c in limits.items():
        hit = " / ".join(f"{v:.2f}" for v in c["first_unit_in_gold"].values())
        print(f"| {f} | {c['relevant_pairs']} | {hit} | {c['perfect_abstention_best_unit_f1']:.3f} | "
              f"{c['perfect_abstention_current_selection_f1']:.3f} | {c['perfect_abstention_best_prefix_f1']:.3f} |")
    print(f"\nrule's pick on all papers: {describe(grid[chosen])}")
    for fold in folds:
        print(f"  fold {fold['held_out']}: {fold['config']}")
    print(f"change accepted (CV beats the current default on every dev file): {accepted}")
    print(f"timing: {json.dumps({k: round(v, 1) for k, v in timing.items()})}")
    result = {
        "date": dt.date.today().isoformat(), "machine": platform.platform(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "command": " ".join(sys.argv),
        "extractor": ex.describe() | {"config": describe(DEFAULT)}, "files": {f: len(golds[f]) for f in files},
        "pairs": len(data.pairs), "papers": data.papers, "bootstrap": {"resamples": BOOT, "seed": 0,
                                                                       "unit": "query (retrieved files), row"},
        "rows": rows, "per_query_rows": query_rows, "pick_all_papers": describe(grid[chosen]), "folds": folds,
        "accepted": accepted, "ceiling": limits, "grid": {k: [list(v) if isinstance(v, tuple) else v for v in vs]
                                       for k, vs in GRID.items()},
        "grid_size": len(grid), "timing_s": timing,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
