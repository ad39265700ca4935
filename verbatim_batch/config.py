"""YAML job configs: every command's options, from a file, with command-line overrides.

A config file maps option names (the long flag without dashes; ``-`` or ``_``) to values.
Top-level keys apply to every command that has that option; a section named after a
command (``extract:``, ``embed:`` ...) applies to that command only and wins over the
top level; flags given on the command line win over both. Keys are checked: an unknown
key, a value of the wrong type or outside the allowed choices is an error that names
the file, the key and what was expected.

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
    """Safe YAML without anchors and aliases: a config never needs them, and nested aliases expand
    exponentially (a few hundred bytes can ask for gigabytes)."""

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


def _convert(path: str, where: str, dest: str, flag: str, spec: dict[str, Any], value: Any) -> Any:
    """A YAML value checked and converted the way the command-line flag would be."""
    label = f"{path}: {where}{dest}"
    if value is None:  # `key:` with no value keeps the option's default
        return spec.get("default", False if spec.get("action") == "store_true" else None)
    if spec.get("action") in ("store_true", "store_false"):
        if not isinstance(value, bool):
            raise ConfigError(f"{label} must be true or false (like {flag}), got {value!r}")
        return value if spec["action"] == "store_true" else not value
    kind = spec.get("type")
    base = getattr(kind, "kind", kind)  # a bounded number type (cli.options) checks its range after the type
    if base in (int, float):
        ok = isinstance(value, int) and not isinstance(value, bool) or (base is float and isinstance(value, float))
        if not ok:
            raise ConfigError(f"{label} must be {'an integer' if base is int else 'a number'}, got {value!r}")
        try:
            value = kind(str(value)) if kind is not base else base(value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"{label} {exc}") from None
    elif kind is not None and kind is not str:  # custom parsers take the flag's text form
        text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        try:
            value = kind(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ConfigError(f"{label}: {exc}") from exc
    elif not isinstance(value, str):
        raise ConfigError(f"{label} must be a string, got {value!r}")
    choices = spec.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{label} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def load_config(path: str, command: str, ignored: list[str] | None = None) -> dict[str, Any]:
    """The option values a YAML config gives ``command`` (``{dest: value}``, checked and converted as the
    flags would be): its top-level keys the command takes, then its own section. Usable from Python: the
    CLI's job builders (``cli.commands.build_job``) take these values by name.

    One file may hold several commands' sections. Every section is checked, whichever command runs (a typo
    in another command's section is an error here too); what ``command`` does not use (other commands'
    sections, top-level keys only other commands take) is named in ``ignored`` when a list is given (the
    CLI prints it as one line)."""
    from .cli.options import COMMANDS, EXTRA_COMMANDS, command_options

    data = load(path)
    names = [*COMMANDS, *EXTRA_COMMANDS]
    if command not in names:
        raise ConfigError(f"unknown command {command!r}")
    options = {k: v for k, v in command_options(command).items() if k != "config"}
    every = {dest for name in names for dest in command_options(name)}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: option names are strings, got {name!r}")
        if name in names:
            if name != command:
                _check_section(path, name, value, command_options(name))
                if ignored is not None:
                    ignored.append(f"section {name!r}")
            continue
        key = _key(name)
        if key not in every:
            raise ConfigError(f"{path}: unknown key {name!r} (not an option of any command)")
        if key in options:
            values[key] = _convert(path, "", key, *options[key], value)
        elif ignored is not None:
            ignored.append(f"key {name!r}")
    section = data.get(command)
    if section is not None:
        for key, value in _check_section(path, command, section, options).items():
            values[key] = _convert(path, f"{command}.", key, *options[key], value)
    return values


def _check_section(path: str, command: str, section: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``{dest: raw value}`` of a command's section, once every key is one of its options."""
    options = {k: v for k, v in options.items() if k != "config"}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: section {command!r} must be a mapping")
    out: dict[str, Any] = {}
    for name, value in section.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: {command}: option names are strings, got {name!r}")
        key = _key(name)
        if key not in options:
            known = ", ".join(sorted(options))
            raise ConfigError(f"{path}: {command}: unknown key {name!r}; {command} takes: {known}")
        out[key] = value
    return out


def apply(parser: argparse.ArgumentParser, command: str, path: str) -> dict[str, Any]:
    """Set ``command``'s defaults on the CLI parser from the config file (flags still override); returns the
    values applied."""
    values = load_config(path, command)
    parser.commands[command].set_defaults(**values)
    return values
