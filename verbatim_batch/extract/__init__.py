"""Span extraction: pairs in, verbatim spans out (``gate.PairExtractor``); the extractors are listed in
``registry``."""
