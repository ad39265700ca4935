"""The run report: what a run did and cost, as ``report.json`` and ``report.html`` (``build``), from the run's
tables (``data``), its sections (``sections``), the performance table (``perf``) and the HTML parts (``html``)."""
