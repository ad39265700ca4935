"""Golden outputs of the three markdown readers: the chunker, the sentence units and silver's reference scan.

Each source (a paper of the bundled demo corpus, a seed paper, a devset file's chunks, a hand-written edge case)
is run through the public functions of ``corpus.chunker`` (chunks with offsets, flags, heading paths and ids at
three configs, the title), ``extract.sentences`` (units with kinds and offsets, sentence segments) and
``silver.dataset`` (reference headings and lists, and ``drop_reason`` probed at every line start so that its
reference regions show), and the sha256 of a canonical JSON dump of it all is compared with
``tests/golden/markdown_scanners.json``. Regenerate (only for an intended, explained change)::

    .venv/bin/python tests/test_markdown_golden.py --write        # rewrite the fixture
    .venv/bin/python tests/test_markdown_golden.py --dump DIR     # full dumps per source, to diff
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from verbatim_batch.core.tables import chunk_id
from verbatim_batch.corpus import chunker
from verbatim_batch.extract import sentences
from verbatim_batch.silver import dataset as silver

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "golden" / "markdown_scanners.json"
DEMO = ROOT / "verbatim_batch" / "examples" / "corpus"
SHARED = ROOT.parent / "shared"
CONFIGS = {
    "default": chunker.ChunkerConfig(),
    "small": chunker.ChunkerConfig(heading_levels=(1, 2), min_chars=0, max_chars=400),
    "deep": chunker.ChunkerConfig(heading_levels=(1, 2, 3, 4, 5, 6), min_chars=100, max_chars=1500),
}
PROBE = "we show that the model works well here"  # a span silver keeps unless it starts in a reference region
BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines' line ends

EDGE = {
    "empty": "",
    "blank": "  \n\n\t\n",
    "one_line": "Just one line without an end",
    "bom_heading": "\ufeff# Title of the paper\n\nAbstract text here. It goes on.\n",
    "bom_only": "\ufeff",
    "unclosed_backtick": "# A\n\nText before.\n\n```python\ncode = 1\n# not a heading\n\nMore text. After it.\n",
    "unclosed_tilde": "Intro.\n\n~~~\nstuff\n## Inside\n",
    "tilde_closed_by_backtick": "~~~\ncode\n```\n# Heading after\n\nText. More.\n~~~\n",
    "backtick_closed_by_tilde": "```\ncode\n~~~\n# Heading?\n```\n\nAfter.\n",
    "longer_closer": "````\na\n```\nb\n`````\n\n# H\n",
    "shorter_closer": "`````\na\n```\nb\n",
    "closer_with_info": "```python\nx\n```python\ny\n```\n",
    "backtick_in_info": "``` a`b\nnot code\n```\n",
    "indented_fence_3": "   ```\n   code\n   ```\n\nText.\n",
    "indented_fence_4": "    ```\n    code\n    ```\n\nText.\n",
    "tab_fence": "\t```\ncode\n\t```\n",
    "fence_in_list": "- item one\n  ```\n  code\n  ```\n- item two\n",
    "headings_in_fence": "# Real\n\n```\n# Fake\n## Fake 2\n```\n\n## Real 2\n\nBody. Text.\n",
    "setext": "Title\n=====\n\nSub title\n---------\n\nBody text. More body.\n",
    "atx_variants": "#hashtag\n\n####### seven\n\n#\n\n# \n\n## Closing ##\n\n#\tTabbed\n\n  ### Indented 2\n\n"
    "    # Indented 4\n\n## Trailing #not\n",
    "references": "## 5 Conclusion\n\nWe show that it works. The end.\n\n## References\n\n"
    "Akari Asai, Zeqiu Wu, and Hannaneh Hajishirzi. 2024. Self-RAG: Learning to retrieve. In "
    "Proceedings of ICLR, pages 1-10.\n\nJ. Devlin, M. Chang, K. Lee, and K. Toutanova. 2019. BERT: "
    "Pre-training. In Proceedings of NAACL, pages 4171-4186.\n\n[3] A. Smith. 2020. Title. arXiv "
    "preprint.\n\n## Appendix A\n\nWe use more data here. It is good.\n",
    "bold_references": "Text before. It reads.\n\n**References**\n\n1. A. Smith and B. Jones. 2020. A title. "
    "In Proc. of ACL, pp. 1-9.\n\n**Appendix**\n\nMore text. Here.\n",
    "references_nested": "# References\n\n## 7.1 Sub\n\nA. B. 2020. T. In Proceedings.\n\n# Next\n\nWe go on.\n",
    "contents": "# Contents\n\n1 Introduction .......... 3\n2 Method .......... 5\n\nIntroduction . . . . . 7\n",
    "front_matter": "# A Great Paper\n\nJohn Smith¹, Jane Doe²\n\n¹University of Somewhere\n\n"
    "john@example.com\n\nURL Source: https://example.com\n\n## Abstract\n\n"
    "We propose a thing. It works.\n",
    "tables": "Table 1: Results on the test set.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nText between. Two.\n\n"
    "| c | d |\n| :-- | --: |\n| 3 | 2019 |\n\nTable 2: A caption after.\n\n  | indented | row |\n",
    "caption_between_tables": "| a |\n|---|\n\nTable 3: Which one.\n\n| b |\n|---|\n",
    "tab_tables": "Name\tScore\tRank\nA\t1\t2\nB\t3\t4\n\nx\ty\nz\tw\n\nOne\ttab only\n",
    "lists": "- dash item. Two sentences.\n* star item\n+ plus item\n• bullet item\n1. numbered\n2) paren\n"
    "-not a list\n10. ten items\n",
    "crlf": "# Title\r\n\r\nFirst para. Second sentence.\r\n\r\n```\r\ncode\r\n```\r\n\r\n| a |\r\n|---|\r\n",
    "lone_cr": "# Title\r\rFirst para. Second.\r\r## Sub\rText here.\r",
    "mixed_ends": "# A\r\nline one\nline two\rline three\r\n\n## B\n\rtext\n",
    "tabs": "#\tTab heading\n\n\tIndented by tab. Still text.\n\n\t\t| tab | table |\n",
    "unicode": "# Données naïves 中文\n\nLe modèle τ ≤ 0.5. Ça marche 🙂. Über alles.\n\n## Résumé\n\nÉtude. Fin.\n",
    "unicode_breaks": "# A\u2028B\n\nLine one\u2028line two. Next\u2029para.\n\nForm\x0cfeed. Vertical\x0btab.\n\n"
    "Next\x85line. Sep\x1cx.\n",
    "rules_and_html": "Text.\n\n---\n\n***\n\n<!-- comment -->\n\n<div>html</div>\n\n![img](a.png)\n",
    "long_paragraph": ("This is a sentence that goes on. " * 60).strip() + "\n" + "word " * 200,
    "oversized_table": "| x | y |\n|---|---|\n" + "| 1234567890 | abcdefghij |\n" * 40,
    "many_headings": "".join(f"{'#' * (i % 6 + 1)} Heading {i}\n\nBody {i}. Text {i}.\n\n" for i in range(30)),
    "mixed_headings_refs": "## Intro\n\nText we do.\n\n**References**\n\nA. Smith. 2020. T. In Proc. ACL, pp. 1-2.\n\n"
    "## Next\n\nWe go on with more words here.\n",
    "closing_hashes_crlf": "# Title ##\r\n\r\nText.\r\n## References ##\r\n\r\nA. B. 2020. T. In Proceedings.\r\n"
    "## Next ##\r\nWe show that it is so.\r\n",
    "refs_in_fence": "We show that the model works here, and it is good for all of us.\n\n```\n# References\n```\n\n"
    "We then go on with the rest of the text, which is prose.\n",
    "bare_hash_after_refs": "# References\n\nA. B. 2020. T. In Proc.\n\n#\n\nWe do things here, and more.\n",
    "indented_pipe_and_hash": "Text.\n\n     | deep | row |\n\n     # deep hash\n\n###NoSpace heading\n",
    "run_in": "**Peer Review** Many tasks are hard. We do them.\n\nHybrid retrieval with RRF. The hybrid works.\n\n"
    "Results and Discussion\n\nWe discuss.\n",
}


def _ids(pid: str, chunks: list, cfg_hash: str) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in chunks:
        occurrence = seen.get(c.text, 0)
        seen[c.text] = occurrence + 1
        out.append(chunk_id(pid, c.text.encode("utf-8"), cfg_hash, occurrence))
    return out


def _chunk_view(text: str, path: tuple[str, ...] | list[str]) -> dict:
    """What sentences and silver make of one chunk (or any text)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch in BREAKS]
    plain = silver.chunk_is_references({"chunk": text, "heading_path": list(path)})
    probes = None
    if not plain:
        probes = [
            silver.drop_reason(
                {"chunk": text, "heading_path": list(path), "spans": [{"start": p, "end": p + 1, "text": PROBE}]}
            )
            for p in starts
        ]
    units = sentences.units(text)
    return {
        "units": [[u.start, u.end, u.kind, list(u.header) if u.header else None] for u in units],
        "segments": sentences.sentence_segments(text),
        "reference_list": silver.looks_like_reference_list(text),
        "chunk_is_references": plain,
        "region_probes": probes,
        "unit_drop": [
            silver.drop_reason(
                {
                    "chunk": text,
                    "heading_path": list(path),
                    "spans": [{"start": u.start, "end": u.end, "text": text[u.start : u.end]}],
                }
            )
            for u in units
        ],
        "whole_drop": silver.drop_reason(
            {"chunk": text, "heading_path": list(path), "spans": [{"start": 0, "end": len(text), "text": text}]}
        )
        if text
        else None,
    }


def _headings_view(path: tuple[str, ...]) -> list:
    return [
        [h, chunker.is_section_heading(h), chunker.is_reference_heading(h), silver.is_reference_heading(h)]
        for h in path
    ]


def paper_view(pid: str, text: str, sentences_too: bool = True) -> dict:
    """Chunks at every config, the title, and for the default chunks what sentences and silver make of them."""
    out: dict = {"title": chunker.first_heading(text)}
    for name, cfg in CONFIGS.items():
        chunks = chunker.chunk_markdown(text, cfg)
        chunker.verify_chunks(text, chunks)
        out[name] = {
            "hash": cfg.hash,
            "ids": _ids(pid, chunks, cfg.hash),
            "chunks": [[c.index, c.start, c.end, list(c.heading_path), list(c.flags)] for c in chunks],
        }
        if name == "default" and sentences_too:
            out["views"] = [_chunk_view(c.text, c.heading_path) for c in chunks]
            out["headings"] = sorted({tuple(h) for c in chunks for h in _headings_view(c.heading_path)})
    return out


def sources() -> dict[str, object]:
    """Every source's view, by name (the demo corpus, the seed papers and devsets where present, edge cases)."""
    out: dict[str, object] = {}
    for path in sorted(DEMO.glob("*.md")):
        out[f"demo/{path.name}"] = lambda p=path: paper_view(p.stem, p.read_text(encoding="utf-8"))
    for path in sorted((SHARED / "seeds").glob("*.txt")):
        out[f"seeds/{path.name}"] = lambda p=path: paper_view(p.stem, p.read_text(encoding="utf-8"))
    for path in sorted((SHARED / "devsets").glob("*.jsonl")):

        def devset(p: Path = path) -> list:
            rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
            return [_chunk_view(r["chunk"], ()) for r in rows]

        out[f"devsets/{path.name}"] = devset
    for name, text in EDGE.items():
        out[f"edge/{name}"] = lambda n=name, t=text: {"paper": paper_view(n, t), "chunk": _chunk_view(t, ())}
    return out


def canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def digest(obj: object) -> str:
    return hashlib.sha256(canonical(obj).encode("ascii")).hexdigest()


def _expected() -> dict[str, str]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))["digests"]


@pytest.mark.parametrize("name", sorted(sources()))
def test_scanners_match_golden(name: str) -> None:
    expected = _expected()
    assert name in expected, f"{name} has no golden digest: regenerate with `python {Path(__file__).name} --write`"
    assert digest(sources()[name]()) == expected[name]


def test_every_golden_source_still_exists() -> None:
    """A real source that went missing would silently stop being checked (shared/ sources may be absent)."""
    names = set(sources())
    missing = [n for n in _expected() if n not in names and not n.startswith(("seeds/", "devsets/"))]
    assert not missing


def main(argv: list[str]) -> None:
    views = {name: fn() for name, fn in sources().items()}
    if "--dump" in argv:
        folder = Path(argv[argv.index("--dump") + 1])
        for name, view in views.items():
            target = folder / f"{name.replace('/', '__')}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(view, sort_keys=True, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    if "--write" in argv:
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "about": "sha256 of each source's canonical view; see tests/test_markdown_golden.py",
            "digests": {name: digest(view) for name, view in sorted(views.items())},
        }
        FIXTURE.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
