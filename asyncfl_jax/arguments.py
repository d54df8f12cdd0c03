"""Up-front checks of the Python API's arguments: a wrong type or value is refused before anything is built or
compiled, with an error naming the argument, the value given and what is allowed.

A wrong type raises ``TypeError`` (``simulate(None, ...)``: "task must be a Task (from make_task), got None"), a value
of the right type out of range a ``ValueError``. ``bool`` is never taken for an integer (``steps=True`` is refused),
nor an integer for a ``bool`` flag. :func:`check_simulate`, :func:`check_make_task` and :func:`check_make_schedule`
check the arguments of :func:`~asyncfl_jax.engine.simulate`, :func:`~asyncfl_jax.task.make_task` and
:func:`~asyncfl_jax.timing.protocols.make_schedule`; :class:`~asyncfl_jax.client.LocalConfig` checks its fields'
types when it is made (:func:`check_int` and the others).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

HOOKS = ("on_start", "on_chunk", "on_interrupt", "on_end")
"""The hooks of a callback object (see :class:`~asyncfl_jax.engine.loop.HostLoop`)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _got(value: Any) -> str:
    return f"got {_shown(value)} ({type(value).__name__})"


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: int | None = None, optional: bool = False) -> None:
    """``value`` is an integer (``None`` too when ``optional``) of at least ``minimum``."""
    if value is None and optional:
        return
    if not is_int(value):
        raise TypeError(f"{name} must be an integer{' or None' if optional else ''}, {_got(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_real(name: str, value: Any, optional: bool = False) -> None:
    """``value`` is a real number (``None`` too when ``optional``)."""
    if value is None and optional:
        return
    if not is_real(value):
        raise TypeError(f"{name} must be a number{' or None' if optional else ''}, {_got(value)}")


def check_bool(name: str, value: Any) -> None:
    """``value`` is ``True`` or ``False``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, {_got(value)}")


def check_str(name: str, value: Any, optional: bool = False) -> None:
    """``value`` is a string (``None`` too when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string{' or None' if optional else ''}, {_got(value)}")


def check_instance(name: str, value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """``value`` is an instance of ``kind`` (``what`` says what is expected, e.g. "a Task (from make_task)")."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, {_got(value)}")


def check_callbacks(callbacks: Any) -> None:
    """``callbacks`` is a list or tuple of functions ``fn(update)`` or objects with at least one hook
    (:data:`HOOKS`); a single callback must be wrapped in a list."""
    if callable(callbacks) or any(hasattr(callbacks, h) for h in HOOKS):
        raise TypeError(f"callbacks must be a list of callbacks; wrap the single one given in a list: "
                        f"callbacks=[{_shown(callbacks)}]")
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks must be a list of callbacks (functions fn(update) or objects with "
                        f"{'/'.join(HOOKS)}), {_got(callbacks)}")
    for i, callback in enumerate(callbacks):
        if not (callable(callback) or any(callable(getattr(callback, h, None)) for h in HOOKS)):
            raise TypeError(f"callbacks[{i}] must be a function fn(update) or an object with one of the hooks "
                            f"{', '.join(HOOKS)}, {_got(callback)}")


def check_hparams(hparams: Any) -> None:
    """``hparams`` is None or a mapping of names (strings) to a number or a list of numbers (a sweep)."""
    if hparams is None:
        return
    if not isinstance(hparams, Mapping):
        raise TypeError(f"hparams must be a dict of hyper-parameter name -> value or list of values (a sweep), "
                        f"{_got(hparams)}")
    for key, value in hparams.items():
        if not isinstance(key, str):
            raise TypeError(f"hparams keys must be hyper-parameter names (strings), got {_shown(key)}")
        values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
        if isinstance(value, (list, tuple, np.ndarray)) and not values:
            raise ValueError(f"hparams[{key!r}] is an empty list: give at least one value")
        for v in values:
            if not _numeric_scalar(v):
                raise TypeError(f"hparams[{key!r}] must be a number or a list of numbers, {_got(v)}")


def _numeric_scalar(value: Any) -> bool:
    """A number, a bool, or a 0-d array of numbers (NumPy or JAX)."""
    if is_real(value) or isinstance(value, (bool, np.bool_)):
        return True
    try:
        return np.ndim(value) == 0 and hasattr(value, "dtype") and (
            np.issubdtype(np.dtype(value.dtype), np.number) or np.dtype(value.dtype) == np.bool_)
    except TypeError:
        return False


def check_seeds(seeds: Any) -> None:
    """``seeds`` is a non-empty list or tuple (or 1-D integer array) of integers (their range and repeats are
    checked with the replicas)."""
    if isinstance(seeds, (str, bytes)) or is_int(seeds) or not isinstance(seeds, (Sequence, np.ndarray)):
        raise TypeError(f"seeds must be a list of integers, e.g. [0, 1, 2], {_got(seeds)}")
    if len(seeds) == 0:
        raise ValueError("seeds must hold at least one seed, got []")


def check_path(name: str, value: Any, optional: bool = True) -> None:
    """``value`` is a path (a string or ``os.PathLike``), or None when ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or value == "":
        raise TypeError(f"{name} must be a folder path (a non-empty string){' or None' if optional else ''}, "
                        f"{_got(value)}")


def check_simulate(task: Any, algorithm: Any, schedules: Any, local: Any, seeds: Any, hparams: Any, eval_every: Any,
                   progress: Any, label: Any, shard_jobs: Any, shard_replicas: Any, shard_clients: Any,
                   lookahead: Any, checkpoint_dir: Any, checkpoint_every: Any, resume: Any, callbacks: Any,
                   precision: Any, trajectory: Any, replica_batch: Any) -> None:
    """The types (and simple ranges) of :func:`~asyncfl_jax.engine.simulate`'s arguments, before anything is
    built; the finer checks (hyper-parameter names and values, seeds' range, schedule sizes) follow in
    ``prepare_run``."""
    from asyncfl_jax.algorithms.base import Algorithm
    from asyncfl_jax.client import LocalConfig
    from asyncfl_jax.task import Task
    from asyncfl_jax.timing.clock import EventClock
    from asyncfl_jax.timing.schedule import Schedule

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
    check_int("eval_every", eval_every, minimum=1)
    check_bool("progress", progress)
    check_str("label", label, optional=True)
    for name, flag in (("shard_jobs", shard_jobs), ("shard_replicas", shard_replicas),
                       ("shard_clients", shard_clients), ("resume", resume)):
        check_bool(name, flag)
    check_int("lookahead", lookahead, minimum=1)
    check_path("checkpoint_dir", checkpoint_dir)
    check_int("checkpoint_every", checkpoint_every, minimum=1)
    check_callbacks(callbacks)
    check_str("precision", precision)
    if not (trajectory is None or isinstance(trajectory, (bool, np.bool_)) or callable(trajectory)):
        raise TypeError("trajectory must be True, False/None, or a function of the flat global model (e.g. "
                        f"lambda x: x[:10]), {_got(trajectory)}")
    check_int("replica_batch", replica_batch, minimum=1, optional=True)


def check_make_task(dataset: Any, parts: Any, model: Any, train_eval_size: Any, seed: Any,
                    client_test_fraction: Any, validation_fraction: Any, eval_clients: Any, loss: Any) -> None:
    """The types of :func:`~asyncfl_jax.task.make_task`'s arguments (the values are checked there)."""
    from asyncfl_jax.data.client_data import Dataset
    from asyncfl_jax.losses import Loss
    from asyncfl_jax.models.core import Model

    check_instance("dataset", dataset, Dataset, "a Dataset (e.g. afl.data.synthetic_leaf(...))")
    if isinstance(parts, (str, bytes, Mapping)) or not isinstance(parts, (Sequence, np.ndarray)) or len(parts) == 0:
        raise TypeError(f"parts must be a non-empty list of integer index arrays (one per client), {_got(parts)}")
    for i, part in enumerate(parts):
        array = part if isinstance(part, np.ndarray) else None
        if array is None and isinstance(part, (list, tuple, range)):
            array = np.asarray(part) if len(part) else np.zeros((0,), np.int64)
        if array is None or array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise TypeError(f"parts[{i}] must be a 1-D array of integer example indices, {_got(part)}")
    check_instance("model", model, Model, "a Model (from make_model or model_from_apply)")
    check_int("train_eval_size", train_eval_size, minimum=1)
    check_int("seed", seed, minimum=0)
    check_real("client_test_fraction", client_test_fraction)
    check_real("validation_fraction", validation_fraction)
    check_int("eval_clients", eval_clients, minimum=1, optional=True)
    if not (loss is None or isinstance(loss, (str, Loss))):
        raise TypeError(f"loss must be None, 'classification', 'regression' or a Loss, {_got(loss)}")


def check_make_schedule(protocol: Any, num_clients: Any, num_steps: Any, delays: Any, seed: Any) -> None:
    """The types of :func:`~asyncfl_jax.timing.protocols.make_schedule`'s positional arguments."""
    from asyncfl_jax.timing.delays import DelayModel

    check_str("protocol", protocol)
    check_int("num_clients", num_clients, minimum=1)
    check_int("num_steps", num_steps, minimum=1)
    if not isinstance(delays, (DelayModel, Mapping)):
        raise TypeError(f"delays must be a DelayModel or its to_dict() form, {_got(delays)}")
    check_int("seed", seed, minimum=0)
