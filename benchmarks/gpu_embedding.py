"""GPU embedding throughput and MFU for granite-embedding-english-r2's architecture (random weights).

    python benchmarks/gpu_embedding.py                 # on a GPU box; needs only torch + transformers
    python benchmarks/gpu_embedding.py --n 20000 --token-budget 65536 --json gpu.json

Builds ``ModernBertModel`` from the architecture of ibm-granite/granite-embedding-english-r2
(written out below as GRANITE_R2; 149M parameters) with random weights, in bf16, and runs
it the way ``verbatim_batch.retrieval.embedder.Embedder`` does: sequences sorted by length (longest
first), packed into forward passes of at most ``--token-budget`` padded tokens, each pass
padded to its own longest row, then mean-pooled and L2-normalised in float32.

Sequence lengths are drawn from the token-length distribution of the synthetic corpus's
chunks (chunker defaults: 500-5000-character chunks plus their context line; quantiles in
CHUNK_TOKEN_QUANTILES), token ids are random. Timings start after a warm-up pass and
bracket ``torch.cuda.synchronize()``.

MFU = model FLOP/s / peak dense bf16 FLOP/s of the GPU. Model FLOPs count only real
(non-pad) tokens: per token 2 x non-embedding parameters (every matmul) plus, per layer,
4 x seq_eff x hidden for QK^T and AV, where seq_eff = seq_len on global layers and
min(seq_len, local_attention) on the sliding-window layers. ``hw_flops_utilization``
also counts pad tokens and full-length attention on local layers (what SDPA with a
sliding-window mask actually computes), to show where the gap goes.

Prints one JSON object; without CUDA it prints ``{"skipped": "no CUDA"}`` and exits 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import sys
import time

# ibm-granite/granite-embedding-english-r2 config.json (ModernBERT-base shape with a
# different global RoPE theta: 80k instead of 160k); pooling is CLS in the released
# model, mean here (same cost).
GRANITE_R2 = dict(
    vocab_size=50368,
    hidden_size=768,
    intermediate_size=1152,  # GLU: Wi projects 768 -> 2 x 1152
    num_hidden_layers=22,
    num_attention_heads=12,
    hidden_activation="gelu",
    max_position_embeddings=8192,
    global_attn_every_n_layers=3,
    local_attention=128,
    global_rope_theta=80000.0,
    local_rope_theta=10000.0,
    norm_eps=1e-5,
    norm_bias=False,
    attention_bias=False,
    mlp_bias=False,
    pad_token_id=50283,
    bos_token_id=50281,
    eos_token_id=50282,
    cls_token_id=50281,
    sep_token_id=50282,
)

# Token-length quantiles (BERT WordPiece, special tokens included) of 5,000 chunks of the
# synthetic corpus (seed 0) with their context line, chunker defaults (500..5000 chars).
CHUNK_TOKEN_QUANTILES = [
    (0.00, 57), (0.10, 216), (0.25, 323), (0.50, 576), (0.75, 936), (0.90, 1144), (0.99, 1442), (1.00, 2161),
]

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, matched against torch.cuda.get_device_name().
PEAK_BF16_TFLOPS = [
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H800", 989.0),
    ("GH200", 989.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0),
    ("B200", 2250.0),
]

ACL_CORPUS_TOKENS = 1.3e9


def param_counts(cfg: dict) -> dict:
    """Parameter counts of ModernBertModel for a config dict (as in granite-r2: no biases)."""
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    attn = h * 3 * h + h * h + (3 * h + h if cfg.get("attention_bias", False) else 0)  # Wqkv + Wo
    mlp = h * 2 * inter + inter * h + (2 * inter + h if cfg.get("mlp_bias", False) else 0)  # Wi (GLU) + Wo
    norm = h * (2 if cfg.get("norm_bias", False) else 1)
    # Norms: embedding norm, attn_norm in every layer but the first (Identity), mlp_norm, final norm.
    norms = norm * (1 + (layers - 1) + layers + 1)
    matmul = layers * (attn + mlp)
    embedding = vocab * h
    return {
        "embedding": embedding,
        "matmul": matmul,
        "non_embedding": matmul + norms,
        "total": embedding + matmul + norms,
    }


def layer_kinds(cfg: dict) -> list[str]:
    every = cfg.get("global_attn_every_n_layers", 1)
    return ["global" if i % every == 0 else "local" for i in range(cfg["num_hidden_layers"])]


def flops_per_sequence(seq_len: int, cfg: dict = GRANITE_R2, *, full_local: bool = False) -> float:
    """Forward FLOPs of one sequence of ``seq_len`` tokens.

    2 x non-embedding parameters per token (the dense matmuls) plus 4 x seq_eff x hidden per
    token and layer for QK^T and AV; seq_eff is min(seq_len, local_attention) on local layers
    unless ``full_local`` (SDPA computes the full product and masks it).
    """
    h, window = cfg["hidden_size"], cfg.get("local_attention", seq_len)
    dense = 2.0 * param_counts(cfg)["non_embedding"] * seq_len
    attn = 0.0
    for kind in layer_kinds(cfg):
        eff = seq_len if (kind == "global" or full_local) else min(seq_len, window)
        attn += 4.0 * seq_len * eff * h
    return dense + attn


def sample_lengths(n: int, seed: int, max_length: int) -> list[int]:
    """Chunk token lengths drawn by inverse-CDF interpolation of CHUNK_TOKEN_QUANTILES."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        for (q0, v0), (q1, v1) in zip(CHUNK_TOKEN_QUANTILES, CHUNK_TOKEN_QUANTILES[1:], strict=False):
            if u <= q1:
                out.append(min(max_length, int(round(v0 + (v1 - v0) * (u - q0) / (q1 - q0)))))
                break
    return out


def plan_batches(lengths: list[int], token_budget: int, max_rows: int) -> list[list[int]]:
    """Longest first; each pass holds rows * longest <= token_budget (and <= max_rows) rows."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, i = [], 0
    while i < len(order):
        k = max(1, min(max_rows, token_budget // max(lengths[order[i]], 1), len(order) - i))
        batches.append(order[i : i + k])
        i += k
    return batches


def peak_tflops(name: str) -> float | None:
    for key, value in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return value
    return None


def build_model(attn: str, dtype):
    import torch
    from transformers import AutoModel, ModernBertConfig

    cfg = ModernBertConfig(**GRANITE_R2)
    try:
        model = AutoModel.from_config(cfg, attn_implementation=attn, dtype=dtype)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModel.from_config(cfg, attn_implementation=attn, torch_dtype=dtype)
    return model.to(device="cuda", dtype=dtype).eval().requires_grad_(False), torch


def run_pass(model, torch, batches, lengths, ids_pool, pad_id) -> tuple[float, int, int]:
    """One timed pass over all batches: (seconds, real tokens, padded tokens)."""
    real = padded = 0
    outs = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for rows in batches:
        lens = torch.tensor([lengths[r] for r in rows])
        width = int(lens.max())
        real += int(lens.sum())
        padded += width * len(rows)
        mask = (torch.arange(width)[None, :] < lens[:, None]).to(torch.long)
        start = (torch.arange(len(rows)) * 7919) % (ids_pool.numel() - width)
        ids = ids_pool[start[:, None] + torch.arange(width)[None, :]]
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
        ids = ids.pin_memory().to("cuda", non_blocking=True)
        mask = mask.pin_memory().to("cuda", non_blocking=True)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(torch.float32)
        pooled = (hidden.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
        outs.append(torch.nn.functional.normalize(pooled, dim=1))
    vecs = torch.cat(outs).cpu()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not torch.isfinite(vecs).all():
        raise RuntimeError("non-finite embeddings")
    return seconds, real, padded


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="sequences per timed pass")
    ap.add_argument("--token-budget", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--max-rows", type=int, default=1024)
    ap.add_argument("--max-length", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attn", nargs="+", default=None, help="default: sdpa, plus flash_attention_2 if importable")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's dense bf16 peak")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "no torch"}))
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device visible to torch", file=sys.stderr)
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    import importlib.util

    import transformers

    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops or peak_tflops(name)
    attns = args.attn or (["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else []))
    lengths = sample_lengths(args.n, args.seed, args.max_length)
    model_flops = sum(flops_per_sequence(n) for n in lengths)
    gen = torch.Generator().manual_seed(args.seed)
    ids_pool = torch.randint(1000, GRANITE_R2["vocab_size"] - 1000, (1 << 20,), generator=gen)
    counts = param_counts(GRANITE_R2)
    result = {
        "benchmark": "gpu_embedding",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "gpu": name,
        "peak_bf16_tflops": peak,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "model": "ModernBertModel, granite-embedding-english-r2 architecture, random weights, bf16",
        "config": GRANITE_R2,
        "params": counts,
        "sequences": args.n,
        "real_tokens": sum(lengths),
        "mean_len": sum(lengths) / len(lengths),
        "model_flops_per_token": model_flops / sum(lengths),
        "runs": [],
    }
    for attn in attns:
        try:
            model, _ = build_model(attn, torch.bfloat16)
        except Exception as exc:  # e.g. flash_attention_2 not usable here
            result["runs"].append({"attn": attn, "error": f"{type(exc).__name__}: {exc}"})
            continue
        actual_params = sum(p.numel() for p in model.parameters())
        result["params"]["actual_total"] = actual_params
        for budget in args.token_budget:
            batches = plan_batches(lengths, budget, args.max_rows)
            try:
                run_pass(model, torch, batches[: min(len(batches), 8)], lengths, ids_pool, GRANITE_R2["pad_token_id"])
                run_pass(model, torch, batches, lengths, ids_pool, GRANITE_R2["pad_token_id"])  # warm-up
                times = []
                for _ in range(args.repeats):
                    seconds, real, padded = run_pass(
                        model, torch, batches, lengths, ids_pool, GRANITE_R2["pad_token_id"]
                    )
                    times.append(seconds)
            except torch.cuda.OutOfMemoryError as exc:
                result["runs"].append({"attn": attn, "token_budget": budget, "error": f"OOM: {exc}"[:300]})
                torch.cuda.empty_cache()
                continue
            best = min(times)
            hw_flops = sum(
                flops_per_sequence(max(lengths[r] for r in rows), full_local=(attn == "sdpa")) * len(rows)
                for rows in batches
            )
            run = {
                "attn": attn,
                "token_budget": budget,
                "forward_passes": len(batches),
                "padding_fraction": 1 - real / padded,
                "seconds": times,
                "real_tokens_per_s": real / best,
                "padded_tokens_per_s": padded / best,
                "sequences_per_s": len(lengths) / best,
                "model_tflops_per_s": model_flops / best / 1e12,
                "mfu": (model_flops / best / 1e12 / peak) if peak else None,
                "hw_flops_utilization": (hw_flops / best / 1e12 / peak) if peak else None,
                "projected_hours_1.3B_tokens": ACL_CORPUS_TOKENS / (real / best) / 3600,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
            result["runs"].append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
        del model
        torch.cuda.empty_cache()
    ok = [r for r in result["runs"] if "real_tokens_per_s" in r]
    if ok:
        best = max(ok, key=lambda r: r["real_tokens_per_s"])
        result["best"] = {k: best[k] for k in ("attn", "token_budget", "real_tokens_per_s", "mfu", "padding_fraction",
                                               "projected_hours_1.3B_tokens")}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
