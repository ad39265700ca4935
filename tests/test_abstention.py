"""The abstention curve of an extract run on a gold file (no Ray: the run's tables are written directly)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verbatim_batch.core.runs import build_manifest
from verbatim_batch.quality.abstention import abstention_curve, abstention_section

CHUNKS = {"A": "alpha beta is the answer here.", "B": "the value is gamma today.", "C": "nothing to see in delta."}
GOLD = [
    {"query": "qa", "paper_id": "P", "chunk_index": 0, "chunk": CHUNKS["A"], "relevant": True,
     "gold_spans": ["alpha beta"]},
    {"query": "qb", "paper_id": "P", "chunk_index": 1, "chunk": CHUNKS["B"], "relevant": True,
     "gold_spans": ["gamma"]},
    {"query": "qc", "paper_id": "P", "chunk_index": 2, "chunk": CHUNKS["C"], "relevant": False, "gold_spans": []},
]
# (gold row, relevance, predicted span text)
PREDICTED = [(0, 0.9, "alpha beta"), (1, 0.4, "gamma"), (2, 0.6, "delta")]


def _run(tmp_path) -> str:
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in GOLD))
    run = tmp_path / "run"
    pairs, spans = [], []
    for i, rel, text in PREDICTED:
        g = GOLD[i]
        ids = {"query": g["query"], "paper_id": g["paper_id"], "chunk_index": g["chunk_index"], "chunk_id": f"c{i}"}
        pairs.append({**ids, "n_spans": 1, "relevance": rel, "error": None})
        start = g["chunk"].index(text)
        spans.append({**ids, "start": start, "end": start + len(text), "text": text})
    pairs.append({"query": "qx", "paper_id": "P", "chunk_index": 9, "chunk_id": "cx", "n_spans": 0,
                  "relevance": None, "error": "empty_query"})
    for name, rows in (("pairs", pairs), ("spans", spans)):
        (run / name).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), run / name / "part-0.parquet")
    manifest = build_manifest(run_id="x", command="extract", config={"pairs": str(gold)}, inputs=[], tables={},
                              counts={}, timings_s={})
    (run / "manifest.json").write_text(json.dumps(manifest))
    return str(run)


def test_precision_and_recall_move_with_the_threshold(tmp_path):
    run = _run(tmp_path)
    curve = {r["threshold"]: r for r in abstention_curve(run, str(tmp_path / "gold.jsonl"),
                                                         thresholds=(0.0, 0.5, 0.7, 0.95))}
    assert (curve[0.0]["answered"], curve[0.0]["abstained"]) == (3, 0)
    assert curve[0.0]["pair_p"] == pytest.approx(2 / 3) and curve[0.0]["pair_r"] == 1.0
    assert curve[0.5]["pair_p"] == 0.5 and curve[0.5]["pair_r"] == 0.5
    assert curve[0.7]["pair_p"] == 1.0 and curve[0.7]["pair_r"] == 0.5 and curve[0.7]["word_p"] == 1.0
    assert curve[0.95]["answered"] == 0 and curve[0.95]["pair_p"] is None and curve[0.95]["pair_r"] == 0.0
    assert curve[0.0]["word_r"] == 1.0 and curve[0.0]["word_p"] < 1.0  # "delta" is a false positive


def test_report_section_uses_the_runs_own_gold_pairs_file(tmp_path):
    run = _run(tmp_path)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    figures, html = abstention_section(run, manifest)
    assert figures["gold"].endswith("gold.jsonl") and len(figures["curve"]) == 20
    assert "Abstention threshold" in html and "<td>0.90</td>" in html
    bins = {b["bin"]: b for b in figures["reliability"]}
    assert bins["[0.8, 1]"] == {"bin": "[0.8, 1]", "pairs": 1, "relevant_share": 1.0}
    assert bins["[0.6, 0.7)"]["relevant_share"] == 0.0 and bins["[0.4, 0.5)"]["relevant_share"] == 1.0
    assert bins["[0, 0.3)"] == {"bin": "[0, 0.3)", "pairs": 0, "relevant_share": None}
    manifest["config"] = json.dumps({"retrieval": "somewhere"})
    assert abstention_section(run, manifest) is None  # no gold: no section
