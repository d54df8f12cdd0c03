"""Up-front checks of the Python API's arguments: a wrong type or value is refused before anything is built or
compiled, with an error naming the argument, the value given and what is allowed.

A wrong type raises ``TypeError`` (``simulate(None, ...)``: "task must be a Task (from make_task), got None"), a value
of the right type out of range a ``ValueError``. ``bool`` is never taken for an integer (``steps=True`` is refused),
nor an integer for a ``bool`` flag. The checks here know no class of the package (it imports none of its modules);
:func:`~asyncfl_jax.engine.arguments.check_simulate`, ``check_make_task`` (:mod:`asyncfl_jax.task`) and
``check_make_schedule`` (:mod:`asyncfl_jax.timing.protocols`) use them for :func:`~asyncfl_jax.engine.simulate`,
:func:`~asyncfl_jax.task.make_task` and :func:`~asyncfl_jax.timing.protocols.make_schedule`, and
:class:`~asyncfl_jax.client.LocalConfig` checks its fields' types when it is made.
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
