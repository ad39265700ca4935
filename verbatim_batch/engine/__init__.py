"""The engine floor: everything that runs stages on Ray and nothing stage-specific.

The one run loop (``runner``), sinks and sources (``sink``, ``datasink``, ``source``, ``listing``), what a stage
asks of Ray (``resources``, ``restarts``, ``ray_env``), model actors and their live counts (``model_actor``,
``live``), progress lines (``progress``), worker faults (``worker_faults``, ``reaper``), the pair planner shared by
rerank and extract (``pair_plan``), the vLLM engine (``vllm``), the Iceberg lake (``lake``, ``iceberg_sink``) and
metrics (``telemetry``). The floors below never import Ray; the stages above import this one.
"""
