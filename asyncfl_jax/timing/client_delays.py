"""Every client's delay at every server step (the AsynFLC-EF paper's Def. 4) and its summary statistics.

The staleness of an applied result says how old the model it was computed on is; the *delay* ``tau_t^i = t - v_i(t)``
is defined for every client at every step, whether it reports or not: ``v_i(t)`` is the model version of client i's
next result applied at step t or later (the last round it took part in). Its maximum and averages
(``tau_max``, ``tau_avg0``, ``tau_avg1``, ``tau_avgm0``, ``tau_avgm1``) are the quantities of the paper's convergence
bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncfl_jax.timing.schedule import Schedule


def client_delays(schedule: Schedule) -> np.ndarray:
    """int64 [T, n]: ``tau_t^i = t - v_i(t)``, ``v_i(t)`` the model version of client i's next result applied at
    step t or later (a job still in flight at the end: the version of its dispatch), at most t."""
    T, n = schedule.num_steps, schedule.num_clients
    steps = np.arange(T)
    tau = np.empty((T, n), dtype=np.int64)
    rows, cols = np.nonzero(schedule.arrival_clients >= 0)
    who = schedule.arrival_clients[rows, cols]
    dispatched = np.zeros(n, dtype=np.int64)  # version of each client's last dispatch (0: the initial jobs)
    drows, dcols = np.nonzero(schedule.dispatch_clients >= 0)
    np.maximum.at(dispatched, schedule.dispatch_clients[drows, dcols], drows)
    for i in range(n):
        mine = who == i
        at, version = rows[mine], schedule.arrival_versions[rows[mine], cols[mine]].astype(np.int64)
        order = np.argsort(at, kind="stable")
        at, version = at[order], version[order]
        nxt = np.searchsorted(at, steps, side="left")
        v = np.where(nxt < at.size, version[np.minimum(nxt, max(at.size - 1, 0))] if at.size else 0, dispatched[i])
        tau[:, i] = steps - np.minimum(v, steps)
    return tau


def delay_statistics(schedule: Schedule) -> dict[str, Any]:
    """The delay statistics of a schedule (Def. 4): ``tau_max``; ``tau_avg0`` and ``tau_avgm0``, the mean over
    steps of the mean and of the max over clients of ``tau_t^i``; ``tau_avg1`` and ``tau_avgm1``, the same taken at
    the step ``t - tau_t^i`` of each client's base model; plus the sizes ``|S_t|`` of the steps, the participation
    frequencies and the mean staleness of the applied results."""
    T, n = schedule.num_steps, schedule.num_clients
    tau = client_delays(schedule)
    per_step_mean, per_step_max = tau.mean(axis=1), tau.max(axis=1)
    base = np.arange(T)[:, None] - tau  # t - tau_t^i, the round of client i's base model
    sizes = schedule.uploads_per_step
    participation = np.bincount(schedule.arrival_clients[schedule.arrival_clients >= 0], minlength=n) / T
    return {
        "tau_max": int(tau.max()), "tau_avg0": float(tau.mean()), "tau_avgm0": float(per_step_max.mean()),
        "tau_avg1": float(per_step_mean[base].mean()), "tau_avgm1": float(per_step_max[base].mean()),
        "S_mean": float(sizes.mean()), "S_min": int(sizes.min()), "S_max": int(sizes.max()),
        "empty_rounds": int((sizes == 0).sum()), "uploads": int(sizes.sum()),
        "participation_min": float(participation.min()), "participation_max": float(participation.max()),
        "staleness_mean": float((np.arange(T)[:, None] - schedule.arrival_versions)[schedule.arrival_mask].mean())
        if sizes.sum() else None,
    }
