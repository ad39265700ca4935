"""The extractor registry: one place maps an extractor kind (and its config type) to how it is built,
fingerprinted and run.

Each extractor module defines an ``EXTRACTOR = ExtractorKind(...)``; ``MODULES`` names the module of each
kind, imported only when that kind is used. Adding an extractor touches its own module and one line here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# kind -> the module defining its ``EXTRACTOR``
MODULES = {
    "semantic": "verbatim_batch.extract.semantic",
    "highlighter": "verbatim_batch.extract.highlighter",
    "llm": "verbatim_batch.extract.llm",
}
EXTRACTORS = tuple(MODULES)
PLACEMENTS = ("model", "io", "vllm")  # one model actor per GPU (else CPU) | I/O-bound actors | ray.data.llm


@dataclass(frozen=True)
class ExtractorKind:
    name: str
    config: type  # a frozen dataclass with ``hash`` and ``to_dict``
    build: Callable[[Any], Any]  # config -> a loaded extractor (``__call__`` over pairs, ``describe``)
    fingerprint: Callable[[Any], str | None] = lambda config: None  # weights hash, without loading the model
    placement: Callable[[Any], str] = lambda config: "model"  # how the extract stage runs it (``PLACEMENTS``)


def get(kind: str) -> ExtractorKind:
    if kind not in MODULES:
        raise ValueError(f"unknown extractor {kind!r} (one of {', '.join(EXTRACTORS)})")
    return importlib.import_module(MODULES[kind]).EXTRACTOR


def kind_of(config: Any) -> str:
    """The registered kind of an extractor config (its class's ``kind``)."""
    kind = getattr(type(config), "kind", None)
    if kind not in MODULES or get(kind).config is not type(config):
        raise TypeError(f"not an extractor config: {type(config).__name__}")
    return kind


def config_for(kind: str, **settings: Any) -> Any:
    """The config of ``kind`` from keyword settings: None values and settings the kind has no field for are
    dropped (so one set of CLI options serves every kind)."""
    cls = get(kind).config
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in settings.items() if v is not None and k in names})


def build_extractor(config: Any) -> Any:
    """Load the extractor a config describes (the model loads here, once per actor)."""
    return get(kind_of(config)).build(config)


def weights_fingerprint(config: Any) -> str | None:
    """The weights hash the extractor would record, without loading it (None for a remote LLM endpoint,
    whose model is known only by the name in its config)."""
    return get(kind_of(config)).fingerprint(config)


def placement(config: Any) -> str:
    return get(kind_of(config)).placement(config)
