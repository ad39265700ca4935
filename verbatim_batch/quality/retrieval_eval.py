"""Retrieval metrics on labelled queries: a run + qrels -> nDCG@10, MRR@10 and Recall@k per method.

The metrics are trec_eval's own (``pytrec_eval``), never computed here; this module reads the inputs: a **run**
(a retrieval or rerank run folder, one list per ``method``, or a TREC run file, one method per tag) and **qrels**
(TREC, BEIR TSV or JSONL, or gold pairs rows as ``evaluate --gold`` takes, whose query is found by its text in the
run's query file and chunk by ``(paper_id, chunk text)`` in its chunk table). At ``level="paper"`` each paper
ranks at its best chunk.

Conventions (BEIR's and TREC's): a query counts when it has a relevant document; one the run has no row for scores
0; unjudged documents are not relevant. A run folder's lists are scored in rank order (ranks passed as scores), a
TREC file's by its scores. MRR@10 is ``recip_rank`` on lists cut at 10; nDCG@10 is ``ndcg_cut.10``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from verbatim_batch.core import storage
from verbatim_batch.core.records import read_queries
from verbatim_batch.core.tables import query_id_for
from verbatim_batch.quality.evaluate import read_jsonl

Qrels = dict[str, dict[str, int]]  # query id -> {doc id: relevance}
Run = dict[str, dict[str, dict[str, float]]]  # method -> query id -> {doc id: score}

LEVELS = ("chunk", "paper")
DEFAULT_RECALL_AT = (5, 10, 100)
_QUERY_KEYS = ("query_id", "query-id", "qid")
_DOC_KEYS = ("doc_id", "corpus-id", "corpus_id", "docid", "chunk_id")
_REL_KEYS = ("relevance", "score", "rel", "label")


def _evaluator(qrels: Qrels, measures: set[str]):
    try:
        import pytrec_eval
    except ImportError:  # a runtime dependency: only a broken install lacks it
        raise ImportError("evaluate-retrieval needs pytrec_eval: pip install pytrec-eval-terrier") from None
    return pytrec_eval.RelevanceEvaluator(qrels, measures)


def _text_lines(path: str) -> Iterable[tuple[int, str]]:
    fs, local = storage.resolve(path)
    with fs.open_input_stream(local) as raw, io.TextIOWrapper(raw, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, line.rstrip("\n")


def _first(row: Mapping[str, Any], keys: Sequence[str]) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _relevance(value: Any, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: relevance must be a number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{where}: relevance must be an integer grade, got {value!r}")
    return int(number)


class ChunkKeys:
    """``(paper_id, chunk text)`` and ``(paper_id, chunk_index)`` -> ``chunk_id`` of a chunk table."""

    def __init__(self, chunks_dir: str) -> None:
        table = storage.read_parquet(chunks_dir, columns=["chunk_id", "paper_id", "chunk_index", "text"])
        ids, papers = table["chunk_id"].to_pylist(), table["paper_id"].to_pylist()
        self.by_text = dict(zip(zip(papers, table["text"].to_pylist(), strict=True), ids, strict=True))
        self.by_index = dict(zip(zip(papers, table["chunk_index"].to_pylist(), strict=True), ids, strict=True))

    def find(self, paper_id: Any, text: Any, index: Any = None) -> str | None:
        """The chunk id of a paper's chunk named by its text, else by its index."""
        if isinstance(text, str):
            return self.by_text.get((str(paper_id), text))
        if isinstance(index, int) and not isinstance(index, bool):
            return self.by_index.get((str(paper_id), index))
        return None


def read_qrels(path: str, *, level: str = "chunk", chunks: ChunkKeys | None = None,
               query_ids: Mapping[str, str] | None = None) -> tuple[Qrels, dict[str, int]]:
    """``(qrels, counts)`` of a qrels file in any format the module docstring lists (judgments, unplaced gold rows)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if not storage.exists(path):
        raise FileNotFoundError(f"qrels file not found: {path}")
    qrels: Qrels = {}
    counts = {"judgments": 0, "unplaced_gold_rows": 0}

    def add(qid: Any, doc: Any, rel: int) -> None:
        docs = qrels.setdefault(str(qid), {})
        docs[str(doc)] = max(rel, docs.get(str(doc), rel))  # a pair judged twice keeps its higher grade
        counts["judgments"] += 1

    name = path.lower()
    if name.endswith((".jsonl", ".json")):
        for lineno, row in read_jsonl(path):
            where = f"{path}, line {lineno}"
            if "query" in row and "paper_id" in row and ("relevant" in row or "gold_spans" in row):
                rel = bool(row["relevant"]) if "relevant" in row else bool(row.get("gold_spans"))
                query = row["query"]
                if not isinstance(query, str) or not query.strip():
                    raise ValueError(f"{where}: a gold row needs a non-empty query")
                qid = _first(row, _QUERY_KEYS) or (query_ids or {}).get(query) or query_id_for(query)
                if level == "paper":
                    doc = row["paper_id"]
                else:
                    doc = row.get("chunk_id") or (
                        chunks.find(row["paper_id"], row.get("chunk"), row.get("chunk_index")) if chunks else None)
                    if doc is None:
                        if chunks is None:
                            raise ValueError(f"{where}: a gold row without chunk_id needs the chunk table (--chunks, "
                                             "or a run whose manifests lead to it) to find its chunk")
                        counts["unplaced_gold_rows"] += 1
                        continue
                add(qid, doc, int(rel))
                continue
            qid, doc, rel = _first(row, _QUERY_KEYS), _first(row, _DOC_KEYS), _first(row, _REL_KEYS)
            if qid is None or doc is None or rel is None:
                raise ValueError(f"{where}: expected query_id, doc_id (or corpus-id) and relevance (or score), "
                                 f"or a gold row (query, paper_id, chunk, relevant); got keys {sorted(row)}")
            add(qid, doc, _relevance(rel, where))
    elif name.endswith(".tsv"):
        for lineno, line in _text_lines(path):
            parts = line.split("\t")
            if lineno == 1 and parts[0].strip().lower() in ("query-id", "query_id", "qid"):
                continue  # the BEIR header
            if len(parts) != 3:
                raise ValueError(f"{path}, line {lineno}: expected query-id, corpus-id, score (tab-separated)")
            add(parts[0].strip(), parts[1].strip(), _relevance(parts[2].strip(), f"{path}, line {lineno}"))
    else:
        for lineno, line in _text_lines(path):
            parts = line.split()
            if len(parts) != 4:
                raise ValueError(f"{path}, line {lineno}: expected TREC qrels 'qid iter docid rel', got {line!r}")
            add(parts[0], parts[2], _relevance(parts[3], f"{path}, line {lineno}"))
    if not qrels:
        unplaced = counts["unplaced_gold_rows"]
        raise ValueError(f"{path}: no judgments" + (
            f": none of its {unplaced} gold rows names a chunk of the chunk table (by chunk_id, paper_id + chunk "
            "text, or paper_id + chunk_index)" if unplaced else ": expected TREC qrels (qid iter docid rel), BEIR "
            "TSV/JSONL (query-id, corpus-id, score) or gold rows (query, paper_id, chunk or chunk_index, relevant)"))
    return qrels, counts


def is_run_folder(path: str) -> bool:
    return storage.isdir(path) and storage.exists(storage.join(path, "manifest.json"))


def read_run(path: str, level: str = "chunk") -> Run:
    """``{method: {query_id: {doc_id: score}}}`` of a retrieval/rerank run folder or a TREC run file."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    run: Run = {}
    if is_run_folder(path):
        from verbatim_batch.core.runs import read_table

        return run_from_table(read_table(path, "retrieval", ["query_id", "rank", "chunk_id", "paper_id", "method"]),
                              level)
    if not storage.exists(path):
        raise FileNotFoundError(f"run not found: {path} (a retrieval run folder or a TREC run file)")
    if level == "paper":
        raise ValueError("--level paper needs a run folder (a TREC run file has no paper ids)")
    for lineno, line in _text_lines(path):
        parts = line.split()
        if len(parts) != 6:
            raise ValueError(f"{path}, line {lineno}: expected a TREC run line 'qid Q0 docid rank score tag'")
        try:
            score = float(parts[4])
        except ValueError:
            raise ValueError(f"{path}, line {lineno}: score {parts[4]!r} is not a number") from None
        docs = run.setdefault(parts[5], {}).setdefault(parts[0], {})
        docs[parts[2]] = max(docs.get(parts[2], -math.inf), score)
    if not run:
        raise ValueError(f"{path}: no run lines")
    return run


def run_from_table(table, level: str = "chunk") -> Run:
    """``{method: {query_id: {doc_id: -rank}}}`` of a retrieval table (ranks as scores: trec_eval keeps our order);
    at ``level="paper"`` each paper at its best chunk's rank."""
    run: Run = {}
    doc_column = "paper_id" if level == "paper" else "chunk_id"
    for qid, rank, doc, method in zip(table["query_id"].to_pylist(), table["rank"].to_pylist(),
                                      table[doc_column].to_pylist(), table["method"].to_pylist(), strict=True):
        docs = run.setdefault(method, {}).setdefault(qid, {})
        docs[doc] = max(docs.get(doc, -math.inf), -float(rank))
    return run


def run_sources(path: str) -> dict[str, str | None]:
    """The query file and chunk table a run folder was made from (through its manifests), when it has them."""
    from verbatim_batch.core.runs import manifest_config

    if not is_run_folder(path):
        return {"queries": None, "chunks": None}
    config = manifest_config(path)
    chunks = None
    if config.get("index"):
        try:
            chunks = manifest_config(config["index"]).get("chunks")
        except (FileNotFoundError, OSError, ValueError, KeyError):
            chunks = None
    return {"queries": config.get("queries"), "chunks": config.get("chunks") or chunks}


def evaluate_run(run: Run, qrels: Qrels, recall_at: Sequence[int] = DEFAULT_RECALL_AT,
                 per_query: bool = False) -> dict[str, Any]:
    """Per method: ``nDCG@10``, ``MRR@10`` and ``Recall@k`` for each ``k`` in ``recall_at``, averaged over the
    queries with at least one relevant document (a query missing from the method's run scores 0)."""
    ks = sorted({int(k) for k in recall_at})
    if not ks or ks[0] < 1:
        raise ValueError(f"recall cutoffs must be positive integers, got {list(recall_at)}")
    labelled = {q: docs for q, docs in qrels.items() if any(r > 0 for r in docs.values())}
    if not labelled:
        raise ValueError("the qrels mark no document relevant: nothing to measure")
    names = {"ndcg_cut_10": "nDCG@10", "recip_rank": "MRR@10", **{f"recall_{k}": f"Recall@{k}" for k in ks}}
    full = _evaluator(labelled, {"ndcg_cut.10", *(f"recall.{k}" for k in ks)})
    cut = _evaluator(labelled, {"recip_rank"})
    out: dict[str, Any] = {}
    for method in sorted(run):
        lists = {q: docs for q, docs in run[method].items() if q in labelled and docs}
        scores = full.evaluate(lists)
        # each list cut at 10 in trec_eval's order: score descending, then doc id descending
        top = {q: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:10])
               for q, docs in lists.items()}
        for q, res in cut.evaluate(top).items():
            scores.setdefault(q, {}).update(res)
        queries = {q: {names[m]: float(scores.get(q, {}).get(m, 0.0)) for m in names} for q in labelled}
        summary: dict[str, Any] = {name: sum(v[name] for v in queries.values()) / len(queries)
                                   for name in names.values()}
        summary["queries"] = len(queries)
        summary["queries_without_rows"] = sum(1 for q in labelled if q not in lists)
        if per_query:
            summary["per_query"] = queries
        out[method] = summary
    return out


def evaluate_retrieval(run_path: str, qrels_path: str, *, level: str = "chunk", chunks: str | None = None,
                       queries: str | None = None, recall_at: Sequence[int] = DEFAULT_RECALL_AT,
                       per_query: bool = False) -> dict[str, Any]:
    """Score every method of a run against qrels (its query file and chunk table from its manifests unless given)."""
    sources = run_sources(run_path)
    for name, given in (("queries", queries), ("chunks", chunks)):
        where = f"--{name}" if given else f"the manifest of {run_path}"
        path = given or sources[name]
        if path and not storage.exists(path):  # never a silent score of 0 from a path that resolves elsewhere
            raise FileNotFoundError(f"{name} not found: {path} (from {where})")
    chunks = chunks or sources["chunks"]
    queries = queries or sources["queries"]
    query_ids = None
    if queries:
        table, _ = read_queries(queries)
        query_ids = dict(zip(table["query"].to_pylist(), table["query_id"].to_pylist(), strict=True))
    chunk_keys = None
    if chunks and level == "chunk":  # a chunk run folder's chunks table, or the path itself (a table)
        inner = storage.join(chunks, "chunks")
        chunk_keys = ChunkKeys(inner if storage.isdir(inner) else chunks)
    qrels, counts = read_qrels(qrels_path, level=level, chunks=chunk_keys, query_ids=query_ids)
    run = read_run(run_path, level)
    labelled = {q for q, docs in qrels.items() if any(r > 0 for r in docs.values())}
    if labelled and not any(labelled & set(lists) for lists in run.values()):
        raise ValueError(f"none of the {len(labelled)} labelled queries of {qrels_path} is in the run {run_path} "
                         "(their query ids differ: give the run's --queries file, or qrels keyed by its query ids)")
    methods = evaluate_run(run, qrels, recall_at, per_query=per_query)
    return {"run": run_path, "qrels": qrels_path, "level": level, "recall_at": sorted(set(recall_at)),
            "labelled_queries": sum(1 for d in qrels.values() if any(r > 0 for r in d.values())),
            "judged_queries": len(qrels), **counts, "methods": methods,
            "metrics_by": "trec_eval through " + _trec_eval_version()}


def _trec_eval_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("pytrec-eval-terrier", "pytrec_eval"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown version"


def format_results(result: Mapping[str, Any]) -> str:
    """A table: one row per method."""
    ks = result["recall_at"]
    head = ["method", "queries", "nDCG@10", "MRR@10", *(f"R@{k}" for k in ks)]
    rows = [head]
    for method, m in result["methods"].items():
        rows.append([method, str(m["queries"]), f"{m['nDCG@10']:.3f}", f"{m['MRR@10']:.3f}",
                     *(f"{m[f'Recall@{k}']:.3f}" for k in ks)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    notes = [f"{result['labelled_queries']} queries with a relevant {result['level']} "
             f"({result['judgments']} judgments; metrics by {result['metrics_by']})"]
    if result.get("unplaced_gold_rows"):
        notes.append(f"{result['unplaced_gold_rows']} gold rows left out: their chunk text is not in the chunk table")
    missing = {m: v["queries_without_rows"] for m, v in result["methods"].items() if v["queries_without_rows"]}
    if missing:
        notes.append(f"labelled queries with no row in the run (scored 0): {missing}")
    return "\n".join([*lines, *notes])
