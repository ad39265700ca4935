"""The only list of extractors: each module defines ``EXTRACTOR = ExtractorKind(...)`` and is listed once here;
the CLI's ``--extractor``, the extract job's config group, the API and the references derive from it.
"""

from __future__ import annotations

from typing import Any

from verbatim_batch.extract import highlighter, llm, semantic
from verbatim_batch.extract.kind import PLACEMENTS, ExtractorKind

KINDS: dict[str, ExtractorKind] = {e.name: e for e in (semantic.EXTRACTOR, highlighter.EXTRACTOR, llm.EXTRACTOR)}
EXTRACTORS = tuple(KINDS)
CONFIGS = tuple(e.config for e in KINDS.values())  # every extractor config type, the default (semantic) first
__all__ = ["CONFIGS", "EXTRACTORS", "KINDS", "PLACEMENTS", "build_extractor", "extractor_config", "get", "kind_of",
           "placement", "weights_fingerprint"]


def get(kind: str) -> ExtractorKind:
    if kind not in KINDS:
        raise ValueError(f"unknown extractor {kind!r} (one of {', '.join(EXTRACTORS)})")
    return KINDS[kind]


def kind_of(config: Any) -> str:
    """The registered kind of an extractor config (its class's ``kind``)."""
    kind = getattr(type(config), "kind", None)
    if kind not in KINDS or KINDS[kind].config is not type(config):
        raise TypeError(f"not an extractor config: {type(config).__name__}")
    return kind


def build_extractor(config: Any) -> Any:
    """Load the extractor a config describes (the model loads here, once per actor)."""
    return get(kind_of(config)).build(config)


def weights_fingerprint(config: Any) -> str | None:
    """The weights hash the extractor would record, without loading it (None for a remote LLM endpoint)."""
    return get(kind_of(config)).fingerprint(config)


def placement(config: Any) -> str:
    return get(kind_of(config)).placement(config)


def extractor_config(kind: str, **settings: Any) -> Any:
    """The config of an extractor kind, built from keyword settings (None values dropped)."""
    return get(kind).config(**{k: v for k, v in settings.items() if v is not None})
