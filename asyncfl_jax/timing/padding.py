"""Schedules that run side by side as the replicas of one program need one arrival and one dispatch width."""

from __future__ import annotations

from typing import Sequence

from asyncfl_jax.timing.schedule import Schedule


def pad_to_common_widths(schedules: Sequence[Schedule]) -> list[Schedule]:
    """The schedules padded to the largest arrival width ``M`` and dispatch width ``D`` among them (padding adds no
    arrival and no dispatch), so that they stack as replicas of one vectorized program."""
    buffer_width = max(s.buffer_width for s in schedules)
    dispatch_width = max(s.dispatch_width for s in schedules)
    return [s.pad(buffer_width=buffer_width, dispatch_width=dispatch_width) for s in schedules]
