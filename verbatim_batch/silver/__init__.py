"""Silver floor: synthetic queries (``querygen``), silver data from an LLM teacher (``dataset``) and the
student's training loop (``train``). No Ray: the Ray Train wiring is the ``train`` stage."""
