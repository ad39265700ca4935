"""CPU floor of tokenising one ~1,500-token (query, chunk) pair with the Rust ``tokenizers`` (issue 25).

    .venv/bin/python benchmarks/bench_tokenizer_floor.py
    .venv/bin/python benchmarks/bench_tokenizer_floor.py --json benchmarks/results-tokenizer-floor.json

Asks whether "all host work <= 1 ms per 1,500-token pair per CPU core" is reachable: if the Rust tokenizer
alone needs more than 1 ms of CPU per pair, no Python-side work can bring the host work under it.

Pairs: ``seed_pairs`` of bench_host_feed.py (the 25 seed papers cut into pairs of ~1,500 MiniLM tokens, queries
from ``examples/queries.jsonl``). Two tokenizer families on the same pairs:

* ``wordpiece``: the bundled MiniLM BERT WordPiece (BertNormalizer with lowercasing, BertPreTokenizer);
* ``bytelevel_bpe``: a byte-level BPE built like ModernBERT's (GPT-NeoX/OLMo style: no normalizer, ByteLevel
  pre-tokenizer with its regex split, ByteLevel decoder, TemplateProcessing ``[CLS] $A [SEP] $B [SEP]``), its
  BPE model trained here (vocab_size 50,280) on the seed papers, since the real one is not available offline.
  Trained on the very text it encodes, it splits words into fewer pieces than a general vocabulary would, so it
  emits fewer tokens per pair; the BPE word cache hides most of the merge work either way.

Stages, each timed per pair in process CPU seconds, single-threaded (``RAYON_NUM_THREADS=1`` set before
``tokenizers`` is imported), best of ``--repeats`` (3), in groups of ``--group`` (64) pairs per call:

* ``pairs``: ``encode_batch`` of the (query, chunk) pairs with truncation ``only_second``, max_length 8192,
  stride 256, overflow windows, special tokens (as the highlighter's pair backend);
* ``queries``: ``encode_batch`` of the queries alone without special tokens (the highlighter's query check);
* ``chunk``: ``encode_batch`` of the chunks alone, no truncation;
* ``pre_tokenize``: the normalizer's ``normalize_str`` (if any) then ``pre_tokenizer.pre_tokenize_str`` of the
  query and the chunk; this includes building the Python list of (piece, offsets), so it is an upper bound on
  the Rust pre-tokenizer's own cost;
* ``no_model``: ``encode_batch`` of the chunks through a tokenizer with the same normalizer and pre-tokenizer but
  a one-entry WordLevel model (every pre-token becomes ``[UNK]``): normalising, pre-tokenising and building the
  encoding, all in Rust, without the vocabulary model's work;
* ``normalize`` (only where there is a normalizer): ``normalize_str`` of the query and the chunk.

Prints JSON; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: the Rust side on one core
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host_feed import CORPUS, DEFAULT_MODEL, _cpu_name, _version, seed_pairs  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def bytelevel_bpe(vocab_size: int) -> Tokenizer:
    """A ModernBERT-like byte-level BPE, its merges trained on the seed papers."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(sorted(glob.glob(str(CORPUS / "corpus" / "*.md"))), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(s, tok.token_to_id(s)) for s in ("[CLS]", "[SEP]")])
    return tok


def wordpiece() -> tuple[Tokenizer, object]:
    """The bundled MiniLM tokenizer: a fresh copy of its Rust backend, and the transformers wrapper."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    return Tokenizer.from_str(hf.backend_tokenizer.to_str()), hf


def best_cpu(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def measure(tok: Tokenizer, queries: list[str], chunks: list[str], group: int, repeats: int,
            max_length: int, stride: int) -> dict:
    n = len(queries)
    spans = [range(s, min(s + group, n)) for s in range(0, n, group)]
    pair_tok = Tokenizer.from_str(tok.to_str())
    pair_tok.no_padding()
    pair_tok.enable_truncation(max_length=max_length, stride=stride, strategy="only_second")
    plain = Tokenizer.from_str(tok.to_str())
    plain.no_padding()
    plain.no_truncation()
    norm, pre = tok.normalizer, tok.pre_tokenizer
    bare = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    if norm is not None:
        bare.normalizer = norm
    bare.pre_tokenizer = pre

    def pairs():
        for r in spans:
            pair_tok.encode_batch([(queries[i], chunks[i]) for i in r], add_special_tokens=True)

    def query():
        for r in spans:
            plain.encode_batch([queries[i] for i in r], add_special_tokens=False)

    def chunk():
        for r in spans:
            plain.encode_batch([chunks[i] for i in r], add_special_tokens=False)

    def pretok():
        for q, c in zip(queries, chunks, strict=True):
            if norm is not None:
                q, c = norm.normalize_str(q), norm.normalize_str(c)
            pre.pre_tokenize_str(q)
            pre.pre_tokenize_str(c)

    def no_model():
        for r in spans:
            bare.encode_batch([chunks[i] for i in r], add_special_tokens=False)

    def normalize():
        for q, c in zip(queries, chunks, strict=True):
            norm.normalize_str(q)
            norm.normalize_str(c)

    pairs()  # warm-up (BPE word cache, allocations)
    encs = pair_tok.encode_batch(list(zip(queries, chunks, strict=True)), add_special_tokens=True)
    tokens = [len(e) for e in encs]
    windows = sum(1 + len(e.overflowing) for e in encs)
    pieces = [len(pre.pre_tokenize_str(norm.normalize_str(c) if norm is not None else c)) for c in chunks]
    chars = sum(len(q) + len(c) for q, c in zip(queries, chunks, strict=True))
    chunk_chars = sum(len(c) for c in chunks)
    stages = {"pairs": (pairs, chars), "queries": (query, chars - chunk_chars), "chunk": (chunk, chunk_chars),
              "pre_tokenize": (pretok, chars), "no_model": (no_model, chunk_chars)}
    if norm is not None:
        stages["normalize"] = (normalize, chars)
    out = {"vocab_size": tok.get_vocab_size(),
           "normalizer": type(norm).__name__ if norm is not None else None,
           "pre_tokenizer": type(pre).__name__,
           "tokens_per_pair": {"min": min(tokens), "median": statistics.median(tokens), "max": max(tokens)},
           "windows": windows, "pre_tokens_per_chunk_median": statistics.median(pieces), "stages": {}}
    for name, (fn, n_chars) in stages.items():
        cpu = best_cpu(fn, repeats)
        out["stages"][name] = {"cpu_s": round(cpu, 4), "ms_per_pair": round(1000 * cpu / n, 4),
                               "chars_per_s": round(n_chars / cpu) if cpu > 0 else None}
    out["stages"]["pairs"]["ms_per_1000_tokens"] = round(
        1000 * out["stages"]["pairs"]["cpu_s"] / sum(tokens) * 1000, 4)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target-tokens", type=int, default=1500)
    ap.add_argument("--max-length", type=int, default=8192)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=50280)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    wp, hf = wordpiece()
    table = seed_pairs(args.pairs, hf, args.target_tokens)
    queries, chunks = table["query"].to_pylist(), table["chunk"].to_pylist()
    t0 = time.process_time()
    bpe = bytelevel_bpe(args.vocab_size)
    train_s = time.process_time() - t0
    result = {
        "benchmark": "bench_tokenizer_floor",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": _cpu_name(),
                    "load_avg_at_start": list(os.getloadavg())},
        "versions": {"tokenizers": _version("tokenizers"), "transformers": _version("transformers"),
                     "python": platform.python_version()},
        "settings": {"RAYON_NUM_THREADS": os.environ["RAYON_NUM_THREADS"], "repeats": args.repeats,
                     "group": args.group, "max_length": args.max_length, "stride": args.stride,
                     "timer": "time.process_time, best of repeats"},
        "pairs": {"n": len(queries), "target_tokens": args.target_tokens,
                  "chunk_chars_median": statistics.median(len(c) for c in chunks),
                  "query_chars_median": statistics.median(len(q) for q in queries)},
        "bytelevel_bpe_train_cpu_s": round(train_s, 2),
        "tokenizers": {},
    }
    for name, tok in (("wordpiece", wp), ("bytelevel_bpe", bpe)):
        r = measure(tok, queries, chunks, args.group, args.repeats, args.max_length, args.stride)
        print(f"{name}: {json.dumps(r)}", file=sys.stderr, flush=True)
        result["tokenizers"][name] = r
    result["machine"]["load_avg_at_end"] = list(os.getloadavg())
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
