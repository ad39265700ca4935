"""The one warning line a metrics sink that cannot be reached costs (never the run)."""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """``verbatim-batch: warning: ...`` on stderr, credentials redacted."""
    from verbatim_batch.core.redact import redact_text

    print(f"verbatim-batch: warning: {redact_text(message)}", file=sys.stderr)
