"""Span extraction: pairs in, verbatim spans out (see ``stage.ExtractStage``)."""

from __future__ import annotations

from typing import Any

EXTRACTORS = ("highlighter", "semantic", "llm")


def extractor_config(kind: str, **settings: Any):
    """The config object of an extractor kind, built from keyword settings (None values dropped)."""
    settings = {k: v for k, v in settings.items() if v is not None}
    if kind == "highlighter":
        from .highlighter import HighlighterConfig

        return HighlighterConfig(**settings)
    if kind == "semantic":
        from .semantic import SemanticConfig

        return SemanticConfig(**settings)
    if kind == "llm":
        from .llm import LLMConfig

        return LLMConfig(**settings)
    raise ValueError(f"unknown extractor {kind!r} (one of {', '.join(EXTRACTORS)})")


def build_extractor(config):
    """Load the extractor a config describes (the model loads here, once per actor)."""
    from .highlighter import Highlighter, HighlighterConfig
    from .llm import LLMConfig, LLMExtractor
    from .semantic import SemanticConfig, SemanticExtractor

    if isinstance(config, HighlighterConfig):
        return Highlighter(config)
    if isinstance(config, SemanticConfig):
        return SemanticExtractor(config)
    if isinstance(config, LLMConfig):
        return LLMExtractor(config)
    raise TypeError(f"not an extractor config: {type(config).__name__}")


def weights_fingerprint(config) -> str | None:
    """The weights hash the extractor would record, without loading it (None for a remote LLM endpoint,
    whose model is known only by the name in its config)."""
    from .highlighter import HighlighterConfig
    from .semantic import SemanticConfig

    if isinstance(config, HighlighterConfig):
        from ..models import fingerprint, resolve_model_dir, safetensors_files

        return fingerprint(safetensors_files(resolve_model_dir(config.model, config.revision, "highlighter model")))
    if isinstance(config, SemanticConfig):
        from ..embedding import weights_fingerprint as embedder_fingerprint

        return embedder_fingerprint(config.embedder_config())
    return None
