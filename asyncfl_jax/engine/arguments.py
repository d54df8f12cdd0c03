"""Up-front checks of :func:`~asyncfl_jax.engine.simulate`'s arguments (types and simple ranges), before anything is
built or compiled; the finer checks (hyper-parameter names and values, the seeds' range, schedule sizes) follow in
``prepare_run``. See :mod:`asyncfl_jax.arguments`."""

from __future__ import annotations

from typing import Any

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.arguments import (_got, check_bool, check_callbacks, check_hparams, check_instance, check_int,
                                   check_path, check_seeds, check_str)
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.checkpoint import cadence
from asyncfl_jax.task import Task
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.schedule import Schedule


def check_simulate(task: Any, algorithm: Any, schedules: Any, local: Any, seeds: Any, hparams: Any, eval_every: Any,
                   progress: Any, label: Any, checkpoint_dir: Any, resume: Any, callbacks: Any) -> None:
    """The types (and simple ranges) of :func:`~asyncfl_jax.engine.simulate`'s arguments other than the engine
    options (:class:`~asyncfl_jax.engine.options.EngineOptions` checks those), before anything is built; the finer
    checks (hyper-parameter names and values, seeds' range, schedule sizes) follow in ``plan``."""
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
    check_bool("resume", resume)
    check_path("checkpoint_dir", checkpoint_dir)
    check_callbacks(callbacks)


def check_checkpoints(checkpoint_dir: Any, every: Any, interval: Any, final: Any, resume: bool) -> tuple[Any, Any, bool]:
    """The checkpoint keywords of :func:`~asyncfl_jax.engine.simulate` as ``(every, interval, final)``: ``every`` an
    integer >= 1 or None, a valid cadence (:func:`~asyncfl_jax.checkpoint.cadence`: not both), ``final`` a bool;
    ``resume``, ``every`` and ``interval`` need a ``checkpoint_dir``."""
    check_int("checkpoint_every", every, minimum=1, optional=True)  # None: by wall-clock interval
    cadence(every, interval)  # invalid values or both: a ValueError before anything runs
    check_bool("final_checkpoint", final)
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir to resume from")
    given = [f"{name} = {value!r}" for name, value in (("checkpoint_every", every), ("checkpoint_interval", interval))
             if value is not None]
    if given and checkpoint_dir is None:
        raise ValueError(f"{given[0]} needs a checkpoint_dir (without one no checkpoint is saved)")
    return every, interval, bool(final)
