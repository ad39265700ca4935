"""Operating a run: the metrics a platform engineer scrapes and alerts on, and each run's performance report.

``declare`` (every metric, once; the Pushgateway, the Ray exporter and docs/reference/metrics.md are built from it),
``accounting`` (a run's manifest -> its stage's samples, the one place counts become metrics), ``session`` (what this
process recorded, handed out once at the end), ``push`` (a Pushgateway), ``ray_export`` (``ray.util.metrics`` in a
detached actor) and ``perf`` (CPU-seconds, peak memory, actor idle share, GPU use, per stage).
"""
