"""The offline (semantic) extractor on real paper text: its defaults against the old ones, signal by signal.

    .venv/bin/python benchmarks/bench_offline_extractor.py
    .venv/bin/python benchmarks/bench_offline_extractor.py --json benchmarks/results-offline-extractor.json

Data: the four hand-labelled development files of ``../shared/devsets`` (see their README): 165
(query, chunk) pairs from four real papers, each marked in two styles, *minimal* (``seeds-dev``,
``seeds-dev-retrieved``) and *broad* (``-broad``). ``seeds-dev`` pairs were picked by hand;
``seeds-dev-retrieved`` pairs are the project's own hybrid retrieval's top 3 for queries written
before retrieval. The paper text stays in that folder; nothing of it is written here.

Every figure comes from the project's own scoring (``evaluate.evaluate_predictions`` →
``metrics.evaluate``): word-level micro F1 (and P, R), span IoU F1 at 0.5, plus abstention
accuracy (share of pairs where "some span" agrees with "the pair is relevant").

The unit signals are computed once (``SemanticExtractor.unit_scores``, bundled MiniLM on CPU);
each setting then re-runs only ``select_spans``. Rows:

* ``v1 default``: the released default before this change (threshold 0.40, margin 0.05, unit
  similarity only);
* ``t0.50 no margin``: the best plain setting known before (threshold 0.50);
* ``+ lexical``, ``+ paragraph``, ``+ lexical + paragraph``: one signal at a time;
* ``new default``: issue 16's default (adds the paragraph fill; ``SemanticConfig()`` before issue 35).

Cross-validation, leave one paper out: for each of the four papers, the setting with the best
mean word micro-F1 over the four files restricted to the *other three* papers is picked from a
small grid (lexical weight, paragraph weight, threshold, paragraph fill); its predictions on the
held-out paper are kept. The four held-out parts together are scored like any other row, next to
the same procedure over the v1 family (threshold, margin). This estimates what tuning on such
data is worth on papers it has not seen, and shows whether the picks are stable.

Prints a table; ``--json PATH`` writes everything (figures, the picks of every fold, timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from devsets import DEFAULT_DEVSETS, FILES, load_devsets  # noqa: E402

from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor, select_spans  # noqa: E402
from verbatim_batch.quality.evaluate import evaluate_predictions, gold_key  # noqa: E402

# Issue 35 added signals and selection rules (context, unit slack, paragraph select, a span bound); off here, so
# these rows keep issue 16's meaning (on issue 35's units: references, TOC lines and author blocks left out).
# The issue-35 default and its comparison: benchmarks/bench_evidence_quality.py.
_ISSUE_35_OFF = {"context_weight": 0.0, "unit_slack": 0.0, "paragraph_select": 1.0, "max_spans": 0}
V1 = SemanticConfig(threshold=0.40, margin=0.05, lexical_weight=0.0, paragraph_weight=0.0, paragraph_fill=1.0,
                    **_ISSUE_35_OFF)
PLAIN = dataclasses.replace(V1, threshold=0.50, margin=None)
NEW = SemanticConfig(threshold=0.50, lexical_weight=0.3, paragraph_weight=0.4, paragraph_fill=0.5, margin=None,
                     **_ISSUE_35_OFF)  # issue 16's default
VARIANTS = {
    "v1 default (t 0.40, margin 0.05)": V1,
    "t 0.50, no margin": PLAIN,
    "+ lexical 0.3": dataclasses.replace(PLAIN, lexical_weight=0.3),
    "+ paragraph 0.4": dataclasses.replace(PLAIN, paragraph_weight=0.4),
    "+ lexical 0.3 + paragraph 0.4": dataclasses.replace(PLAIN, lexical_weight=0.3, paragraph_weight=0.4),
    "new default (+ paragraph fill 0.5)": NEW,
}
GRID = {  # the cross-validation grid of the new extractor
    "lexical_weight": (0.0, 0.2, 0.3, 0.4),
    "paragraph_weight": (0.0, 0.2, 0.3, 0.4),
    "threshold": (0.425, 0.45, 0.475, 0.5, 0.525, 0.55, 0.575),
    "paragraph_fill": (0.3, 0.5, 0.7, 1.0),
}
V1_GRID = {"threshold": (0.35, 0.4, 0.45, 0.5, 0.55, 0.6), "margin": (0.05, 0.1, 0.2, None)}


def pair_key(row) -> tuple[str, str]:
    return row["query"], row["chunk"]


def score_file(gold, preds: dict, paper_ids=None) -> dict:
    """The project's metrics for one file (optionally only some papers), plus abstention accuracy."""
    rows = [g for g in gold if paper_ids is None or g["paper_id"] in paper_ids]
    spans = {gold_key(g): preds.get(pair_key(g), []) for g in rows}
    res = evaluate_predictions(rows, spans)
    abstain = np.mean([bool(spans[gold_key(g)]) == bool(g["gold_spans"]) for g in rows])
    w = res["word"]
    return {"word_f1": w["micro_f1"], "word_p": w["micro_p"], "word_r": w["micro_r"],
            "iou50_f1": res["iou"]["0.5"]["f1"], "abstention_acc": float(abstain), "pairs": len(rows)}


def predict(scored: dict, config: SemanticConfig) -> dict:
    out = {}
    for key, scores in scored.items():
        spans = select_spans(scores, key[1], config).spans
        out[key] = [(s.start, s.end) for s in spans]
    return out


def mean_f1(golds, preds, papers=None) -> float:
    return float(np.mean([score_file(golds[f], preds, papers)["word_f1"] for f in FILES]))


def cross_validate(golds, scored, configs: list[SemanticConfig], papers: list[str]) -> tuple[dict, list]:
    """Leave one paper out: pick on three papers, predict the fourth; returns predictions and picks."""
    all_preds = [predict(scored, c) for c in configs]
    paper_of = {pair_key(g): g["paper_id"] for f in FILES for g in golds[f]}
    held_out: dict = {}
    picks = []
    for paper in papers:
        train = set(papers) - {paper}
        scores = [mean_f1(golds, p, train) for p in all_preds]
        best = int(np.argmax(scores))
        picks.append({"held_out": paper, "train_mean_word_f1": scores[best],
                      "config": {k: getattr(configs[best], k) for k in
                                 ("threshold", "margin", "lexical_weight", "paragraph_weight", "paragraph_fill")}})
        held_out.update({k: v for k, v in all_preds[best].items() if paper_of[k] == paper})
    return held_out, picks


def fmt_row(name: str, figures: dict) -> str:
    cells = [f"{figures[f]['word_f1']:.3f} / {figures[f]['iou50_f1']:.3f} / {figures[f]['abstention_acc']:.2f}"
             for f in FILES]
    mean = np.mean([figures[f]["word_f1"] for f in FILES])
    return f"| {name} | " + " | ".join(cells) + f" | {mean:.3f} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devsets", default=str(DEFAULT_DEVSETS), help="folder with the four seeds-dev*.jsonl files")
    ap.add_argument("--no-cv", action="store_true", help="skip the cross-validation (a few minutes on 2 CPUs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    golds = load_devsets(Path(args.devsets))
    if golds is None:
        return 2
    pairs = {pair_key(g): g for f in FILES for g in golds[f]}
    papers = sorted({g["paper_id"] for g in golds[FILES[0]]})

    t0 = time.perf_counter()
    ex = SemanticExtractor(SemanticConfig(device="cpu"))
    keys = list(pairs)
    scored = dict(zip(keys, ex.unit_scores([k[0] for k in keys], [k[1] for k in keys]), strict=True))
    errors = [k for k, s in scored.items() if isinstance(s, str)]
    if errors:
        raise SystemExit(f"{len(errors)} pairs could not be scored")
    embed_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    variants = {}
    for name, cfg in VARIANTS.items():
        preds = predict(scored, cfg)
        variants[name] = {f: score_file(golds[f], preds) for f in FILES}
    cv = {}
    if not args.no_cv:
        grid = [dataclasses.replace(NEW, **dict(zip(GRID, values, strict=True)))
                for values in itertools.product(*GRID.values())
                if values[0] + values[1] <= 1.0]
        v1_grid = [dataclasses.replace(V1, threshold=t, margin=m) for t, m in itertools.product(*V1_GRID.values())]
        for name, configs in (("v1 family (threshold, margin) tuned per fold", v1_grid),
                              ("new extractor tuned per fold", grid)):
            preds, picks = cross_validate(golds, scored, configs, papers)
            cv[name] = {"figures": {f: score_file(golds[f], preds) for f in FILES}, "picks": picks,
                        "grid_size": len(configs)}
    sweep_s = time.perf_counter() - t0

    header = ("| setting | " + " | ".join(FILES) + " | mean word F1 |\n|---|" + "---|" * (len(FILES) + 1))
    print("word micro-F1 / IoU F1@0.5 / abstention accuracy")
    print(header)
    for name, figures in variants.items():
        print(fmt_row(name, figures))
    for name, res in cv.items():
        print(fmt_row(f"CV: {name}", res["figures"]))
    for name, res in cv.items():
        print(f"\n{name}: picks per held-out paper")
        for p in res["picks"]:
            print(f"  {p['held_out']}: {p['config']} (train mean word F1 {p['train_mean_word_f1']:.3f})")
    result = {
        "date": dt.date.today().isoformat(), "machine": platform.platform(), "processor": platform.processor(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "command": " ".join(sys.argv),
        "devsets": {f: len(golds[f]) for f in FILES}, "pairs": len(pairs), "papers": papers,
        "extractor": ex.describe(), "defaults": dataclasses.asdict(NEW),
        "variants": {name: {"config": dataclasses.asdict(VARIANTS[name]), "figures": figs}
                     for name, figs in variants.items()},
        "cross_validation": cv, "grid": GRID, "v1_grid": V1_GRID,
        "timing_s": {"unit_scores": embed_s, "settings_and_cv": sweep_s},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
