"""Operating a run: the metrics a platform engineer scrapes and alerts on, and each run's performance report.

- ``declare``: every exported metric, declared once (name, kind, help, labels); the Pushgateway registry, the
  Ray exporter and the metric reference (docs/reference/metrics.md) are all built from it.
- ``accounting``: a committed (or failed) run's manifest -> the samples of its stage (rows by outcome, tokens,
  batches, bytes, duration). The one place a manifest's counts become metrics; the manifest records the
  result (``manifest["metrics"]``), so the exported figures are the manifest's.
- ``session``: what this process recorded, handed out once when the command ends (``finish``).
- ``push``: a Pushgateway (``--metrics-push URL``), for one-shot commands and cron.
- ``ray_export``: ``ray.util.metrics`` in a detached actor, scraped with Ray's own metrics on a cluster.
- ``perf``: CPU-seconds of every process, peak memory, actor idle share, GPU use, per stage.
"""
