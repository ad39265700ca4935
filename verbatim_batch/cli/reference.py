"""The option reference, generated from the options' declarations (``python -m verbatim_batch.cli.reference``).

``docs/reference/options.md`` is this module's output; a test keeps it current.
"""

from __future__ import annotations

import sys

from verbatim_batch.cli.options import COMMANDS, command_flags
from verbatim_batch.core.options import show


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """Every command's options: flag, YAML key, default, help; a chain's stage sections by reference."""
    lines = ["# Option reference", "",
             "Generated from the option declarations (`python -m verbatim_batch.cli.reference`). Each option is a "
             "flag, and a key of a YAML config (`--config FILE`): at the top level for every command that takes "
             "it, or in the command's section. `run` and `nightly` also take each stage's section (`chunk:`, "
             "`embed:`, `index:`, `retrieve:`, `rerank:`, `extract:`), or the same options on the command line "
             "as `--<stage>-<option>` (the extract stage's also without the prefix). An option's role is `output` when "
             "its value decides the run's rows (it is part of the settings bound to the run id and compared by the "
             "nights) or `runtime` when it only decides how the run goes (a killed run resumes with another "
             "value).", ""]
    for command, spec in COMMANDS.items():
        lines += [f"## `verbatim-batch {command}`", "", _cell(spec.help) + ".", "",
                  "| flag | YAML key | default | role | help |", "|---|---|---|---|---|"]
        stages: dict[str, list[str]] = {}
        for key, flag in command_flags(command).items():
            if flag.stage is not None:
                stages.setdefault(flag.stage, []).append(key.split(".", 1)[1])
                continue
            of = flag.of
            if of.option.default_help is not None:
                default = of.option.default_help
            elif flag.required:
                default = "required"
            elif of.is_bool:
                default = "off"
            else:
                shown = [(k, v) for k, v in of.defaults if v is not None]
                default = ", ".join(f"{k} {show(v)}" if k else show(v) for k, v in shown) if shown else ""
            role = "runtime" if of.option.runtime else "output"
            lines.append(f"| `{' '.join(flag.flags)}` | `{key}` | {_cell(default)} | {role} "
                         f"| {_cell(of.option.text)} |")
        if stages:
            lines += ["", "Stage sections (the options of each stage's command above, but its inputs, outputs and "
                      "run options, which the chain sets):", ""]
            lines += [f"- `{stage}:` " + ", ".join(f"`{k}`" for k in keys) for stage, keys in stages.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
