"""Helpers shared by several test modules (no test module imports another: they import from here).

Other shared modules beside this one: llmserver.py (a real OpenAI-compatible server), s3server.py (moto's S3
server on loopback), raycluster.py (a local multi-node Ray cluster), chain_digest.py (digests of a chain's
tables) and docblocks.py (the guide's fenced code blocks and shell command lines). Heavy imports (torch,
transformers) stay inside the functions that need them, so that importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from verbatim_batch.core.tables import text_chunk_id

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "verbatim_batch" / "examples"
PAPERS = sorted(p.name for p in (EXAMPLES / "corpus").glob("*.md"))


# --- nightly runs: a corpus, one `verbatim-batch nightly` process, its tables compared ---------------------

# Columns that measure a run rather than describe its output.
MEASURED = {"latency_ms"}


def make_corpus(folder: Path, names: list[str], n_queries: int = 4) -> Path:
    """Papers, their metadata and the first ``n_queries`` bundled queries (``queries.jsonl`` beside the folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(EXAMPLES / "corpus" / name, folder / name)
    shutil.copy(EXAMPLES / "corpus" / "metadata.jsonl", folder / "metadata.jsonl")
    lines = (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()[:n_queries]
    (folder.parent / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def nightly(root: Path, corpus: Path, run_id: str, *extra: str, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """One `verbatim-batch nightly` process (its own local Ray, 2 CPUs)."""
    cmd = [sys.executable, "-c", "import sys; from verbatim_batch.cli import main; sys.exit(main())", "nightly",
           "--input", str(corpus), "--metadata", str(corpus / "metadata.jsonl"),
           "--queries", str(corpus.parent / "queries.jsonl"), "--root", str(root), "--run-id", run_id,
           "--num-cpus", "2", "--extract-batch-rows", "16", "--embed-batch-rows", "64", *extra]
    base = {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "VERBATIM_BATCH_FAULT", "VERBATIM_BATCH_DRIVER_PID")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=base | {"HF_HUB_OFFLINE": "1"} | (env or {}))
    if check:
        assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done


def canonical(table: pa.Table, drop: set[str] = frozenset()) -> pa.Table:
    """The table without measured columns, rows in a fixed order (file order is not part of the contract)."""
    table = table.drop_columns([c for c in table.column_names if c in MEASURED | set(drop)])
    keys = [f.name for f in table.schema if not pa.types.is_nested(f.type) and not pa.types.is_floating(f.type)
            and not pa.types.is_fixed_size_list(f.type)]
    return table.sort_by([(k, "ascending") for k in keys])


def assert_tables_match(got: pa.Table, want: pa.Table, what: str, drop: set[str] = frozenset()) -> None:
    """Same rows. Model scores (floats) agree to 1e-5: a pair scored in another batch (carried from an
    earlier night, or redone after a resume) gets the same spans, but its score can differ in the last bits."""
    got, want = canonical(got, drop), canonical(want, drop)
    floats = [f.name for f in got.schema if pa.types.is_floating(f.type)]
    assert got.num_rows == want.num_rows, f"{what}: {got.num_rows} rows, expected {want.num_rows}"
    g, w = got.drop_columns(floats), want.drop_columns(floats)
    if not g.equals(w):
        rows = [(a, b) for a, b in zip(g.to_pylist(), w.to_pylist(), strict=True) if a != b]
        raise AssertionError(f"{what} differs in {len(rows)} rows; first: got {rows[0][0]}, expected {rows[0][1]}"
                             if rows else f"{what} differs (types or metadata)")
    for name in floats:
        g, w = got[name].to_numpy(zero_copy_only=False), want[name].to_numpy(zero_copy_only=False)
        np.testing.assert_allclose(g.astype(float), w.astype(float), atol=1e-5, err_msg=f"{what}.{name}")


# Every table of a nightly run, as (stage, table).
RUN_TABLES = [("chunks", "papers"), ("chunks", "chunks"), ("chunks", "quarantine"), ("embeddings", "embeddings"),
              ("index", "ids.parquet"), ("retrieval", "retrieval"), ("spans", "spans"), ("spans", "pairs"),
              ("spans", "rejects")]


def assert_same_run(root: Path, base: Path, run_id: str = "r1") -> None:
    """Every table of every stage equals the uninterrupted run's: no row missing, none duplicated."""
    for stage, table in RUN_TABLES:
        got = pq.read_table(root / "runs" / run_id / stage / table)
        want = pq.read_table(base / "runs" / run_id / stage / table)
        if table == "embeddings":  # vectors: compared numerically (batch makeup may differ after a resume)
            got, want = got.sort_by("chunk_id"), want.sort_by("chunk_id")
            assert got["chunk_id"].equals(want["chunk_id"]), "embeddings: other chunks"
            np.testing.assert_allclose(np.stack(got["vector"].to_numpy(zero_copy_only=False)),
                                       np.stack(want["vector"].to_numpy(zero_copy_only=False)), atol=1e-5)
            got, want = got.drop_columns(["vector"]), want.drop_columns(["vector"])
        assert_tables_match(got, want, f"{stage}/{table}")
    manifest = json.loads((root / "runs" / run_id / "manifest.json").read_text())
    assert manifest["status"] == "committed"
    assert (root / "current").resolve() == (root / "runs" / run_id).resolve()


# --- tiny random-weight models built from configs, saved, loaded through the real code -----------------------


def make_token_classifier(path: Path, num_labels: int = 2, max_positions: int = 512, seed: int = 0,
                          config_patch: dict | None = None) -> Path:
    """A tiny ModernBERT token classifier (the highlighter's shape), with the bundled MiniLM tokenizer."""
    import torch
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(seed)
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=max_positions, pad_token_id=0,
                           cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
                           global_attn_every_n_layers=2, local_attention=16, num_labels=num_labels)
    model = ModernBertForTokenClassification(cfg)
    with torch.no_grad():  # spread the logits so that probabilities vary across tokens
        model.classifier.weight.mul_(40.0)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    if config_patch:
        conf = json.loads((path / "config.json").read_text())
        conf.update(config_patch)
        (path / "config.json").write_text(json.dumps(conf))
    return path


# A chunk for the highlighter tests.
CHUNK = ("We train the tagger on 12k sentences. Results improve by 3.1 points over the baseline. "
         "Table 2 lists the scores per domain, and the ablation removes the CRF layer. ") * 4


def _save(model, path: Path) -> None:
    import inspect

    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    model.save_pretrained(str(path), **kwargs)


def tiny_model_dir(path: Path, arch: str, pooling: str | None = None) -> Path:
    """A tiny random-weight embedding model (``arch``: bert or modernbert), optionally with a
    sentence-transformers pooling config (``pooling``: cls or mean)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, ModernBertConfig, ModernBertModel

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(0)
    if arch == "bert":
        cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512, pad_token_id=0)
        model = BertModel(cfg)
    else:
        cfg = ModernBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=128, max_position_embeddings=512, pad_token_id=0,
                               cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
                               global_attn_every_n_layers=2, local_attention=16)
        model = ModernBertModel(cfg)
    path.mkdir(parents=True, exist_ok=True)
    _save(model, path)
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    if pooling:
        (path / "1_Pooling").mkdir(exist_ok=True)
        (path / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": 64,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
        }))
    return path


def make_cross_encoder(path: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A tiny random BERT sequence classifier with the bundled MiniLM tokenizer, saved as safetensors."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, num_labels=num_labels)
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():  # spread the scores so that they differ between pairs
        model.classifier.weight.mul_(50.0)
    model.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    return path


# Sentences for the embedding tests: ordinary, empty, short, long, non-ASCII.
SENTENCES = [
    "We fine-tune the encoder on named entity recognition with a CRF head.",
    "Table 3 reports BLEU scores on the WMT14 English-German test set.",
    "The tokenizer splits rare words into sub-word units.",
    "Our baseline is a bidirectional LSTM with attention.",
    "Results are averaged over five random seeds.",
    "",
    "Short.",
    "A much longer sentence that keeps going " * 12,
    "Données et naïve café — 中文 text with ≤ symbols.",
    "The model achieves 45.3% accuracy on the held-out split.",
]


# --- evaluate: gold rows and a span run's rows -----------------------------------------------------------------

CHUNK_A = "Alpha beta gamma delta."  # Alpha 0-5, beta 6-10, gamma 11-16, delta. 17-23
CHUNK_B = "One two three four."  # One 0-3, two 4-7, three 8-13, four. 14-19
CHUNK_C = "Epsilon zeta eta."

GOLD = [
    # ids given: matched on (query, paper_id, chunk_index)
    {"query": "q1", "paper_id": "P1", "chunk_index": 0, "chunk": CHUNK_A, "relevant": True,
     "gold_spans": ["beta gamma", {"start": 0, "end": 5}, "not in the chunk"]},
    # no ids: matched on (query, chunk) or (query, text_chunk_id(chunk))
    {"query": "q2", "chunk": CHUNK_B, "relevant": False, "gold_spans": ["TWO three"]},
    {"query": "q1", "paper_id": "P1", "chunk_index": 1, "chunk": CHUNK_C, "gold_spans": None},
]


def span_row(query, paper_id, chunk_index, chunk_id, start, end, text):
    return {
        "run_id": "run-1", "pair_id": "p", "query_id": query, "query": query, "paper_id": paper_id,
        "chunk_id": chunk_id, "chunk_index": chunk_index, "start": start, "end": end, "text": text,
        "extractor": "test", "config_hash": "h",
    }


SPAN_ROWS = [
    span_row("q1", "P1", 0, "c-0", 6, 16, "beta gamma"),  # matches gold row 1
    span_row("q1", "P1", 0, "c-0", 0, 5, "Alphx"),  # text differs from the gold chunk: offset mismatch
    span_row("q2", None, None, text_chunk_id(CHUNK_B), 4, 7, "two"),  # gold row 2 through its text hash
    span_row("q1", "P2", 0, "c-9", 0, 3, "abc"),  # no such gold pair
]


# --- reports rendered in a real headless Chromium ---------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render(path: str, tmp_path) -> str:
    """The DOM headless Chromium builds from a page (file:// only: the page loads nothing else)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}",
           "--dump-dom", f"file://{path}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


MARK = re.compile(r'<mark class="span" data-start="(\d+)" data-end="(\d+)" title="([^"]+)">(.*?)</mark>', re.S)


def reindex_files(run: Path) -> None:
    """Rewrite a run's ``files.json`` to what its table files now hold (size, digest): a test that edits a
    committed run's rows on purpose, to exercise the checks of the rows themselves, hides its edit from the
    byte check (``verify`` reports a file whose bytes differ from ``files.json`` on its own)."""
    from verbatim_batch.core import storage

    run = Path(run)
    index = json.loads((run / "files.json").read_text(encoding="utf-8"))
    for table in list(index):
        entries = index[table]
        for f in sorted((run / table).glob("*.parquet")):
            known = entries.get(f.name, {"rows": pq.ParquetFile(f).metadata.num_rows, "counts": {}})
            entries[f.name] = known | {"bytes": f.stat().st_size, "digest": storage.file_digest(str(f)),
                                       "rows": pq.ParquetFile(f).metadata.num_rows}
    (run / "files.json").write_text(json.dumps(index, sort_keys=True), encoding="utf-8")
