"""Span extraction: pairs in, verbatim spans out (``stage.PairExtractor``); extractors are registered in
``registry``."""

from __future__ import annotations

from typing import Any

from verbatim_batch.extract.registry import EXTRACTORS, build_extractor, weights_fingerprint

__all__ = ["EXTRACTORS", "build_extractor", "extractor_config", "weights_fingerprint"]


def extractor_config(kind: str, **settings: Any):
    """The config object of an extractor kind, built from keyword settings (None values dropped)."""
    from verbatim_batch.extract.registry import get

    return get(kind).config(**{k: v for k, v in settings.items() if v is not None})
