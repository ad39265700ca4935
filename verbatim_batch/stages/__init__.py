"""Stages wired into Ray Data, each in its own module, all run by one runner (``runner.run_stage``).

- ``ray_env``: joining or starting Ray, sizing model actors;
- ``source`` / ``sink``: reading a corpus, writing a stage's tables with resumable writes and carry-forward;
- ``runner``: the run lifecycle shared by every stage (staging, resume, carry, manifest, commit, report);
- one module per stage: ``chunk``, ``embed``, ``index``, ``retrieve``, ``extract``, ``querygen``, ``silver``;
- ``chains``: chunk -> embed -> index -> retrieve -> extract, defined once; ``nightly``: incremental chains.
"""

from verbatim_batch.core.records import read_queries
from verbatim_batch.engine.ray_env import init_ray
from verbatim_batch.engine.runner import (
    CompositeStage,
    Outcome,
    Plan,
    RunOptions,
    Stage,
    StageContext,
    StageResult,
    TableStage,
    Work,
    run_stage,
)
from verbatim_batch.stages.chains import STAGES, Chain, ChainJob, run_chain, run_chain_job
from verbatim_batch.stages.chunk import ChunkJob, run_chunk
from verbatim_batch.stages.embed import EmbedJob, run_embed
from verbatim_batch.stages.extract import ExtractJob, build_pairs, run_extract
from verbatim_batch.stages.index import IndexJob, run_index
from verbatim_batch.stages.nightly import NightlyJob, run_nightly
from verbatim_batch.stages.querygen import QueryGenJob, run_querygen
from verbatim_batch.stages.retrieve import RetrieveJob, run_retrieve
from verbatim_batch.stages.silver import SilverJob, run_silver

__all__ = [
    "STAGES", "Chain", "ChainJob", "ChunkJob", "EmbedJob", "ExtractJob", "IndexJob", "NightlyJob", "QueryGenJob",
    "RetrieveJob",
    "CompositeStage", "Outcome", "Plan", "RunOptions", "SilverJob", "Stage", "StageContext", "StageResult",
    "TableStage", "Work", "build_pairs", "init_ray", "read_queries",
    "run_chain", "run_chain_job", "run_chunk", "run_embed", "run_extract", "run_index", "run_nightly", "run_querygen",
    "run_retrieve", "run_silver", "run_stage",
]
