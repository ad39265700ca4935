"""The four hand-labelled dev files of ``../shared/devsets`` (beside the repository), as the extractor
benchmarks read them: ``bench_evidence_quality.py`` and ``bench_offline_extractor.py``."""

from __future__ import annotations

import sys
from pathlib import Path

FILES = ("seeds-dev", "seeds-dev-broad", "seeds-dev-retrieved", "seeds-dev-retrieved-broad")
DEFAULT_DEVSETS = Path(__file__).resolve().parents[2] / "shared" / "devsets"


def load_devsets(folder: Path) -> dict[str, list[dict]] | None:
    """Each file's gold rows (``evaluate.load_gold``); None, saying which are missing, when any is."""
    from verbatim_batch.quality.evaluate import load_gold

    missing = [f for f in FILES if not (folder / f"{f}.jsonl").exists()]
    if missing:
        print(f"dev sets not found in {folder} (missing {', '.join(missing)})", file=sys.stderr)
        return None
    return {f: load_gold(folder / f"{f}.jsonl") for f in FILES}
