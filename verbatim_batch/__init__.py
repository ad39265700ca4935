"""verbatim-batch: verbatim evidence extraction over research-paper corpora, on Ray."""

__version__ = "0.1.0"
