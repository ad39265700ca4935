"""Fine-tuning the highlighter (a ModernBERT token classifier) on silver data: ``data`` reads pairs and cuts
labelled windows exactly as the highlighter reads them, ``loop`` is the transformers Trainer and its passes,
``report`` the training report. The Ray Train wiring and the run folder around it are the ``train`` stage
(``verbatim_batch.stages.train``)."""
