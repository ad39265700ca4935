"""Training throughput: Ray Train (TorchTrainer + transformers Trainer) vs a plain single-process
transformers Trainer, on the same packed batches of the same synthetic pairs and the same model.

    .venv/bin/python benchmarks/bench_train.py [--pairs 256] [--epochs 2] [--hidden 256] [--layers 4] \
        [--max-length 256] [--out benchmarks/results-train-cpu.json]

tokens/s counts real (unpadded) training tokens over the time spent in training steps (evaluation and
checkpoint saving left out, for both); `wall_s` is the whole call, Ray start and data loading included.
The plain run uses all the CPU threads the Ray workers get together.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima the model data table result "
         "shows we use paper method corpus score baseline train").split()


def make_model(path: Path, hidden: int, layers: int) -> str:
    import torch
    from transformers import AutoTokenizer, ModernBertConfig, ModernBertForTokenClassification

    from verbatim_batch.retrieval.embedder import DEFAULT_MODEL

    torch.manual_seed(0)
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=max(1, hidden // 64), intermediate_size=2 * hidden,
                           max_position_embeddings=1024, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                           bos_token_id=101, eos_token_id=102, num_labels=2)
    ModernBertForTokenClassification(cfg).save_pretrained(str(path))
    AutoTokenizer.from_pretrained(DEFAULT_MODEL).save_pretrained(str(path))
    return str(path)


def make_pairs(path: Path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(n):
            parts, spans, pos = [], [], 0
            for _ in range(rng.randint(10, 40)):
                sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12)))
                if rng.random() < 0.2:
                    spans.append({"start": pos, "end": pos + len(sentence)})
                parts.append(sentence + ". ")
                pos += len(sentence) + 2
            fh.write(json.dumps({"query_id": f"q{i}", "question": "which sentences are evidence",
                                 "chunk": "".join(parts).strip(), "spans": spans}) + "\n")
    return str(path)


def plain(model: str, train: str, evalp: str, args, threads: int) -> dict:
    """The same data pipeline and Trainer, in this process, no Ray."""
    import torch

    from verbatim_batch.silver.train import data
    from verbatim_batch.silver.train.loop import BatchPasses, load_model, make_trainer, table_rows

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    net, tok = load_model(model, 0)
    pairs, _ = data.read_pairs(train, "train")
    epairs, _ = data.read_pairs(evalp, "eval")
    batches = data.pack_batches(data.windows(pairs, tok, args.max_length, args.stride), batch_size=args.batch_size)
    ebatches = data.pack_batches(data.windows(epairs, tok, args.max_length, args.stride), batch_size=args.batch_size)
    steps = batches.num_rows
    passes = BatchPasses(table_rows(batches, 0), per_pass=steps, pad_token_id=tok.pad_token_id)
    erows = ebatches.to_pylist()

    def eval_batches():
        for r in erows:
            yield data.collate(r["input_ids"], r["labels"], tok.pad_token_id)

    cfg = {"steps_per_epoch": steps, "epochs": args.epochs, "grad_accum": 1, "lr": 5e-4, "weight_decay": 0.01,
           "warmup_ratio": 0.1, "seed": 0, "max_length": args.max_length, "stride": args.stride, "use_gpu": False}
    with tempfile.TemporaryDirectory() as out:
        trainer = make_trainer(cfg, net, tok, passes, eval_batches, epairs.to_pylist(), out)
        t1 = time.perf_counter()
        output = trainer.train()
        wall = time.perf_counter() - t1
    busy = wall - trainer.clock["eval_s"] - trainer.clock["save_s"]
    return {"mode": "plain transformers Trainer, 1 process", "threads": threads, "steps": output.global_step,
            "tokens": passes.tokens, "train_busy_s": round(busy, 2), "tokens_per_s": round(passes.tokens / busy, 1),
            "eval_s": round(trainer.clock["eval_s"], 2), "save_s": round(trainer.clock["save_s"], 2),
            "wall_s": round(time.perf_counter() - t0, 2)}


def ray_train(model: str, train: str, evalp: str, args, workers: int, cpus: float, tmp: Path) -> dict:
    from verbatim_batch.stages.train import TrainJob, run_train

    t0 = time.perf_counter()
    _, manifest = run_train(TrainJob(train=train, eval=evalp, output=str(tmp / f"ray-{workers}"), model=model,
                                     epochs=args.epochs, lr=5e-4, batch_size=args.batch_size,
                                     max_length=args.max_length, stride=args.stride, num_workers=workers,
                                     cpus_per_worker=cpus, seed=0, overwrite=True))
    t = manifest["training"]["throughput"]
    return {"mode": f"Ray Train, {workers} worker(s) x {cpus:g} CPU", "threads": int(workers * cpus),
            "steps": manifest["counts"]["steps"], "tokens": t["train_tokens"],
            "train_busy_s": round(t["train_busy_s"], 2), "tokens_per_s": round(t["tokens_per_s"], 1),
            "eval_s": round(t["eval_s"], 2), "save_s": round(t["save_s"], 2),
            "fit_s": round(manifest["timings_s"]["fit"], 2), "wall_s": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--stride", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default="benchmarks/results-train-cpu.json")
    args = ap.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = make_model(tmp / "model", args.hidden, args.layers)
        train = make_pairs(tmp / "train.jsonl", args.pairs, 1)
        evalp = make_pairs(tmp / "eval.jsonl", max(8, args.pairs // 16), 2)
        results = [plain(model, train, evalp, args, args.cpus)]
        print(json.dumps(results[-1]), flush=True)
        from verbatim_batch.engine.ray_env import init_ray

        init_ray(address="local", num_cpus=args.cpus, log_to_driver=False)
        results.append(ray_train(model, train, evalp, args, 1, float(args.cpus), tmp))
        print(json.dumps(results[-1]), flush=True)
        if args.cpus >= 2:
            results.append(ray_train(model, train, evalp, args, 2, args.cpus / 2, tmp))
            print(json.dumps(results[-1]), flush=True)
        ray.shutdown()
    base = results[0]["tokens_per_s"]
    for r in results[1:]:
        r["vs_plain"] = round(r["tokens_per_s"] / base, 3)
    report = {"date": dt.date.today().isoformat(), "machine": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs visible, no GPU", "command": " ".join(sys.argv),
              "model": f"ModernBERT token classifier, hidden {args.hidden}, {args.layers} layers (random init)",
              "data": f"{args.pairs} synthetic pairs, windows of {args.max_length} tokens (stride {args.stride}), "
                      f"batch {args.batch_size} windows", "epochs": args.epochs, "results": results}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
