"""Span metrics and alignment, checked against figures worked out by hand from the definitions."""

from __future__ import annotations

import pytest

from verbatim_batch.quality.metrics import EvalRow, align_gold, align_prediction, evaluate, format_table, word_spans

# ---------------------------------------------------------------------------
# Worked example: 100 characters, two gold spans of 45 characters, a 10-character gap
# ---------------------------------------------------------------------------

# 45 chars: one 5-letter word + eight 4-letter words + 8 spaces = 5 + 32 + 8
FIRST = "aaaaa bbbb cccc dddd eeee ffff gggg hhhh iiii"
GAP = " xxxx yyy "  # 10 chars: space, 4 letters, space, 3 letters, space
SECOND = "jjjjj kkkk llll mmmm nnnn oooo pppp qqqq rrrr"
PASSAGE = FIRST + GAP + SECOND


def test_worked_example_layout():
    assert len(FIRST) == len(SECOND) == 45 and len(GAP) == 10 and len(PASSAGE) == 100
    assert len(word_spans(PASSAGE)) == 20  # 9 + 2 + 9
    assert PASSAGE[0:45] == FIRST and PASSAGE[55:100] == SECOND


def test_worked_example_figures():
    row = EvalRow(chunk=PASSAGE, gold=[(0, 45), (55, 100)], pred=[(0, 100)], key=("ex",))
    res = evaluate([row])
    # Words: gold covers 18 (9 + 9), the prediction all 20 -> tp 18, fp 2 (the gap's two words), fn 0.
    assert res["word"]["micro_p"] == pytest.approx(18 / 20)  # 0.9
    assert res["word"]["micro_r"] == pytest.approx(1.0)
    assert res["word"]["micro_f1"] == pytest.approx(2 * 0.9 * 1.0 / 1.9)  # 0.947
    assert res["word"]["macro_f1"] == pytest.approx(36 / 38)  # 2tp / (2tp + fp + fn), one row
    # Containment against one gold span: best overlap 45 / 100 = 0.45, below every threshold.
    assert res["containment"] == {"0.5": 0.0, "0.8": 0.0, "1.0": 0.0}
    # Against the union of gold spans: 90 / 100 = 0.9 -> contained at 0.5 and 0.8, not at 1.0.
    assert res["containment_union"] == {"0.5": 1.0, "0.8": 1.0, "1.0": 0.0}
    assert evaluate([row], containment_thresholds=(0.9, 0.95))["containment_union"] == {"0.9": 1.0, "0.95": 0.0}
    # Both gold spans lie entirely inside the prediction.
    assert res["coverage"] == {"0.5": 1.0, "0.8": 1.0, "1.0": 1.0}
    assert res["any_overlap_recall"] == 1.0
    # IoU of the prediction with either gold span: 45 / 100 = 0.45. One prediction -> at most one match.
    # At 0.3: p = 1/1, r = 1/2, f1 = 2 * 1 * 0.5 / 1.5 = 2/3. At 0.5 and 0.7: no match.
    assert res["iou"]["0.3"] == pytest.approx({"p": 1.0, "r": 0.5, "f1": 2 / 3})
    assert res["iou"]["0.5"] == {"p": 0.0, "r": 0.0, "f1": 0.0}
    assert res["iou"]["0.7"] == {"p": 0.0, "r": 0.0, "f1": 0.0}
    assert res["over_prediction_ratio"] == 0.5  # 1 predicted / 2 gold
    assert (res["n_rows"], res["n_gold_spans"], res["n_pred_spans"]) == (1, 2, 1)


# ---------------------------------------------------------------------------
# Empty sides, micro vs macro
# ---------------------------------------------------------------------------


def test_both_empty_row_is_perfect_for_iou_but_zero_for_macro_f1():
    res = evaluate([EvalRow(chunk="x y", gold=[], pred=[])])
    for t in ("0.3", "0.5", "0.7"):
        assert res["iou"][t] == {"p": 1.0, "r": 1.0, "f1": 1.0}
    assert res["word"] == {"micro_p": 0.0, "micro_r": 0.0, "micro_f1": 0.0, "macro_f1": 0.0}
    assert res["containment"]["0.5"] == 0.0 and res["coverage"]["0.5"] == 0.0  # nothing to count
    assert res["any_overlap_recall"] == 0.0
    assert res["over_prediction_ratio"] is None


def test_one_side_empty_rows_score_zero():
    gold_only = EvalRow(chunk="abc def", gold=[(0, 3)], pred=[])
    pred_only = EvalRow(chunk="abc def", gold=[], pred=[(4, 7)])
    res = evaluate([gold_only, pred_only])
    assert res["iou"]["0.3"] == {"p": 0.0, "r": 0.0, "f1": 0.0}
    # words: row 1 tp 0 fp 0 fn 1; row 2 tp 0 fp 1 fn 0 -> every figure 0
    assert res["word"] == {"micro_p": 0.0, "micro_r": 0.0, "micro_f1": 0.0, "macro_f1": 0.0}
    assert res["containment"]["0.5"] == 0.0  # the one prediction overlaps no gold
    assert res["coverage"]["0.5"] == 0.0
    assert res["over_prediction_ratio"] == 1.0  # 1 / 1


def test_micro_and_macro_differ():
    rows = [
        # words a b c d; gold "a b" -> {a, b}; pred "a" -> {a}: tp 1, fp 0, fn 1, row F1 2/3
        EvalRow(chunk="a b c d", gold=[(0, 3)], pred=[(0, 1)]),
        # words e f g h; no gold; pred all four: tp 0, fp 4, fn 0, row F1 0
        EvalRow(chunk="e f g h", gold=[], pred=[(0, 7)]),
        # nothing on either side: row F1 0
        EvalRow(chunk="x y", gold=[], pred=[]),
    ]
    res = evaluate(rows)
    # micro: tp 1, fp 4, fn 1 -> P 1/5, R 1/2, F1 = 2 * 0.2 * 0.5 / 0.7
    assert res["word"]["micro_p"] == pytest.approx(0.2)
    assert res["word"]["micro_r"] == pytest.approx(0.5)
    assert res["word"]["micro_f1"] == pytest.approx(0.2 / 0.7)
    # macro: (2/3 + 0 + 0) / 3
    assert res["word"]["macro_f1"] == pytest.approx(2 / 9)
    # IoU at 0.3: row 1 pred (0,1) vs gold (0,3) = 1/3 -> match: p 1, r 1, f1 1; row 2 zeros; row 3 ones
    assert res["iou"]["0.3"] == pytest.approx({"p": 2 / 3, "r": 2 / 3, "f1": 2 / 3})
    # at 0.5 row 1 no longer matches: only the empty row scores
    assert res["iou"]["0.5"] == pytest.approx({"p": 1 / 3, "r": 1 / 3, "f1": 1 / 3})


def test_word_partially_touched_counts_as_covered():
    # words "hello"(0,5) "world"(6,11); a span over "lo w" touches both
    res = evaluate([EvalRow(chunk="hello world", gold=[(0, 5)], pred=[(3, 7)])])
    # G = {hello}, P = {hello, world}: tp 1, fp 1, fn 0
    assert res["word"]["micro_p"] == pytest.approx(0.5)
    assert res["word"]["micro_r"] == pytest.approx(1.0)
    # a span lying only on whitespace touches no word
    res = evaluate([EvalRow(chunk="ab   cd", gold=[(0, 2)], pred=[(2, 5)])])
    assert res["word"]["micro_p"] == 0.0 and res["word"]["micro_r"] == 0.0


# ---------------------------------------------------------------------------
# Span IoU matching
# ---------------------------------------------------------------------------


def test_greedy_iou_matching_is_order_dependent():
    chunk = "x" * 30
    gold = [(0, 10), (10, 20)]  # G1, G2
    pred = [(2, 14), (0, 5)]  # A, B
    # A-G1: inter 8, union 14 -> 0.571; A-G2: inter 4, union 18 -> 0.222; B-G1: inter 5, union 10 -> 0.5; B-G2: 0
    # Greedy at 0.2 takes A-G1 first, which blocks both B-G1 and A-G2: 1 match (the best pairing would be 2).
    res = evaluate([EvalRow(chunk=chunk, gold=gold, pred=pred)], iou_thresholds=(0.2, 0.55, 0.6))
    assert res["iou"]["0.2"] == pytest.approx({"p": 0.5, "r": 0.5, "f1": 0.5})
    # at 0.55 only A-G1 (0.571) qualifies: still 1 match
    assert res["iou"]["0.55"] == pytest.approx({"p": 0.5, "r": 0.5, "f1": 0.5})
    # at 0.6 nothing qualifies
    assert res["iou"]["0.6"] == {"p": 0.0, "r": 0.0, "f1": 0.0}


def test_iou_matching_is_one_to_one():
    # two identical predictions on one gold span: one match only
    res = evaluate([EvalRow(chunk="abcdefghij", gold=[(0, 10)], pred=[(0, 10), (0, 10)])])
    # p = 1/2, r = 1/1, f1 = 2 * 0.5 / 1.5 = 2/3
    assert res["iou"]["0.7"] == pytest.approx({"p": 0.5, "r": 1.0, "f1": 2 / 3})


# ---------------------------------------------------------------------------
# Containment, coverage, any-overlap recall, over-prediction
# ---------------------------------------------------------------------------


def test_overlapping_predictions():
    chunk = "abcdefghij" * 2  # 20 chars
    row = EvalRow(chunk=chunk, gold=[(0, 10)], pred=[(0, 6), (3, 10)])
    res = evaluate([row])
    # each prediction lies wholly inside the gold span
    assert res["containment"] == {"0.5": 1.0, "0.8": 1.0, "1.0": 1.0}
    # union of predictions = (0, 10): the gold span is fully covered
    assert res["coverage"] == {"0.5": 1.0, "0.8": 1.0, "1.0": 1.0}
    # IoU: (0,6)-G = 6/10, (3,10)-G = 7/10; one gold -> 1 match at 0.3, 0.5 and 0.7
    # p = 1/2, r = 1, f1 = 2/3
    for t in ("0.3", "0.5", "0.7"):
        assert res["iou"][t] == pytest.approx({"p": 0.5, "r": 1.0, "f1": 2 / 3})
    assert res["over_prediction_ratio"] == 2.0


def test_coverage_uses_the_union_not_the_sum():
    # two copies of (0, 4) on gold (0, 10): union 4 chars -> 0.4 (a sum would give 0.8)
    res = evaluate([EvalRow(chunk="x" * 10, gold=[(0, 10)], pred=[(0, 4), (0, 4)])], coverage_thresholds=(0.4, 0.5))
    assert res["coverage"] == {"0.4": 1.0, "0.5": 0.0}


def test_coverage_from_several_predictions():
    # gold (0, 10); predictions (0, 5) and (5, 9) -> 9 of 10 characters covered
    res = evaluate([EvalRow(chunk="x" * 12, gold=[(0, 10)], pred=[(0, 5), (5, 9)])])
    assert res["coverage"] == {"0.5": 1.0, "0.8": 1.0, "1.0": 0.0}


def test_containment_per_predicted_span():
    # gold (0, 10); predictions: (5, 15) half inside; (0, 8) wholly inside; (12, 14) outside
    res = evaluate([EvalRow(chunk="x" * 20, gold=[(0, 10)], pred=[(5, 15), (0, 8), (12, 14)])])
    # >= 0.5: (5,15) and (0,8) -> 2/3; >= 0.8 and 1.0: (0,8) -> 1/3
    assert res["containment"] == pytest.approx({"0.5": 2 / 3, "0.8": 1 / 3, "1.0": 1 / 3})


def test_any_overlap_recall_and_over_prediction():
    gold = [(0, 5), (10, 15), (20, 25)]
    # (4, 6) shares one character with the first; (15, 20) only touches the ends of the second and third
    pred = [(4, 6), (15, 20)]
    res = evaluate([EvalRow(chunk="y" * 30, gold=gold, pred=pred)])
    assert res["any_overlap_recall"] == pytest.approx(1 / 3)
    assert res["over_prediction_ratio"] == pytest.approx(2 / 3)
    assert res["coverage"]["0.5"] == 0.0  # first gold only 1/5 covered


def test_figures_pool_spans_across_rows():
    rows = [
        EvalRow(chunk="x" * 10, gold=[(0, 10)], pred=[(0, 10)]),
        EvalRow(chunk="x" * 10, gold=[(0, 5), (5, 10)], pred=[]),
        EvalRow(chunk="x" * 10, gold=[], pred=[(0, 3), (3, 6)]),
    ]
    res = evaluate(rows)
    # predicted spans: 3, contained: 1 -> 1/3; gold spans: 3, covered: 1 -> 1/3
    assert res["containment"]["1.0"] == pytest.approx(1 / 3)
    assert res["coverage"]["1.0"] == pytest.approx(1 / 3)
    assert res["any_overlap_recall"] == pytest.approx(1 / 3)
    assert res["over_prediction_ratio"] == 1.0


@pytest.mark.parametrize("span", [(3, 3), (4, 2), (-1, 2), (0, 11), (0.0, 2)])
def test_invalid_spans_raise_with_the_row_key(span):
    with pytest.raises(ValueError, match="paper-7"):
        evaluate([EvalRow(chunk="x" * 10, gold=[], pred=[span], key=("q", "paper-7", 0))])
    with pytest.raises(ValueError, match="paper-7"):
        evaluate([EvalRow(chunk="x" * 10, gold=[span], pred=[], key=("q", "paper-7", 0))])


def test_no_rows():
    res = evaluate([])
    assert res["n_rows"] == 0 and res["word"]["macro_f1"] == 0.0 and res["iou"]["0.5"]["f1"] == 0.0


def test_format_table_lists_every_figure():
    res = evaluate([EvalRow(chunk=PASSAGE, gold=[(0, 45), (55, 100)], pred=[(0, 100)])])
    res["diagnostics"] = {"offset_mismatch": 2, "gold_rows": 1}
    text = format_table(res)
    for needle in ("micro", "macro F1", "IoU >= 0.3", "IoU >= 0.7", "0.900", "0.947", "0.667", "any-overlap recall",
                   "over-prediction ratio", "0.500", "offset_mismatch", "gold_rows", "containment", "coverage"):
        assert needle in text, needle
    no_gold = format_table(evaluate([EvalRow(chunk="ab", gold=[], pred=[])]))
    assert "n/a" in no_gold


# ---------------------------------------------------------------------------
# Alignment
# ---------------------------------------------------------------------------


def test_word_spans():
    assert word_spans("  ab c\n\td ") == [(2, 4), (5, 6), (8, 9)]
    assert word_spans("") == []


def test_align_exact_takes_first_occurrence():
    chunk = "The cat sat. The cat ran."
    assert align_gold(chunk, "cat") == (4, 7)
    assert align_prediction(chunk, "cat ran") == (17, 24)


def test_align_case_insensitive():
    chunk = "Results: The Model Works."
    a, b = align_gold(chunk, "the model works")
    assert (a, b) == (9, 24) and chunk[a:b].lower() == "the model works"
    assert align_prediction(chunk, "THE MODEL") == (9, 18)
    # an exact occurrence wins over an earlier case-insensitive one
    assert align_gold("Cat cat", "cat") == (4, 7)


def test_align_gold_collapses_whitespace():
    chunk = "Deep  learning\nmodels are\n\n  big."
    # "learning" starts at 6; "big" ends at 32
    s = "  Learning models  are big "
    assert align_gold(chunk, s) == (6, 32)
    assert chunk[6:32] == "learning\nmodels are\n\n  big"
    # predictions must match verbatim (up to case)
    assert align_prediction(chunk, "learning models are big") is None
    assert align_prediction(chunk, "learning\nmodels") == (6, 21)


def test_align_unicode_offsets():
    # "Résumé" (precomposed, 6 code points) ": " then "e" + COMBINING ACUTE "tude" (6 code points), emoji, CJK
    chunk = "Résumé: e\u0301tude 😀 テスト data"
    s = "e\u0301tude 😀 テスト"
    # "e\u0301tude" = 8..14, space 14, emoji 15, space 16, "テスト" 17..20
    assert align_gold(chunk, s) == (8, 20)
    assert align_prediction(chunk, s) == (8, 20)
    assert align_prediction(chunk, "E\u0301TUDE 😀 テスト") == (8, 20)
    assert align_gold(chunk, "テスト  DATA") == (17, 25)  # collapsed whitespace, case-insensitive
    assert chunk[17:25] == "テスト data"


def test_align_case_insensitive_with_length_changing_lowercase():
    # "İ".lower() is two code points, so naive lower-then-find would shift offsets by 2
    chunk = "İİ abc"
    assert align_gold(chunk, "ABC") == (3, 6)
    assert align_prediction(chunk, "ABC") == (3, 6)
    chunk = "Visit İstanbul now"
    a, b = align_prediction(chunk, "İSTANBUL")
    assert (a, b) == (6, 14) and chunk[a:b].lower() == "İSTANBUL".lower()
    # dotless mismatch: "istanbul" is not "İstanbul".lower() (which has a combining dot) -> no match
    assert align_gold("visit istanbul", "İstanbul") is None


def test_align_misses():
    assert align_gold("abc", "xyz") is None
    assert align_gold("abc", "") is None
    assert align_gold("a b c", "   ") is None
    assert align_prediction("abc", "") is None
