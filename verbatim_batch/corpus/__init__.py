"""Corpus floor: reading papers (``readers``), their metadata tables (``metadata``), the one markdown scanner
(``markdown``), the chunker with exact offsets (``chunker``) and the chunk stage's batch callable (``ingest``)."""
