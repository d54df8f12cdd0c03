"""Vectorized fast paths: the same schedules as the event loop (:mod:`asyncfl_jax.timing.events`) for the policy
combinations where no event depends on another, computed with numpy instead of one Python step per event.

They are optimizations only, used by :mod:`asyncfl_jax.timing.protocols` exactly for the combinations they cover,
and ``tests/test_timing.py`` checks that they equal the loop:

* :func:`all_active_fast`: refill ``Immediate(n)`` (or ``Boundary(n)``: with every client training, the only idle
  client at an arrival is the one that arrived, either way), aggregation ``Count(1)``, every client always available
  (the ``all_active`` protocol, and ``concurrent`` with ``concurrency == n, buffer_size == 1``). About 8x faster than
  the loop at n = 100,000.
* :func:`synchronous_fast`: refill ``Rounds(m)``, aggregation ``AllInFlight``, every client always available (the
  ``synchronous`` protocol without dropouts or suspensions). Rounds do not interact, so all of them are computed at
  once.
* :func:`rounds_log`: ``Rounds(m)`` and ``AllInFlight`` with dropouts or suspensions (``synchronous`` with them).
  Everything in a round follows from its start, so a round is one vectorized step instead of one loop step per
  event (6 to 10 times faster than the loop with 100 to 1,000 participants per round).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from asyncfl_jax.timing.delays import JobDurations
from asyncfl_jax.timing.events import EventLog
from asyncfl_jax.timing.policies import Availability, Rounds
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.streams import base_width, timing_rng


# ---------------------------------------------------------------------- all clients active, one arrival per step
@dataclasses.dataclass
class _FinishTimes:
    """Known finish times of the clients' first jobs, in levels: level 0 has jobs ``[0, B0)`` of every client, a
    later level jobs ``[K, 2K)`` of the clients whose first ``K`` were not enough.

    Under ``Immediate(n)`` with ``Count(1)`` every client is redispatched to itself at each of its arrivals, so
    client ``i``'s finish times are the cumulative sums of its own durations, independent of the other clients.
    """

    times: list[np.ndarray]  # [clients of the level, jobs of the level]
    clients: list[np.ndarray]
    first: list[int]  # index of the level's first job
    last_time: np.ndarray  # [n] finish time of each client's last known job
    known: np.ndarray  # [n] number of known jobs

    @classmethod
    def initial(cls, table: JobDurations, n: int, width: int) -> "_FinishTimes":
        clients = np.arange(n, dtype=np.int64)
        times = np.cumsum(np.concatenate([np.zeros((n, 1)), table.block(clients, 0, width)], axis=1), axis=1)[:, 1:]
        return cls([times], [clients], [0], times[:, -1].copy(), np.full(n, width, dtype=np.int64))

    def double(self, table: JobDurations, needy: np.ndarray) -> None:
        """Doubles the known prefix of each client in ``needy`` (one level per distinct prefix length)."""
        for first in np.unique(self.known[needy]).tolist():
            group = needy[self.known[needy] == first]
            cums = np.cumsum(np.concatenate([self.last_time[group, None], table.block(group, first, first)],
                                            axis=1), axis=1)[:, 1:]
            self.times.append(cums)
            self.clients.append(group)
            self.first.append(first)
            self.last_time[group] = cums[:, -1]
            self.known[group] += first

    def levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per level: finish times, and the client and job index of each (broadcast to the same shape)."""
        return [(a, np.broadcast_to(cl[:, None], a.shape), np.broadcast_to(np.arange(f, f + a.shape[1]), a.shape))
                for a, cl, f in zip(self.times, self.clients, self.first)]


def _tth_event(ft: _FinishTimes, T: int) -> tuple[float, int, int] | None:
    """``(time, client, job)`` of the ``T``-th known event in ``(time, client, job)`` order (``None``: fewer known)."""
    flat = np.concatenate([a.ravel() for a in ft.times])
    if flat.size < T:
        return None
    tau = np.partition(flat, T - 1)[T - 1]
    less = int(np.count_nonzero(flat < tau))
    # Among the known events at time tau, the (T - less)-th in (client, job) order is the T-th event overall.
    tie_c = np.concatenate([cl[a == tau] for a, cl, _ in ft.levels()])
    tie_k = np.concatenate([kk[a == tau] for a, _, kk in ft.levels()])
    o = np.lexsort((tie_k, tie_c))[T - less - 1]
    return tau, int(tie_c[o]), int(tie_k[o])


def _first_events(table: JobDurations, n: int, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``T`` events ``(time, client, job)``, in that order."""
    ft = _FinishTimes.initial(table, n, base_width(n, T + n))
    clients = np.arange(n)
    while True:
        tth = _tth_event(ft, T)
        if tth is None:
            ft.double(table, clients)
            continue
        tau, c_star, k_star = tth
        # A client's unknown jobs come after its last known one: extend those whose last known event precedes the
        # T-th known event; when there is none, the T-th known event is the T-th event.
        last_k = ft.known - 1
        needy = np.flatnonzero((ft.last_time < tau) | ((ft.last_time == tau) & (
            (clients < c_star) | ((clients == c_star) & (last_k < k_star)))))
        if needy.size == 0:
            break
        ft.double(table, needy)
    ev_t, ev_c, ev_k = [], [], []
    for a, cc, kk in ft.levels():  # the events up to the T-th
        mask = (a < tau) | ((a == tau) & ((cc < c_star) | ((cc == c_star) & (kk <= k_star))))
        ev_t.append(a[mask])
        ev_c.append(cc[mask])
        ev_k.append(kk[mask])
    ev_t, ev_c, ev_k = np.concatenate(ev_t), np.concatenate(ev_c), np.concatenate(ev_k)
    assert ev_t.size == T, (ev_t.size, T)
    order = np.lexsort((ev_k, ev_c, ev_t))
    return ev_t[order], ev_c[order], ev_k[order]


def all_active_fast(n: int, T: int, table: JobDurations, info: dict[str, Any]) -> Schedule:
    """The event loop's schedule for ``Immediate(n)``, ``Count(1)``, always available.

    The arrivals are the first ``T`` finish times over all clients in ``(time, client, job)`` order. Client ``i``
    keeps slot ``i`` (the loop's LIFO free list hands the slot read at step ``t`` to the job dispatched right after
    it: the same client's next job, of version ``t + 1``).
    """
    ev_t, ev_c, ev_k = _first_events(table, n, T)
    # Version of each arrival: 0 for a client's first job, else (step of its previous arrival) + 1.
    by_client = np.lexsort((ev_k, ev_c))
    prev = np.empty(T, dtype=np.int64)
    prev[by_client[1:]] = by_client[:-1]
    versions = np.where(ev_k > 0, prev + 1, 0)
    arrival_clients = ev_c.astype(np.int32).reshape(T, 1)
    dispatch_clients = np.full((T, 1), -1, dtype=np.int32)
    dispatch_clients[1:, 0] = arrival_clients[:-1, 0]
    dispatch_times = np.full((T, 1), np.nan)
    dispatch_times[1:, 0] = ev_t[:-1]
    return Schedule(
        init_clients=np.arange(n, dtype=np.int32),
        init_slots=np.arange(n, dtype=np.int32),
        dispatch_clients=dispatch_clients,
        dispatch_slots=dispatch_clients.copy(),
        dispatch_times=dispatch_times,
        arrival_clients=arrival_clients,
        arrival_slots=arrival_clients.copy(),
        arrival_versions=versions.astype(np.int32).reshape(T, 1),
        arrival_times=ev_t.astype(np.float64).reshape(T, 1),
        step_times=ev_t.astype(np.float64),
        num_clients=n,
        num_slots=n,
        init_time=0.0,
        info=info,
    )


# ---------------------------------------------------------------------- synchronous rounds
def _round_participants(n: int, T: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``[T, m]`` clients of each round (sorted) and the index of each one's job among its own jobs."""
    if m == n:
        return (np.broadcast_to(np.arange(n, dtype=np.int64), (T, n)),
                np.broadcast_to(np.arange(T, dtype=np.int64)[:, None], (T, n)))
    rng = timing_rng(seed, 3)
    clients = np.sort(np.stack([rng.choice(n, size=m, replace=False) for _ in range(T)]), axis=1)
    flat = clients.ravel()
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=n)
    starts = np.cumsum(counts) - counts
    ranks = np.empty(flat.size, dtype=np.int64)
    ranks[order] = np.arange(flat.size) - np.repeat(starts, counts)
    return clients, ranks.reshape(T, m)


def synchronous_fast(n: int, T: int, m: int, table: JobDurations, seed: int, info: dict[str, Any]) -> Schedule:
    """The event loop's schedule for ``Rounds(m)``, ``AllInFlight``, always available: every round has ``m``
    participants, so the loop's ``rng.choice(n, size=m)`` on the sorted pool of all clients is
    ``rng.choice(n, size=m)`` on ``0 .. n-1``, and round ``t`` ends at ``start_t + max_i d_i``."""
    clients, jobs = _round_participants(n, T, m, seed)
    durations = np.empty((T, m))
    rows = max(1, (1 << 20) // m)  # bounded temporaries
    for r in range(0, T, rows):
        durations[r:r + rows] = table.durations(clients[r:r + rows], jobs[r:r + rows])
    step_times = np.cumsum(np.concatenate([[0.0], durations.max(axis=1)]))
    starts = step_times[:-1]
    ids = np.ascontiguousarray(clients, dtype=np.int32)
    slots = np.broadcast_to(np.arange(m, dtype=np.int32), (T, m)).copy()
    return Schedule(
        init_clients=np.zeros(0, dtype=np.int32),
        init_slots=np.zeros(0, dtype=np.int32),
        dispatch_clients=ids,
        dispatch_slots=slots,
        dispatch_times=np.repeat(starts[:, None], m, axis=1),
        arrival_clients=ids.copy(),
        arrival_slots=slots.copy(),
        arrival_versions=np.broadcast_to(np.arange(T, dtype=np.int32)[:, None], (T, m)).copy(),
        arrival_times=starts[:, None] + durations,
        step_times=step_times[1:],
        num_clients=n,
        num_slots=m,
        init_time=0.0,
        info=info,
    )


@dataclasses.dataclass
class _Clients:
    """Per-client state between rounds: when each is back from a suspension, its job and upload counters."""

    dropped: np.ndarray  # bool [n]
    back: np.ndarray  # float64 [n]
    jobs: np.ndarray  # int64 [n]
    uploads: np.ndarray  # int64 [n]

    def available(self, start: float, dropout_time: float) -> tuple[float, np.ndarray]:
        """``(start, available clients)`` of a round that may start at ``start``: the clients not gone and not
        suspended then, or, if there are none, those at the first time one returns."""
        while True:
            gone = self.dropped & (start >= dropout_time)
            available = np.flatnonzero(~gone & (self.back <= start))
            if available.size:
                return start, available
            # Nobody can take part: wait for the first live client to return (there is one: not all clients drop).
            waiting = ~self.dropped | (self.back < dropout_time)
            start = float(self.back[waiting & (self.back > start)].min())


def rounds_log(n: int, T: int, refill: Rounds, table: JobDurations, availability: Availability,
               seed: int) -> EventLog:
    """The event loop's log for ``Rounds`` with ``AllInFlight`` under ``availability``, one round at a time.

    A round starting at ``start`` dispatches ``refill.choose`` of the available clients; each arrives at
    ``start + duration`` unless it is dropped and that is after the dropout time (then it is discarded); the round ends
    at its last arrival, or at the dropout time if that is later and a job was discarded. A client that uploads is
    suspended after it (unless it leaves then) until ``finish + length``. The log holds arrays, not lists.
    """
    drop_time, susp = availability.dropout_time, availability.suspensions
    dropped = np.zeros(n, dtype=bool)
    dropped[list(availability.dropped)] = True
    clients = _Clients(dropped, np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))
    rng = timing_rng(seed, 3)
    chosen_rows, start_rows, kept_rows, finish_rows, step_times = [], [], [], [], []
    start = 0.0
    for _ in range(T):
        start, available = clients.available(start, drop_time)
        chosen = refill.choose(available, rng)
        finish = start + table.durations(chosen, clients.jobs[chosen])
        clients.jobs[chosen] += 1
        kept = ~(dropped[chosen] & (finish > drop_time))
        arrived = chosen[kept]
        end = float(finish[kept].max()) if arrived.size else -math.inf
        if not kept.all():
            end = max(end, drop_time)  # the server learns that the others left at the dropout time
        if susp is not None and arrived.size:
            lengths = susp.lengths(arrived, clients.uploads[arrived])
            hit = ~(dropped[arrived] & (finish[kept] >= drop_time)) & ~np.isnan(lengths)
            clients.back[arrived[hit]] = finish[kept][hit] + lengths[hit]
        clients.uploads[arrived] += 1
        chosen_rows.append(chosen)
        start_rows.append(start)
        kept_rows.append(kept)
        finish_rows.append(finish[kept])
        step_times.append(end)
        start = end
    sizes = np.array([c.size for c in chosen_rows], dtype=np.int64)
    ends = np.cumsum(sizes)
    kept = np.concatenate(kept_rows)
    return EventLog(
        num_initial=0,
        job_client=np.concatenate(chosen_rows),
        job_slot=np.arange(ends[-1]) - np.repeat(ends - sizes, sizes),
        job_time=np.repeat(start_rows, sizes),
        arrival_job=np.flatnonzero(kept),
        arrival_time=np.concatenate(finish_rows),
        dispatch_ends=ends,
        arrival_ends=np.cumsum([k.sum() for k in kept_rows]),
        step_times=step_times,
        num_slots=int(sizes.max()),
    )
