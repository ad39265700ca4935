"""The embed stage's split path on one GPU: tokens/s of the model actor and the host cores it needs (issue 25).

    python benchmarks/gpu_embed_split.py                          # on a GPU box: granite-r2 shape, bf16
    python benchmarks/gpu_embed_split.py --repeat 8 --json gpu-embed-split.json
    .venv/bin/python benchmarks/gpu_embed_split.py --device cpu --tiny       # a CPU check of the script

The embed job's two stages in this process, over the chunks of the seed papers (``bench_host_feed.seed_chunks``,
repeated ``--repeat`` times): ``EmbedTokenizer.tokenize_table`` (the CPU stage: CPU seconds per token), then
``Embedder`` on the tokenized batches (the model actor: wall tokens/s on the GPU, and its own time outside
the forward passes). Host cores to feed the actor = tokenize CPU seconds per token x the actor's tokens/s.
The model is ``ModernBertModel`` in the architecture of granite-embedding-english-r2 (``gpu_embedding.GRANITE_R2``,
random weights; ``--tiny``: 2 x 64) with the bundled MiniLM's tokenizer (no hub), max length 512. Without CUDA
and without ``--device cpu`` it prints ``{"skipped": "no CUDA"}`` and exits 0.
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
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--repeat", type=int, default=4, help="passes over the seed chunks")
    ap.add_argument("--batch-rows", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=65536)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import pyarrow as pa
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    from bench_host_feed import seed_chunks
    from gpu_embedding import GRANITE_R2
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertModel

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL, Embedder, EmbedderConfig, EmbedTokenizer

    shape = dict(GRANITE_R2)
    if args.tiny:
        shape.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    shape.update(pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                 bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    model_dir = Path(tempfile.mkdtemp(prefix="gpu-embed-split-"))
    torch.manual_seed(0)
    ModernBertModel(ModernBertConfig(**shape)).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    config = EmbedderConfig(model=str(model_dir), device=args.device, max_length=512, token_budget=args.budget,
                            max_batch_rows=512)
    emb, host = Embedder(config), EmbedTokenizer(config)
    chunks = pa.concat_tables([seed_chunks()] * args.repeat)
    groups = [chunks.slice(s, args.batch_rows) for s in range(0, chunks.num_rows, args.batch_rows)]

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    emb(host.tokenize_table(groups[0]))  # warm-up
    c0 = time.process_time()
    tokens = [host.tokenize_table(g) for g in groups]
    tokenize_cpu = time.process_time() - c0
    sync()
    f0, n0, t0 = emb.stats["forward_s"], emb.stats["tokens"], time.perf_counter()
    for t in tokens:
        emb(t)
    sync()
    wall, forward, n_tok = time.perf_counter() - t0, emb.stats["forward_s"] - f0, emb.stats["tokens"] - n0
    result = {
        "benchmark": "gpu_embed_split", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None},
        "model": {"shape": "tiny" if args.tiny else "granite-r2", "dtype": str(emb.torch_dtype),
                  "attn": emb.attn_implementation},
        "chunks": chunks.num_rows, "tokens": n_tok, "padding_fraction": emb.stats["padding_fraction"],
        "actor_tokens_per_s": n_tok / wall, "actor_forward_share": forward / wall,
        "actor_host_us_per_1k_tokens": 1e6 * (wall - forward) / n_tok * 1000,
        "tokenize_cpu_us_per_1k_tokens": 1e6 * tokenize_cpu / n_tok * 1000,
        "host_cores_to_feed_the_actor": tokenize_cpu / n_tok * n_tok / wall,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
