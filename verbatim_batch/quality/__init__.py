"""Quality floor: the paper's span metrics (``metrics``, ``evaluate``), retrieval metrics (``retrieval_eval``),
the abstention curve (``abstention``) and the re-check of any run (``verify``). No Ray: a check that can fan
out hands its calls to ``core.tasks.run_each``."""
