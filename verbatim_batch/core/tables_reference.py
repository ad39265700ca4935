"""The table reference, generated from ``tables.py`` (``python -m verbatim_batch.core.tables_reference``).

``docs/reference/tables.md`` is this module's output; a test keeps it current. Every schema defined at the top
level of ``tables.py`` gets a section, in the order of the file: the comment above its definition, then one row
per column with its Arrow type, whether it may be null and the comment on (or just above) its line.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import tokenize

import pyarrow as pa

from verbatim_batch.core import tables

EXAMPLE_DIM = 384  # the bundled MiniLM's; the embeddings table's vector width is the model's


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line -> (comment text, whether the line holds only the comment)."""
    out = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            alone = not lines[line - 1][: tok.start[1]].strip()
            out[line] = (tok.string.lstrip("#").strip(), alone)
    return out


def _block_above(line: int, comments: dict[int, tuple[str, bool]]) -> list[str]:
    """The comment lines directly above ``line`` (a block of whole-line comments), top first."""
    block = []
    line -= 1
    while line in comments and comments[line][1]:
        block.insert(0, comments[line][0])
        line -= 1
    return block


def _definitions() -> list[tuple[str, object, int, int]]:
    """(name, value, first line, last line) of each schema (or struct type, or schema function) in tables.py."""
    tree = ast.parse(inspect.getsource(tables))
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value = getattr(tables, name, None)
            if isinstance(value, (pa.Schema, pa.StructType)):
                out.append((name, value, node.lineno, node.end_lineno))
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("_schema") and not node.name.startswith("_"):
            out.append((node.name, getattr(tables, node.name), node.lineno, node.end_lineno))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _column_notes(fields: list[str], first: int, last: int, source_lines: list[str],
                  comments: dict[int, tuple[str, bool]]) -> dict[str, str]:
    """Column -> the comment on its line (the line naming only that column) or in the block just above it."""
    notes: dict[str, str] = {}
    names = set(fields)
    for line in range(first, last + 1):
        named = [n for n in re.findall(r"""["'](\w+)["']""", source_lines[line - 1]) if n in names]
        if len(named) != 1 or named[0] in notes:
            continue
        parts = _block_above(line, comments)
        if line in comments and not comments[line][1]:
            parts.append(comments[line][0])
        if parts:
            notes[named[0]] = " ".join(parts)
    return notes


def markdown() -> str:
    """Every table schema of ``tables.py``: its columns, types, nullability and notes."""
    source = inspect.getsource(tables)
    source_lines = source.splitlines()
    comments = _comments(source)
    doc = inspect.getdoc(tables) or ""
    lines = ["# Table reference", "",
             "Generated from `verbatim_batch/core/tables.py` (`python -m verbatim_batch.core.tables_reference`), "
             "the one home of "
             "every schema: the contracts between stages. Each schema made by `_schema` carries in its metadata "
             f"the schema version (`verbatim_batch.schema_version`, now `{tables.SCHEMA_VERSION}`), its table name "
             f"(`verbatim_batch.table`) and the offset unit (`verbatim_batch.offset_unit`, `{tables.OFFSET_UNIT}`), "
             "and the metadata travels into every Parquet file written with it.", "",
             doc.split("\n\n")[-1].replace("\n", " ").replace("``", "`"), ""]
    lines += ["| schema | table | columns |", "|---|---|---|"]
    defs = _definitions()
    for name, value, _, _ in defs:
        schema = value(EXAMPLE_DIM) if callable(value) else value
        table = tables.table_name_of(schema) if isinstance(schema, pa.Schema) else None
        n = len(schema) if isinstance(schema, pa.Schema) else schema.num_fields
        lines.append(f"| [`{name}`](#{name.lower()}) | {f'`{table}`' if table else ''} | {n} |")
    lines.append("")
    for name, value, first, last in defs:
        schema = value(EXAMPLE_DIM) if callable(value) else value
        about = " ".join(_block_above(first, comments))
        if callable(value):
            about = (inspect.getdoc(value) or "") + (
                f" Shown for a {EXAMPLE_DIM}-dimensional model (`{name}({EXAMPLE_DIM})`): `vector` is as wide as the "
                "model's vectors, its items `float32` unless `embed --output-dtype` says otherwise.")
        fields = list(schema) if isinstance(schema, pa.Schema) else [schema.field(i) for i in range(schema.num_fields)]
        table = tables.table_name_of(schema) if isinstance(schema, pa.Schema) else None
        lines += [f"## {name}", ""]
        head = f"Table `{table}`." if table else ("A struct type." if isinstance(schema, pa.StructType) else
                                                   "No table metadata.")
        lines += [f"{head} {about}".strip(), ""]
        notes = _column_notes([f.name for f in fields], first, last, source_lines, comments)
        lines += ["| column | type | null | note |", "|---|---|---|---|"]
        for f in fields:
            lines.append(f"| `{f.name}` | `{_cell(str(f.type))}` | {'yes' if f.nullable else 'no'} | "
                         f"{_cell(notes.get(f.name, ''))} |")
        lines.append("")
    reasons = sorted(tables.QuarantineReason.ALL)
    lines += ["## Quarantine reasons", "",
              "The closed vocabulary of `QUARANTINE.reason` (`tables.QuarantineReason`): "
              + ", ".join(f"`{r}`" for r in reasons) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
