"""What an extractor module declares about itself (``EXTRACTOR = ExtractorKind(...)``): its config type, how it
is built, fingerprinted and placed. The registry (``registry``) lists the modules that declare one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PLACEMENTS = ("model", "io", "vllm")  # one model actor per GPU (else CPU) | I/O-bound actors | ray.data.llm


@dataclass(frozen=True)
class ExtractorKind:
    name: str
    config: type  # a frozen dataclass with ``hash`` and ``to_dict``
    build: Callable[[Any], Any]  # config -> a loaded extractor (``__call__`` over pairs, ``describe``)
    fingerprint: Callable[[Any], str | None] = lambda config: None  # weights hash, without loading the model
    placement: Callable[[Any], str] = lambda config: "model"  # how the extract stage runs it (``PLACEMENTS``)
