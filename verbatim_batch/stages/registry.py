"""The stage registry: every stage module, listed once, in chain order.

Each stage module declares its ``COMMAND`` (``engine.stage.Command``): its job, its stage, how it runs and
reports, and, with a ``folder``, its chain step. The CLI, the YAML sections, the chain, ``build_job`` and the
option reference derive from this list. A new stage is its own module and one line here; a user's joins with
``add``.
"""

from __future__ import annotations

from verbatim_batch.engine.stage import Command
from verbatim_batch.stages import chunk, embed, extract, index, publish, querygen, rerank, retrieve, silver, train

STAGES: list[Command] = [
    chunk.COMMAND,
    embed.COMMAND,
    index.COMMAND,
    retrieve.COMMAND,
    rerank.COMMAND,
    extract.COMMAND,
    querygen.COMMAND,
    silver.COMMAND,
    train.COMMAND,
    publish.COMMAND,
]


def steps() -> list[Command]:
    """The chain's steps: the stages with a ``folder``, in registry order."""
    return [c for c in STAGES if c.folder]


def add(command: Command, after: str | None = None) -> None:
    """Register a stage of a user's own: after the stage whose command or folder is ``after`` (a chain step
    goes into the chain there), else last. Its command, options, YAML section and chain step are derived."""
    if any(c.name == command.name or (command.folder and c.folder == command.folder) for c in STAGES):
        raise ValueError(f"a stage {command.name!r} (or a chain folder {command.folder!r}) is already registered")
    at = len(STAGES) if after is None else 1 + next(i for i, c in enumerate(STAGES) if after in (c.name, c.folder))
    STAGES.insert(at, command)


def remove(name: str) -> None:
    """Take a stage added with ``add`` out again."""
    STAGES[:] = [c for c in STAGES if c.name != name]
