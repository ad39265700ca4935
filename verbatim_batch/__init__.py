"""verbatim-batch: verbatim evidence extraction over research-paper corpora, on Ray."""

from verbatim_batch.core import __version__
from verbatim_batch.core.redact import install_log_redaction as _install_log_redaction

__all__ = ["__version__"]

_install_log_redaction()  # a log line of this package never carries a credential (redact.py)
