"""docs/reference/metrics.md, generated from the declarations (``declare.METRICS``): ``python -m
verbatim_batch.engine.telemetry.reference > docs/reference/metrics.md`` (a test keeps it current)."""

from __future__ import annotations

from verbatim_batch.engine.telemetry.declare import DURATION_BUCKETS, METRICS, OUTCOMES, STATUSES


def markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Generated from `verbatim_batch/engine/telemetry/declare.py` "
        "(`python -m verbatim_batch.engine.telemetry.reference`); "
        "a test keeps this page current. How to scrape them, the dashboard and the alerts: "
        "[Operating it](../operations.md).",
        "",
        "| metric | type | labels | Ray name | what it counts |",
        "|---|---|---|---|---|",
    ]
    for m in METRICS:
        ray = "ray_" + m.ray_name + ("_total" if m.kind == "counter" else "")
        lines.append(f"| `{m.name}` | {m.kind} | {', '.join(f'`{x}`' for x in m.labels)} | `{ray}` | "
                     f"{m.help.replace('|', '/')} |")
    lines += [
        "",
        f"- `outcome`: {', '.join(f'`{o}`' for o in OUTCOMES)}. For every stage, in = written + carried + "
        "resumed; failed, withheld and rejected are counted apart (failed rows are written as error rows).",
        f"- `status`: {', '.join(f'`{s}`' for s in STATUSES)}.",
        "- `command`: the command that ran (`nightly`, `run`, `demo`, `extract`, ...); `stage`: the stage run "
        "within it (`chunk`, `embed`, `index`, `retrieve`, `rerank`, `extract`, `querygen`, `silver-data`), or "
        "`total` for the whole command's duration.",
        f"- Duration buckets (seconds): {', '.join(f'{b:g}' for b in DURATION_BUCKETS)}.",
        "- Through a Pushgateway the counters hold the last command's figures (each push replaces them); through "
        "Ray they are running totals over every command the cluster ran: take `increase()` over a night.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
