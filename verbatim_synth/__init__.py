"""Synthetic docling-style papers and labelled queries: the bundled example corpus, tests and benchmarks.

Not part of the runtime: nothing in ``verbatim_batch`` imports it except the ``synth`` command and the demo.
Relevance is judged on real text (``../shared/devsets``), never on this corpus.
"""

from .corpus import generate_paper, main, write_bad_inputs, write_corpus
from .labelled import make_labelled_queries

__all__ = ["generate_paper", "main", "make_labelled_queries", "write_bad_inputs", "write_corpus"]
