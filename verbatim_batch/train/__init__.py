"""``verbatim-batch train``: fine-tune the highlighter (a ModernBERT token classifier) on silver data with
Ray Train. ``data`` reads pairs and cuts labelled windows exactly as the highlighter reads them, ``loop`` is
the transformers Trainer inside a Ray Train worker, ``job`` the run folder around it."""

from verbatim_batch.train.job import TrainJob, run_train

__all__ = ["TrainJob", "run_train"]
