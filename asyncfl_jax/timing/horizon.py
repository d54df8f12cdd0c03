"""A fixed virtual-time horizon: schedules long enough to pass it, and cut at it.

An experiment that compares methods at a wall-clock horizon ``t_h`` (AREA) or within a time budget (AsyncFedED) needs
schedules whose last step lies after the horizon; the number of server steps that takes is not known in advance, so
:func:`build_past` doubles a first guess until it is enough. :func:`cut_at_horizon` then empties every step applied
after the horizon, so that the model after the last step is the model at the horizon and the schedules of several
trials keep one length (one vectorized program).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from asyncfl_jax.timing.schedule import Schedule

_ARRIVAL_FIELDS = ("arrival_clients", "arrival_slots", "arrival_versions", "arrival_times")
_DISPATCH_FIELDS = ("dispatch_clients", "dispatch_slots", "dispatch_times")


def steps_within(schedule: Schedule, horizon: float) -> int:
    """The number of server steps applied at or before ``horizon``."""
    return int(np.searchsorted(schedule.step_times, horizon, side="right"))


def build_past(build: Callable[[int], Schedule], horizon: float, steps: int) -> tuple[Schedule, int]:
    """``(build(k), k)`` for the first ``k`` of ``steps, 2 steps, 4 steps, ...`` whose schedule's last step is
    applied after ``horizon``."""
    while True:
        schedule = build(steps)
        if schedule.step_times[-1] > horizon:
            return schedule, steps
        steps *= 2


def cut_at_horizon(schedule: Schedule, horizon: float, num_steps: int) -> Schedule:
    """The schedule's first ``num_steps`` steps with every step applied after ``horizon`` emptied (no arrival, no
    dispatch): the model after the last step is then the model at the horizon, and schedules of different trials
    have one length (so they run as one vectorized program). Jobs in flight at the horizon are never applied."""
    schedule = schedule.truncate(num_steps)
    keep = steps_within(schedule, horizon)
    if keep == num_steps:
        return schedule
    fields = {}
    for name in (*_ARRIVAL_FIELDS, *_DISPATCH_FIELDS):
        a = getattr(schedule, name).copy()
        a[keep:] = np.nan if a.dtype.kind == "f" else -1
        fields[name] = a
    out = dataclasses.replace(schedule, **fields, info={**schedule.info, "horizon": horizon, "steps_in_horizon": keep})
    out.validate()
    return out
