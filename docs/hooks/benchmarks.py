"""MkDocs hook: the Benchmarks page (docs/benchmarks.md) includes the repository's benchmarks/README.md.

A line ``--8<-- "PATH"`` on that page is replaced by the file PATH (relative to the repository root), without its
first-level title; a missing file fails the build with one line. The included file's relative links point at files
beside it in the repository, outside the guide, which ``mkdocs build --strict`` refuses: a link to a guide page
(``../docs/llm.md``) becomes a link to that page, any other becomes the file's repository path as a code span.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

PAGE = "benchmarks.md"
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s#:]+)(#[^)\s]*)?\)")  # relative links only: a scheme has a ':'


def _rewrite(text: str, source: str) -> str:
    folder = posixpath.dirname(source)

    def link(m: re.Match) -> str:
        label, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        path = posixpath.normpath(posixpath.join(folder, target))
        if path.startswith("docs/") and path.endswith(".md"):
            return f"[{label}]({posixpath.relpath(path, 'docs')}{anchor})"
        if label.strip("`") in (target, path, posixpath.splitext(posixpath.basename(path))[0]):
            return f"`{path}`"
        return f"{label} (`{path}`)"

    return LINK.sub(link, text)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    root = Path(config["config_file_path"]).parent

    def include(m: re.Match) -> str:
        source = m.group(1)
        try:
            text = (root / source).read_text(encoding="utf-8")
        except OSError as exc:
            raise PluginError(f"{PAGE}: cannot include {source}: {exc}") from None
        text = re.sub(r"\A# [^\n]*\n+", "", text)  # the page has its own title
        return _rewrite(text, source)

    return INCLUDE.sub(include, markdown)
