"""YAML job configs: every command's options, from a file, with command-line overrides.

A config file maps option names (the long flag without dashes; ``-`` or ``_``) to values. Top-level keys apply to
every command that has that option; a section named after a command (``extract:``, ...) applies to that command
only and wins over the top level (``nightly`` also takes the ``publish:`` section, between the two); flags win over
both. An unknown key or a bad value is an error naming the file, the key and what was expected.

    # conf.yaml
    address: auto
    chunks: s3://bucket/runs/chunks
    extract:
      extractor: highlighter
      model: KRLabsOrg/acl-verbatim-modernbert
      threshold: 0.2

    verbatim-batch extract --config conf.yaml --retrieval RUN --output OUT --threshold 0.3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file that cannot be applied."""


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The CLI parser's commands (``cli.build_parser``)."""
    return dict(parser.commands)


MAX_CONFIG_BYTES = 1 << 20


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without aliases: a config never needs them, and nested aliases expand exponentially."""

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in a config",
                                              event.start_mark)
        return super().compose_node(parent, index)


def load(path: str) -> dict[str, Any]:
    """The YAML mapping in ``path`` (an empty file is an empty config)."""
    try:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config {path} is not a file")
        if p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config {path} is larger than {MAX_CONFIG_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except (yaml.YAMLError, RecursionError) as exc:
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML: {problem}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config is a mapping of option names to values, got {type(data).__name__}")
    return data


def _key(name: Any) -> str:
    return str(name).replace("-", "_")


def load_config(path: str, command: str, ignored: list[str] | None = None) -> dict[str, Any]:
    """The option values a YAML config gives ``command`` (``{key: value}``, checked as the flags would be); for a
    chain also each stage's section, as ``<stage>.<option>`` keys (``cli.commands.build_job`` takes them by name).

    Every section is checked, whichever command runs; what ``command`` does not use is named in ``ignored`` when a
    list is given."""
    from verbatim_batch.cli.options import COMMANDS, command_flags
    from verbatim_batch.cli.options import convert as convert_option
    from verbatim_batch.core.options import OptionError

    data = load(path)
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {command!r}")
    flags = command_flags(command)
    every: dict[str, Any] = {}
    for name in COMMANDS:
        for key, flag in command_flags(name).items():
            if "." not in key:
                every.setdefault(key, flag)

    def convert(where: str, flag: Any, value: Any) -> Any:
        if value is None:  # `key:` with no value keeps the option's default
            return flag.default
        try:
            return convert_option(flag, value)
        except OptionError as exc:
            raise ConfigError(f"{path}: {where} {exc}") from None

    groups = group_sections(command)
    values: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: option names are strings, got {name!r}")
        if name in COMMANDS:
            section = _section(path, name, value)
            own = command_flags(name)
            for key, raw in section.items():
                if key not in own or "." in key:
                    known = ", ".join(sorted(k for k in own if "." not in k))
                    raise ConfigError(f"{path}: {name}: unknown key {key!r}; {name} takes: {known}")
                checked = convert(f"{name}.{key}", own[key], raw)
                if f"{name}.{key}" in flags:  # a stage section of this chain
                    values[f"{name}.{key}"] = checked
                elif name in groups and key in flags:  # nightly's `publish:` section: its publish options
                    values[key] = checked
                elif name != command and ignored is not None:
                    is_stage = any(k.startswith(name + ".") for k in flags)
                    ignored.append(f"{name}.{key}" if is_stage else f"section {name!r}")
            continue
        key = _key(name)
        if key not in every:
            raise ConfigError(f"{path}: unknown key {name!r} (not an option of any command)")
        checked = convert(key, every[key], value)
        if key in flags:
            values.setdefault(key, checked)  # the command's own section wins
        elif ignored is not None:
            ignored.append(f"key {name!r}")
    section = data.get(command)
    if isinstance(section, dict):  # the command's own section wins over top-level keys
        for key, raw in _section(path, command, section).items():
            values[key] = convert(f"{command}.{key}", flags[key], raw)
    return values


def group_sections(command: str) -> set[str]:
    """The commands whose section also applies to ``command``: its job's group fields (``nightly``'s ``publish``)."""
    import dataclasses

    from verbatim_batch.cli.options import COMMANDS

    return {f.name for f in dataclasses.fields(COMMANDS[command].job)
            if "group" in f.metadata and f.name in COMMANDS and f.name != command}


def _section(path: str, command: str, section: Any) -> dict[str, Any]:
    """``{key: raw value}`` of a command's section."""
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: section {command!r} must be a mapping")
    out: dict[str, Any] = {}
    for name, value in section.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: {command}: option names are strings, got {name!r}")
        out[_key(name)] = value
    return out


def apply(parser: argparse.ArgumentParser, command: str, path: str) -> dict[str, Any]:
    """Set ``command``'s defaults on the CLI parser from the config file; returns the values applied."""
    values = load_config(path, command)
    parser.commands[command].set_defaults(**values)
    return values
