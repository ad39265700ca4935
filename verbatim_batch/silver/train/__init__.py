"""Fine-tuning the highlighter on silver data: ``data`` (pairs, labelled windows), ``loop`` (the Trainer and its
passes), ``report``; the Ray Train wiring and run folder are ``stages.train``."""
