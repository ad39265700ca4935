"""Corpus floor: reading papers (``readers``), their metadata tables (``metadata``), the markdown chunker with
exact offsets (``chunker``) and the chunk stage's batch callable over raw records (``ingest``). No Ray."""
