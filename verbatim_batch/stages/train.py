"""``run_train``: silver (or any pairs file) -> a trained highlighter in a run folder.

The run folder:

    RUN_DIR/
      manifest.json     config, data hashes, counts, timings, per-epoch metrics, the best epoch
      model/            the best epoch's model (by eval Word-F1): safetensors, config (id2label), tokenizer;
                        `verbatim-batch extract --extractor highlighter --model RUN_DIR/model` loads it as is
      checkpoints/      Ray Train's checkpoints (the best and the latest kept): checkpoint_*/checkpoint/ is a
                        transformers checkpoint (weights, optimizer, scheduler, trainer state)
      train_pairs/ eval_pairs/   the pairs trained and evaluated on (``data.TRAIN_PAIRS_SCHEMA``)
      training.json, training.html   per-epoch metrics and the loss / F1 curves

With ``run_id``, a rerun after the job dies continues from the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from verbatim_batch.core import limits, storage
from verbatim_batch.core.options import option, settings
from verbatim_batch.engine.runner import run_stage
from verbatim_batch.engine.stage import NOT_INCREMENTAL, Command, Plan, RunOptions, Stage, StageContext, StageResult
from verbatim_batch.extract.highlighter_spans import window_problem
from verbatim_batch.silver.train import data
from verbatim_batch.silver.train.data import collate
from verbatim_batch.silver.train.loop import (
    BEST_METRIC,
    BatchPasses,
    distributed,
    load_model,
    make_trainer,
    null_context,
    ray_shard_rows,
    resume_step,
)

DEFAULT_MODEL = "answerdotai/ModernBERT-base"
CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
SUMMARY = "train_summary.json"  # written by rank 0 when training ends: steps, tokens, times
TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin")


@dataclass
class TrainJob(RunOptions):
    """One training run. Defaults follow the reference recipe (lr 5e-5, 3 epochs, batch 8, 8192 tokens)."""

    train: str = option(help="a silver run (its train split), or Parquet/JSONL pairs with question (or query), chunk "
                        "and spans [{start, end}]", path=True)
    eval: str | None = option(None, "pairs to evaluate on each epoch", path=True,
                              default_help="the silver run's dev split")
    model: str = option(DEFAULT_MODEL, "a base model (a fresh head) or a token classifier: hub id or local path")
    epochs: int = option(3, "passes over the training pairs", low=1, high=limits.BATCH)
    lr: float = option(5e-5, "peak learning rate, linear warmup then linear decay", low=0, low_open=True)
    batch_size: int | None = option(8, "windows per step per worker", low=1, high=limits.BATCH)
    batch_tokens: int | None = option(None, "token budget per step per worker instead of --batch-size", low=1,
                                      high=limits.TOKENS)
    grad_accum: int = option(1, "batches per optimizer step", low=1, high=limits.BATCH)
    warmup_ratio: float = option(0.1, "share of steps spent warming up", low=0, high=1, high_open=True)
    weight_decay: float = 0.01
    max_length: int = option(8192, "tokens per window (capped at the model's positions), as the highlighter reads",
                             low=16, high=limits.TOKENS)
    stride: int = option(256, "tokens shared by neighbouring windows, as the highlighter reads", low=0,
                         high=limits.TOKENS)
    num_workers: int = option(2, "Ray Train workers, DDP", low=1, high=limits.WORKERS)
    use_gpu: bool = option(False, "one GPU per worker, NCCL, bf16 autocast")
    cpus_per_worker: float = option(1.0, "CPUs per training worker", low=0, high=limits.WORKERS, low_open=True)
    keep_checkpoints: int = option(2, "checkpoints kept besides the best", low=1, high=limits.ROWS, runtime=True)
    seed: int = option(0, "sampling and initialisation seed", low=0, high=limits.SEED)

    def __post_init__(self) -> None:
        super().__post_init__()  # the declared bounds and choices
        if not self.batch_tokens and not self.batch_size:
            raise ValueError("give a positive batch_size or batch_tokens")
        if problem := window_problem(self.max_length, self.stride):
            raise ValueError(problem)
        local = os.path.expanduser(self.model)
        if os.path.isdir(local):  # workers run elsewhere (another cwd, another node): an absolute path
            self.model = os.path.abspath(local)

    def config(self) -> dict[str, Any]:
        """What decides the trained weights (not where the run goes or which cluster runs it)."""
        return settings(self)


def _effective_max_length(model: str, max_length: int) -> tuple[int, Any]:
    """The window length the highlighter will use for this model (capped at its positions), and the tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from verbatim_batch.core.models import resolve_model_dir

    model_dir = str(resolve_model_dir(model, None, "model to train"))
    positions = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    tok = AutoTokenizer.from_pretrained(model_dir)
    return min(max_length, positions or max_length), tok


def _export_model(checkpoint, dest: str) -> None:
    """The weights, config and tokenizer of a Ray checkpoint's transformers checkpoint into ``dest``."""
    if storage.exists(dest):
        storage.rmtree(dest)
    storage.makedirs(dest)
    with checkpoint.as_directory() as d:
        src = os.path.join(d, "checkpoint")
        for name in sorted(os.listdir(src)):
            path = os.path.join(src, name)
            if os.path.isfile(path) and name not in TRAINING_STATE_FILES and not name.startswith("rng_state"):
                with open(path, "rb") as fh:
                    storage.write_bytes(storage.join(dest, name), fh.read())


def _log_history(checkpoint) -> list[dict[str, Any]]:
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, "checkpoint", "trainer_state.json"), encoding="utf-8") as fh:
            return json.load(fh).get("log_history", [])


def history(log: list[dict[str, Any]], steps_per_epoch: int) -> dict[str, list[dict[str, Any]]]:
    """Per-epoch eval metrics and the training-loss curve from a transformers log history."""
    epochs: dict[int, dict[str, Any]] = {}
    losses: dict[int, dict[str, Any]] = {}
    for entry in log:
        step = int(entry.get("step", 0))
        if BEST_METRIC in entry:
            epochs[step] = {"epoch": round(step / steps_per_epoch, 3), "step": step,
                            **{k: v for k, v in entry.items() if k.startswith("eval_")}}
        elif "loss" in entry:
            losses[step] = {"step": step, "epoch": round(step / steps_per_epoch, 3), "loss": entry["loss"],
                            "learning_rate": entry.get("learning_rate")}
    return {"epochs": [epochs[k] for k in sorted(epochs)], "train_loss": [losses[k] for k in sorted(losses)]}


def _best(best_checkpoints) -> tuple[Any, dict[str, Any]]:
    """The kept checkpoint with the highest eval Word-F1 (then the lowest eval loss, then the latest)."""
    scored = [(c, m) for c, m in best_checkpoints if BEST_METRIC in m]
    if not scored:
        raise RuntimeError("training reported no evaluated checkpoint")
    return max(scored, key=lambda cm: (cm[1][BEST_METRIC], -cm[1].get("eval_loss", 0.0), cm[1].get("step", 0)))


class TrainStage(Stage):
    """Ray Train over packed batches; the staging folder keeps its checkpoints, so a rerun with the same run
    id continues from the latest one."""

    command = "train"
    resumable = True
    takes_previous = False

    def plan(self) -> Plan:
        job: TrainJob = self.job
        inputs = [job.train, *([job.eval] if job.eval else [])]
        if os.path.isdir(job.model):
            from pathlib import Path

            from verbatim_batch.core.models import check_model_dir

            check_model_dir(Path(job.model), "--model")  # before any work: one line, exit 2
            inputs.append(job.model)
        return Plan(config=job.config(), inputs=tuple(inputs))

    def execute(self, plan: Plan, ctx: StageContext) -> StageResult:
        import ray.data
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from verbatim_batch.silver.train.report import write_training_report

        job: TrainJob = self.job
        staging = ctx.staging
        t0 = time.perf_counter()
        # --- data: pairs -> labelled windows -> packed batches (deterministic, so a resumed run rebuilds them)
        train_pairs, train_info = data.read_pairs(job.train, "train")
        eval_source = job.eval or (job.train if data.silver_data_dir(storage.normalize(job.train)) else None)
        if eval_source is None:
            raise ValueError("--eval is required unless --train is a silver run (its dev split is the default)")
        eval_pairs, eval_info = data.read_pairs(eval_source, "eval")
        if not train_pairs.num_rows or not eval_pairs.num_rows:
            raise ValueError(f"no usable pairs: {train_pairs.num_rows} to train on, {eval_pairs.num_rows} to evaluate")
        for name, table in (("train_pairs", train_pairs), ("eval_pairs", eval_pairs)):
            storage.write_parquet(table, storage.join(staging, name, "part-0.parquet"))
        max_length, tokenizer = _effective_max_length(job.model, job.max_length)
        stats: dict[str, dict[str, int]] = {"train": {}, "eval": {}}
        train_w = data.windows(train_pairs, tokenizer, max_length, job.stride, stats["train"])
        eval_w = data.windows(eval_pairs, tokenizer, max_length, job.stride, stats["eval"])
        batches = data.pack_batches(train_w, batch_size=job.batch_size, batch_tokens=job.batch_tokens, seed=job.seed)
        eval_batches = data.pack_batches(eval_w, batch_size=job.batch_size, batch_tokens=job.batch_tokens,
                                         seed=job.seed)
        per_worker = batches.num_rows // job.num_workers
        steps_per_epoch = per_worker // job.grad_accum
        if steps_per_epoch < 1:
            raise ValueError(f"{batches.num_rows} batches cannot give each of {job.num_workers} workers "
                             f"{job.grad_accum} batch(es) per step: use more data or smaller batches")
        t_prep = time.perf_counter()

        # --- Ray Train
        ctx.ray()
        loop_config = {
            "model": job.model, "seed": job.seed, "epochs": job.epochs, "lr": job.lr, "grad_accum": job.grad_accum,
            "warmup_ratio": job.warmup_ratio, "weight_decay": job.weight_decay, "max_length": max_length,
            "stride": job.stride, "steps_per_epoch": steps_per_epoch, "use_gpu": job.use_gpu,
            "threads": job.cpus_per_worker, "eval_pairs": storage.join(staging, "eval_pairs"),
            "summary": storage.join(staging, SUMMARY),
        }
        resources = {"CPU": job.cpus_per_worker, **({"GPU": 1} if job.use_gpu else {})}
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=loop_config,
            scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu,
                                         resources_per_worker=resources),
            run_config=RunConfig(
                name=CHECKPOINTS, storage_path=staging,
                checkpoint_config=CheckpointConfig(num_to_keep=job.keep_checkpoints,
                                                   checkpoint_score_attribute=BEST_METRIC,
                                                   checkpoint_score_order="max"),
                failure_config=FailureConfig(max_failures=0)),
            datasets={"train": ray.data.from_arrow(batches), "eval": ray.data.from_arrow(eval_batches)},
        )
        result = trainer.fit()
        t_fit = time.perf_counter()

        # --- the best epoch's model, the curves, the manifest
        best_ckpt, best_metrics = _best(result.best_checkpoints or [])
        model_dir = storage.join(staging, MODEL_DIR)
        _export_model(best_ckpt, model_dir)
        curves = history(_log_history(result.checkpoint), steps_per_epoch)
        final = json.loads(storage.read_text(storage.join(staging, SUMMARY)))
        best = {"epoch": round(best_metrics.get("step", 0) / steps_per_epoch, 3), "step": best_metrics.get("step"),
                **{k: v for k, v in best_metrics.items() if k.startswith("eval_")}}
        training = {
            "best": best, "epochs": curves["epochs"], "train_loss": curves["train_loss"],
            "steps_per_epoch": steps_per_epoch, "max_steps": steps_per_epoch * job.epochs,
            "global_step": final.get("global_step"), "resumed_from_step": final.get("resumed_from_step", 0),
            "max_length": max_length, "stride": job.stride, "selected_by": BEST_METRIC,
            "data": {"train": train_info, "eval": eval_info},
            "throughput": {k: final.get(k) for k in ("train_tokens", "train_wall_s", "train_busy_s", "eval_s",
                                                      "save_s", "tokens_per_s")},
        }
        write_training_report(staging, training)
        counts = {
            "train_pairs": train_pairs.num_rows, "eval_pairs": eval_pairs.num_rows,
            "train_windows": train_w.num_rows, "eval_windows": eval_w.num_rows,
            "train_batches": batches.num_rows, "eval_batches": eval_batches.num_rows,
            "train_skipped_long_query": stats["train"].get("skipped_long_query", 0),
            "eval_skipped_long_query": stats["eval"].get("skipped_long_query", 0),
            **{f"train_skipped.{k}": v for k, v in train_info["skipped"].items()},
            **{f"eval_skipped.{k}": v for k, v in eval_info["skipped"].items()},
            "steps": int(final.get("global_step") or 0), "resumed_from_step": int(final.get("resumed_from_step") or 0),
            "tokens": int(final.get("train_tokens") or 0), "workers": job.num_workers,
        }
        return StageResult(
            tables={"train_pairs": {"rows": train_pairs.num_rows, "files": 1},
                    "eval_pairs": {"rows": eval_pairs.num_rows, "files": 1}},
            counts=counts,
            timings_s={"prepare": t_prep - t0, "fit": t_fit - t_prep, "export": time.perf_counter() - t_fit},
            config={"train_data": train_info["path"], "eval_data": eval_info["path"]},
            manifest={"training": training})


def run_train(job: TrainJob) -> tuple[str, dict[str, Any]]:
    """Train, evaluate each epoch, keep the best epoch's model; returns (run folder, manifest)."""
    return run_stage(TrainStage(job))


def train_loop_per_worker(cfg: dict[str, Any]) -> None:
    """What every Ray Train worker runs (``cfg`` from ``job.loop_config``)."""
    import ray.train
    import torch
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    torch.set_num_threads(max(1, int(cfg.get("threads") or 1)))
    ctx = ray.train.get_context()
    model, tokenizer = load_model(cfg["model"], cfg["seed"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eval_pairs = storage.read_parquet(cfg["eval_pairs"]).to_pylist()
    eval_shard = ray.train.get_dataset_shard("eval")

    def eval_batches() -> Iterator[dict[str, Any]]:
        for b in eval_shard.iter_batches(batch_size=1, batch_format="pyarrow"):
            row = b.to_pylist()[0]
            yield collate(row["input_ids"], row["labels"], pad)

    checkpoint = ray.train.get_checkpoint()
    with tempfile.TemporaryDirectory() as out_dir, (checkpoint.as_directory() if checkpoint else null_context()) as ck:
        resume_from = os.path.join(ck, RayTrainReportCallback.CHECKPOINT_NAME) if checkpoint else None
        step = resume_step(resume_from)
        steps, accum = cfg["steps_per_epoch"], cfg["grad_accum"]
        rows = ray_shard_rows(ray.train.get_dataset_shard("train"), cfg["seed"] * 1009 + ctx.get_world_rank())
        passes = BatchPasses(rows, per_pass=steps * accum, pad_token_id=pad, skip=(step % steps) * accum,
                             first_pass=step // steps)
        trainer = make_trainer(cfg, model, tokenizer, passes, eval_batches, eval_pairs, out_dir,
                               callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        t0 = time.perf_counter()
        if step >= steps * cfg["epochs"]:  # killed after its last checkpoint: nothing left to train
            global_step, loss = step, float("nan")
        else:
            output = trainer.train(resume_from_checkpoint=resume_from)
            global_step, loss = int(output.global_step), float(output.training_loss)
        wall = time.perf_counter() - t0
    tokens = torch.tensor([float(passes.tokens)], dtype=torch.float64)
    if distributed():
        distributed().all_reduce(tokens)
    busy = wall - trainer.clock["eval_s"] - trainer.clock["save_s"]
    summary = {
        "global_step": global_step, "resumed_from_step": step, "workers": ctx.get_world_size(),
        "train_tokens": int(tokens.item()), "train_wall_s": wall, "train_busy_s": busy,
        "eval_s": trainer.clock["eval_s"], "save_s": trainer.clock["save_s"],
        "tokens_per_s": float(tokens.item()) / busy if busy > 0 else 0.0,
        "training_loss": loss,
    }
    if ctx.get_world_rank() == 0:  # Ray Train keeps metrics with checkpoints only: the summary goes in a file
        storage.write_text(cfg["summary"], json.dumps(summary, sort_keys=True))


def print_training(job: TrainJob, result: tuple[str, dict[str, Any]]) -> None:
    """Where the model is, its best epoch's scores, steps, throughput and the curves."""
    path, manifest = result
    t = manifest["training"]
    best = t["best"]
    print(f"train run {manifest['run_id']} -> {path}")
    print(f"  model: {path}/model  (best epoch {best['epoch']}: Word-F1 {best.get('eval_word_f1', 0):.3f}, "
          f"IoU-F1 {best.get('eval_iou_f1', 0):.3f}, eval loss {best.get('eval_loss', 0):.4f})")
    print(f"  {t['global_step']} steps ({t['steps_per_epoch']}/epoch), resumed from step {t['resumed_from_step']}; "
          f"{(t['throughput'].get('tokens_per_s') or 0):.0f} tokens/s")
    print(f"  curves: {path}/training.html")


COMMAND = Command("train", "fine-tune the highlighter (a ModernBERT token classifier) on silver data with Ray "
                  "Train", TrainJob, run_train, summary=print_training, omit=NOT_INCREMENTAL + ("batch_retries",))
