"""verbatim-batch: verbatim evidence extraction over research-paper corpora, on Ray."""

__version__ = "0.1.0"

from verbatim_batch.redact import install_log_redaction as _install_log_redaction

_install_log_redaction()  # a log line of this package never carries a credential (redact.py)
