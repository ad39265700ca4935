"""The extract job on a real local Ray, through the CLI, and `evaluate` on its output."""

from __future__ import annotations

import json
import os

import pytest
from helpers import CHUNK, make_token_classifier

from verbatim_batch.cli import main
from verbatim_batch.core.runs import read_manifest, read_table
from verbatim_batch.core.tables import PAIRS, SPANS

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GOLD = [
    {"query": "what improved", "chunk": CHUNK, "paper_id": "P1", "chunk_index": 0, "relevant": True,
     "gold_spans": ["Results improve by 3.1 points over the baseline."], "annotator": "a1"},
    {"query": "which layer is removed", "chunk": CHUNK, "paper_id": "P1", "chunk_index": 1, "relevant": True,
     "gold_spans": [{"start": CHUNK.index("the ablation"), "end": CHUNK.index("the ablation") + 34}]},
    {"query": "penguins", "chunk": "Penguins live in the south. They swim well and eat krill every day.",
     "relevant": False, "gold_spans": []},
    {"query": "long one", "chunk": CHUNK * 3, "paper_id": "P2", "chunk_index": 0, "relevant": True,
     "gold_spans": ["Table 2 lists the scores per domain"]},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_token_classifier(tmp_path_factory.mktemp("hlp") / "m")


def _hl_args(model_dir) -> list[str]:
    return ["--extractor", "highlighter", "--model", str(model_dir), "--max-length", "64", "--stride", "16",
            "--threshold", "0.5"]


def test_extract_pairs_file_with_highlighter_then_evaluate(ray_local, model_dir, tmp_path, capsys):
    gold = tmp_path / "gold.jsonl"
    bad = ['{"query": "broken', json.dumps({"query": "no chunk here"}), json.dumps({"query": "", "chunk": "x y z"})]
    gold.write_text("\n".join([json.dumps(r) for r in GOLD] + bad) + "\n")
    out = tmp_path / "spans"
    assert main(["extract", "--pairs", str(gold), "--output", str(out), "--batch-rows", "2", *_hl_args(model_dir)]) == 0
    pairs = read_table(str(out), "pairs")
    spans = read_table(str(out), "spans")
    assert pairs.schema.equals(PAIRS) and spans.schema.equals(SPANS)
    rows = {r["query"]: r for r in pairs.to_pylist()}
    assert pairs.num_rows == 7  # every input line has a row, readable or not
    assert rows["what improved"]["error"] is None and json.loads(rows["what improved"]["extra"]) == {"annotator": "a1"}
    assert rows["what improved"]["relevant"] is True and rows["penguins"]["relevant"] is False
    assert rows[""]["error"] == "empty_query" and rows["no chunk here"]["error"].startswith("missing_chunk")
    assert sum(1 for r in pairs.to_pylist() if (r["error"] or "").startswith("invalid_json")) == 1
    chunk_of = {r["query"]: r["chunk"] for r in GOLD}
    for s in spans.to_pylist():
        assert chunk_of[s["query"]][s["start"]:s["end"]] == s["text"]
        assert s["model_revision"].startswith("sha256:") and s["extractor"] == "highlighter"
    manifest = read_manifest(str(out))
    counts = manifest["counts"]
    assert counts["pairs"] == 7 and counts["pairs_failed"] == 3 and counts["spans"] == spans.num_rows
    assert counts["verbatim_violations"] == 0 and counts["errors.empty_query"] == 1
    assert json.loads(manifest["config"])["model_revision"].startswith("sha256:")

    capsys.readouterr()
    assert main(["evaluate", "--gold", _clean_gold(tmp_path), "--predictions", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_rows"] == 4 and result["n_gold_spans"] == 3
    assert result["n_pred_spans"] == sum(1 for s in spans.to_pylist() if s["query"] in chunk_of)
    assert set(result["word"]) == {"micro_p", "micro_r", "micro_f1", "macro_f1"}
    assert set(result["iou"]) == {"0.3", "0.5", "0.7"} and set(result["coverage"]) == {"0.5", "0.8", "1.0"}


def _clean_gold(tmp_path) -> str:
    path = tmp_path / "gold_clean.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GOLD) + "\n")
    return str(path)


def test_threshold_sweep_reports_each_threshold(model_dir, tmp_path, capsys):
    gold = _clean_gold(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", "--gold", gold, "--sweep-threshold", "0.3,0.5,0.7", "--json", *_hl_args(model_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["thresholds"]) == ["0.3", "0.5", "0.7"]
    recall = [result["thresholds"][t]["word"]["micro_r"] for t in ("0.3", "0.5", "0.7")]
    predicted = [result["thresholds"][t]["n_pred_spans"] for t in ("0.3", "0.5", "0.7")]
    # a higher threshold selects a subset of the text, so word recall can only fall
    assert recall[0] >= recall[1] >= recall[2], recall
    assert result["extractor"]["model_id"] == str(model_dir) and all(n >= 0 for n in predicted)
    assert main(["evaluate", "--gold", gold]) == 2  # neither predictions nor a sweep: a clear error
    assert "give --predictions" in capsys.readouterr().err
