"""Parsing what an extraction LLM returned into per-document span strings.

The prompt asks for ``{"doc_0": ["...", ...], "doc_1": [], ...}``; ``parse_extraction`` is forgiving about
*shape* (fences, prose around the JSON, several values, key spellings like ``"Document 1"``, wrappers like
``{"spans": [...]}``, item objects with a doc reference, single quotes, trailing or missing commas, bare keys, a
``<think>`` block skipped) and strict about *content*: only strings *closed* in the output are returned, so a cut-off
answer keeps its complete items and nothing partial reaches alignment (``align.align_spans`` still checks each).

``problems`` holds short codes, some with a ``:detail`` suffix: ``empty_output``, ``no_json``, ``think_block``,
``code_fence``, ``extra_text``, ``truncated``, ``invalid_json`` (items before the error kept), ``lenient_json``,
``unknown_key:K``, ``doc_out_of_range:N``, ``wrong_type:WHERE``, ``non_string_item:WHERE``, ``empty_item:WHERE``,
``ambiguous_list``, ``too_deep``. ``ok`` is False for empty output too.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

_MAX_CANDIDATES = 64  # JSON start positions tried per region
_MAX_DEPTH = 64  # nesting the forgiving parser (and the interpreter) follows
_MAX_KEY_NOTE = 40

_DOC_KEY = re.compile(r"\s*\[?\s*(?:doc(?:ument)?|d)?[\s_\-#:.]*(\d{1,9})\s*\]?\s*", re.IGNORECASE)
_WRAPPERS = frozenset({"spans", "evidence", "quotes", "results", "extractions", "items", "output", "answer",
                       "answers", "documents", "docs", "data", "excerpts", "highlights", "snippets"})
_TEXT_FIELDS = ("text", "span", "quote", "evidence", "excerpt", "sentence", "content", "snippet")
_LIST_FIELDS = ("spans", "quotes", "texts", "evidence", "excerpts", "items", "highlights", "snippets")
_DOC_REF_FIELDS = ("doc", "doc_id", "document", "document_id", "doc_index", "docid", "source", "source_id")

_FENCE_OPEN = re.compile(r"```[ \t]*[A-Za-z0-9_+\-]*[ \t]*\r?\n?")
_FENCE_ANY = re.compile(r"```[ \t]*[A-Za-z0-9_+\-]*")
_DQ_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_SQ_STRING = re.compile(r"'((?:[^'\\]|\\.)*)'", re.DOTALL)
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_BARE = re.compile(r"[^\s:,{}\[\]\"']+(?:[ \t]+[^\s:,{}\[\]\"']+)*")
_WS = re.compile(r"\s*")
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = {"true": True, "false": False, "null": None, "none": None}

_STRICT = json.JSONDecoder(strict=False)
_THINK_CLOSE = "</think>"


@dataclass
class ParsedOutput:
    """Span strings per document index, plus notes on what was wrong with the output."""

    spans: dict[int, list[str]] = field(default_factory=dict)  # doc index -> strings, in order, no duplicates
    problems: list[str] = field(default_factory=list)
    ok: bool = False  # False when nothing usable came out of a non-empty output


# --- a forgiving JSON reader -----------------------------------------------------------------

_MISSING = object()


class _Lenient:
    """Reads one JSON-like value, keeping what was complete at the end or an error: ``stop`` ends as ``None``,
    ``"eof"`` or ``"error"`` (at ``pos``); unclosed strings and keys without a value are never kept."""

    def __init__(self, text: str, end: int) -> None:
        self.s = text
        self.n = end
        self.stop: str | None = None
        self.pos = 0
        self.too_deep = False

    def _skip(self, i: int) -> int:
        return _WS.match(self.s, i, self.n).end()

    def _fail(self, kind: str, i: int) -> None:
        self.stop = kind
        self.pos = i

    def value(self, i: int, depth: int = 0) -> tuple[Any, int]:
        i = self._skip(i)
        if i >= self.n:
            self._fail("eof", i)
            return _MISSING, i
        if depth > _MAX_DEPTH:
            self.too_deep = True
            self._fail("error", i)
            return _MISSING, i
        c = self.s[i]
        if c in "{[":
            return self._container(i + 1, depth, "}" if c == "{" else "]")
        if c in "\"'":
            return self._string(i)
        m = _NUMBER.match(self.s, i, self.n)
        if m:
            if m.end() >= self.n:  # a number at the very end may have been cut short
                self._fail("eof", m.end())
                return _MISSING, m.end()
            text = m.group()
            try:
                return (float(text) if any(ch in text for ch in ".eE") else int(text)), m.end()
            except ValueError:
                return _MISSING, m.end()
        m = _BARE.match(self.s, i, self.n)
        if m and m.group().lower() in _LITERALS:
            return _LITERALS[m.group().lower()], m.end()
        self._fail("error", i)
        return _MISSING, i

    def _junk_after(self, val: Any, i: int) -> bool:
        """True (and stop with an error) when a string is followed by what cannot follow a value: usually an
        unescaped quote ended it early, so it is not what the model meant and is dropped."""
        j = self._skip(i)
        if j >= self.n or self.s[j] in ",]}\"'{[" or not isinstance(val, str):
            return False
        self._fail("error", j)
        return True

    def _string(self, i: int) -> tuple[Any, int]:
        quote = self.s[i]
        m = (_DQ_STRING if quote == '"' else _SQ_STRING).match(self.s, i, self.n)
        if m is None:  # no closing quote before the end: the string was cut off
            self._fail("eof", self.n)
            return _MISSING, self.n
        return _unescape(m.group(1)), m.end()

    def _key(self, i: int) -> tuple[Any, int]:
        if self.s[i] in "\"'":
            return self._string(i)
        m = _BARE.match(self.s, i, self.n)
        if m is None:
            self._fail("error", i)
            return _MISSING, i
        if m.end() >= self.n:
            self._fail("eof", m.end())
            return _MISSING, m.end()
        return m.group(), m.end()

    def _container(self, i: int, depth: int, close: str) -> tuple[Any, int]:
        """An object (``close`` is ``}``) or an array (``]``) after its opening bracket."""
        out: Any = {} if close == "}" else []
        while True:
            i = self._skip(i)
            if i >= self.n:
                self._fail("eof", i)
                return out, i
            c = self.s[i]
            if c == close:
                return out, i + 1
            if c == ",":
                i += 1
                continue
            if close == "}":
                key, i = self._key(i)
                if self.stop:
                    return out, i
                i = self._skip(i)
                if i >= self.n:
                    self._fail("eof", i)
                    return out, i
                if self.s[i] not in ":=":
                    self._fail("error", i)
                    return out, i
                i += 1
            val, i = self.value(i, depth + 1)
            if not self.stop and self._junk_after(val, i):
                return out, i
            if val is not _MISSING:
                if close == "}":
                    out[str(key)] = val
                else:
                    out.append(val)
            if self.stop:
                return out, i


def _unescape(body: str) -> str:
    """Decode JSON-style escapes; an unknown escape keeps its character, a bad ``\\u`` is kept as written."""
    if "\\" not in body:
        return body
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        j = body.find("\\", i)
        if j < 0 or j == n - 1:
            out.append(body[i:])
            break
        out.append(body[i:j])
        c = body[j + 1]
        if c == "u":
            hexpart = body[j + 2 : j + 6]
            if len(hexpart) == 4 and all(h in "0123456789abcdefABCDEF" for h in hexpart):
                code = int(hexpart, 16)
                low = body[j + 6 : j + 12]
                if 0xD800 <= code < 0xDC00 and len(low) == 6 and low[:2] == "\\u":
                    try:
                        code2 = int(low[2:], 16)
                    except ValueError:
                        code2 = -1
                    if 0xDC00 <= code2 < 0xE000:
                        out.append(chr(0x10000 + ((code - 0xD800) << 10) + (code2 - 0xDC00)))
                        i = j + 12
                        continue
                out.append(chr(code))
                i = j + 6
            else:
                out.append(body[j : j + 2])
                i = j + 2
            continue
        out.append(_ESCAPES.get(c, c))
        i = j + 2
    return "".join(out)


# --- finding the JSON in the output ----------------------------------------------------------


@dataclass
class _Found:
    value: Any
    start: int
    end: int
    status: str  # "strict" | "lenient" | "eof" | "error"
    too_deep: bool = False


def _parse_at(text: str, i: int, end: int) -> _Found:
    """The value starting at ``text[i]``: strict JSON if possible, else the forgiving reader."""
    with contextlib.suppress(Exception):  # ValueError, RecursionError: fall back to the forgiving reader
        value, stop = _STRICT.raw_decode(text[:end], i)
        return _Found(value, i, stop, "strict")
    reader = _Lenient(text, end)
    try:
        value, stop = reader.value(i)
    except RecursionError:
        return _Found(_MISSING, i, i + 1, "error", True)
    if reader.stop is None:
        return _Found(value, i, stop, "lenient")
    return _Found(value, i, reader.pos if reader.stop == "error" else end, reader.stop, reader.too_deep)


def _usable(value: Any) -> bool:
    return isinstance(value, dict | list) and bool(value)


def _looks_like_root(obj: dict) -> bool:
    return any(isinstance(k, str) and (_DOC_KEY.fullmatch(k) or k.strip().lower() in _WRAPPERS) for k in obj)


def _find_root(text: str, start: int, end: int) -> _Found | None:
    """The JSON value to read in ``text[start:end]``: the first object that looks like an answer, else the first
    object, else the earliest of the first list and the first salvaged partial (after a broken object, a later one
    only if it looks like an answer: else it is probably one of its items)."""
    first_obj: _Found | None = None
    first_list: _Found | None = None
    partial: _Found | None = None
    i = start
    for _ in range(_MAX_CANDIDATES):
        brace, bracket = text.find("{", i, end), text.find("[", i, end)
        hits = [p for p in (brace, bracket) if p >= 0]
        if not hits:
            break
        p = min(hits)
        found = _parse_at(text, p, end)
        if found.status != "error" and isinstance(found.value, dict):
            if _looks_like_root(found.value):
                return found
            if first_obj is None and (partial is None or not isinstance(partial.value, dict)):
                first_obj = found
        elif found.status != "error" and isinstance(found.value, list):
            if first_list is None:
                first_list = found
        elif found.status == "error" and partial is None and _usable(found.value):
            partial = found
        if found.status == "eof":
            break  # the value ran to the end of the text: nothing can follow it
        i = max(found.end, p + 1)
    if first_obj is not None:
        return first_obj
    candidates = [f for f in (first_list, partial) if f is not None]
    return min(candidates, key=lambda f: f.start) if candidates else None


def _fence(text: str, start: int) -> tuple[int, int, int, int] | None:
    """The first fenced block from ``start`` holding ``{`` or ``[``: (open, content start, content end, close end)."""
    for m in _FENCE_OPEN.finditer(text, start):
        close = text.find("```", m.end())
        content_end = close if close >= 0 else len(text)
        if "{" in text[m.end() : content_end] or "[" in text[m.end() : content_end]:
            return m.start(), m.end(), content_end, (close + 3 if close >= 0 else len(text))
    return None


# --- interpreting the value ------------------------------------------------------------------


class _Collector:
    def __init__(self, n_docs: int) -> None:
        self.n_docs = n_docs
        self.spans: dict[int, list[str]] = {}
        self._seen: dict[int, set[str]] = {}
        self.problems: list[str] = []
        self.recognized = False

    def note(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)

    def doc_index(self, ref: Any) -> int | None:
        """A document reference (key or field value) as an index, or None if it is not one."""
        if isinstance(ref, bool):
            return None
        if isinstance(ref, int):
            return ref
        if isinstance(ref, float) and ref.is_integer():
            return int(ref)
        if isinstance(ref, str):
            m = _DOC_KEY.fullmatch(ref)
            if m:
                return int(m.group(1))
        return None

    def in_range(self, idx: int) -> bool:
        if 0 <= idx < self.n_docs:
            return True
        self.note(f"doc_out_of_range:{idx}")
        return False

    def add(self, idx: int, text: str, where: str) -> None:
        if not text.strip():
            self.note(f"empty_item:{where}")
            return
        self.recognized = True
        seen = self._seen.setdefault(idx, set())
        if text not in seen:
            seen.add(text)
            self.spans.setdefault(idx, []).append(text)

    # A doc's value: a list of items, or (wrongly) one string / one item object.
    def doc_value(self, value: Any, idx: int, depth: int) -> None:
        where = f"doc_{idx}"
        if isinstance(value, list):
            self.recognized = True
            self.items(value, idx, where, depth + 1)
            return
        self.note(f"wrong_type:{where}")
        if value is None:
            self.recognized = True  # null: read as "nothing here"
        elif isinstance(value, str):
            self.add(idx, value, where)
        elif isinstance(value, dict) and (_field(value, _TEXT_FIELDS, str) is not None
                                          or _field(value, _LIST_FIELDS, list) is not None):
            self.items([value], idx, where, depth + 1)

    def items(self, values: list, idx: int | None, where: str, depth: int) -> None:
        """Items of a list; ``idx`` is the doc they belong to unless an item says otherwise (None: unknown)."""
        if depth > _MAX_DEPTH:
            self.note("too_deep")
            return
        for item in values:
            if isinstance(item, str):
                target = idx if idx is not None else self._default_doc()
                if target is not None:
                    self.add(target, item, where)
            elif isinstance(item, dict):
                self.item_object(item, idx, where, depth + 1)
            elif isinstance(item, list):
                self.items(item, idx, where, depth + 1)
            else:
                self.note(f"non_string_item:{where}")

    def _default_doc(self) -> int | None:
        if self.n_docs == 1:
            return 0
        self.note("ambiguous_list")
        return None

    def _item_doc(self, item: dict) -> int | None | bool:
        """The item's own doc reference: an index, None when it has none, False when it is unreadable."""
        for name in _DOC_REF_FIELDS:
            if name in item:
                ref = self.doc_index(item[name])
                return False if ref is None else ref
        return None

    def item_object(self, item: dict, idx: int | None, where: str, depth: int) -> None:
        if any(self.doc_index(k) is not None for k in item):
            self.mapping(item, depth + 1)  # a nested {"doc_0": [...]} mapping
            return
        ref = self._item_doc(item)
        if ref is False:
            self.note(f"non_string_item:{where}")
            return
        if ref is not None:
            if not self.in_range(ref):
                return
            idx, where = ref, f"doc_{ref}"
        text, inner = _field(item, _TEXT_FIELDS, str), _field(item, _LIST_FIELDS, list)
        if text is None and inner is None:
            self.note(f"non_string_item:{where}")
            return
        if idx is None:
            idx = self._default_doc()
            if idx is None:
                return
        if text is not None:
            self.add(idx, text, where)
        if inner is not None:
            self.items(inner, idx, where, depth + 1)

    def mapping(self, obj: dict, depth: int) -> None:
        if depth > _MAX_DEPTH:
            self.note("too_deep")
            return
        has_doc_keys = any(self.doc_index(k) is not None for k in obj)
        if not has_doc_keys and (_field(obj, _TEXT_FIELDS, str) is not None
                                 or self._item_doc(obj) not in (None, False)):
            self.item_object(obj, None, "root", depth)  # the whole object is one item
            return
        if not obj:
            self.recognized = True  # {}: no spans anywhere, which is a valid answer
        for key, value in obj.items():
            idx = self.doc_index(key)
            if idx is not None:
                if self.in_range(idx):
                    self.doc_value(value, idx, depth)
            elif key.strip().lower() in _WRAPPERS:
                if isinstance(value, list | dict) and not value:
                    self.recognized = True  # {"spans": []}: nothing found, a valid answer
                if isinstance(value, dict):
                    self.mapping(value, depth + 1)
                elif isinstance(value, list):
                    self.items(value, None, key.strip().lower(), depth + 1)
                elif isinstance(value, str):
                    self.items([value], None, key.strip().lower(), depth + 1)
                else:
                    self.note(f"wrong_type:{key.strip().lower()[:_MAX_KEY_NOTE]}")
            else:
                self.note(f"unknown_key:{key[:_MAX_KEY_NOTE]}")

    def root(self, value: Any) -> None:
        if isinstance(value, dict):
            self.mapping(value, 0)
        elif isinstance(value, list):
            if not value:
                self.recognized = True
            self.items(value, None, "root", 1)
        else:
            self.note("wrong_type:root")


def _field(item: dict, names: tuple[str, ...], kind: type) -> Any:
    """The first of ``names`` in ``item`` whose value is a ``kind``, else None."""
    return next((item[n] for n in names if isinstance(item.get(n), kind)), None)


# --- the entry point -------------------------------------------------------------------------


def parse_extraction(raw: str, n_docs: int) -> ParsedOutput:
    """Span strings per document from one model output (see the module docs); never raises."""
    try:
        return _parse(raw, n_docs)
    except Exception as exc:  # noqa: BLE001 - a bad output must not take the batch down
        return ParsedOutput({}, [f"parser_error:{type(exc).__name__}"], False)


def _parse(raw: str, n_docs: int) -> ParsedOutput:
    if not isinstance(raw, str):
        return ParsedOutput({}, ["wrong_type:output"], False)
    if not raw.strip():
        return ParsedOutput({}, ["empty_output"], False)
    out = _Collector(int(n_docs))
    body = 0  # where the answer starts: after a closed reasoning block, drafts in it are not the answer
    think = raw.rfind(_THINK_CLOSE)
    if think >= 0:
        body = think + len(_THINK_CLOSE)
        out.note("think_block")
    found: _Found | None = None
    fence = _fence(raw, body)
    if fence is not None:
        out.note("code_fence")
        found = _find_root(raw, fence[1], fence[2])
    if found is None:
        found = _find_root(raw, body, len(raw))
        fence = None
    if found is None:
        out.note("no_json")
        return ParsedOutput({}, out.problems, False)

    if found.status == "eof":
        out.note("truncated")
    elif found.status == "error":
        out.note("invalid_json")
    elif found.status == "lenient":
        out.note("lenient_json")
    if found.too_deep:
        out.note("too_deep")
    if fence is not None:
        outside = raw[body : fence[0]] + raw[fence[1] : found.start] + raw[found.end : fence[2]] + raw[fence[3] :]
    else:
        outside = raw[body : found.start] + raw[found.end :]
    if _FENCE_ANY.sub("", outside).strip():
        out.note("extra_text")

    out.root(found.value)
    spans = {k: out.spans[k] for k in sorted(out.spans)}
    complete = found.status in ("strict", "lenient")
    ok = bool(spans) or (out.recognized and complete)
    return ParsedOutput(spans, out.problems, ok)
