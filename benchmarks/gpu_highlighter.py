"""The highlighter's split path on one GPU: pairs/s of the model actor, and the host cores it needs (issue 25).

    python benchmarks/gpu_highlighter.py                            # on a GPU box: ModernBERT-base shape, bf16
    python benchmarks/gpu_highlighter.py --pairs 4096 --budget 65536 --json gpu-highlighter.json
    .venv/bin/python benchmarks/gpu_highlighter.py --device cpu --tiny --pairs 32   # a CPU check of the script

Runs the extract job's three highlighter stages in this process, one after another, over (query, chunk) pairs
of ``--target-tokens`` (1,500) tokens cut from the seed papers (``bench_host_feed.seed_pairs``):

1. tokenize stage (``highlighter_stages.encode_table``): CPU seconds per pair;
2. the model actor's work (``highlighter_stages.forward_table``) on the GPU, batches of ``--batch-rows`` pairs packed
   under ``--budget`` tokens: wall pairs/s of the actor (its input already tokenized, as the tokenize stage
   hands it), and its own host time (wall minus the forward passes, which ``Highlighter.stats`` times);
3. span stage (``spans_table`` + ``pack``): CPU seconds per pair.

Host cores for the actor's rate = (1 + 3) CPU seconds per pair x the actor's pairs/s. The model is
``ModernBertForTokenClassification`` with random weights in the ModernBERT-base shape (``--tiny``: 2 x 64), the
tokenizer the bundled MiniLM's (no hub). Without CUDA and without ``--device cpu`` it prints
``{"skipped": "no CUDA"}`` and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--pairs", type=int, default=2048)
    ap.add_argument("--batch-rows", type=int, default=64)
    ap.add_argument("--budget", type=int, default=32768)
    ap.add_argument("--target-tokens", type=int, default=1500)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import pyarrow.compute as pc
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    from bench_highlighter import make_model
    from bench_host_feed import seed_pairs

    from verbatim_batch.extract.gate import PairExtractor, pack
    from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig, host_describe
    from verbatim_batch.extract.highlighter_stages import HighlighterRows, encode_table, forward_table, spans_table

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    model_dir = make_model(Path(tempfile.mkdtemp(prefix="gpu-highlighter-")), "tiny" if args.tiny else "base")
    config = HighlighterConfig(model=model_dir, device=args.device, dtype=dtype, token_budget=args.budget,
                               max_batch_rows=256)
    hl = Highlighter(config)
    pairs = seed_pairs(args.pairs, hl.tokenizer, args.target_tokens)
    groups = [pairs.slice(s, args.batch_rows) for s in range(0, pairs.num_rows, args.batch_rows)]
    stage = PairExtractor(HighlighterRows(host_describe(config)), "bench")

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    forward_table(hl, encode_table(hl.host, groups[0], 200_000, 2_000))  # warm-up (kernels, allocator)
    c0 = time.process_time()
    tokens = [encode_table(hl.host, g, 200_000, 2_000) for g in groups]
    tokenize_cpu = time.process_time() - c0
    sync()
    fwd0, tok0, pad0, t0 = hl.stats["forward_s"], hl.stats["tokens"], hl.stats["padded_tokens"], time.perf_counter()
    scored = [forward_table(hl, t) for t in tokens]
    sync()
    actor_wall, forward = time.perf_counter() - t0, hl.stats["forward_s"] - fwd0
    c0 = time.process_time()
    out = [pack(spans_table(s, stage, config)) for s in scored]
    span_cpu = time.process_time() - c0
    n = pairs.num_rows
    host_ms = 1000 * (tokenize_cpu + span_cpu) / n
    result = {
        "benchmark": "gpu_highlighter", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None},
        "model": {"shape": "tiny" if args.tiny else "base", "dtype": dtype, "attn": hl.attn_implementation},
        "pairs": n, "batch_rows": args.batch_rows, "token_budget": args.budget,
        "spans": sum(pc.sum(pc.list_value_length(t["spans"])).as_py() or 0 for t in out),
        "tokens": hl.stats["tokens"] - tok0, "padded_tokens": hl.stats["padded_tokens"] - pad0,
        "actor_pairs_per_s": n / actor_wall, "actor_tokens_per_s": (hl.stats["tokens"] - tok0) / actor_wall,
        "actor_forward_share": forward / actor_wall,
        "actor_host_ms_per_pair": 1000 * (actor_wall - forward) / n,
        "tokenize_cpu_ms_per_pair": 1000 * tokenize_cpu / n, "span_stage_cpu_ms_per_pair": 1000 * span_cpu / n,
        "host_cores_to_feed_the_actor": host_ms / 1000 * n / actor_wall,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
