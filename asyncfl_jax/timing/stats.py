"""Summary statistics of a :class:`Schedule` (staleness, participation, virtual time, concurrency)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl_jax.timing.schedule import Schedule


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


def _dispatch_and_arrival_times(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Sorted start times of all jobs (initial + dispatched) and sorted arrival times of all applied results."""
    init = np.full(int(np.count_nonzero(schedule.init_clients >= 0)), float(schedule.init_time))
    dispatched = schedule.dispatch_times[schedule.dispatch_clients >= 0]
    starts = np.sort(np.concatenate([init, dispatched.astype(np.float64)]))
    arrivals = np.sort(schedule.arrival_times[schedule.arrival_mask].astype(np.float64))
    return starts, arrivals


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
    total_time (last step time minus init time), mean_time_per_step, max_concurrency.
    """
    stale = staleness_values(schedule)
    part = participation_counts(schedule)
    T = schedule.num_steps
    total_time = float(schedule.step_times[-1] - schedule.init_time) if T else 0.0
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
    }
