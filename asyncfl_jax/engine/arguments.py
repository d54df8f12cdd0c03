"""Up-front checks of :func:`~asyncfl_jax.engine.simulate`'s arguments (types and simple ranges), before anything is
built or compiled; the finer checks (hyper-parameter names and values, the seeds' range, schedule sizes) follow in
``prepare_run``. See :mod:`asyncfl_jax.arguments`."""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.arguments import (_got, check_bool, check_callbacks, check_hparams, check_instance, check_int,
                                   check_path, check_seeds, check_str)
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.precision import check_precision
from asyncfl_jax.task import Task
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.schedule import Schedule


def check_simulate(task: Any, algorithm: Any, schedules: Any, local: Any, seeds: Any, hparams: Any, eval_every: Any,
                   progress: Any, label: Any, shard_jobs: Any, shard_replicas: Any, shard_clients: Any,
                   lookahead: Any, checkpoint_dir: Any, checkpoint_every: Any, resume: Any, callbacks: Any,
                   precision: Any, trajectory: Any, replica_batch: Any) -> None:
    """The types (and simple ranges) of :func:`~asyncfl_jax.engine.simulate`'s arguments, before anything is
    built; the finer checks (hyper-parameter names and values, seeds' range, schedule sizes) follow in
    ``prepare_run``."""
    check_instance("task", task, Task, "a Task (from make_task)")
    check_instance("algorithm", algorithm, Algorithm, "an Algorithm (e.g. afl.fedbuff(), afl.get_algorithm(name))")
    timelines = (Schedule, EventClock)
    if not isinstance(schedules, timelines):
        if not isinstance(schedules, (list, tuple)) or not schedules:
            raise TypeError("schedules must be a Schedule (from make_schedule), an EventClock, or a non-empty list of "
                            f"them (one per seed), {_got(schedules)}")
        for i, s in enumerate(schedules):
            check_instance(f"schedules[{i}]", s, timelines, "a Schedule (from make_schedule) or an EventClock")
    if local is not None:
        check_instance("local", local, LocalConfig, "a LocalConfig or None")
    check_seeds(seeds)
    check_hparams(hparams)
    check_int("eval_every", eval_every, minimum=1, optional=True)  # None: the usual 30 evaluations per run
    check_bool("progress", progress)
    check_str("label", label, optional=True)
    for name, flag in (("shard_jobs", shard_jobs), ("shard_replicas", shard_replicas),
                       ("shard_clients", shard_clients), ("resume", resume)):
        check_bool(name, flag)
    check_int("lookahead", lookahead, minimum=1)
    check_path("checkpoint_dir", checkpoint_dir)
    check_int("checkpoint_every", checkpoint_every, minimum=1, optional=True)  # None: by wall-clock interval
    check_callbacks(callbacks)
    check_precision(precision)  # the one message of every entry point: "precision must be one of [...]"
    if not (trajectory is None or isinstance(trajectory, (bool, np.bool_)) or callable(trajectory)):
        raise TypeError("trajectory must be True, False/None, or a function of the flat global model (e.g. "
                        f"lambda x: x[:10]), {_got(trajectory)}")
    check_int("replica_batch", replica_batch, minimum=1, optional=True)
