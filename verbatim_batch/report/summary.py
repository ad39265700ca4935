"""What a command prints when a run commits: where its tables are and its main counts (``report.html``: the long
form)."""

from __future__ import annotations

import json
import os

from verbatim_batch.core import storage


def night_changes(manifest: dict) -> str | None:
    """What a night changed against its base, in a line (papers unchanged, changed, added, removed); else None."""
    if manifest.get("command") != "nightly":
        return None
    counts = manifest.get("counts") or {}
    if "chunks.papers_unchanged" in counts:
        return "papers: " + ", ".join(f"{counts.get('chunks.papers_' + k, 0)} {k}"
                                      for k in ("unchanged", "changed", "added", "removed"))
    if (base := _config(manifest).get("base")) is None:
        return f"papers: {counts.get('chunks.papers', 0)} added (first night)"
    return f"papers: {counts.get('chunks.papers_chunked', 0)} chunked, none carried from {base}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def night_stages(manifest: dict) -> str | None:
    """Each stage of a night in a line: ``unchanged`` where it did no work and nothing before it changed, else what
    it did; None for a run that is no night."""
    if manifest.get("command") != "nightly":
        return None
    c = manifest.get("counts") or {}
    chunked, removed = c.get("chunks.papers_chunked", 0), c.get("chunks.papers_removed", 0)
    first = _config(manifest).get("base") is None
    same = not first and not chunked and not removed  # the corpus as the base night had it
    chunk = "unchanged" if same else f"{_plural(chunked, 'paper')} chunked" + (f", {removed} removed" if removed
                                                                              else "")
    embedded = c.get("embeddings.rows_new", 0)
    same = same and not embedded
    embed = "unchanged" if same else (f"{_plural(embedded, 'chunk')} embedded, "
                                      f"{c.get('embeddings.rows_carried', 0)} carried")
    action = (manifest.get("index_update") or {}).get("action") or "rebuilt"
    action = "built" if first and action == "rebuilt" else action
    index = action if action != "added" else (f"added ({_plural(c.get('index.added', 0), 'vector')} added, "
                                              f"{c.get('index.removed', 0)} removed)")
    retrieve = "unchanged" if c.get("retrieval.reused") else "searched" if first else "searched again"
    extracted = c.get("spans.rows_new", 0)
    extract = "unchanged" if retrieve == "unchanged" and not extracted else (
        f"{_plural(extracted, 'pair')} extracted, {c.get('spans.rows_carried', 0)} carried")
    return f"stages: chunk {chunk}; embed {embed}; index {index}; retrieve {retrieve}; extract {extract}"


QUESTION_WORDS = frozenset("what how why which who whom whose when where does do did is are was were can could "
                           "should will would has have".split())


def looks_like_question(query: str) -> bool:
    """A natural question (ends with ``?`` or opens with a question word), not a keyword query."""
    words = query.strip().lower().split()
    return bool(words) and (query.strip().endswith("?") or words[0] in QUESTION_WORDS)


def _config(manifest: dict) -> dict:
    """A manifest's recorded ``config`` (a JSON text in a manifest; a dict where a caller built one), {} if none."""
    config = manifest.get("config")
    try:
        config = json.loads(config) if isinstance(config, str) else config
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def questions_hint(path: str, manifest: dict) -> str | None:
    """For an extract run by the offline (semantic) extractor whose queries are mostly natural questions: a line
    saying so, with the command that runs the highlighter (which answers them; the semantic one abstains)."""
    try:
        config = _config(manifest)
        if manifest.get("command") != "extract" or config.get("extractor") != "semantic":
            return None
        queries = set(storage.read_parquet(storage.join(path, "pairs"), columns=["query"])["query"].to_pylist())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a summary line is advice, never a reason to fail
    queries.discard(None)
    asked = sum(looks_like_question(q) for q in queries)
    if not queries or asked * 2 <= len(queries):
        return None
    return (f"{asked} of {len(queries)} queries look like natural questions: the offline semantic extractor suits "
            "keyword queries and abstains on many questions; the highlighter answers them: verbatim-batch extract "
            f"--retrieval {config.get('retrieval') or 'RETRIEVAL'} --extractor highlighter --model MODEL --output "
            "SPANS (docs/extraction.md)")


def truncated_lines(counts: dict, embedder: dict) -> list[str]:
    """An embed run's ``truncated`` count in words, with the options that change it."""
    truncated = counts.get("truncated", 0)
    limit = embedder.get("max_windows")
    # a truncated row of one window under a limit above one is a reference list (first window only); an older
    # manifest without the count takes every truncated row as cut at the limit
    references = counts.get("truncated_first_window", 0) if (limit or 1) > 1 else 0
    cut = truncated - references
    lines = []
    if cut:
        at = f"--max-windows {limit}" if limit else "--max-windows"
        lines.append(f"{cut} chunk(s) longer than {at} windows: the text past the last window is not embedded, so "
                     "retrieval does not find it there; a larger --max-windows embeds more (more vectors, more time)")
    if references:
        lines.append(f"{references} reference list(s) embedded in their first window only (cited titles match many "
                     "topics and answer none); --reference-windows embeds them whole")
    return lines


def print_run(path: str, manifest: dict) -> None:
    """Where a committed run's tables are, and its main counts."""
    counts = manifest["counts"]
    print(f"run {manifest['run_id']} committed to {path}")
    for name, info in manifest["tables"].items():
        folder = storage.join(path, name)  # or its single file (the index's ids.parquet)
        single = not storage.isdir(folder) and storage.exists(folder + ".parquet")
        print(f"  {name:<11} {info['rows']:>9} rows  {folder + '.parquet' if single else folder}")
    print(f"  manifest    {os.path.join(path, 'manifest.json')}")
    reasons = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("quarantine.")}
    if reasons:
        print(f"  quarantined by reason: {json.dumps(reasons, sort_keys=True)}")
    if "papers_bytes" in counts:
        print(f"  {counts['papers_bytes'] / 1e6:.1f} MB of papers in {manifest['timings_s']['total']:.1f} s")
    if skipped := manifest.get("skipped_files"):  # never silent: a folder of .pdf papers would chunk nothing
        first = ", ".join(skipped["first"][:3]) + (", ..." if skipped["count"] > 3 else "")
        print(f"  {skipped['count']} file(s) in the corpus folder not read, {skipped['why']}: {first}")
    if "pairs" in counts:
        print(f"  {counts['pairs']} pairs: {counts.get('pairs_with_spans', 0)} with spans, "
              f"{counts.get('pairs_abstained', 0)} abstained, {counts.get('pairs_failed', 0)} failed; "
              f"{counts.get('spans', 0)} spans, {counts.get('verbatim_violations', 0)} withheld as non-verbatim")
        if hint := questions_hint(path, manifest):
            print(f"  {hint}")
    if "truncated" in counts and "windows" in counts:  # an embed run
        print(f"  {counts.get('tokens', 0)} tokens; {counts.get('multi_window', 0)} chunks longer than the model's "
              f"window embedded in {counts.get('windows', 0)} windows in all")
        for line in truncated_lines(counts, _config(manifest).get("embedder") or {}):
            print(f"  {line}")
    elif counts.get("truncated"):  # a rerank run: (query, chunk) inputs cut to the reranker's length
        limit = (_config(manifest).get("reranker") or {}).get("max_length")
        at = f"--max-length {limit}" if limit else "--max-length"
        print(f"  {counts['truncated']} (query, chunk) input(s) cut to the reranker's {at} tokens: it scored the "
              "start of those chunks only; a larger --max-length (up to the model's own) scores more of each")
