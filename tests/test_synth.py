"""Tests for the synthetic corpus generator (verbatim_synth)."""

from __future__ import annotations

import json
import random
import re
import statistics

import pytest

from verbatim_synth import corpus as synth
from verbatim_synth.corpus import (
    SyntheticPaper,
    generate_paper,
    iter_corpus,
    sample_target_chars,
    write_bad_inputs,
    write_corpus,
)

N_STRUCT = 200


@pytest.fixture(scope="module")
def papers() -> list[SyntheticPaper]:
    return [generate_paper(11, i) for i in range(N_STRUCT)]


# -- determinism ---------------------------------------------------------------

def test_same_seed_index_gives_identical_paper():
    a = generate_paper(3, 17)
    b = generate_paper(3, 17)
    assert a == b
    assert a.markdown == b.markdown and a.metadata == b.metadata


def test_different_seeds_and_indices_differ():
    a = generate_paper(3, 17)
    assert generate_paper(4, 17).markdown != a.markdown
    assert generate_paper(3, 18).markdown != a.markdown


def test_independent_of_call_order_and_global_random_state():
    forward = [generate_paper(5, i, 6000) for i in range(8)]
    random.seed(12345)
    random.random()
    backward = [generate_paper(5, i, 6000) for i in reversed(range(8))][::-1]
    assert forward == backward
    assert list(iter_corpus(3, seed=5)) == [generate_paper(5, i) for i in range(3)]


def test_explicit_target_matches_sampled_default():
    t = synth.target_chars_for(9, 4)
    assert generate_paper(9, 4) == generate_paper(9, 4, t)


def test_ids_unique_and_anthology_like():
    ids = [p.paper_id for p in iter_corpus(300, seed=2, max_chars=3000)]
    assert len(set(ids)) == len(ids)
    pat = re.compile(r"^(\d{4}\.[a-z0-9]+-[a-z0-9]+\.\d+|[A-Z]\d{2}-\d{4})$")
    assert all(pat.match(i) for i in ids), [i for i in ids if not pat.match(i)][:5]
    assert any("." in i for i in ids) and any("." not in i for i in ids)


# -- structure -----------------------------------------------------------------

def test_metadata_fields(papers):
    for p in papers:
        m = p.metadata
        assert set(m) == {"paper_id", "title", "authors", "year", "venue", "url", "language"}
        assert m["paper_id"] == p.paper_id
        assert isinstance(m["year"], int) and 2000 <= m["year"] <= 2024
        assert isinstance(m["authors"], list) and all(isinstance(a, str) for a in m["authors"])
        assert m["url"].endswith(p.paper_id)
        assert p.markdown.startswith("## " + m["title"] + "\n")
        assert "\x01" not in p.markdown
        assert p.markdown.endswith("\n")
    langs = [p.metadata["language"] for p in papers]
    assert langs.count("en") > 0.85 * len(langs)


def test_expected_elements_appear(papers):
    regular = [p.markdown for p in papers if p.metadata["authors"]]

    def frac(pred, docs=regular):
        return sum(1 for d in docs if pred(d)) / len(docs)

    assert frac(lambda d: "\n## Abstract\n\n" in d) == 1.0
    assert frac(lambda d: "\n## 1 Introduction\n" in d) == 1.0
    assert frac(lambda d: "\n## References\n" in d) == 1.0
    assert frac(lambda d: re.search(r"^### \d+\.\d+ ", d, re.M) is not None) > 0.3
    assert frac(lambda d: re.search(r"^#### \d+\.\d+\.\d+ ", d, re.M) is not None) > 0.05
    assert frac(lambda d: re.search(r"^#{5,6} \S", d, re.M) is not None) > 0.1
    assert frac(lambda d: re.search(r"^## [A-Z] \S", d, re.M) is not None) > 0.1  # appendix
    assert frac(lambda d: "<!-- formula-not-decoded -->" in d) > 0.3
    assert frac(lambda d: "<!-- image -->\n\nFigure " in d) > 0.3
    assert frac(lambda d: re.search(r"^(```|~~~)[a-z]*\n", d, re.M) is not None) > 0.1
    assert frac(lambda d: re.search(r"^- \S", d, re.M) is not None) > 0.2
    assert frac(lambda d: "&amp;" in d or "&lt;" in d) > 0.5
    assert frac(lambda d: re.search(r"\([A-Z][^()]* et al\., \d{4}\)", d) is not None) > 0.8
    assert frac(lambda d: re.search(r"\[\d+\]", d) is not None) > 0.5
    assert frac(lambda d: any(ord(c) > 127 for c in d)) > 0.9
    # every non-volume paper has at least one paragraph over 2,500 chars in some papers
    assert frac(lambda d: any(len(p) > 2500 for p in d.split("\n\n"))) > 0.1
    assert any(not p.metadata["authors"] for p in iter_corpus(400, seed=0, max_chars=2500))


def test_tables_have_captions_before_and_after(papers):
    before = after = tables = 0
    for p in papers:
        blocks = p.markdown.split("\n\n")
        for i, b in enumerate(blocks):
            if not b.startswith("| "):
                continue
            lines = b.rstrip("\n").split("\n")
            assert re.fullmatch(r"\|(-+\|)+", lines[1]), lines[1]
            assert all(ln.startswith("|") and ln.endswith("|") for ln in lines)
            assert len({ln.count("|") for ln in lines}) == 1
            tables += 1
            if i > 0 and re.match(r"Table \d+: ", blocks[i - 1]):
                before += 1
            elif i + 1 < len(blocks) and re.match(r"Table \d+: ", blocks[i + 1]):
                after += 1
            else:
                pytest.fail(f"table without caption in {p.paper_id}")
            assert 3 <= len(lines) - 2 <= 30
    assert tables > N_STRUCT
    assert before > after > 0


def test_fences_balanced_and_some_contain_hash_lines(papers):
    hash_inside = 0
    for p in papers:
        lines = p.markdown.split("\n")
        fence = None
        for ln in lines:
            if fence is None and (ln.startswith("```") or ln.startswith("~~~")):
                fence = ln[:3]
            elif fence is not None and ln == fence:
                fence = None
            elif fence is not None and ln.startswith("#"):
                hash_inside += 1
        assert fence is None, p.paper_id
    assert hash_inside > 0


def test_references_count(papers):
    for p in papers:
        if not p.metadata["authors"] or len(p.markdown) < 9000:
            continue
        refs = p.markdown.split("\n## References\n\n", 1)[1]
        refs = re.split(r"\n## [A-Z] ", refs)[0]
        entries = [e for e in re.split(r"\n\n|\n(?=- )", refs.strip()) if e.strip()]
        assert 10 <= len(entries) <= 60, (p.paper_id, len(entries))


# -- sizes -----------------------------------------------------------------------

def test_size_distribution_quantiles():
    rng = random.Random(1)
    xs = sorted(sample_target_chars(rng) for _ in range(4000))
    q = statistics.quantiles(xs, n=100)
    for got, want in ((q[49], 37_000), (q[89], 74_000), (q[98], 162_000)):
        assert abs(got - want) / want < 0.2, (got, want)
    assert xs[0] >= 2_000 and xs[-1] <= 400_000


@pytest.mark.parametrize("target", [5_000, 9_000, 37_000, 120_000])
def test_generated_length_close_to_target(target):
    for i in range(6):
        n = len(generate_paper(21, i, target).markdown)
        assert abs(n - target) / target < 0.25, (i, n, target)


def test_max_chars_caps_sizes():
    for p in iter_corpus(10, seed=4, max_chars=8000):
        assert len(p.markdown) < 8000 * 1.25


# -- writers -------------------------------------------------------------------

def _read_meta(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_write_corpus_md(tmp_path):
    out = tmp_path / "corpus"
    s = write_corpus(out, n=7, seed=3, fmt="md", max_chars=6000)
    assert s["papers"] == 7 and len(s["files"]) == 7
    expected = list(iter_corpus(7, seed=3, max_chars=6000))
    got = {p.stem: p.read_bytes() for p in out.glob("*.md")}
    assert got == {p.paper_id: p.markdown.encode("utf-8") for p in expected}
    assert s["bytes"] == sum(len(v) for v in got.values())
    meta = _read_meta(s["metadata"])
    assert [m["paper_id"] for m in meta] == [p.paper_id for p in expected]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_write_corpus_sharded(tmp_path, fmt):
    out = tmp_path / fmt
    s = write_corpus(out, n=9, seed=3, fmt=fmt, shard_size=4, max_chars=6000)
    assert [p.rsplit("/", 1)[-1] for p in s["files"]] == [f"part-0000{i}.{fmt}" for i in range(3)]
    rows = []
    if fmt == "parquet":
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        for f in s["files"]:
            t = pq.read_table(f)
            assert t.schema.field("anthology_id").type == pa.string()
            assert t.schema.field("markdown").type == pa.large_string()
            rows += t.to_pylist()
    else:
        for f in s["files"]:
            with open(f, encoding="utf-8") as fh:
                rows += [json.loads(line) for line in fh]
    expected = list(iter_corpus(9, seed=3, max_chars=6000))
    assert [(r["anthology_id"], r["markdown"]) for r in rows] == [(p.paper_id, p.markdown) for p in expected]
    ids = [r["anthology_id"] for r in rows]
    assert len(set(ids)) == len(ids)
    assert [m["paper_id"] for m in _read_meta(s["metadata"])] == ids


def test_write_corpus_total_bytes_and_no_metadata(tmp_path):
    s = write_corpus(tmp_path / "tb", total_bytes=40_000, seed=1, fmt="jsonl", metadata=False, max_chars=9000)
    assert s["bytes"] >= 40_000 and s["metadata"] is None
    assert not (tmp_path / "tb" / "metadata.jsonl").exists()
    with pytest.raises(ValueError):
        write_corpus(tmp_path / "x")
    with pytest.raises(ValueError):
        write_corpus(tmp_path / "x", n=1, fmt="csv")


def test_cli(tmp_path, capsys):
    assert synth.main(["--out", str(tmp_path / "cli"), "--n", "3", "--seed", "2", "--format", "jsonl",
                       "--max-chars", "5000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["papers"] == 3 and (tmp_path / "cli" / "part-00000.jsonl").exists()


def test_write_bad_inputs(tmp_path):
    out = tmp_path / "bad"
    cases = write_bad_inputs(out, seed=0, big_bytes=200_000)
    assert set(cases) == set(synth.BAD_CASES)
    data = {c: (out / f"{stem}.md").read_bytes() for c, stem in cases.items()}

    assert data["empty"] == b""
    assert data["whitespace_only"] and not data["whitespace_only"].strip()
    with pytest.raises(UnicodeDecodeError):
        data["invalid_utf8"].decode("utf-8")
    assert b"\xff\xfe" in data["invalid_utf8"] and b"\n## " in data["invalid_utf8"]
    assert b"\x00" in data["nul_bytes"] and "## " in data["nul_bytes"].decode("utf-8")
    with pytest.raises(UnicodeDecodeError):
        data["binary_junk"].decode("utf-8")
    line = data["huge_single_line"]
    assert len(line) == 200_000 and b"\n" not in line and b"\r" not in line
    assert line.count(b" ") > 10_000
    line.decode("utf-8")

    crlf = data["crlf"].decode("utf-8")
    assert "\r\n" in crlf and "\n" not in crlf.replace("\r\n", "")
    assert crlf.startswith("## ")

    fence = data["unclosed_fence"].decode("utf-8")
    fence_lines = [ln for ln in fence.split("\n") if ln.startswith(("```", "~~~"))]
    assert len(fence_lines) == 1
    after = fence.split(fence_lines[0], 1)[1]
    assert re.search(r"^## \d+ ", after, re.M)

    table = data["huge_table"].decode("utf-8")
    tlines = [ln for ln in table.split("\n") if ln.startswith("|")]
    assert 250_000 < sum(len(ln) + 1 for ln in tlines) < 400_000
    assert "\n\nTable 3: " in table
    i = table.index("\nTable 3: ")
    assert table[i:].split("\n\n", 2)[1].startswith("| ")

    stem = cases["duplicate_id"]
    dup = out / "dup" / f"{stem}.md"
    assert dup.exists() and dup.read_bytes() != data["duplicate_id"]
    assert len(list(out.rglob(f"{stem}.md"))) == 2
    for good in synth.GOOD_CASES:
        data[good].decode("utf-8")
