"""The in-scan event clock: virtual time decided inside the compiled scan, so job durations may depend on the state.

A pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule` fixes every event before training starts. That is not
possible when a job's length depends on what the server decided (AsyncFedED gives each client a number of local
steps ``K_i`` that changes as it trains, and a job of ``K`` steps takes ``K`` times as long). :class:`EventClock`
describes such a run; the engine (:func:`asyncfl_jax.engine.simulate` with ``schedules=EventClock(...)``) carries
the clock in the scan:

* every client has one job in flight (or is suspended, or has left): its finish time is kept per client, and each
  server step applies the earliest one (ties: the lowest client id), as in ``all_active`` with one arrival per step;
* the arriving client is sent ``x_{t+1}`` at once; its new job of ``K`` local steps takes
  ``comm_time + (K / local.steps) * compute`` where ``compute`` is the delay model's compute part of that client's
  ``k``-th job (``s_i * eps`` or ``s_i + eps``), the same counter-based draw the protocols use; a job of
  ``local.steps`` steps takes exactly the delay model's duration;
* suspensions and dropouts of the :class:`~asyncfl_jax.timing.delays.DelayModel` act as in ``all_active``: after its
  ``u``-th upload a client may be suspended and then starts its next job when it returns, from the model current at
  that time; a dropped client's job in flight at the dropout time is discarded and it never comes back. Events at
  one instant are ordered dropout, arrivals, returns.

When the durations do not depend on the state (every job runs ``local.steps`` steps), the clock produces exactly the
events of the pre-sampled ``all_active(num_clients, num_steps, delays, seed)`` schedule, and the engine trains the same
jobs with the same keys (tested).

Precision. Times are carried on the device as double-float pairs ``hi + lo`` of float32 (about 48 bits of mantissa),
built from the float64 durations, so the order of events equals the float64 order of the pre-sampled schedule except
for finish times that agree to about 1e-14 (relative). A duration scaled by ``K / local.steps != 1`` is rounded to
float32 (relative 6e-8) before it is added.

Tables. The durations and suspension lengths a chunk of ``E`` steps may need are computed on the host before the
chunk, for each client from its job and upload counters: a client starts at most ``E + 1`` jobs and makes at most
``E`` uploads in ``E`` steps (each job but one carried over from the previous chunk follows one of its arrivals), so
``[n, E + 1]`` tables per replica always suffice.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.streams import (check_common, dropout_info, dropped_clients, job_durations_table,
                                        schedule_info, suspension_table)


class ClockTables(NamedTuple):
    """Per-replica inputs of one chunk of the clocked scan (numpy or device arrays; durations as hi/lo float32).

    Attributes:
      full_hi, full_lo: [n, W] duration of jobs ``base_jobs[i] + w`` of client ``i`` (the delay model's duration).
      compute_hi, compute_lo: [n, W] their compute part (the duration without ``comm_time``).
      suspension_hi, suspension_lo: [n, W] suspension after upload ``base_uploads[i] + w`` (``nan``: none).
      base_jobs, base_uploads: int32 [n] the counters the tables start from.
      comm_hi, comm_lo: float32 scalars, ``comm_time``.
      dropped: bool [n] clients that leave at the dropout time.
      dropout_hi, dropout_lo: float32 scalars, the dropout time (``inf``: never).
    """

    full_hi: Any
    full_lo: Any
    compute_hi: Any
    compute_lo: Any
    suspension_hi: Any
    suspension_lo: Any
    base_jobs: Any
    base_uploads: Any
    comm_hi: Any
    comm_lo: Any
    dropped: Any
    dropout_hi: Any
    dropout_lo: Any


def split_double(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 -> ``(hi, lo)`` float32 with ``hi = fl32(v)`` and ``lo = fl32(v - hi)`` (``lo = 0`` where ``v`` is not
    finite)."""
    values = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        hi = values.astype(np.float32)
        lo = np.where(np.isfinite(values), values - hi.astype(np.float64), 0.0).astype(np.float32)
    return hi, lo


@dataclasses.dataclass(frozen=True)
class EventClock:
    """An all-active run whose job durations are decided in the scan (see the module docstring).

    Attributes:
      num_clients: n.
      num_steps: T server steps (one arrival each).
      delays: the delay model (a :class:`DelayModel` or its dict), suspensions and dropouts included.
      seed: the timing seed (the same streams as the protocols' ``seed``).
    """

    num_clients: int
    num_steps: int
    delays: DelayModel | dict
    seed: int = 0

    def __post_init__(self) -> None:
        n, T, delays, seed = check_common(self.num_clients, self.num_steps, self.delays, self.seed)
        if not isinstance(delays, DelayModel):
            raise ValueError("the in-scan event clock does not read device traces (its durations scale with a "
                             "state-dependent number of local steps); use a pre-sampled protocol (all_active, "
                             "concurrent, synchronous) with device traces")
        object.__setattr__(self, "num_clients", n)
        object.__setattr__(self, "num_steps", T)
        object.__setattr__(self, "delays", delays)
        object.__setattr__(self, "seed", seed)

    @property
    def info(self) -> dict[str, Any]:
        """The description written with the results (as a schedule's ``info``)."""
        return schedule_info("event_clock", self.num_clients, self.num_steps, self.delays, self.seed,
                             concurrency=self.num_clients, buffer_size=1)

    def tables(self, base_jobs: np.ndarray, base_uploads: np.ndarray, width: int) -> ClockTables:
        """The :class:`ClockTables` for clients whose next job is ``base_jobs[i]`` and next upload ``base_uploads[i]``."""
        n = self.num_clients
        clients = np.arange(n, dtype=np.int64)[:, None]
        offsets = np.arange(width, dtype=np.int64)[None, :]
        base_jobs = np.asarray(base_jobs, dtype=np.int64)
        base_uploads = np.asarray(base_uploads, dtype=np.int64)
        durations = job_durations_table(n, self.delays, self.seed)
        compute = durations.compute_times(clients, base_jobs[:, None] + offsets)
        full = compute + self.delays.comm_time  # = durations.durations(...), bit for bit
        if self.delays.has_suspensions:
            suspension = suspension_table(n, self.delays, self.seed).lengths(clients, base_uploads[:, None] + offsets)
        else:
            suspension = np.full((n, width), np.nan)
        dropped = np.zeros(n, dtype=bool)
        dropout_time = np.inf
        if self.delays.has_dropouts(n):
            dropped[dropped_clients(n, self.delays, self.seed)] = True
            dropout_time = self.delays.dropout_time
        full_hi, full_lo = split_double(full)
        compute_hi, compute_lo = split_double(compute)
        suspension_hi = suspension.astype(np.float32)
        _, suspension_lo = split_double(suspension)
        comm_hi, comm_lo = split_double(np.float64(self.delays.comm_time))
        dropout_hi, dropout_lo = split_double(np.float64(dropout_time))
        return ClockTables(full_hi, full_lo, compute_hi, compute_lo, suspension_hi, suspension_lo,
                           base_jobs.astype(np.int32), base_uploads.astype(np.int32), comm_hi, comm_lo, dropped,
                           dropout_hi, dropout_lo)


def stack_tables(tables: Sequence[ClockTables]) -> ClockTables:
    """Per-replica tables stacked on a leading replica axis."""
    return ClockTables(*(np.stack([np.asarray(getattr(t, f)) for t in tables]) for f in ClockTables._fields))


class Trace(NamedTuple):
    """What the clocked scan records at each server step (one arrival), as numpy arrays [T] of one replica.

    ``client`` arrived at step ``t`` with the job it started in dispatch row ``row`` (0: the initial jobs, ``r >= 1``:
    started during step ``r - 1``, i.e. from ``x_{r-1}``; the job's version is ``max(row - 1, 0)``) at position
    ``col`` of that row, ran ``steps`` local steps, started at ``start`` and arrived at ``arrival``.
    """

    client: np.ndarray
    row: np.ndarray
    col: np.ndarray
    steps: np.ndarray
    start: np.ndarray
    arrival: np.ndarray


class OpenJobs(NamedTuple):
    """Jobs that never arrived within the run: in flight at the end, or discarded at the dropout (numpy [k] each)."""

    client: np.ndarray
    row: np.ndarray
    col: np.ndarray
    start: np.ndarray


def realized_schedule(clock: EventClock, trace: Trace, open_jobs: OpenJobs) -> Schedule:
    """The :class:`Schedule` a clocked run went through (client ``i`` always uses slot ``i``); with state-independent
    durations it equals ``all_active(n, T, delays, seed)`` except for the slots."""
    n, T = clock.num_clients, int(trace.client.shape[0])
    rows = np.concatenate([trace.row, open_jobs.row]).astype(np.int64)
    cols = np.concatenate([trace.col, open_jobs.col]).astype(np.int64)
    clients = np.concatenate([trace.client, open_jobs.client]).astype(np.int64)
    starts = np.concatenate([trace.start, open_jobs.start]).astype(np.float64)
    init = rows == 0
    order = np.lexsort((cols[init],))
    init_clients = clients[init][order].astype(np.int32)
    keep = (rows >= 1) & (rows <= T)  # jobs started during steps 0 .. T-1 (not those after the last step)
    d_rows, d_cols, d_clients, d_starts = rows[keep] - 1, cols[keep], clients[keep], starts[keep]
    width = int(max(1, np.bincount(d_rows, minlength=T).max(initial=0))) if d_rows.size else 1
    dispatch_clients = np.full((T, width), -1, np.int32)
    dispatch_times = np.full((T, width), np.nan)
    order = np.lexsort((d_cols, d_rows))
    position = np.zeros(T, dtype=np.int64)
    for r, c, s in zip(d_rows[order].tolist(), d_clients[order].tolist(), d_starts[order].tolist()):
        dispatch_clients[r, position[r]] = c
        dispatch_times[r, position[r]] = s
        position[r] += 1
    versions = np.maximum(trace.row.astype(np.int64) - 1, 0)
    arrival_clients = trace.client.astype(np.int32)[:, None]
    return Schedule(
        init_clients=init_clients,
        init_slots=init_clients.copy(),
        dispatch_clients=dispatch_clients,
        dispatch_slots=dispatch_clients.copy(),
        dispatch_times=dispatch_times,
        arrival_clients=arrival_clients,
        arrival_slots=arrival_clients.copy(),
        arrival_versions=versions.astype(np.int32)[:, None],
        arrival_times=trace.arrival.astype(np.float64)[:, None],
        step_times=trace.arrival.astype(np.float64),
        num_clients=n,
        num_slots=n,
        init_time=0.0,
        info={**clock.info, "num_steps": T, **dropout_info(n, clock.delays, clock.seed)[2]},
    )
