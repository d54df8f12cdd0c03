"""What a run's clock reads: a pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule` as device arrays, and the
host-planned windows of lookahead batching.

A schedule becomes a :class:`ScheduleArrays` pytree (the initial jobs, then one :class:`StepArrays` row per server
step). Replicas that share a schedule share one copy; replicas with their own schedules stack them on a leading axis
(:func:`stack_schedules`). Lookahead batching adds a :class:`LookaheadPlan` to the steps (:func:`lookahead_plan`): it
is computed on the host from the schedule(s) and shared by every replica.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.timing.schedule import Schedule


class StepArrays(NamedTuple):
    """The per-step part of a schedule (leading axis: server steps)."""

    step: jax.Array  # int32 [T]
    time: jax.Array  # float32 [T]
    dispatch_clients: jax.Array  # int32 [T, D]
    dispatch_slots: jax.Array  # int32 [T, D]
    arrival_clients: jax.Array  # int32 [T, M]
    arrival_slots: jax.Array  # int32 [T, M]
    staleness: jax.Array  # int32 [T, M]
    plan: Any = ()  # LookaheadPlan with lookahead batching, else ()


class ScheduleArrays(NamedTuple):
    """A :class:`Schedule` as device arrays, in the form the scan consumes (a pytree; may have a replica axis)."""

    init_clients: jax.Array  # int32 [D0] jobs started from x_0 before step 0
    init_slots: jax.Array  # int32 [D0]
    steps: StepArrays


class LookaheadPlan(NamedTuple):
    """Host-computed control of lookahead batching, per server step (shared by every replica)."""

    position: jax.Array  # int32 [T] the buffer row step t's dispatches go to
    flush: jax.Array  # bool [T] train the buffered jobs at step t, before its arrivals


def schedule_arrays(schedule: Schedule, num_slots: int | None = None, init_width: int | None = None) -> ScheduleArrays:
    """Converts a schedule to the arrays the scan reads; pads the initial jobs to ``init_width`` if given."""
    del num_slots  # the slot count is the schedule's (kept for callers that pass it)
    d0 = schedule.init_clients.shape[0] if init_width is None else init_width
    init_clients = np.full((d0,), -1, np.int32)
    init_slots = np.full((d0,), -1, np.int32)
    init_clients[: schedule.init_clients.shape[0]] = schedule.init_clients
    init_slots[: schedule.init_slots.shape[0]] = schedule.init_slots
    steps = StepArrays(
        step=jnp.arange(schedule.num_steps, dtype=jnp.int32),
        time=jnp.asarray(schedule.step_times, jnp.float32),
        dispatch_clients=jnp.asarray(schedule.dispatch_clients, jnp.int32),
        dispatch_slots=jnp.asarray(schedule.dispatch_slots, jnp.int32),
        arrival_clients=jnp.asarray(schedule.arrival_clients, jnp.int32),
        arrival_slots=jnp.asarray(schedule.arrival_slots, jnp.int32),
        staleness=jnp.asarray(np.maximum(schedule.staleness, 0), jnp.int32),
    )
    return ScheduleArrays(init_clients=jnp.asarray(init_clients), init_slots=jnp.asarray(init_slots), steps=steps)


def stack_schedules(schedules: Sequence[Schedule]) -> tuple[ScheduleArrays, int]:
    """Stacks per-replica schedules (same T, M, D) on a leading axis; returns the arrays and the slot count."""
    first = schedules[0]
    for i, s in enumerate(schedules):
        if (s.num_steps, s.buffer_width, s.dispatch_width, s.num_clients) != (
            first.num_steps, first.buffer_width, first.dispatch_width, first.num_clients
        ):
            raise ValueError(
                f"schedule {i} has (T, M, D, n) = {(s.num_steps, s.buffer_width, s.dispatch_width, s.num_clients)}, "
                f"schedule 0 has {(first.num_steps, first.buffer_width, first.dispatch_width, first.num_clients)}; "
                "replicas must share shapes"
            )
    d0 = max(s.init_clients.shape[0] for s in schedules)
    arrays = [schedule_arrays(s, init_width=d0) for s in schedules]
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *arrays)
    return stacked, max(s.num_slots for s in schedules)


def slice_steps(steps: StepArrays, start: int, stop: int, replica_axis: bool) -> StepArrays:
    """Steps [start, stop) of the per-step arrays."""
    return jax.tree_util.tree_map(lambda a: a[:, start:stop] if replica_axis else a[start:stop], steps)


# ---------------------------------------------------------------------------------------------------- lookahead plan
def lookahead_plan(schedules: Sequence[Schedule], lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """(position int32 [T], flush bool [T]): the lookahead-batching control, valid for every schedule given.

    Step ``t``'s dispatched jobs go to buffer row ``position[t]``; at a step with ``flush[t]`` the buffer (jobs of
    steps ``t - position[t] .. t``) is trained before the step's arrivals are read. A flush happens at the first step
    at which some buffered job arrives (in any of the schedules), or when the buffer is full (``lookahead`` rows).
    """
    T = schedules[0].num_steps
    first_arrival = np.full(T, np.iinfo(np.int64).max, dtype=np.int64)  # earliest arrival of a job dispatched at t
    for schedule in schedules:
        for t, arrival in job_arrivals(schedule):
            if arrival < first_arrival[t]:
                first_arrival[t] = arrival
    position = np.zeros(T, np.int32)
    flush = np.zeros(T, bool)
    row, earliest = 0, np.iinfo(np.int64).max
    for t in range(T):
        position[t] = row
        earliest = min(earliest, int(first_arrival[t]))
        row += 1
        if earliest <= t or row == lookahead:
            flush[t] = True
            row, earliest = 0, np.iinfo(np.int64).max
    return position, flush


def job_arrivals(schedule: Schedule) -> list[tuple[int, int]]:
    """(dispatch step, arrival step) of every job of the dispatch rows that arrives (replaying the slots)."""
    holder: dict[int, int] = {}
    out = []
    for t in range(schedule.num_steps):
        for c, slot in zip(schedule.dispatch_clients[t].tolist(), schedule.dispatch_slots[t].tolist()):
            if c >= 0:
                holder[slot] = t
        for c, slot in zip(schedule.arrival_clients[t].tolist(), schedule.arrival_slots[t].tolist()):
            if c >= 0 and slot in holder:
                out.append((holder.pop(slot), t))
    return out


def lookahead_windows(flush: np.ndarray) -> np.ndarray:
    """The lengths of the lookahead windows (steps between two flushes) of a plan."""
    ends = np.flatnonzero(flush)
    return np.diff(np.concatenate([[-1], ends])) if ends.size else np.zeros(0, np.int64)


def lookahead_summary(lookahead: int, flush: Any) -> dict[str, Any]:
    """What ``History.lookahead`` reports: L, the number of windows and their length statistics and histogram."""
    windows = lookahead_windows(np.asarray(flush))
    return {"L": int(lookahead), "num_windows": int(windows.size),
            "mean_window": float(windows.mean()) if windows.size else 0.0,
            "max_window": int(windows.max(initial=0)),
            "window_histogram": [int(c) for c in np.bincount(windows, minlength=lookahead + 1)[1:]]}


def flush_buckets(lookahead: int) -> tuple[int, ...]:
    """The buffer sizes a lookahead flush is compiled for: powers of two below ``L``, and ``L``."""
    return tuple(sorted({min(2 ** i, lookahead) for i in range(max(1, lookahead).bit_length() + 1)}))
