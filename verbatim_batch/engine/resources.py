"""What a stage needs from Ray, declared once on the stage, and the one function that turns it into Ray arguments.

A stage class declares its ``Resources`` (as NeMo Curator's ``ProcessingStage.resources``); the runner applies a
job's options (``with_job``) and hands the result to the stage; ``ray_args`` alone turns it into Ray arguments: one
actor per GPU where there are GPUs and the stage declares them; on CPU, a pool (``ray_env.actor_pool``) that always
leaves one CPU to the reads and writes around it; inside a user's pipeline (``api``), actors that claim no CPU (a
scheduling figure, not a limit), so chained pools never take every CPU from the reads. Actors and tasks restart
``restarts`` times (Ray Data: forever), then the stage stops with one line (``worker_faults``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from verbatim_batch.engine import ray_env
from verbatim_batch.engine.restarts import Restarting


def _quiet_bounds_warning() -> None:
    """Ray 2.60 deprecates ``map_batches(**ray_remote_args)`` but has no parameter for the restart bounds ``ray_args``
    sets, so its warning is off for the package's own calls (put first again at each call: Ray adds filters later)."""
    warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated", module=r"verbatim_batch\.")


@dataclass(frozen=True)
class Resources:
    """What one actor or task of a stage needs, and how its calls are cut. ``with_`` gives an overridden copy."""

    cpus: float = 1.0  # CPUs per actor or task (CPU-only clusters size actor pools down to fit: ``actor_pool``)
    gpus: float = 0.0  # GPUs per actor or task where the cluster has GPUs (1: one model per GPU); none: CPU
    actors: int | None = None  # actor-pool size (or the cap on concurrent tasks); None: one per GPU, else 1
    batch_rows: int | None = None  # rows per call (None: a whole block per call)
    whole_blocks: bool = False  # each call takes one block as the stage cut it (e.g. whole queries, about
    #                             ``batch_rows`` rows): ``batch_rows`` sizes the blocks, not the calls
    threads: int | None = None  # torch threads per model actor (a stage declaring ``gpus``); None: every CPU on a
    #                             CPU cluster, torch's own on a GPU one
    token_budget: int | None = None  # padded tokens per forward pass; None: the model config's own
    restarts: int = Restarting.worker_restarts  # restarts of a lost actor / retries of a lost task, then the stage
    #                                              stops (``worker_faults``); never Ray Data's unbounded default

    def __post_init__(self) -> None:
        if self.cpus < 0 or self.gpus < 0:
            raise ValueError(f"cpus and gpus must be >= 0, got {self.cpus} and {self.gpus}")
        if isinstance(self.restarts, bool) or not isinstance(self.restarts, int) or self.restarts < 0:
            raise ValueError(f"restarts must be an integer >= 0, got {self.restarts!r}")
        for name in ("actors", "batch_rows", "threads", "token_budget"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")

    def with_(self, **changes: Any) -> Resources:
        """A copy with ``changes``; a change of None keeps the declared value (an option that was not given)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def with_job(self, job: Any) -> Resources:
        """A copy with a job's ``batch_rows``, ``concurrency``, ``threads`` and ``worker_restarts`` applied, where
        set."""
        return self.with_(batch_rows=getattr(job, "batch_rows", None), actors=getattr(job, "concurrency", None),
                          threads=getattr(job, "threads", None), restarts=getattr(job, "worker_restarts", None))


@dataclass(frozen=True)
class Cluster:
    """Where a declaration is applied: the cluster's CPUs and GPUs, and whether the stage runs inside someone
    else's pipeline (``api``: its actors claim no CPU) or owns its pipeline (a stage job)."""

    cpus: int
    gpus: int
    user_pipeline: bool = False

    @classmethod
    def current(cls, user_pipeline: bool = False) -> Cluster:
        """This driver's Ray cluster (started, through ``ray_env.init_ray``, if it is not up yet)."""
        ray_env.init_ray()
        return cls(ray_env.cpus(), ray_env.gpus(), user_pipeline)


def task_bounds(restarts: int) -> dict[str, int]:
    """The ``max_retries`` bound of a stage's plain tasks beside its actors: Ray Data's retry forever, so a task the OOM
    killer ends on every attempt would loop without a word. Resources stay Ray Data's own."""
    _quiet_bounds_warning()
    return {"max_retries": restarts}


def ray_args(res: Resources, fn: Any = None, cluster: Cluster | None = None, **kwargs: Any) -> dict[str, Any]:
    """The Ray arguments of ``res`` on ``cluster`` (default ``Cluster.current()``), merged into ``kwargs``: an actor
    pool's ``map_batches`` arguments for a class (a GPU model actor also gets ``threads`` and ``token_budget``), tasks'
    for a function, a Ray task's options for None."""
    import ray

    _quiet_bounds_warning()
    kwargs = {"max_retries": res.restarts} | kwargs if fn is None or not isinstance(fn, type) else \
        {"max_restarts": res.restarts, "max_task_retries": res.restarts} | kwargs  # bounded: Ray Data's is -1
    if fn is None and not res.gpus:  # a CPU task: nothing to look up
        return kwargs | {"num_cpus": res.cpus}
    cluster = cluster or Cluster.current()
    gpus = res.gpus if cluster.gpus else 0.0
    if fn is None:
        return kwargs | {"num_cpus": res.cpus} | ({"num_gpus": gpus} if gpus else {})
    args: dict[str, Any] = dict(kwargs)
    args["batch_size"] = None if res.whole_blocks else res.batch_rows
    if not isinstance(fn, type):  # tasks: they give their CPU back after each call
        args["num_cpus"] = res.cpus
        if gpus:
            args["num_gpus"] = gpus
        if res.actors:
            args["compute"] = ray.data.TaskPoolStrategy(size=res.actors)
        return args
    if cluster.user_pipeline:
        size, resources = res.actors or (cluster.gpus if gpus else 1), {"num_cpus": 0}
    elif gpus:  # one model per GPU; Ray's own CPU default per actor, as before
        size, resources = res.actors or cluster.gpus, {}
    else:
        size, per_actor = ray_env.actor_pool(cluster.cpus, res.actors or 1, res.cpus)
        resources = {"num_cpus": per_actor}
    args["compute"] = ray.data.ActorPoolStrategy(size=size)
    args.update(resources)
    if gpus:
        args["num_gpus"] = gpus
    from verbatim_batch.engine.model_actor import ModelActor

    if issubclass(fn, ModelActor) and (res.gpus or res.token_budget):
        extra: dict[str, Any] = {}
        if res.gpus:  # a model stage; an I/O stage's actors (an HTTP endpoint) set no torch threads
            extra["threads"] = res.threads or (None if cluster.gpus else cluster.cpus)
        if res.token_budget:
            extra["token_budget"] = res.token_budget
        args["fn_constructor_kwargs"] = dict(kwargs.get("fn_constructor_kwargs") or {}) | extra
    return args
