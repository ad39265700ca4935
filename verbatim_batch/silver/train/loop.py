"""The training loop: the transformers ``Trainer`` inside a Ray Train ``TorchTrainer`` worker.

Each worker reads its shard of packed batches from Ray Data; Ray Train sets up DDP, the ``Trainer`` the
optimisation, and ``RayTrainReportCallback`` reports each checkpoint with its metrics. An "epoch" is one pass over
a worker's shard, the same number of steps on every worker, so evaluation and checkpoints fall on the same steps.
Evaluation (``evaluate_spans``) saves the weights as a model folder, runs the highlighter itself on the eval pairs
(split across workers, predictions gathered) and scores them with ``metrics.evaluate``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext as null_context  # the name stages.train imports
from typing import Any

import numpy as np

from verbatim_batch.silver.train.data import collate

BEST_METRIC = "eval_word_f1"
LABELS = {0: "O", 1: "EVIDENCE"}


def span_predictions(model_dir: str, pairs: Sequence[dict[str, Any]], *, max_length: int, stride: int,
                     device: str = "cpu", batch_pairs: int = 64) -> list[list[tuple[int, int]] | None]:
    """Spans the highlighter finds with the model at ``model_dir`` on each pair (None where the pair failed)."""
    from verbatim_batch.extract.highlighter import Highlighter, HighlighterConfig

    hl = Highlighter(HighlighterConfig(model=model_dir, max_length=max_length, stride=stride, device=device))
    out: list[list[tuple[int, int]] | None] = []
    for b in range(0, len(pairs), batch_pairs):
        batch = pairs[b:b + batch_pairs]
        for res in hl.extract([p["question"] for p in batch], [p["chunk"] for p in batch]):
            out.append(None if res.error else [(int(s.start), int(s.end)) for s in res.spans])
    return out


def span_metrics(pairs: Sequence[dict[str, Any]], preds: Sequence[list[tuple[int, int]] | None],
                 prefix: str = "eval") -> dict[str, float]:
    """Word-F1 (micro P/R/F1, macro F1), span IoU F1 at 0.5 and abstention figures of predictions."""
    from verbatim_batch.quality.metrics import EvalRow, evaluate

    rows = [EvalRow(chunk=p["chunk"], gold=[(int(s["start"]), int(s["end"])) for s in p["spans"]],
                    pred=list(pred or []), key=(p["pair_index"],)) for p, pred in zip(pairs, preds, strict=True)]
    res = evaluate(rows, iou_thresholds=(0.5,))
    negatives = [r for r in rows if not r.gold]
    positives = [r for r in rows if r.gold]
    return {
        f"{prefix}_word_f1": res["word"]["micro_f1"], f"{prefix}_word_p": res["word"]["micro_p"],
        f"{prefix}_word_r": res["word"]["micro_r"], f"{prefix}_word_macro_f1": res["word"]["macro_f1"],
        f"{prefix}_iou_f1": res["iou"]["0.5"]["f1"],
        # irrelevant pairs the model leaves empty / relevant pairs it leaves empty / all pairs left empty
        f"{prefix}_abstention_acc": (sum(1 for r in negatives if not r.pred) / len(negatives)) if negatives else 1.0,
        f"{prefix}_missed_rate": (sum(1 for r in positives if not r.pred) / len(positives)) if positives else 0.0,
        f"{prefix}_abstain_rate": (sum(1 for r in rows if not r.pred) / len(rows)) if rows else 0.0,
        f"{prefix}_failed_pairs": float(sum(1 for p in preds if p is None)),
    }


def distributed():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def evaluate_model(model, tokenizer, eval_batches: Callable[[], Iterator[dict[str, Any]]],
                   pairs: Sequence[dict[str, Any]], *, max_length: int, stride: int, device,
                   prefix: str = "eval") -> dict[str, float]:
    """Eval loss over this worker's eval batches and span metrics over ``pairs`` (split across workers),
    reduced over all workers: every worker returns the same figures."""
    import torch

    dist = distributed()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    loss_sum = torch.zeros(2, dtype=torch.float64)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else null_context()
    with torch.no_grad(), autocast:
        for batch in eval_batches():
            batch = {k: v.to(device) for k, v in batch.items()}
            n = int((batch["labels"] != -100).sum())
            if n:
                loss_sum[0] += float(model(**batch).loss) * n
                loss_sum[1] += n
    mine = list(range(rank, len(pairs), world))
    with tempfile.TemporaryDirectory() as d:
        save_model_folder(model, tokenizer, d)
        preds_mine = span_predictions(d, [pairs[i] for i in mine], max_length=max_length, stride=stride,
                                      device=str(device))
    if was_training:
        model.train()
    if dist:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (mine, preds_mine))
        loss_t = loss_sum.to(device) if device.type == "cuda" else loss_sum
        dist.all_reduce(loss_t)
        loss_sum = loss_t.cpu()
    else:
        gathered = [(mine, preds_mine)]
    preds: list[Any] = [None] * len(pairs)
    for idx, ps in gathered:
        for i, p in zip(idx, ps, strict=True):
            preds[i] = p
    out = span_metrics(pairs, preds, prefix)
    out[f"{prefix}_loss"] = float(loss_sum[0] / loss_sum[1]) if loss_sum[1] else float("nan")
    out[f"{prefix}_seconds"] = time.perf_counter() - t0
    return out


def save_model_folder(model, tokenizer, dest: str) -> None:
    """Weights (safetensors), config and tokenizer as a model folder, on any rank (transformers'
    ``save_pretrained`` writes only on rank 0 once torch.distributed is up)."""
    from safetensors.torch import save_model

    os.makedirs(dest, exist_ok=True)
    save_model(model, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    model.config.to_json_file(os.path.join(dest, "config.json"))
    tokenizer.save_pretrained(dest)


class BatchPasses:
    """Training batches, pass after pass: exactly ``per_pass`` from ``make_iter(pass_no)`` each, the first pass after a
    resume skipping those the checkpointed steps consumed; counts the real tokens handed out."""

    def __init__(self, make_iter: Callable[[int], Iterator[dict[str, Any]]], per_pass: int, pad_token_id: int,
                 skip: int = 0, first_pass: int = 0) -> None:
        self.make_iter, self.per_pass, self.pad_token_id = make_iter, per_pass, pad_token_id
        self.skip, self.pass_no = skip, first_pass
        self.tokens = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        n = 0
        skip, self.skip = self.skip, 0
        for row in self.make_iter(self.pass_no):
            if n >= self.per_pass:
                break
            n += 1
            if n <= skip:
                continue
            self.tokens += int(row["n_tokens"])
            yield collate(row["input_ids"], row["labels"], self.pad_token_id)
        self.pass_no += 1
        if n < self.per_pass:
            raise RuntimeError(f"a data pass gave {n} batches, {self.per_pass} expected")


def ray_shard_rows(shard, seed: int, shuffle_buffer: int = 16) -> Callable[[int], Iterator[dict[str, Any]]]:
    """Packed-batch rows of a Ray Data shard, locally shuffled with a per-pass seed."""
    def make(pass_no: int) -> Iterator[dict[str, Any]]:
        for b in shard.iter_batches(batch_size=1, batch_format="pyarrow", prefetch_batches=2,
                                    local_shuffle_buffer_size=shuffle_buffer, local_shuffle_seed=seed + pass_no):
            yield b.to_pylist()[0]
    return make


def table_rows(table, seed: int) -> Callable[[int], Iterator[dict[str, Any]]]:
    """Packed-batch rows of an in-memory table, in a per-pass seeded order (the single-process path)."""
    rows = table.to_pylist()

    def make(pass_no: int) -> Iterator[dict[str, Any]]:
        for i in np.random.default_rng(seed + pass_no).permutation(len(rows)):
            yield rows[int(i)]
    return make


def make_trainer(cfg: dict[str, Any], model, tokenizer, passes: BatchPasses,
                 eval_batches: Callable[[], Iterator[dict[str, Any]]], eval_pairs: Sequence[dict[str, Any]],
                 output_dir: str, callbacks: Sequence[Any] = ()):
    """A transformers ``Trainer`` over ``passes`` whose evaluation is ``evaluate_model``."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset
    from transformers import Trainer, TrainingArguments

    from verbatim_batch.core.faults import fault_point

    class _Iterable(IterableDataset):
        def __iter__(self):
            return iter(passes)

    clock = {"eval_s": 0.0, "save_s": 0.0}

    class SpanTrainer(Trainer):
        def get_train_dataloader(self) -> DataLoader:
            return DataLoader(_Iterable(), batch_size=None)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
            fault_point("train.evaluate")  # crash tests: a worker killed here, before this epoch's checkpoint
            t0 = time.perf_counter()
            metrics = evaluate_model(self.model, tokenizer, eval_batches, eval_pairs,
                                     max_length=cfg["max_length"], stride=cfg["stride"], device=self.args.device,
                                     prefix=metric_key_prefix)
            metrics["epoch"] = self.state.global_step / cfg["steps_per_epoch"]
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            clock["eval_s"] += time.perf_counter() - t0
            return metrics

        def _save_checkpoint(self, model, trial):
            t0 = time.perf_counter()
            super()._save_checkpoint(model, trial)
            clock["save_s"] += time.perf_counter() - t0

    steps = cfg["steps_per_epoch"]
    use_gpu = bool(cfg.get("use_gpu")) and torch.cuda.is_available()
    args = TrainingArguments(
        output_dir=output_dir, max_steps=steps * cfg["epochs"], per_device_train_batch_size=1,
        gradient_accumulation_steps=cfg["grad_accum"], learning_rate=cfg["lr"], weight_decay=cfg["weight_decay"],
        lr_scheduler_type="linear", warmup_steps=cfg["warmup_ratio"],
        eval_strategy="steps", eval_steps=steps, save_strategy="steps", save_steps=steps, save_total_limit=1,
        logging_strategy="steps", logging_steps=max(1, steps // 4), report_to="none", disable_tqdm=True,
        use_cpu=not use_gpu, bf16=use_gpu and torch.cuda.is_bf16_supported(), seed=cfg["seed"],
        data_seed=cfg["seed"], ignore_data_skip=True, remove_unused_columns=False, dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    trainer = SpanTrainer(model=model, args=args, processing_class=tokenizer, callbacks=list(callbacks),
                          eval_dataset=list(eval_pairs))  # evaluation itself is SpanTrainer.evaluate
    trainer.clock = clock
    return trainer


def load_model(model: str, seed: int):
    """The token classifier to train (a fresh 2-label head on a base model; a trained head is kept), and
    its tokenizer. A seeded head, so a rerun starts from the same weights."""
    from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer, set_seed

    from verbatim_batch.core.models import resolve_model_dir

    model_dir = str(resolve_model_dir(model, None, "model to train"))
    set_seed(seed)
    conf = AutoConfig.from_pretrained(model_dir)
    kwargs: dict[str, Any] = {}
    if getattr(conf, "num_labels", None) != 2:
        kwargs = {"num_labels": 2, "ignore_mismatched_sizes": True}
    kwargs.update(id2label=dict(LABELS), label2id={v: k for k, v in LABELS.items()})
    net = AutoModelForTokenClassification.from_pretrained(model_dir, **kwargs)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{model}: a fast tokenizer (with offsets) is required")
    return net, tok


def resume_step(checkpoint_dir: str | None) -> int:
    if not checkpoint_dir:
        return 0
    state = os.path.join(checkpoint_dir, "trainer_state.json")
    if not os.path.isfile(state):
        return 0
    with open(state, encoding="utf-8") as fh:
        return int(json.load(fh).get("global_step", 0))
