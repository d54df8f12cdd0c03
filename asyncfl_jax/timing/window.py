"""A server that aggregates every W units of virtual time, with clients that wait for the window to close.

The AsynFL servers of the AsynFLC-EF paper (digest 004 section 2) apply, at the end of each window
``(t W, (t+1) W]``, whatever results arrived in it (``S_t``, of varying size); a client that reported waits for the
window to close and starts its next job from the new model ``x_{t+1}``, while the others keep training on their old
model. With W at least the longest job every round is a synchronous round of all n clients (staleness 0).

The package's ``all_active`` protocol with ``aggregation="periodic"`` is the other reading: the arriving client
restarts at once from the current model (no idling).
"""

from __future__ import annotations

import math

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.protocols import job_durations_table
from asyncfl_jax.timing.schedule import Schedule

# One window's events: (arriving clients in time order, their model versions, their arrival times).
_Arrivals = tuple[np.ndarray, np.ndarray, np.ndarray]


def window_schedule(n: int, rounds: int, window: float, delays: DelayModel, seed: int,
                    max_duration: float = math.inf) -> Schedule:
    """``rounds`` windows of length ``window``: every client starts a job from x_0 at time 0; the clients whose jobs
    finish in round t's window are aggregated at its end (step t, at time ``(t+1) W``) and start their next job from
    x_{t+1} then; the others keep training on their old model.

    Job durations are the package's (``job_durations_table``: client i's k-th job has the same duration as in every
    protocol), capped at ``max_duration`` (the AsynFLC-EF paper's "1000 means synchronous"). Client i keeps pending
    slot i. With W >= the longest job every round is a synchronous round of all n clients (staleness 0).
    """
    arrivals, dispatches = _window_events(n, rounds, window, delays, seed, max_duration)
    schedule = _window_arrays(n, rounds, window, arrivals, dispatches)
    schedule = Schedule(**schedule, num_clients=n, num_slots=n, info={
        "protocol": "window_wait", "num_clients": n, "num_steps": rounds, "seed": seed, "delays": delays.to_dict(),
        "aggregation": "periodic", "period": window,
        "max_duration": max_duration if math.isfinite(max_duration) else None})
    schedule.validate()
    return schedule


def _window_events(n: int, rounds: int, window: float, delays: DelayModel, seed: int,
                   max_duration: float) -> tuple[list[_Arrivals], list[np.ndarray]]:
    """Per round, the arrivals (clients in time order, ties by id; versions; times) and the clients dispatched at its
    start (none in round 0: the initial jobs start from x_0)."""
    table = job_durations_table(n, delays, seed)
    clients = np.arange(n)
    jobs = np.zeros(n, dtype=np.int64)
    version = np.zeros(n, dtype=np.int64)
    finish = np.minimum(table.durations(clients, jobs), max_duration)
    arrivals: list[_Arrivals] = []
    dispatches = [np.zeros(0, dtype=np.int64)]
    for t in range(rounds):
        tick = (t + 1) * window
        came = np.flatnonzero(finish <= tick)
        came = came[np.lexsort((came, finish[came]))]  # time order, ties by client id
        arrivals.append((came, version[came].copy(), finish[came].copy()))
        if t + 1 < rounds:
            dispatches.append(came)
            jobs[came] += 1
            version[came] = t + 1
            finish[came] = tick + np.minimum(table.durations(came, jobs[came]), max_duration)
    return arrivals, dispatches


def _window_arrays(n: int, rounds: int, window: float, arrivals: list[_Arrivals],
                   dispatches: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The :class:`Schedule` arrays of the window events (client i in slot i; rows padded with -1 / nan)."""
    M = max(1, max(len(a[0]) for a in arrivals))
    D = max(1, max(len(d) for d in dispatches))
    arrival_clients = np.full((rounds, M), -1, np.int32)
    arrival_versions = np.full((rounds, M), -1, np.int32)
    arrival_times = np.full((rounds, M), np.nan)
    dispatch_clients = np.full((rounds, D), -1, np.int32)
    dispatch_times = np.full((rounds, D), np.nan)
    for t, (came, ver, when) in enumerate(arrivals):
        arrival_clients[t, :len(came)] = came
        arrival_versions[t, :len(came)] = ver
        arrival_times[t, :len(came)] = when
    for t, d in enumerate(dispatches):
        dispatch_clients[t, :len(d)] = d
        dispatch_times[t, :len(d)] = t * window
    clients = np.arange(n).astype(np.int32)
    return {"init_clients": clients, "init_slots": clients.copy(), "dispatch_clients": dispatch_clients,
            "dispatch_slots": dispatch_clients.copy(), "dispatch_times": dispatch_times,
            "arrival_clients": arrival_clients, "arrival_slots": arrival_clients.copy(),
            "arrival_versions": arrival_versions, "arrival_times": arrival_times,
            "step_times": (np.arange(rounds) + 1.0) * window}
