"""Embedding throughput on CPU: our Embedder (token-budget batching) vs sentence-transformers.

    .venv/bin/python benchmarks/bench_embedding.py --n 5000
    .venv/bin/python benchmarks/bench_embedding.py --n 1000 --max-length 512 --json emb512.json
    .venv/bin/python benchmarks/bench_embedding.py --n 1000 --random-modernbert   # no truncation

Builds ``--n`` realistic chunks (``chunk_markdown`` over ``synth.generate_paper(0, i)`` papers,
in order, with their context line: the embedding text is ``context + "\\n\\n" + text``) and
embeds them, in one run and side by side, with the same model (the bundled all-MiniLM-L6-v2),
the same texts, the same max length and the same torch thread count:

  * sentence-transformers ``SentenceTransformer(path).encode(texts, batch_size=B)`` for each
    ``--st-batch-sizes`` (32 is its default; it sorts texts by character length);
  * ``verbatim_batch.retrieval.embedder.Embedder`` for each ``--budgets`` token budget (texts sorted by
    token length, ``rows * longest <= budget`` per forward pass).

Every method is warmed up first; then the methods run interleaved (so background load hits
them alike) ``--repeats`` times each and the best wall time counts. Real tokens (non-pad,
after truncation; identical for both) / best wall time = tokens/s. The padding fraction of
sentence-transformers' batches is computed from its own ordering (by characters, batch_size
rows) and the true token lengths. The tokenize vs forward split is measured for both (ST's
``preprocess`` is wrapped with a timer). The vectors are checked against each other (cosine).

``--random-modernbert`` swaps the model for a MiniLM-sized ModernBERT with random weights
(6 layers, hidden 384, sliding-window attention every layer but each third, 8192 positions,
the MiniLM tokenizer) saved as safetensors in a temp dir and loaded by both sides: it shows
the long-context case (like granite-embedding-english-r2, where chunks are not truncated).

Prints JSON; ``--json PATH`` also writes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verbatim_batch.corpus.chunker import build_context, chunk_markdown  # noqa: E402
from verbatim_batch.retrieval.embedder import DEFAULT_MODEL, Embedder, EmbedderConfig, plan_batches  # noqa: E402
from verbatim_synth import corpus as synth  # noqa: E402


def build_texts(n: int, seed: int = 0) -> list[str]:
    texts, i = [], 0
    while len(texts) < n:
        paper = synth.generate_paper(seed, i)
        i += 1
        title = paper.metadata.get("title")
        for c in chunk_markdown(paper.markdown):
            ctx = build_context(title, c.heading_path)
            texts.append(f"{ctx}\n\n{c.text}" if ctx else c.text)
    return texts[:n]


def make_random_modernbert(path: Path) -> str:
    """A MiniLM-sized ModernBERT (random weights, 8192 positions) with the MiniLM tokenizer."""
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=384, intermediate_size=576, num_hidden_layers=6,
                           num_attention_heads=6, max_position_embeddings=8192, global_attn_every_n_layers=3,
                           local_attention=128, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                           bos_token_id=101, eos_token_id=102)
    ModernBertModel(cfg).save_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    tok.model_max_length = 8192
    tok.save_pretrained(str(path))
    return str(path)


def st_padding(texts: list[str], lengths: np.ndarray, batch_size: int) -> float:
    """Padding fraction of sentence-transformers' batches: sorted by -len(text), batch_size rows each."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    padded = sum(int(lengths[order[s : s + batch_size]].max()) * len(order[s : s + batch_size])
                 for s in range(0, len(order), batch_size))
    return 1.0 - float(lengths.sum()) / padded


class TimedPreprocess:
    """Wraps SentenceTransformer.preprocess (its per-batch tokenization) to time it."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="number of chunks")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8192, 16384, 32768], help="our token budgets")
    ap.add_argument("--st-batch-sizes", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--max-length", type=int, default=None, help="default: the model's own (256 for MiniLM)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--random-modernbert", action="store_true", help="a random-weight ModernBERT, no truncation")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from sentence_transformers import SentenceTransformer

    if args.random_modernbert:
        import tempfile

        args.model = make_random_modernbert(Path(tempfile.mkdtemp(prefix="bench-modernbert-")))
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    texts = build_texts(args.n)
    build_s = time.perf_counter() - t0

    ours = {b: Embedder(EmbedderConfig(model=args.model, device="cpu", max_length=args.max_length, token_budget=b,
                                       max_batch_rows=4096))
            for b in args.budgets}
    first = ours[args.budgets[0]]
    max_length = first.max_length
    st = SentenceTransformer(args.model, device="cpu")
    st.max_seq_length = max_length
    timed_pre = TimedPreprocess(st.preprocess)
    st.preprocess = timed_pre

    tok = first._tokenize(texts)
    lengths, real_tokens = tok.lengths, int(tok.lengths.sum())

    methods: dict[str, dict] = {}
    for b in args.budgets:
        plan = plan_batches(lengths, b, 4096)
        padded = sum(int(lengths[p].max()) * len(p) for p in plan)
        methods[f"ours_budget_{b}"] = {"kind": "ours", "token_budget": b, "forward_passes": len(plan),
                                       "padding_fraction": 1 - real_tokens / padded, "runs": []}
    for bs in args.st_batch_sizes:
        methods[f"st_batch_{bs}"] = {"kind": "sentence-transformers", "batch_size": bs,
                                     "forward_passes": -(-len(texts) // bs),
                                     "padding_fraction": st_padding(texts, lengths, bs), "runs": []}

    def run(name: str) -> tuple[float, np.ndarray, dict]:
        m = methods[name]
        if m["kind"] == "ours":
            emb = ours[m["token_budget"]]
            before = dict(emb.stats)
            t = time.perf_counter()
            vec = emb.embed(texts)[0]
            wall = time.perf_counter() - t
            split = {"tokenize_s": emb.stats["tokenize_s"] - before["tokenize_s"],
                     "forward_s": emb.stats["forward_s"] - before["forward_s"]}
        else:
            timed_pre.seconds = 0.0
            t = time.perf_counter()
            vec = st.encode(texts, batch_size=m["batch_size"], convert_to_numpy=True, normalize_embeddings=True)
            wall = time.perf_counter() - t
            split = {"tokenize_s": timed_pre.seconds, "forward_s": wall - timed_pre.seconds}
        return wall, vec, split

    # Warm-up: every method on a slice (allocators, oneDNN primitives, tokenizer caches).
    warm = texts[: min(len(texts), 128)]
    for b in args.budgets:
        ours[b].embed(warm)
    for bs in args.st_batch_sizes:
        st.encode(warm, batch_size=bs)

    vectors: dict[str, np.ndarray] = {}
    for rep in range(args.repeats):
        for name in methods:
            wall, vec, split = run(name)
            vectors.setdefault(name, vec)
            methods[name]["runs"].append({"wall_s": wall, **split})
            print(f"[rep {rep}] {name}: {wall:.1f} s, {real_tokens / wall:.0f} tok/s", file=sys.stderr, flush=True)

    for m in methods.values():
        best = min(m["runs"], key=lambda r: r["wall_s"])
        m["best_wall_s"] = best["wall_s"]
        m["tokens_per_s"] = real_tokens / best["wall_s"]
        m["texts_per_s"] = len(texts) / best["wall_s"]
        m["tokenize_s"], m["forward_s"] = best["tokenize_s"], best["forward_s"]

    ours_names = [k for k in methods if k.startswith("ours")]
    st_names = [k for k in methods if k.startswith("st")]
    best_ours = min(ours_names, key=lambda k: methods[k]["best_wall_s"])
    best_st = min(st_names, key=lambda k: methods[k]["best_wall_s"])
    st_default = "st_batch_32" if "st_batch_32" in methods else best_st
    ref = vectors[st_default]
    cosine = {k: float((v * ref).sum(axis=1).min()) for k, v in vectors.items()}

    result = {
        "benchmark": "bench_embedding",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": _cpu_name(), "cpus": os.cpu_count(),
                    "torch_threads": threads, "load_avg_at_end": list(os.getloadavg())},
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"),
                     "sentence_transformers": _version("sentence_transformers"), "python": platform.python_version()},
        "model": "random-weight ModernBERT (6 x 384, 8192 positions)" if args.random_modernbert else first.model_id,
        "model_revision": first.model_revision,
        "dtype": "float32",
        "max_length": max_length,
        "n_texts": len(texts),
        "build_texts_s": build_s,
        "real_tokens": real_tokens,
        "mean_tokens": real_tokens / len(texts),
        "truncated_fraction": float(tok.truncated.mean()),
        "repeats": args.repeats,
        "methods": methods,
        "best_ours": best_ours,
        "best_st": best_st,
        "speedup_vs_st_default": methods[st_default]["best_wall_s"] / methods[best_ours]["best_wall_s"],
        "speedup_vs_best_st": methods[best_st]["best_wall_s"] / methods[best_ours]["best_wall_s"],
        "min_cosine_vs_st_default": cosine,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
