"""The README and the guide name only files that exist in the repository (a reader follows them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"} - {"shared"}
# a backticked or linked path under one of the repository's top-level folders (or a top-level file)
CANDIDATE = re.compile(r"(?:`|\]\()((?:\./)?([A-Za-z0-9_.-]+)(?:/[A-Za-z0-9_.*{}<>-]+)*/?)(?:[`)#:])")


def cited_paths(text: str) -> list[str]:
    out = []
    for m in CANDIDATE.finditer(text):
        path, top = m.group(1).removeprefix("./"), m.group(2)
        if top in TOP and ("/" in path or "." in path) and not any(c in path for c in "*{}<>"):
            out.append(path.rstrip("/"))
    return out


def test_every_cited_repository_path_exists():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md"]
    missing = []
    for doc in (d for d in docs if d.is_file()):
        text = doc.read_text(encoding="utf-8")
        missing += [f"{doc.relative_to(ROOT)}: {p}" for p in cited_paths(text) if not (ROOT / p).exists()]
        # files outside the repository are not cited as if they were in it
        missing += [f"{doc.relative_to(ROOT)}: {m}" for m in re.findall(r"(?<![./\w])shared/devsets/[\w.-]+", text)]
    assert not missing, "\n".join(missing)


def test_the_checker_finds_a_missing_path():
    assert cited_paths("see `tests/no_such_test.py` and [x](verbatim_batch/cli/options.py)") == [
        "tests/no_such_test.py", "verbatim_batch/cli/options.py"]


def test_the_table_reference_is_current():
    """docs/reference/tables.md is generated from verbatim_batch/core/tables.py; regenerate it with
    `python -m verbatim_batch.core.tables_reference > docs/reference/tables.md`."""
    from verbatim_batch.core.tables_reference import markdown

    assert (ROOT / "docs" / "reference" / "tables.md").read_text(encoding="utf-8") == markdown()


def test_the_table_reference_has_every_schema_and_its_notes():
    import pyarrow as pa

    from verbatim_batch.core import tables
    from verbatim_batch.core.tables_reference import markdown

    text = markdown()
    for name, value in vars(tables).items():
        if isinstance(value, pa.Schema) and name.isupper():
            assert f"## {name}\n" in text, name
            assert all(f"| `{f.name}` |" in text for f in value), name
    assert "| `markdown` | `large_string` | yes | the text all offsets refer to |" in text
    assert "## embeddings_schema\n" in text and "`fixed_size_list<item: float>[384]`" in text


README_MAX_BYTES = 16_000
BENCHMARKS_README_MAX_BYTES = 12_000


def _slug(heading: str) -> str:
    """A heading's anchor as MkDocs' toc (and GitHub) make it: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*\[\]()]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_short_and_links_every_guide_page():
    readme = ROOT / "README.md"
    size = readme.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail into docs/"
    text = readme.read_text(encoding="utf-8")
    links = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", text))
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - links == set(), f"guide pages the README does not link: {sorted(pages - links)}"
    assert links - pages == set(), f"README links to guide pages that do not exist: {sorted(links - pages)}"


def test_the_readme_anchors_into_the_guide_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [f"{page}#{anchor}" for page, anchor in re.findall(r"\]\((docs/[^)#\s]+\.md)#([^)\s]+)\)", text)
               if anchor not in _anchors(ROOT / page)]
    assert not missing, f"README links to headings the guide does not have: {missing}"


def test_the_slugs_are_mkdocs_slugs():
    assert _slug("Reranking (optional: `rerank`)") == "reranking-optional-rerank"
    assert _slug("Re-checking a run (`verify`)") == "re-checking-a-run-verify"
    assert _slug("In-cluster vLLM: GPU nodes, or CPU") == "in-cluster-vllm-gpu-nodes-or-cpu"
    assert _slug("RAW_RECORDS") == "raw_records"


def test_the_benchmarks_readme_is_short():
    size = (ROOT / "benchmarks" / "README.md").stat().st_size
    assert size <= BENCHMARKS_README_MAX_BYTES, (
        f"benchmarks/README.md is {size} bytes, over {BENCHMARKS_README_MAX_BYTES}: move history to its history/")
