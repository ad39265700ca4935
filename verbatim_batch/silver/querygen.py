"""Synthetic search queries for chunks, in three LLM steps (after the ScIRGen method).

1. **Types.** The model picks the 3 question types, out of an 18-type taxonomy, that the chunk can answer.
2. **Questions.** For each type it writes one question the chunk answers.
3. **Queries.** Each question is rewritten as the short query a researcher would type into a search engine.

Papers are sampled with a seed (English papers with at least one author, when the metadata says so); one chunk per
paper is picked, also seeded. Every step's failure is recorded on the row (``error``), never raised.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from verbatim_batch.core import tables
from verbatim_batch.core.tables import stable_hash

# (name, what it asks for, a short example) — the 18 types of the question taxonomy.
QUESTION_TYPES: list[tuple[str, str, str]] = [
    ("Verification", "asks whether something is true; the answer is yes or no",
     "Does data augmentation help low-resource parsing?"),
    ("Disjunctive", "offers two or more alternatives to choose from",
     "Is the encoder frozen or fine-tuned during adaptation?"),
    ("Concept Completion", "asks who, what, when or where", "Which corpus was used for pre-training?"),
    ("Example", "asks for instances of a category or concept", "What are examples of subword tokenizers?"),
    ("Feature Specification", "asks for properties or attributes of something",
     "What are the characteristics of the annotated dialogues?"),
    ("Quantification", "asks for a number, amount or measurement", "How many annotators labelled each item?"),
    ("Definition", "asks what a term or concept means", "What is label smoothing?"),
    ("Comparison", "asks how two or more things are alike or differ",
     "How does the distilled model compare with its teacher?"),
    ("Interpretation", "asks what can be inferred from observations or results",
     "What does the drop in recall on long documents suggest?"),
    ("Causal Antecedent", "asks what caused something or why it happened",
     "Why does performance degrade on code-switched text?"),
    ("Causal Consequence", "asks what follows from something", "What happens when the context window is halved?"),
    ("Goal Orientation", "asks about the aim or motivation behind an action",
     "Why did the authors build a new benchmark?"),
    ("Instrumental/Procedural", "asks how something is done or achieved",
     "How are negative examples sampled for training?"),
    ("Enablement", "asks what makes an action or outcome possible",
     "What allows the parser to handle unseen languages?"),
    ("Expectation", "asks why an expected outcome did or did not occur",
     "Why did pre-training not improve the smallest model?"),
    ("Judgmental", "asks for an assessment or opinion", "Is BLEU a reliable metric for this task?"),
    ("Assertion", "states a gap in the asker's knowledge", "I don't understand how the reranker is trained."),
    ("Request/Directive", "asks to summarise, analyse or find something", "Summarise the error analysis."),
]
TYPE_NAMES = [t[0] for t in QUESTION_TYPES]
_TYPE_INDEX = {re.sub(r"[^a-z]", "", n.lower()): n for n in TYPE_NAMES}

QUERIES_SCHEMA = tables.GENERATED_QUERIES


def types_messages(chunk: str) -> list[dict[str, str]]:
    listing = "\n".join(f"{i}. {name}: {desc}." for i, (name, desc, _) in enumerate(QUESTION_TYPES, 1))
    return [
        {"role": "system", "content": "You help build a search benchmark over research papers. Question types:\n"
                                      + listing},
        {"role": "user", "content": f"Passage from a research paper:\n\n{chunk}\n\nWhich 3 of the question types "
                                    "above could this passage answer best? Reply with a JSON array of the 3 type "
                                    "names and nothing else."},
    ]


def question_messages(chunk: str, qtype: str) -> list[dict[str, str]]:
    _, desc, example = QUESTION_TYPES[TYPE_NAMES.index(qtype)]
    return [
        {"role": "system", "content": "You are a researcher looking for information in research papers."},
        {"role": "user", "content": (
            f"Passage from a research paper:\n\n{chunk}\n\nWrite one question of type \"{qtype}\" (a question "
            f"that {desc}; for example: \"{example}\") that the passage answers. Keep it short and general, as "
            "someone who has not read the paper would ask it: say \"a dataset\" or \"a method\", never \"this "
            "paper\" or \"the authors\". Reply with the question only.")},
    ]


def rewrite_messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a researcher using a search engine."},
        {"role": "user", "content": f"Question: {question}\n\nWrite the short search query you would type to find "
                                    "the answer: a few keywords, no full sentence. Reply with the query only."},
    ]


def parse_types(raw: str, n: int = 3) -> list[str]:
    """Up to ``n`` known type names from a model's answer (JSON array, or any text naming them)."""
    found: list[str] = []
    candidates: list[Any] = []
    match = re.search(r"\[.*\]", raw or "", re.S)
    if match:
        try:
            loaded = json.loads(match.group(0))
            candidates = loaded if isinstance(loaded, list) else []
        except json.JSONDecodeError:
            candidates = []
    items = [c.get("name") or c.get("type") if isinstance(c, dict) else c for c in candidates]
    items = [str(i) for i in items if i is not None] or re.split(r"[\n,;]", raw or "")
    for item in items:
        key = re.sub(r"[^a-z]", "", re.sub(r"^\s*\d+[.)]?", "", item).lower())
        name = _TYPE_INDEX.get(key) or next((v for k, v in _TYPE_INDEX.items() if key and k.startswith(key)), None)
        if name and name not in found:
            found.append(name)
    return found[:n]


def clean_line(raw: str) -> str:
    """The first non-empty line of an answer, without list markers, labels or wrapping quotes."""
    for line in (raw or "").splitlines():
        line = re.sub(r"^\s*(?:[-*\d.)]+\s*)?(?:question|query|search query)\s*:\s*", "", line.strip(), flags=re.I)
        line = line.strip().strip("\"'`“”").strip()
        if line:
            return line
    return ""


def sample_papers(papers: pa.Table, n: int, seed: int = 0) -> list[str]:
    """``n`` paper ids, seeded; English papers with at least one author where the metadata has those fields."""
    rows = papers.select([c for c in ("paper_id", "language", "authors") if c in papers.column_names]).to_pylist()
    keep = []
    for r in rows:
        lang = r.get("language")
        if lang is not None and str(lang).lower() not in ("en", "eng", "english"):
            continue
        if "authors" in r and r["authors"] is not None and len(r["authors"]) == 0:
            continue
        keep.append(r["paper_id"])
    keep.sort()
    random.Random(f"papers:{seed}").shuffle(keep)
    return keep[:n]


_SKIP_HEADINGS = ("reference", "bibliography", "acknowledg", "appendix")


def pick_chunks(chunks: pa.Table, paper_ids: Sequence[str], seed: int = 0, min_chars: int = 300) -> pa.Table:
    """One chunk per paper, seeded; prose chunks of at least ``min_chars`` outside references and the like."""
    wanted = set(paper_ids)
    cols = ["chunk_id", "paper_id", "chunk_index", "text", "heading_path"]
    by_paper: dict[str, list[dict[str, Any]]] = {}
    for r in chunks.select(cols).to_pylist():
        if r["paper_id"] not in wanted or len(r["text"]) < min_chars:
            continue
        if any(h.lower().lstrip("0123456789. ").startswith(_SKIP_HEADINGS) for h in r["heading_path"] or []):
            continue
        by_paper.setdefault(r["paper_id"], []).append(r)
    out = []
    for pid in paper_ids:
        options = sorted(by_paper.get(pid, []), key=lambda r: r["chunk_index"])
        if options:
            out.append(random.Random(f"chunk:{seed}:{pid}").choice(options))
    return pa.Table.from_pylist(out, schema=tables.PICKED_CHUNKS)


class QueryGenerator:
    """Runs the three steps for chunk rows with a ``chat(messages) -> str`` function (any backend)."""

    def __init__(self, chat: Callable[[list[dict[str, str]]], str], model_id: str, per_chunk: int = 3,
                 max_in_flight: int = 8) -> None:
        self.chat, self.model_id, self.per_chunk = chat, model_id, per_chunk
        self.pool = ThreadPoolExecutor(max_workers=max_in_flight)

    def _one(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        base = {"paper_id": chunk["paper_id"], "chunk_id": chunk["chunk_id"], "chunk_index": chunk["chunk_index"],
                "model_id": self.model_id}
        try:
            types = parse_types(self.chat(types_messages(chunk["text"])), self.per_chunk)
        except Exception as exc:  # noqa: BLE001 - recorded on the row
            return [base | {"query_id": f"qg-{chunk['chunk_id']}-err", "query": None, "question": None,
                            "question_type": None, "error": f"types: {exc}"}]
        if not types:
            return [base | {"query_id": f"qg-{chunk['chunk_id']}-none", "query": None, "question": None,
                            "question_type": None, "error": "types: no known question type in the answer"}]
        rows = []
        for qtype in types:
            qid = "qg-" + stable_hash(chunk["chunk_id"], qtype, size=8)
            row = base | {"query_id": qid, "question_type": qtype, "question": None, "query": None, "error": None}
            try:
                row["question"] = clean_line(self.chat(question_messages(chunk["text"], qtype))) or None
                if row["question"] is None:
                    row["error"] = "question: empty answer"
                else:
                    row["query"] = clean_line(self.chat(rewrite_messages(row["question"]))) or None
                    if row["query"] is None:
                        row["error"] = "rewrite: empty answer"
            except Exception as exc:  # noqa: BLE001 - recorded on the row
                row["error"] = f"{'rewrite' if row['question'] else 'question'}: {exc}"
            rows.append(row)
        return rows

    def __call__(self, chunks: pa.Table) -> pa.Table:
        rows = chunks.to_pylist()
        out = [r for result in self.pool.map(self._one, rows) for r in result]
        return pa.Table.from_pylist(out, schema=QUERIES_SCHEMA)
