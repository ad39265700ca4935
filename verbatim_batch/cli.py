"""``verbatim-batch <command>``: the command-line entry point."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources

from .chunking import ChunkerConfig
from .corpus import NORMALIZATIONS

EXAMPLES = resources.files("verbatim_batch") / "examples"


def _levels(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated levels like 1,2,3,4, got {value!r}") from None


def _normalizations(value: str) -> tuple[str, ...]:
    ops = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    bad = set(ops) - set(NORMALIZATIONS)
    if bad:
        raise argparse.ArgumentTypeError(f"unknown normalization {sorted(bad)}; choose from {NORMALIZATIONS}")
    return ops


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs for a local Ray (default: all)")


def _add_chunk_args(p: argparse.ArgumentParser) -> None:
    d = ChunkerConfig()
    p.add_argument("--min-chars", type=int, default=d.min_chars, help="merge chunks shorter than this")
    p.add_argument("--max-chars", type=int, default=d.max_chars, help="split chunks longer than this")
    p.add_argument("--heading-levels", type=_levels, default=d.heading_levels, help="ATX levels that split (1,2,3,4)")
    p.add_argument(
        "--normalize", type=_normalizations, default=(),
        help=f"opt-in text normalisation, comma-separated from {','.join(NORMALIZATIONS)} (default: none; "
        "changes offsets and is recorded on every row)",
    )
    p.add_argument("--max-paper-mb", type=float, default=16.0, help="quarantine papers larger than this")
    p.add_argument("--no-store-text", action="store_true", help="do not keep paper text in the papers table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verbatim-batch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("chunk", help="chunk a corpus into papers/chunks/quarantine Parquet tables")
    p.add_argument("--input", required=True, help="folder of .md files, or Parquet/JSONL file or folder")
    p.add_argument("--output", required=True, help="run folder to create (atomically)")
    p.add_argument("--format", choices=["auto", "md", "parquet", "jsonl"], default="auto")
    p.add_argument("--metadata", help="metadata table (.parquet/.jsonl/.csv) joined by paper id")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--concurrency", type=int, help="max parallel ingest tasks")
    _add_chunk_args(p)
    _add_ray_args(p)

    p = sub.add_parser("demo", help="run the pipeline on the bundled example corpus (offline, CPU)")
    p.add_argument("--output", default="verbatim-demo", help="folder for the demo's runs")
    _add_ray_args(p)

    p = sub.add_parser("verify", help="re-check a chunk run: offsets exact, coverage complete")
    p.add_argument("run_dir")

    p = sub.add_parser("synth", help="write a synthetic corpus (see verbatim_batch.synth)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _chunker(args: argparse.Namespace) -> ChunkerConfig:
    return ChunkerConfig(
        heading_levels=args.heading_levels, min_chars=args.min_chars, max_chars=args.max_chars,
        normalization=args.normalize,
    )


def cmd_chunk(args: argparse.Namespace) -> int:
    from .pipeline import ChunkJob, run_chunk

    job = ChunkJob(
        input=args.input, output=args.output, format=args.format, metadata=args.metadata,
        chunker=_chunker(args), max_paper_bytes=int(args.max_paper_mb * 1024 * 1024),
        store_text=not args.no_store_text, overwrite=args.overwrite, address=args.address,
        num_cpus=args.num_cpus, concurrency=args.concurrency,
    )
    path, manifest = run_chunk(job)
    _report(path, manifest)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .pipeline import ChunkJob, run_chunk

    corpus_dir = str(EXAMPLES / "corpus")
    out = os.path.abspath(args.output)
    job = ChunkJob(
        input=corpus_dir, output=os.path.join(out, "chunks"), format="md",
        metadata=os.path.join(corpus_dir, "metadata.jsonl"), overwrite=True,
        address=args.address, num_cpus=args.num_cpus,
    )
    path, manifest = run_chunk(job)
    _report(path, manifest)
    print("\nLoad the chunk table with:")
    print(f"  {sys.executable} -c \"import pyarrow.parquet as pq; print(pq.read_table('{path}/chunks').to_pandas().head())\"")
    return 0


def _report(path: str, manifest: dict) -> None:
    counts = manifest["counts"]
    print(f"\nrun {manifest['run_id']} committed to {path}")
    for name in ("papers", "chunks", "quarantine"):
        print(f"  {name:<11} {manifest['tables'][name]['rows']:>9} rows  {os.path.join(path, name)}")
    print(f"  manifest    {os.path.join(path, 'manifest.json')}")
    reasons = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("quarantine.")}
    if reasons:
        print(f"  quarantined by reason: {json.dumps(reasons, sort_keys=True)}")
    print(f"  {counts.get('papers_bytes', 0) / 1e6:.1f} MB of papers in {manifest['timings_s']['total']:.1f} s")


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_run

    result = verify_run(args.run_dir)
    print(json.dumps(result, indent=2))
    return 1 if result["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "synth":
        from .synth import main as synth_main

        return synth_main(args.args)
    handlers = {"chunk": cmd_chunk, "demo": cmd_demo, "verify": cmd_verify}
    try:
        return handlers[args.command](args)
    except (FileNotFoundError, FileExistsError, ValueError, NotImplementedError) as exc:
        print(f"verbatim-batch {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
