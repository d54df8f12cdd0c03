"""Summary statistics of a :class:`Schedule` (staleness, participation, virtual time, concurrency)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.streams import suspension_table


def staleness_values(schedule: Schedule) -> np.ndarray:
    """int64 [num_uploads]: staleness ``t - version`` of every applied result, in step order."""
    return schedule.staleness[schedule.arrival_mask].astype(np.int64)


def staleness_histogram(schedule: Schedule) -> np.ndarray:
    """int64 [max_staleness + 1]: number of applied results with staleness 0, 1, ..., max (empty if none)."""
    values = staleness_values(schedule)
    return np.bincount(values).astype(np.int64) if values.size else np.zeros(0, dtype=np.int64)


def participation_counts(schedule: Schedule) -> np.ndarray:
    """int64 [n]: number of results of each client applied over the schedule."""
    ids = schedule.arrival_clients[schedule.arrival_mask].astype(np.int64)
    return np.bincount(ids, minlength=schedule.num_clients).astype(np.int64)


def _dropout(schedule: Schedule) -> tuple[list[int], float | None]:
    """(dropped clients, dropout time) recorded in ``schedule.info``; ``([], None)`` without dropouts."""
    dropped = [int(c) for c in schedule.info.get("dropped_clients", ())]
    time = schedule.info.get("dropout_time")
    return (dropped, float(time)) if dropped and time is not None else ([], None)


def _dispatch_and_arrival_times(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Sorted start times of all jobs (initial + dispatched) and sorted end times: the arrival times of all applied
    results, plus the dropout time for each job of a dropped client that never arrives (it is discarded then), plus
    the times at which device traces discarded jobs of clients that went offline (``info["offline_discards"]``, up to
    the last step; a job discarded later was still in flight)."""
    init = np.full(int(np.count_nonzero(schedule.init_clients >= 0)), float(schedule.init_time))
    dispatched = schedule.dispatch_times[schedule.dispatch_clients >= 0]
    starts = np.sort(np.concatenate([init, dispatched.astype(np.float64)]))
    arrivals = schedule.arrival_times[schedule.arrival_mask].astype(np.float64)
    discards = np.asarray(schedule.info.get("offline_discards") or [], dtype=np.float64)
    if discards.size and schedule.num_steps:
        arrivals = np.concatenate([arrivals, discards[discards <= schedule.step_times[-1]]])
    dropped, dropout_time = _dropout(schedule)
    if dropped:
        n = schedule.num_clients
        started = (np.bincount(schedule.init_clients[schedule.init_clients >= 0], minlength=n)
                   + np.bincount(schedule.dispatch_clients[schedule.dispatch_clients >= 0], minlength=n))
        arrived = np.bincount(schedule.arrival_clients[schedule.arrival_mask], minlength=n)
        unmatched = int(np.maximum(started - arrived, 0)[dropped].sum())
        arrivals = np.concatenate([arrivals, np.full(unmatched, dropout_time)])
    return starts, np.sort(arrivals)


def num_suspensions(schedule: Schedule) -> int:
    """Number of uploads in the schedule after which the client was suspended (recomputed from the counter-based
    suspension stream of ``info["seed"]`` and ``info["delays"]``; uploads of dropped clients at or after the dropout
    time do not count, they leave instead). 0 when ``suspension_prob`` is 0 or the schedule does not say."""
    info = schedule.info
    if "delays" not in info or "seed" not in info or info["delays"].get("kind") == "device_trace":
        return 0  # (device traces have no suspensions)
    delays = DelayModel.from_dict(info["delays"])
    if not delays.has_suspensions:
        return 0
    mask = schedule.arrival_mask
    clients = schedule.arrival_clients[mask].astype(np.int64)  # row-major: the order in which they arrived
    if clients.size == 0:
        return 0
    # Upload index of each arrival: its rank among the same client's arrivals.
    order = np.argsort(clients, kind="stable")
    counts = np.bincount(clients, minlength=schedule.num_clients)
    first = np.cumsum(counts) - counts
    uploads = np.empty(clients.size, dtype=np.int64)
    uploads[order] = np.arange(clients.size) - np.repeat(first, counts)
    suspended = ~np.isnan(suspension_table(schedule.num_clients, delays, int(info["seed"])).lengths(clients, uploads))
    dropped, dropout_time = _dropout(schedule)
    if dropped:
        times = schedule.arrival_times[mask]
        suspended &= ~(np.isin(clients, dropped) & (times >= dropout_time))
    return int(np.count_nonzero(suspended))


def concurrency_profile(schedule: Schedule, times: np.ndarray | None = None) -> np.ndarray:
    """int64 [len(times)]: number of jobs in flight at each time (default: at each step time).

    A job is in flight at time ``tau`` if it started at or before ``tau`` and its result has not reached the server by
    ``tau`` (jobs never applied within the schedule stay in flight). At a step time this counts the jobs dispatched at
    that instant (refills) and not the results that arrived then.
    """
    starts, arrivals = _dispatch_and_arrival_times(schedule)
    times = schedule.step_times if times is None else np.asarray(times, dtype=np.float64)
    started = np.searchsorted(starts, times, side="right")
    arrived = np.searchsorted(arrivals, times, side="right")
    return (started - arrived).astype(np.int64)


def max_concurrency(schedule: Schedule) -> int:
    """Largest number of jobs in flight at any virtual time (the maximum is reached at some start time)."""
    starts, _ = _dispatch_and_arrival_times(schedule)
    if starts.size == 0:
        return 0
    return int(concurrency_profile(schedule, np.unique(starts)).max())


def schedule_summary(schedule: Schedule) -> dict[str, Any]:
    """JSON-serialisable summary (python ints/floats/lists; ``None`` where undefined).

    Keys: protocol, num_clients, num_steps, num_uploads, num_slots, staleness_mean/max/std (population std),
    staleness_histogram (counts for 0..max), participation (per-client counts), participation_min/median/max/mean,
    total_time (last step time minus init time), mean_time_per_step, max_concurrency, num_empty_steps (steps with no
    arrival), num_dropped (clients that left by the last step time), dropout_time (``None`` without dropouts),
    num_suspensions (see :func:`num_suspensions`).
    """
    stale = staleness_values(schedule)
    part = participation_counts(schedule)
    T = schedule.num_steps
    total_time = float(schedule.step_times[-1] - schedule.init_time) if T else 0.0
    dropped, dropout_time = _dropout(schedule)
    left = dropout_time is not None and T > 0 and dropout_time <= schedule.step_times[-1]
    return {
        "protocol": schedule.info.get("protocol"),
        "num_clients": int(schedule.num_clients),
        "num_steps": int(T),
        "num_uploads": int(stale.size),
        "num_slots": int(schedule.num_slots),
        "staleness_mean": float(stale.mean()) if stale.size else None,
        "staleness_max": int(stale.max()) if stale.size else None,
        "staleness_std": float(stale.std()) if stale.size else None,
        "staleness_histogram": [int(x) for x in staleness_histogram(schedule)],
        "participation": [int(x) for x in part],
        "participation_min": int(part.min()),
        "participation_median": float(np.median(part)),
        "participation_max": int(part.max()),
        "participation_mean": float(part.mean()),
        "total_time": total_time,
        "mean_time_per_step": total_time / T if T else None,
        "max_concurrency": max_concurrency(schedule),
        "num_empty_steps": int(np.count_nonzero(schedule.uploads_per_step == 0)),
        "num_dropped": len(dropped) if left else 0,
        "dropout_time": dropout_time,
        "num_suspensions": num_suspensions(schedule),
    }
