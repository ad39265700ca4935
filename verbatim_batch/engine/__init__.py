"""The engine floor: everything that runs stages on Ray and nothing stage-specific: the run loop (``runner``), sinks
and sources, what a stage asks of Ray (``resources``, ``restarts``, ``ray_env``), model actors and live counts,
progress, worker faults, the pair planner, the vLLM engine, the Iceberg lake and ``telemetry``. The floors below
never import Ray.
"""
