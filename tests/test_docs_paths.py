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
    """docs/reference/tables.md is generated from verbatim_batch/tables.py; regenerate it with
    `python -m verbatim_batch.tables_reference > docs/reference/tables.md`."""
    from verbatim_batch.tables_reference import markdown

    assert (ROOT / "docs" / "reference" / "tables.md").read_text(encoding="utf-8") == markdown()


def test_the_table_reference_has_every_schema_and_its_notes():
    import pyarrow as pa

    from verbatim_batch import tables
    from verbatim_batch.tables_reference import markdown

    text = markdown()
    for name, value in vars(tables).items():
        if isinstance(value, pa.Schema) and name.isupper():
            assert f"## {name}\n" in text, name
            assert all(f"| `{f.name}` |" in text for f in value), name
    assert "| `markdown` | `large_string` | yes | the text all offsets refer to |" in text
    assert "## embeddings_schema\n" in text and "`fixed_size_list<item: float>[384]`" in text

