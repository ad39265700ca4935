"""Options, each declared once: a dataclass field carrying its default, its bounds or choices and its help.

    top_k: int = option(5, "retrieved chunks per query to extract from", low=1)

Everything else is derived from the fields: the CLI flags and their ``--help`` (``cli.options``), the YAML keys
(``cli.config``), the Python API (the dataclasses, ``cli.commands.build_job``) and the option reference
(``cli.reference``). A ``group`` field holds a nested config whose options are the command's too, possibly one
of several chosen by a selector (``--extractor semantic|highlighter|llm``).

``check`` converts and bounds a value whatever it comes from (a flag's text, a YAML value, a Python argument) and
raises a one-line ``OptionError`` naming the option; a ``Declared`` config checks its own fields when built, and
its ``__post_init__`` adds only rules across options. Every field has a role: by default it decides the output
(``settings``: bound to the run id, compared by nights); ``runtime`` marks one that only decides how the run goes
(workers, batch sizes that do not change results, retries, addresses).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field
from functools import cache
from typing import Any

from verbatim_batch.core import storage


class OptionError(ValueError):
    """An option value that cannot be used (one line, naming the option and what it takes)."""


@dataclass(frozen=True)
class Option:
    """What a field declares as an option, besides its type and default (those are the field's own)."""

    help: str
    name: str | None = None  # the option's key and flag when not the field's name
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # a flag's text (a YAML list: joined by commas) -> the value
    path: bool = False  # a local path (made absolute where it is read) or a URI: an input, unless ``writes``
    writes: bool = False  # a location the command writes (its output), not one it reads
    invert: bool = False  # a flag --no-x that sets the bool field x to False
    default_help: str | None = None  # the default in words, where the value alone says little
    metavar: str | None = None
    runtime: bool = False  # only how the run goes (workers, batch sizes, retries, addresses), never its output
    selects: bool = False  # chooses which rows there are, not what a row holds: a row carries across a change
    # the values of its config's other options under which it applies (``{"backend": "vllm"}``): its help says so
    # first, and a group that fixes one of them otherwise leaves it out
    when: tuple[tuple[str, Any], ...] = ()

    @property
    def text(self) -> str:
        """The help as shown: what it applies to (``when``) first."""
        return "".join(f"{v}: " for _, v in self.when) + self.help


@dataclass(frozen=True)
class Group:
    """A field holding a nested config whose option fields the command takes too."""

    kinds: tuple[type, ...]
    select: str | None = None  # the option choosing among ``kinds`` by their ``kind`` attribute
    select_default: str | None = None
    select_help: str = ""
    omit: tuple[str, ...] = ()  # of the nested options, those the job does not take
    fixed: tuple[tuple[str, Any], ...] = ()  # values the job sets itself (e.g. the HTTP backend)
    selects: bool = False  # as ``Option.selects``: each row carries by its own fingerprint across a change


def option(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, **settings: Any) -> Any:
    """A dataclass field that is an option (``settings``: the fields of ``Option``)."""
    if "when" in settings:
        settings["when"] = tuple(settings["when"].items())
    return field(default=default, default_factory=default_factory, metadata={"option": Option(help, **settings)})


def runtime(default: Any = MISSING, *, default_factory: Any = MISSING, **bounds: Any) -> Any:
    """A plain (not an option) dataclass field that only decides how the run goes, never its output; its
    ``bounds`` (``low``, ``high``, ``low_open``, ``high_open``) are checked when the config is built."""
    return field(default=default, default_factory=default_factory, metadata={"runtime": True} | _bounded(bounds))


def bounded(default: Any, **bounds: Any) -> Any:
    """A plain (not an option: no flag, no YAML key) field that decides the output, its ``bounds`` checked when the
    config is built, as an option's are."""
    return field(default=default, metadata=_bounded(bounds))


def _bounded(bounds: dict[str, Any]) -> dict[str, Any]:
    return {"bounds": Option("", **bounds)} if bounds else {}


def is_runtime(f: dataclasses.Field) -> bool:
    """Whether a dataclass field only decides how the run goes (``option(..., runtime=True)`` or ``runtime``)."""
    return bool(f.metadata.get("runtime")) or ("option" in f.metadata and f.metadata["option"].runtime)


@cache
def runtime_fields(cls: type) -> frozenset[str]:
    """The names of ``cls``'s fields that only decide how the run goes."""
    return frozenset(f.name for f in dataclasses.fields(cls) if is_runtime(f))


def carried_across(cls: type) -> tuple[str, ...]:
    """The output-deciding fields of ``cls`` a row carries across (from ``--previous``): its inputs (path options)
    and the options and groups declared ``selects`` (which rows there are, not what a row holds)."""
    out = []
    for f in dataclasses.fields(cls):
        opt, grp = f.metadata.get("option"), f.metadata.get("group")
        if is_runtime(f):
            continue
        if (opt is not None and (opt.path or opt.selects)) or (grp is not None and grp.selects):
            out.append(f.name)
    return tuple(out)


def changed_setting(before: Mapping[str, Any], now: Mapping[str, Any], across: Iterable[str] = (),
                    missing_same: bool = False) -> str | None:
    """The first of the settings ``now`` that an earlier run recorded otherwise (``before``), leaving out those a
    row carries across; None when none did (``missing_same``: one the earlier run did not record counts as the
    same)."""
    skip = set(across)
    return next((k for k, v in now.items() if k not in skip
                 and (before.get(k, v) if missing_same else before.get(k)) != v), None)


def settings(obj: Any) -> dict[str, Any]:
    """What decides the output of a job or config: every field but the runtime ones, nested dataclasses (a
    group's config) by their own settings, in declaration order."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if is_runtime(f):
            continue
        value = getattr(obj, f.name)
        out[f.name] = settings(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    return out


def validate(obj: Any) -> None:
    """Every declared bound and choice of ``obj``'s own option fields checked on the value it holds (a nested
    config checks itself when built): ``OptionError`` naming the option, as its flag would be refused."""
    for of in options_of(type(obj)):
        if of.group is not None:
            continue
        value = getattr(obj, of.field)
        if of.option.invert or (of.option.path and value == ""):
            continue
        try:
            check(of, value)
        except OptionError as exc:
            raise OptionError(f"{of.key} {exc}") from None
    for f in dataclasses.fields(obj):  # the plain fields declared with bounds (``runtime(..., low=1)``, ``bounded``)
        if (opt := f.metadata.get("bounds")) is not None:
            try:
                _bounds(opt, getattr(obj, f.name))
            except OptionError as exc:
                raise OptionError(f"{f.name} {exc}") from None


class Declared:
    """A dataclass whose option fields check themselves when it is built (``validate``). A subclass's own
    ``__post_init__`` calls ``super().__post_init__()`` first and adds only checks across options."""

    def __post_init__(self) -> None:
        validate(self)

    def to_dict(self) -> dict[str, Any]:
        """Every field, nested configs as dicts (``dataclasses.asdict``)."""
        return dataclasses.asdict(self)


def group(*kinds: type, default: Any = None, default_factory: Any = MISSING, required: bool = False,
          select: str | None = None, select_default: str | None = None, select_help: str = "",
          omit: tuple[str, ...] = (), fixed: dict[str, Any] | None = None, selects: bool = False) -> Any:
    """A dataclass field holding a nested config (one of ``kinds``) whose options the command takes (None by
    default; ``required``: no default, the job is built with one)."""
    if required or default_factory is not MISSING:
        default = MISSING
    spec = Group(tuple(kinds), select, select_default, select_help, omit, tuple((fixed or {}).items()), selects)
    return field(default=default, default_factory=default_factory, metadata={"group": spec})


@dataclass(frozen=True)
class OptionField:
    """One option of a job, as found by ``options_of``."""

    key: str  # the YAML key and the flag's name (``top_k`` -> ``--top-k``)
    field: str  # the dataclass field it sets
    option: Option
    type: Any  # the field's type hint
    defaults: tuple[tuple[str, Any], ...]  # (kind, default) per config class that has it ("" for a plain field)
    group: str | None = None  # the job field holding the nested config, if any
    kinds: tuple[str, ...] = ()  # the selector values whose configs take it (a selected group)
    required: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def default(self) -> Any:
        return self.defaults[0][1] if self.defaults else None

    @property
    def is_bool(self) -> bool:
        return _base(self.type)[0] is bool

    def help_text(self) -> str:
        """The help with the default, as declared (never a literal copy)."""
        text = self.option.text
        if self.option.default_help is not None:
            return f"{text} (default: {self.option.default_help})"
        if self.is_bool or self.required:
            return text
        shown = [(k, v) for k, v in self.defaults if v is not None]
        if not shown:
            return text
        if len({repr(v) for _, v in shown}) == 1 and len(shown) == len(self.defaults):
            return f"{text} (default: {show(shown[0][1])})"
        return f"{text} (default: " + ", ".join(f"{k} {show(v)}" for k, v in shown) + ")"


def show(value: Any) -> str:
    """A default as a user would type it."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


@cache
def options_of(cls: type) -> tuple[OptionField, ...]:
    """Every option a job (or config) class takes, its groups' included, in declaration order. Raises if two
    options would share a key (a declaration error, caught by the tests)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, OptionField] = {}

    def add(of: OptionField) -> None:
        if of.key in out:
            old = out[of.key]
            if old.group is None or old.group != of.group or old.field != of.field:
                raise TypeError(f"{cls.__name__}: option {of.key!r} declared twice ({old.field}, {of.field})")
            out[of.key] = dataclasses.replace(old, defaults=old.defaults + of.defaults, kinds=old.kinds + of.kinds,
                                              required=old.required and of.required)
            return
        out[of.key] = of

    for f in dataclasses.fields(cls):
        if "option" in f.metadata:
            opt = f.metadata["option"]
            add(OptionField(opt.name or f.name, f.name, opt, hints[f.name], (("", _field_default(f)),),
                            required=_required(f)))
        elif "group" in f.metadata:
            spec: Group = f.metadata["group"]
            fixed = dict(spec.fixed)
            if spec.select:
                names = tuple(k.kind for k in spec.kinds)
                add(OptionField(spec.select, spec.select, Option(spec.select_help, choices=names), str,
                                (("", spec.select_default),), group=f.name))
            for kind in spec.kinds:
                label = getattr(kind, "kind", "") if spec.select else ""
                for inner in options_of(kind):
                    if inner.key in spec.omit or inner.field in fixed or any(
                            k in fixed and fixed[k] != v for k, v in inner.option.when):
                        continue
                    add(dataclasses.replace(inner, group=f.name, defaults=((label, inner.default),),
                                            kinds=(label,) if spec.select else ()))
    return tuple(out.values())


def _base(hint: Any) -> tuple[Any, bool]:
    """``(type, optional)`` of a field's hint: ``int | None`` -> ``(int, True)``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), len(rest) < len(args)
    return hint, False


def check(of: OptionField, value: Any, text: bool = False) -> Any:
    """``value`` converted and checked as option ``of`` takes it (``text``: a flag's text). None stays None
    (not given)."""
    opt = of.option
    if value is None:
        return None
    kind, _ = _base(of.type)
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(f"must be true or false, got {value!r}")
        return value
    if opt.parse is not None:
        if isinstance(value, (list, tuple)) and not text:
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict) and not text:
            value = ",".join(f"{k}={v}" for k, v in value.items())
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise OptionError(f"expected text, got {value!r}")
        try:
            value = opt.parse(str(value))
        except (TypeError, ValueError) as exc:
            raise OptionError(str(exc)) from None
    elif kind in (int, float):
        value = _number(kind, value, text)
    elif not isinstance(value, str):
        raise OptionError(f"must be a string, got {value!r}")
    elif opt.path and not value.strip():
        raise OptionError("must be a path, got an empty string")
    if opt.choices is not None and value not in opt.choices:
        raise OptionError(f"must be one of {', '.join(map(str, opt.choices))}, got {value!r}")
    if opt.low is not None or opt.high is not None:
        _bounds(opt, value)
    return value


def _number(kind: type, value: Any, text: bool) -> int | float:
    word = "an integer" if kind is int else "a number"
    if text:
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise OptionError(f"expected {word}, got {value!r}") from None
    elif isinstance(value, bool) or not isinstance(value, int) and not (kind is float and isinstance(value, float)):
        raise OptionError(f"must be {word}, got {value!r}")
    value = kind(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f"expected a finite number, got {value!r}")
    return value


def _bounds(opt: Option, value: Any) -> None:
    low_bad = opt.low is not None and (value < opt.low or (opt.low_open and value == opt.low))
    high_bad = opt.high is not None and (value > opt.high or (opt.high_open and value == opt.high))
    if low_bad or high_bad:
        lo = "" if opt.low is None else f"{'>' if opt.low_open else '>='} {_shown(opt.low)}"
        hi = "" if opt.high is None else f"{'<' if opt.high_open else '<='} {_shown(opt.high)}"
        raise OptionError(f"must be {' and '.join(x for x in (lo, hi) if x)}, got {value!r}")


def _shown(bound: float) -> str:
    """A bound as a user would type it: an integer whole (``4294967295``, not ``4.29497e+09``)."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 2**63 else f"{bound:g}"


def resolve_path(value: str | None) -> str | None:
    """A local path made absolute (a URI as given): what manifests record, whatever the working directory. An
    existing local path that is neither a regular file nor a folder (a named pipe, a device, a socket) is
    refused here, before anything opens it: reading one can hang or never end."""
    if value is None or storage.is_remote(value):
        return value
    try:
        storage.refuse_special(value)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    return storage.normalize(value)


def build(cls: type, values: dict[str, Any], label: Callable[[OptionField], str] | None = None) -> Any:
    """An instance of ``cls`` from option values by key (None or absent: the field's default). Values are
    assumed checked (``check``); what only a combination can break (an option the chosen extractor does not
    take, a required option missing) raises ``OptionError``."""
    label = label or (lambda of: of.flag)
    kwargs: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    own = [of for of in options_of(cls) if of.group is None]
    for of in own:
        value = values.get(of.key)
        if value is None:
            if of.required:
                raise OptionError(f"{label(of)} is required")
            continue
        if of.option.path:
            value = resolve_path(value)
        kwargs[of.field] = (not value) if of.option.invert else value
    for name, f in fields.items():  # plain fields (not options) pass through when given, e.g. a chain's stages
        if "option" not in f.metadata and "group" not in f.metadata and name in values and f.init:
            kwargs[name] = values[name]
    for name, f in fields.items():
        if "group" not in f.metadata:
            continue
        spec: Group = f.metadata["group"]
        inner = [of for of in options_of(cls) if of.group == name and of.key != spec.select]
        given = {of.key: values[of.key] for of in inner if values.get(of.key) is not None}
        if spec.select:
            chosen = values.get(spec.select) or spec.select_default
            kinds = {k.kind: k for k in spec.kinds}
            kind = kinds[chosen]
            stray = [label(of) for of in inner if of.key in given and chosen not in of.kinds]
            if stray:
                raise OptionError(f"{', '.join(stray)} do(es) not apply to the {chosen} {spec.select}")
        else:
            kind = spec.kinds[0]
            if not given and not spec.fixed and f.default is None:
                continue  # the job's own default (None: its offline default)
        sub = {of.key: given.get(of.key) for of in options_of(kind)} | dict(spec.fixed)
        sub |= {f.name: values[f.name] for f in dataclasses.fields(kind)
                if "option" not in f.metadata and "group" not in f.metadata and f.name in values}
        missing = [of for of in options_of(kind) if of.required and sub.get(of.key) is None]
        if missing:
            what = f"the {chosen} {spec.select}" if spec.select else name
            raise OptionError(f"{what} needs {', '.join(label(of) for of in missing)}")
        try:
            kwargs[name] = build(kind, sub, label)
        except OptionError:
            raise
        except (TypeError, ValueError) as exc:
            raise OptionError(f"{name}: {exc}") from None
    return cls(**kwargs)


def input_paths(job: Any) -> list[str]:
    """The locations a job reads, by its declared path options (nested configs' included)."""
    out = []
    for of in options_of(type(job)):
        if not of.option.path or of.option.writes:
            continue
        owner = getattr(job, of.group, None) if of.group else job
        value = getattr(owner, of.field, None) if owner is not None else None
        if isinstance(value, str) and value:
            out.append(value)
    return out


def defaults(cls: type) -> dict[str, Any]:
    """``{key: default}`` of every option of ``cls`` (a selected group's options: the default kind's)."""
    return {of.key: of.default for of in options_of(cls)}
