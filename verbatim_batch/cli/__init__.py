"""``verbatim-batch <command>``: the command-line entry point.

Options are declared once in ``options`` and shared by the commands that take them; ``commands`` turns them
into jobs. A ``--config FILE`` (YAML) supplies defaults that flags override (``verbatim_batch.config``).
"""

from __future__ import annotations

import argparse
import sys

from .commands import EXAMPLES, HANDLERS
from .options import COMMANDS, add_options, command_options

__all__ = ["EXAMPLES", "build_parser", "main", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser; ``parser.commands`` maps each command to its sub-parser and ``parser.required`` each
    command to its required option dests (checked by ``parse_args`` once a config file is applied)."""
    parser = argparse.ArgumentParser(prog="verbatim-batch", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands, parser.required = {}, {}
    for name, (help_text, _) in COMMANDS.items():
        parser.commands[name] = p = sub.add_parser(name, help=help_text, description=help_text)
        parser.required[name] = add_options(p, name)
    p = parser.commands["report"] = sub.add_parser("report", help="(re)write report.json and report.html of a run "
                                                   "folder")
    p.add_argument("run_dir")
    parser.required["report"] = add_options(p, "report")
    p = parser.commands["verify"] = sub.add_parser("verify", help="re-check a chunk run: offsets exact, coverage "
                                                   "complete")
    p.add_argument("run_dir")
    parser.required["verify"] = add_options(p, "verify")
    sub.add_parser("synth", help="write a synthetic corpus: verbatim-batch synth --out DIR --n 100 "
                   "(see python -m verbatim_synth --help)", add_help=False)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; a ``--config FILE`` supplies defaults that flags override."""
    from .. import config

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if known.config and command in parser.commands:
        ignored: list[str] = []
        try:
            parser.commands[command].set_defaults(**config.load_config(known.config, command, ignored))
        except config.ConfigError as exc:
            parser.exit(2, f"verbatim-batch {command}: config error: {exc}\n")
        if ignored:
            print(f"verbatim-batch {command}: {known.config}: not used by {command} (for other commands): "
                  f"{', '.join(ignored)}", file=sys.stderr)
    args = parser.parse_args(argv)
    missing = [d for d in sorted(parser.required.get(args.command, ())) if getattr(args, d, None) is None]
    if missing:
        flags = ", ".join(command_options(args.command)[d][0] for d in missing)
        parser.commands[args.command].error(f"the following arguments are required: {flags}")
    return args


def main(argv: list[str] | None = None) -> int:
    from ..faults import mark_driver

    mark_driver()  # crash tests can aim a fault at this process from a worker
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["synth"]:  # the generator has its own options
        from verbatim_synth import main as synth_main

        return synth_main(argv[1:])
    args = parse_args(argv)
    try:
        return HANDLERS[args.command](args)
    except (FileNotFoundError, FileExistsError, PermissionError, ConnectionError, ValueError,
            NotImplementedError) as exc:
        print(f"verbatim-batch {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
