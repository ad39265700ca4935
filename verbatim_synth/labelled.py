"""Labelled retrieval queries drawn from known chunks (for recall checks and the demo).

Each query comes from one sentence of one chunk, so the chunk it came from is the
label. Two styles: ``sentence`` (the sentence itself) and ``keywords`` (a few of its
content words, in order, like a search-engine query; much harder for BM25 and
dense retrieval alike). Deterministic in (chunks, n, seed, style).
"""

from __future__ import annotations

import random
import re

import pyarrow as pa

from verbatim_batch.core.tables import stable_hash

_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?](?=\s|$))")
_WORD_RE = re.compile(r"[^\W_][\w\-]*", re.UNICODE)
STOPWORDS = frozenset(
    """a an the and or but of in on at to for from by with without as is are was were be been being this that
    these those it its we our they their them he she his her you your i not no nor so than then there here which
    who whom whose what when where why how all any both each few more most other some such only own same too very
    can will just should now also into over under again further once during before after above below up down out
    off between through while about against because until do does did doing have has had having may might must
    shall would could et al e g i e""".split()
)
LABELLED_SCHEMA = pa.schema(
    [
        ("query_id", pa.string()),
        ("query", pa.string()),
        ("chunk_id", pa.string()),
        ("paper_id", pa.string()),
        ("style", pa.string()),
    ]
)


def candidate_sentences(text: str, min_words: int = 8, max_words: int = 45) -> list[str]:
    """Prose sentences of a chunk (no headings, tables, code, captions or placeholders)."""
    out = []
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped or stripped[0] in "#|`~<-*" or stripped.lower().startswith(("table ", "figure ")):
            continue
        for m in _SENTENCE_RE.finditer(stripped):
            sentence = m.group(0).strip()
            n_words = len(sentence.split())
            if min_words <= n_words <= max_words and "http" not in sentence:
                out.append(sentence)
    return out


def keywords(sentence: str, n: int, rng: random.Random) -> str:
    words = [w.lower() for w in _WORD_RE.findall(sentence)]
    content = [w for w in words if w not in STOPWORDS and not w.isdigit() and len(w) > 2]
    if len(content) <= n:
        return " ".join(content)
    keep = sorted(rng.sample(range(len(content)), n))
    return " ".join(content[i] for i in keep)


def make_labelled_queries(chunks: pa.Table, n: int, seed: int = 0, style: str = "keywords") -> pa.Table:
    """``n`` queries (one per sampled chunk) with the chunk they came from."""
    if style not in ("keywords", "sentence"):
        raise ValueError(f"style must be 'keywords' or 'sentence', got {style!r}")
    rng = random.Random(f"{seed}:{style}")
    rows = chunks.select(["chunk_id", "paper_id", "text"]).to_pylist()
    rows.sort(key=lambda r: r["chunk_id"])
    rng.shuffle(rows)
    out = []
    seen_papers: set[str] = set()
    for row in rows:
        if len(out) >= n:
            break
        if row["paper_id"] in seen_papers:
            continue  # one query per paper spreads the set over the corpus
        sentences = candidate_sentences(row["text"])
        if not sentences:
            continue
        sentence = rng.choice(sentences)
        query = sentence if style == "sentence" else keywords(sentence, rng.randint(4, 7), rng)
        if len(query.split()) < 3:
            continue
        seen_papers.add(row["paper_id"])
        qid = "q-" + stable_hash(row["chunk_id"], style, str(seed), size=6)
        out.append({"query_id": qid, "query": query, "chunk_id": row["chunk_id"],
                    "paper_id": row["paper_id"], "style": style})
    return pa.Table.from_pylist(out, schema=LABELLED_SCHEMA)
