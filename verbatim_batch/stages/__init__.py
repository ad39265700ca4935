"""The stages floor: one module per stage (its job, its stage, its ``COMMAND``), the registry that lists them
(``registry``), the chain chunk -> embed -> index -> retrieve [-> rerank] -> extract (``chains``), nightly runs
(``nightly``) and publishing (``publish``). Every stage runs through the engine's one runner
(``engine.runner.run_stage``)."""
