"""Command-line options of ``verbatim-batch train`` and the job built from them.

``add_train_arguments`` declares the train-only options; the common ones (``--output``, ``--run-id``,
``--overwrite``, ``--config``, ``--address``, ``--num-cpus``) come from the CLI's shared groups
(``add_common_arguments`` here stands in for them until then).
"""

from __future__ import annotations

import argparse
import sys

from .job import DEFAULT_MODEL, TrainJob


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainJob(train="", output="")
    p.add_argument("--train", required=True, help="a silver run (its train split), or Parquet/JSONL pairs with "
                   "question (or query), chunk and spans [{start, end}]")
    p.add_argument("--eval", help="pairs to evaluate on each epoch (default: the silver run's dev split)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model or token classifier, hub id or folder")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (linear warmup, then linear decay)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per step per worker")
    p.add_argument("--batch-tokens", type=int, help="token budget per step per worker instead of --batch-size")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="batches per optimizer step")
    p.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    p.add_argument("--max-length", type=int, default=d.max_length, help="tokens per window (as the highlighter)")
    p.add_argument("--stride", type=int, default=d.stride, help="tokens shared by neighbouring windows")
    p.add_argument("--num-workers", type=int, default=d.num_workers, help="Ray Train workers (DDP)")
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker, NCCL, bf16 autocast")
    p.add_argument("--cpus-per-worker", type=float, default=d.cpus_per_worker)
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument("--seed", type=int, default=d.seed)


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Stand-in for the CLI's shared option groups."""
    p.add_argument("--output", required=True, help="the training run folder to create")
    p.add_argument("--run-id", help="name the run; rerunning with the same id after a crash resumes it from "
                   "its last checkpoint, and a committed run is left as is")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--config", help="YAML file of options (see README: Configuration); flags override it")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs for a local Ray (default: all)")


def job_from_args(args: argparse.Namespace) -> TrainJob:
    return TrainJob(
        train=args.train, eval=args.eval, output=args.output, model=args.model, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, batch_tokens=args.batch_tokens, grad_accum=args.grad_accum,
        warmup_ratio=args.warmup_ratio, max_length=args.max_length, stride=args.stride,
        num_workers=args.num_workers, use_gpu=args.use_gpu, cpus_per_worker=args.cpus_per_worker,
        keep_checkpoints=args.keep_checkpoints, seed=args.seed, run_id=args.run_id, overwrite=args.overwrite,
        address=args.address, num_cpus=args.num_cpus,
    )


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action
    return None


def build_parser() -> argparse.ArgumentParser:
    """The project's parser with a ``train`` command added (so a shared ``--config`` file applies), or a
    parser of ``train`` alone when the project's is not at hand."""
    try:
        from ..cli import build_parser as project_parser

        parser = project_parser()
    except ImportError:
        parser = argparse.ArgumentParser(prog="verbatim-batch")
        parser.add_subparsers(dest="command")
    sub = _subcommands(parser)
    if sub is not None and "train" not in sub.choices:
        p = sub.add_parser("train", help="fine-tune the highlighter on silver data with Ray Train")
        add_train_arguments(p)
        add_common_arguments(p)
    return parser


def print_summary(path: str, manifest: dict) -> None:
    t = manifest["training"]
    best = t["best"]
    print(f"train run {manifest['run_id']} -> {path}")
    print(f"  model: {path}/model  (best epoch {best['epoch']}: Word-F1 {best.get('eval_word_f1', 0):.3f}, "
          f"IoU-F1 {best.get('eval_iou_f1', 0):.3f}, eval loss {best.get('eval_loss', 0):.4f})")
    print(f"  {t['global_step']} steps ({t['steps_per_epoch']}/epoch), resumed from step {t['resumed_from_step']}; "
          f"{(t['throughput'].get('tokens_per_s') or 0):.0f} tokens/s")
    print(f"  curves: {path}/training.html")


def main(argv: list[str] | None = None) -> int:
    """``train`` on its own (jobs/train.py): parse, apply ``--config``, run, print where things are."""
    from .. import config
    from .job import run_train

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        try:
            config.apply(parser, "train", known.config)
        except config.ConfigError as exc:
            parser.exit(2, f"verbatim-batch train: config error: {exc}\n")
    args = parser.parse_args(["train", *argv])
    try:
        path, manifest = run_train(job_from_args(args))
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"verbatim-batch train: error: {exc}", file=sys.stderr)
        return 2
    print_summary(path, manifest)
    return 0
