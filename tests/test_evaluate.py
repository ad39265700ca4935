"""Loading gold and prediction files, matching pairs, and the diagnostics of evaluate_files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import CHUNK_A, CHUNK_B, CHUNK_C, GOLD, SPAN_ROWS, span_row

from verbatim_batch.core.tables import PAIRS, SPANS, text_chunk_id, to_table
from verbatim_batch.quality.evaluate import (
    evaluate_files,
    evaluate_predictions,
    gold_chunk_id,
    gold_key,
    load_gold,
    load_predictions,
)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def gold_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "gold.jsonl", GOLD)


# ---------------------------------------------------------------------------
# Gold loading
# ---------------------------------------------------------------------------


def test_load_gold_jsonl_aligns_strings_and_keeps_offsets(gold_file):
    rows = load_gold(gold_file)
    assert len(rows) == 3
    # "beta gamma" -> (6, 16); {"start": 0, "end": 5} kept; the third string cannot be placed
    assert rows[0]["gold_spans"] == [(6, 16), (0, 5)]
    assert rows[0]["gold_unaligned"] == 1
    assert rows[1]["gold_spans"] == [(4, 13)]  # case-insensitive "TWO three"
    assert rows[2]["gold_spans"] == [] and rows[2]["relevant"] is None
    assert gold_key(rows[0]) == ("q1", "P1", 0)
    assert gold_key(rows[1]) == ("q2", CHUNK_B)
    assert gold_chunk_id(rows[1]) == text_chunk_id(CHUNK_B)


def test_load_gold_parquet(tmp_path):
    table = pa.Table.from_pylist(
        [
            {"query": "q1", "paper_id": "P1", "chunk_index": 0, "chunk": CHUNK_A,
             "gold_spans": [{"start": 6, "end": 10}]},
            {"query": "q2", "paper_id": None, "chunk_index": None, "chunk": CHUNK_B, "gold_spans": None},
        ]
    )
    pq.write_table(table, tmp_path / "gold.parquet")
    rows = load_gold(tmp_path / "gold.parquet")
    assert [r["gold_spans"] for r in rows] == [[(6, 10)], []]
    assert gold_key(rows[1]) == ("q2", CHUNK_B)
    folder = tmp_path / "gold_dir"
    folder.mkdir()
    pq.write_table(table, folder / "part-0.parquet")
    assert len(load_gold(folder)) == 2


def test_bad_gold_lines_name_the_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [GOLD[1], "{not json", GOLD[2]])
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_gold(bad)
    no_query = write_jsonl(tmp_path / "no_query.jsonl", [GOLD[1], "", {"chunk": "abc"}])
    with pytest.raises(ValueError, match="line 3: missing or non-string 'query'"):
        load_gold(no_query)
    no_chunk = write_jsonl(tmp_path / "no_chunk.jsonl", [{"query": "q"}])
    with pytest.raises(ValueError, match="line 1: missing or non-string 'chunk'"):
        load_gold(no_chunk)


def test_duplicate_gold_pairs_rejected(tmp_path):
    dup = write_jsonl(tmp_path / "dup.jsonl", [GOLD[0], GOLD[1], GOLD[0]])
    with pytest.raises(ValueError, match="duplicate gold pair"):
        evaluate_files(dup, write_jsonl(tmp_path / "p.jsonl", []))


# ---------------------------------------------------------------------------
# JSONL predictions
# ---------------------------------------------------------------------------


def test_jsonl_predictions_by_ids_and_by_text(gold_file, tmp_path):
    preds = write_jsonl(
        tmp_path / "pred.jsonl",
        [
            {"query": "q1", "paper_id": "P1", "chunk_index": 0, "spans": [{"start": 6, "end": 16}]},
            # the second string differs from the chunk only in whitespace: dropped
            {"query": "q2", "chunk": CHUNK_B, "spans": ["two three", "two  three"]},
            {"query": "q9", "chunk": "x", "spans": ["x"]},  # no such gold pair
        ],
    )
    res = evaluate_files(gold_file, preds)
    assert res["diagnostics"] == {
        "gold_unaligned": 1, "pred_dropped": 1, "unmatched_predictions": 1, "offset_mismatch": 0,
        "gold_rows": 3, "relevant_rows": 1,
    }
    # Row 1: G = {Alpha, beta, gamma}, P = {beta, gamma}: tp 2 fp 0 fn 1, F1 4/5
    # Row 2: gold (4,13), pred (4,13): tp 2, F1 1
    # Row 3: nothing on either side (no prediction line): F1 0
    # micro: tp 4 fp 0 fn 1 -> P 1, R 0.8, F1 1.6/1.8; macro (0.8 + 1 + 0) / 3 = 0.6
    assert res["word"]["micro_p"] == pytest.approx(1.0)
    assert res["word"]["micro_r"] == pytest.approx(0.8)
    assert res["word"]["micro_f1"] == pytest.approx(1.6 / 1.8)
    assert res["word"]["macro_f1"] == pytest.approx(0.6)
    # IoU@0.5: row 1 one exact match of two gold: p 1, r 0.5, f1 2/3; row 2 perfect; row 3 both empty -> 1
    assert res["iou"]["0.5"] == pytest.approx({"p": 1.0, "r": 2.5 / 3, "f1": (2 / 3 + 2) / 3})
    assert (res["n_gold_spans"], res["n_pred_spans"]) == (3, 2)
    assert res["over_prediction_ratio"] == pytest.approx(2 / 3)
    # gold spans touched: (6,16) and (4,13); (0,5) not -> 2/3
    assert res["any_overlap_recall"] == pytest.approx(2 / 3)


def test_jsonl_prediction_strings_and_case(gold_file, tmp_path):
    preds = write_jsonl(
        tmp_path / "pred.jsonl",
        [{"query": "q1", "paper_id": "P1", "chunk_index": 0, "spans": ["ALPHA", "gamma delta.", "zzz"]}],
    )
    res = evaluate_files(gold_file, preds)
    assert res["diagnostics"]["pred_dropped"] == 1
    # row 1: pred words {Alpha, gamma, delta.}, gold {Alpha, beta, gamma}: tp 2, fp 1, fn 1
    # row 2: gold {two, three}, no prediction: fn 2; row 3 empty
    # micro P = 2/3, R = 2/5
    assert res["word"]["micro_p"] == pytest.approx(2 / 3)
    assert res["word"]["micro_r"] == pytest.approx(2 / 5)


def test_jsonl_prediction_errors(gold_file, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "q1", "spans": []}, "[1, 2"])
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_predictions(bad)
    no_pair = write_jsonl(tmp_path / "no_pair.jsonl", [{"query": "q1", "spans": []}])
    with pytest.raises(ValueError, match="line 1: a prediction needs"):
        load_predictions(no_pair)
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"query": "q2", "chunk": CHUNK_B, "spans": []},
                                               {"query": "q2", "chunk": CHUNK_B, "spans": None}])
    with pytest.raises(ValueError, match="line 2: duplicate prediction"):
        load_predictions(dup)
    # offsets outside the chunk are an error naming the pair
    far = {"query": "q1", "paper_id": "P1", "chunk_index": 0, "spans": [{"start": 20, "end": 40}]}
    out_of_range = write_jsonl(tmp_path / "oor.jsonl", [far])
    with pytest.raises(ValueError, match="'P1'"):
        evaluate_files(gold_file, out_of_range)


def test_unreadable_predictions_are_refused(gold_file, tmp_path):
    """The gold file itself, rows without spans, spans without offsets, ids of another gold file: errors, not 0."""
    with pytest.raises(ValueError, match=r"line 1: no 'spans' field, so not a predictions file \(it has 'gold_spans'"):
        evaluate_files(gold_file, gold_file)
    no_spans = write_jsonl(tmp_path / "no_spans.jsonl", [{"query": "q1", "paper_id": "P1", "chunk_index": 0}])
    with pytest.raises(ValueError, match="line 1: no 'spans' field"):
        evaluate_files(gold_file, no_spans)
    for span in ({"text": "beta"}, {"start": "6", "end": "16"}, {"start": None, "end": 3}, 7):
        bad = write_jsonl(tmp_path / "bad.jsonl", [{"query": "q1", "paper_id": "P1", "chunk_index": 0,
                                                     "spans": [span]}])
        with pytest.raises(ValueError, match="line 1: predicted span"):
            evaluate_files(gold_file, bad)
    other = write_jsonl(tmp_path / "other.jsonl", [
        {"query": "q1", "paper_id": "X", "chunk_index": 0, "spans": [{"start": 0, "end": 5}]},
        {"query": "q7", "chunk": CHUNK_B, "spans": []},
    ])
    with pytest.raises(ValueError, match="none of the 2 predicted pairs matches a gold pair"):
        evaluate_files(gold_file, other)
    table = tmp_path / "other.parquet"
    pq.write_table(to_table([span_row("q1", "P9", 3, "c-x", 0, 3, "abc")], SPANS), table)
    with pytest.raises(ValueError, match="none of the 1 predicted pairs"):
        evaluate_files(gold_file, table)
    with pytest.raises(ValueError, match="not a span table"):  # a pairs table is not a span table
        pq.write_table(pa.table({"query": ["q1"], "chunk": [CHUNK_A]}), tmp_path / "pairs.parquet")
        evaluate_files(gold_file, tmp_path / "pairs.parquet")
    # an empty prediction file is readable: it predicts nothing
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    assert evaluate_files(gold_file, empty)["n_pred_spans"] == 0


def test_cli_evaluate_refuses_the_gold_file_with_exit_2(gold_file, capsys):
    from verbatim_batch.cli import main

    assert main(["evaluate", "--gold", str(gold_file), "--predictions", str(gold_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evaluate: error:" in err[0] and "no 'spans' field" in err[0]


# ---------------------------------------------------------------------------
# Span tables
# ---------------------------------------------------------------------------


def check_span_table_result(res):
    assert res["diagnostics"] == {
        "gold_unaligned": 1, "pred_dropped": 0, "unmatched_predictions": 1, "offset_mismatch": 1,
        "gold_rows": 3, "relevant_rows": 1,
    }
    # row 1: pred (6,16) -> tp 2, fn 1; row 2: pred "two" (4,7) vs gold {two, three}: tp 1, fn 1; row 3 empty
    # micro: tp 3, fp 0, fn 2 -> P 1, R 3/5
    assert res["word"]["micro_p"] == pytest.approx(1.0)
    assert res["word"]["micro_r"] == pytest.approx(0.6)
    assert res["n_pred_spans"] == 2


def test_span_table_parquet_file(gold_file, tmp_path):
    path = tmp_path / "spans.parquet"
    pq.write_table(to_table(SPAN_ROWS, SPANS), path)
    preds = load_predictions(path)
    assert preds.kind == "spans" and len(preds.records) == 3  # pairs: (q1,P1,0), (q2,chunk B), (q1,P2,0)
    check_span_table_result(evaluate_files(gold_file, path))


def test_span_table_folder_and_run_folder(gold_file, tmp_path):
    folder = tmp_path / "spans_only"
    folder.mkdir()
    pq.write_table(to_table(SPAN_ROWS[:2], SPANS), folder / "part-0.parquet")
    pq.write_table(to_table(SPAN_ROWS[2:], SPANS), folder / "part-1.parquet")
    check_span_table_result(evaluate_files(gold_file, folder))

    run = tmp_path / "run"
    (run / "spans").mkdir(parents=True)
    (run / "pairs").mkdir()
    pq.write_table(to_table(SPAN_ROWS, SPANS), run / "spans" / "part-0.parquet")
    pair = {"run_id": "run-1", "pair_id": "p", "query_id": "q1", "n_spans": 0, "n_violations": 0,
            "extractor": "test", "config_hash": "h"}
    pq.write_table(to_table([pair], PAIRS), run / "pairs" / "part-0.parquet")
    (run / "manifest.json").write_text("{}")
    check_span_table_result(evaluate_files(gold_file, run))


def test_run_without_spans(gold_file, tmp_path):
    run = tmp_path / "run"
    (run / "spans").mkdir(parents=True)
    res = evaluate_files(gold_file, run)
    # no predictions anywhere: rows 1 and 2 score 0, row 3 (both empty) 1
    assert res["n_pred_spans"] == 0 and res["iou"]["0.5"]["f1"] == pytest.approx(1 / 3)
    empty_file = run / "spans" / "part-0.parquet"
    pq.write_table(to_table([], SPANS), empty_file)
    assert evaluate_files(gold_file, empty_file)["n_pred_spans"] == 0


def test_span_table_matches_gold_chunk_id(tmp_path):
    gold = write_jsonl(
        tmp_path / "gold.jsonl",
        [{"query": "q", "chunk": CHUNK_A, "chunk_id": "my-chunk", "gold_spans": ["gamma"]}],
    )
    spans = tmp_path / "spans.parquet"
    # the text hash no longer applies once the gold row names its own chunk id
    rows = [span_row("q", None, None, "my-chunk", 11, 16, "gamma"),
            span_row("q", None, None, text_chunk_id(CHUNK_A), 0, 5, "Alpha")]
    pq.write_table(to_table(rows, SPANS), spans)
    res = evaluate_files(gold, spans)
    assert res["diagnostics"]["unmatched_predictions"] == 1
    assert res["iou"]["0.7"] == {"p": 1.0, "r": 1.0, "f1": 1.0}
    assert res["coverage"]["1.0"] == 1.0


# ---------------------------------------------------------------------------
# In-memory predictions
# ---------------------------------------------------------------------------


def test_evaluate_predictions_in_memory(gold_file):
    gold = load_gold(gold_file)
    preds = {
        ("q1", "P1", 0): [(6, 16), {"start": 0, "end": 5, "text": "Alpha"}],
        ("q2", CHUNK_B): ["two three", {"start": 0, "end": 3, "text": "Two"}],  # second: text disagrees
        ("q1", "P1", 7): [(0, 1)],  # no such gold pair
    }
    res = evaluate_predictions(gold, preds)
    assert res["diagnostics"]["unmatched_predictions"] == 1
    assert res["diagnostics"]["offset_mismatch"] == 1
    assert res["diagnostics"]["gold_unaligned"] == 1
    # rows 1 and 2 predicted exactly, row 3 both empty -> IoU perfect everywhere
    assert res["iou"]["0.7"] == {"p": 1.0, "r": 1.0, "f1": 1.0}
    assert res["word"]["micro_f1"] == 1.0
    # raw (un-normalised) gold rows are accepted too, with custom thresholds
    res2 = evaluate_predictions(GOLD, preds, iou_thresholds=(0.9,))
    assert list(res2["iou"]) == ["0.9"] and res2["iou"]["0.9"]["f1"] == 1.0


# ---------------------------------------------------------------------------
# evaluate --report and the sweep table
# ---------------------------------------------------------------------------

PREDICTIONS = [
    {"query": "q1", "paper_id": "P1", "chunk_index": 0, "spans": ["beta gamma"]},  # 2 of 3 gold words: F1 0.8
    {"query": "q2", "chunk": CHUNK_B, "spans": [{"start": 0, "end": 3}]},  # "One": no gold word, F1 0
]


def test_cli_evaluate_report_shows_gold_beside_predicted_with_row_f1(gold_file, tmp_path, capsys):
    import html
    import re

    from helpers import CHROMIUM, MARK, render

    from verbatim_batch.cli import main

    preds = write_jsonl(tmp_path / "pred.jsonl", PREDICTIONS)
    out = tmp_path / "rep"
    assert main(["evaluate", "--gold", str(gold_file), "--predictions", str(preds), "--report", str(out)]) == 0
    assert f"report: {out}/report.html" in capsys.readouterr().out
    data = json.loads((out / "report.json").read_text())
    f1 = {(r["query"], r["chunk_index"]): r["word_f1"] for r in data["rows"]}
    assert f1 == {("q1", 0): pytest.approx(0.8), ("q2", None): 0.0, ("q1", 1): 0.0}
    assert data["scores"]["n_rows"] == 3 and data["sweep"] is None
    page = (out / "report.html").read_text()
    if CHROMIUM is not None:
        page = render(str(out / "report.html"), tmp_path)
    rows = re.findall(r'<section class="row" data-f1="([0-9.]+)">(.*?)</section>', page, re.S)
    assert [float(f) for f, _ in rows] == [0.0, 0.8, 0.0]  # worst first; the row with no span either side last
    chunks = [CHUNK_A, CHUNK_B, CHUNK_C]
    for _, body in rows:
        gold = re.search(r'<div class="gold">(.*?)</div></div>', body, re.S).group(1)
        pred = re.search(r'<div class="pred">(.*?)</div></div>', body, re.S).group(1)
        for side, want in ((gold, "gold"), (pred, "predicted")):
            for start, end, title, text in MARK.findall(side):
                assert title == want and any(c[int(start):int(end)] == html.unescape(text) for c in chunks)
    q2 = next(body for _, body in rows if "<h3>q2</h3>" in body)
    assert ">One</mark>" in q2.split('class="pred"')[1] and ">two three</mark>" in q2.split('class="pred"')[0]
    assert "<svg" in page and not re.search(r"<script|<link|<img|(?:src|href)=", page)


def test_threshold_sweep_prints_one_compact_table_and_reports_it(gold_file, tmp_path):
    from verbatim_batch.quality.evaluate import format_sweep
    from verbatim_batch.report.build import write_evaluation_report

    gold = load_gold(gold_file)
    by_t = {"0.3": {("q1", "P1", 0): [(0, 23)], ("q2", CHUNK_B): [(0, 19)]},  # over-predicts
            "0.5": {("q1", "P1", 0): [(0, 16)], ("q2", CHUNK_B): [(4, 13)]},  # every gold word, nothing else
            "0.7": {("q1", "P1", 0): [(6, 10)]}}
    details = {t: [] for t in by_t}
    results = {t: evaluate_predictions(gold, p, details[t]) for t, p in by_t.items()}
    text = format_sweep(results, "semantic")
    lines = text.splitlines()
    assert len(lines) == 6 and lines[0].startswith("semantic threshold sweep over 3 gold rows")
    assert "threshold" in lines[1] and "word F1" in lines[1] and lines[-1].startswith("diagnostics:")
    best = [line for line in lines[2:5] if line.endswith("*")]
    assert len(best) == 1 and best[0].split()[0] == "0.5"
    path = write_evaluation_report(str(tmp_path / "r"), results["0.5"], details["0.5"], results, "sweep")
    page = open(path, encoding="utf-8").read()
    assert page.count("<tr class=best>") == 1 and page.count("<tr") >= 4 and "Scores by threshold" in page
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [r["threshold"] for r in data["sweep"]] == [0.3, 0.5, 0.7]


def test_cli_sweep_with_report(gold_file, tmp_path, capsys, monkeypatch):
    from verbatim_batch.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "rep"
    assert main(["evaluate", "--gold", str(gold_file), "--sweep-threshold", "0.3,0.9", "--report", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 6 and printed[-1] == f"report: {out}/report.html"  # title, header, 2 rows, diagnostics
    assert (out / "report.html").read_text().count('<section class="row"') == 3


def test_a_gold_row_naming_its_chunk_without_chunks_asks_for_chunks(tmp_path):
    """A gold file that names chunks by id, read without --chunks: the line says to pass --chunks (issue 43),
    not "missing or non-string 'chunk'"."""
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"query": "q", "chunk_id": "abc", "gold_spans": []}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: names its chunk \(chunk_id\) but has no 'chunk' text: pass "
                                         r"--chunks RUN"):
        load_gold(gold)
    gold.write_text(json.dumps({"query": "q", "paper_id": "p", "chunk_index": 0, "gold_spans": []}) + "\n")
    with pytest.raises(ValueError, match=r"\(paper_id, chunk_index\) but has no 'chunk' text: pass --chunks"):
        load_gold(gold)


def test_the_table_says_how_span_iou_is_averaged():
    """The span IoU printed is a mean over rows that scores an empty/empty row 1: the table says so."""
    from verbatim_batch.quality.metrics import EvalRow, evaluate, format_table

    result = evaluate([EvalRow("a b c", [], []), EvalRow("a b c", [(0, 1)], [(0, 1)])])
    assert result["iou"]["0.5"]["f1"] == pytest.approx(1.0)  # the empty/empty row scores 1, as the table says
    text = format_table(result)
    assert "span IoU (mean of rows)" in text
    assert "a row with no gold and no predicted span scores 1" in text
