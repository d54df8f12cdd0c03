"""Arrival protocols: turn a :class:`DelayModel` into a :class:`Schedule` (see ``schedule.py`` for the conventions).

Randomness. Everything is a deterministic function of ``seed`` (a non-negative int) and never touches numpy's global
state or the host clock. Timing has its own streams, independent of any training randomness:

* speeds:  ``np.random.default_rng([seed, 0x7157, 1])`` -> ``delays.sample_speeds(rng, n)`` (drawn once);
* initial clients: ``default_rng([seed, 0x7157, 2])``;
* client choices at refills (and synchronous participants): ``default_rng([seed, 0x7157, 3])``, consumed as U[0, 1)
  in bulk blocks;
* job durations: the duration of the ``k``-th job of client ``i`` (``k = 0, 1, ...`` counts that client's jobs in
  dispatch order) is a pure function of ``(seed, i, k)`` (:class:`~asyncfl_jax.timing.delays.JobDurations`, a
  counter-based stream keyed by ``SeedSequence([seed, 0x7157, 4])``). Hence a client's sequence of durations is the
  same in every protocol and code path, a schedule for ``T`` steps is a prefix of the one for ``T' > T`` steps, and the
  vectorized fast path and the event loop give identical schedules.

Ties. A client never has two jobs in flight, so events are ordered by ``(finish time, client id)``: results that reach
the server at the same virtual time are applied in increasing client id (after a zero-length job, the same client
may be picked again and arrive again at the same instant; it is then ordered again by its id).

Slots. Pending-buffer slots are handed out from a LIFO free list: the slots read at step ``t`` are released when step
``t`` is applied (after its ``M``-th arrival), so only jobs of version ``>= t+1`` reuse them. ``num_slots`` is the
largest number of slots ever held (``<= concurrency + buffer_size`` without dropouts, suspensions or a clock).

Client availability and the server clock (all off by default; then every schedule is exactly what it was before
these features existed, fast path included). They use three more streams:

* dropped clients: ``default_rng([seed, 0x7157, 5]).choice(n, size=floor(dropout_fraction * n), replace=False)``,
  sorted (``info["dropped_clients"]``, ``info["dropout_time"]``);
* suspensions: the coin and the length after the ``u``-th upload of client ``i`` are a pure function of
  ``(seed, i, u)`` (:class:`~asyncfl_jax.timing.delays.Suspensions`, keyed by ``SeedSequence([seed, 0x7157, 6])``);
* Poisson server clock: inter-step gaps ``default_rng([seed, 0x7157, 7]).exponential(1 / rate)``, drawn in blocks
  of 1024.

With any of them on, ``concurrent`` and ``all_active`` run a general discrete-event loop (never the vectorized fast
path). Events at the same virtual time are handled in this order: the dropout, then arrivals (by client id, including
those of jobs dispatched at that instant), then returns from suspension (by client id), then the server tick. So a job
dispatched at a tick's time starts from the model before that tick, and an arrival at a tick's time belongs to that
tick's step.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import numbers
from typing import Any, Mapping

import numpy as np

from asyncfl_jax.timing.delays import DelayModel, JobDurations, Suspensions
from asyncfl_jax.timing.schedule import Schedule

TIMING_TAG = 0x7157
REFILLS = ("immediate", "boundary")
PROTOCOLS = ("all_active", "concurrent", "synchronous")
AGGREGATIONS = ("count", "periodic", "poisson")
_CLOCK_BLOCK = 1024  # Poisson inter-step gaps drawn per rng call
_FORMAT = "asyncfl_jax.timing/1"
_BASE_JOBS = 16  # at most this many jobs per client have their durations precomputed in one vectorized call
_UNIFORM_BLOCK = 1 << 16  # uniforms drawn per rng call by the event loop


# ---------------------------------------------------------------------- argument checks and random streams
def _check_int(name: str, value: Any, low: int, high: int | None = None, high_name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high_name or high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bound}, got {value}" if high is not None else
                         f"{name} must be {bound}, got {value}")
    return value


def _check_common(num_clients: Any, num_steps: Any, delays: Any, seed: Any) -> tuple[int, int, DelayModel, int]:
    n = _check_int("num_clients", num_clients, 1)
    T = _check_int("num_steps", num_steps, 1)
    if not isinstance(delays, DelayModel):
        delays = DelayModel.from_dict(delays)
    seed = _check_int("seed", seed, 0)
    return n, T, delays, seed


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, TIMING_TAG, stream])


def client_speeds(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> np.ndarray:
    """float64 [n]: the speed factors ``s_i`` every protocol uses for ``(delays, seed)``."""
    n, _, delays, seed = _check_common(num_clients, 1, delays, seed)
    return delays.sample_speeds(_rng(seed, 1), n)


def job_durations_table(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> JobDurations:
    """The :class:`JobDurations` every protocol uses for ``(delays, seed)``: ``.durations(i, k)`` is the duration of
    client ``i``'s ``k``-th job."""
    n, _, delays, seed = _check_common(num_clients, 1, delays, seed)
    key = int(np.random.SeedSequence([seed, TIMING_TAG, 4]).generate_state(1, np.uint64)[0])
    return JobDurations(delays, key, client_speeds(n, delays, seed))


def suspension_table(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> Suspensions:
    """The :class:`Suspensions` every protocol uses for ``(delays, seed)``: ``.lengths(i, u)`` is the suspension after
    client ``i``'s ``u``-th upload (``nan``: none)."""
    _, _, delays, seed = _check_common(num_clients, 1, delays, seed)
    key = int(np.random.SeedSequence([seed, TIMING_TAG, 6]).generate_state(1, np.uint64)[0])
    return Suspensions(delays, key)


def dropped_clients(num_clients: int, delays: DelayModel | Mapping[str, Any], seed: int) -> np.ndarray:
    """int64 [floor(dropout_fraction * n)], sorted: the clients that leave at ``delays.dropout_time``."""
    n, _, delays, seed = _check_common(num_clients, 1, delays, seed)
    k = delays.num_dropped(n)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(_rng(seed, 5).choice(n, size=k, replace=False).astype(np.int64))


def _base_width(n: int, jobs: int) -> int:
    """Jobs per client to precompute: about twice the mean number of jobs per client, in [2, 16]. (Durations do not
    depend on how they are batched, so this only trades memory for the number of later per-client extensions.)"""
    return int(min(_BASE_JOBS, max(2, -(-2 * jobs // n) + 2)))


def _info(protocol: str, n: int, T: int, delays: DelayModel, seed: int, **extra: Any) -> dict[str, Any]:
    return {"protocol": protocol, "num_clients": n, "num_steps": T, "seed": seed, "delays": delays.to_dict(),
            **extra, "rng": _FORMAT}


def _pad_rows(rows: np.ndarray, values: list[np.ndarray], T: int, width: int,
              fills: list[Any], dtypes: list[Any]) -> list[np.ndarray]:
    """Scatters flat per-entry values (rows non-decreasing) into [T, width] arrays, in order within each row."""
    rows = np.asarray(rows, dtype=np.int64)
    first = np.searchsorted(rows, np.arange(T), side="left")
    cols = np.arange(rows.size, dtype=np.int64) - first[rows] if rows.size else rows
    out = []
    for v, fill, dtype in zip(values, fills, dtypes):
        a = np.full((T, width), fill, dtype=dtype)
        a[rows, cols] = v
        out.append(a)
    return out


# ---------------------------------------------------------------------- concurrent: event loop
def _concurrent_event_loop(n: int, T: int, delays: DelayModel, seed: int, concurrency: int, buffer_size: int,
                           refill: str) -> Schedule:
    """Discrete-event simulation of the concurrent protocol (the general path; arguments already validated)."""
    Mc, M = concurrency, buffer_size
    table = job_durations_table(n, delays, seed)
    base = table.block(np.arange(n), 0, _base_width(n, T * M + Mc))  # [n, B0]
    durs: list[list[float] | None] = [None] * n  # per-client durations, materialized lazily as Python floats

    def extend(c: int, k: int) -> list[float]:
        """Client c's known durations, extended to cover its job k (values do not depend on the chunking)."""
        lst = durs[c]
        if lst is None:
            lst = durs[c] = base[c].tolist()
        while k >= len(lst):
            lst.extend(table.block(np.array([c]), len(lst), max(len(lst), 64))[0].tolist())
        return lst

    # Initial clients: Mc distinct clients, sorted by id; slot j for the j-th of them.
    if Mc == n:
        init = np.arange(n, dtype=np.int64)
    else:
        init = np.sort(_rng(seed, 2).choice(n, size=Mc, replace=False).astype(np.int64))
    idle = np.ones(n, dtype=bool)
    idle[init] = False
    pool: list[int] = np.flatnonzero(idle).tolist()  # idle clients, in an order that only determinism relies on

    choice_rng = _rng(seed, 3)
    UB = _UNIFORM_BLOCK
    uni: list[float] = choice_rng.random(UB).tolist()
    ui = 0
    t0 = 0.0
    # Jobs: ids 0..Mc-1 are the initial jobs, then one per dispatch, in dispatch order.
    job_slot: list[int] = list(range(Mc))
    job_client: list[int] = []
    job_row: list[int] = []
    job_time: list[float] = []
    job_count = [0] * n  # jobs started so far by each client (index of its next job's duration)
    heap: list[tuple[float, int, int]] = []
    for j, c in enumerate(init.tolist()):
        job_count[c] = 1
        heap.append((t0 + extend(c, 0)[0], c, j))
    heapq.heapify(heap)
    free: list[int] = []  # LIFO free list of slots released at step boundaries
    pending: list[int] = []  # slots read during the current step
    num_slots = Mc
    arr_j: list[int] = []
    arr_t: list[float] = []
    step_times: list[float] = []
    arr_j_append, arr_t_append, pending_append, pool_append = arr_j.append, arr_t.append, pending.append, pool.append
    job_slot_append, job_client_append = job_slot.append, job_client.append
    job_row_append, job_time_append = job_row.append, job_time.append
    heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace

    def dispatch(time: float) -> tuple[float, int, int]:
        """Starts a job at ``time`` for a client drawn uniformly from the idle pool; returns its heap entry.

        The draw is an O(1) swap-remove (``int(u * L) < L`` for doubles ``u < 1``); the job takes the most recently
        freed slot, or a new one.
        """
        nonlocal uni, ui, num_slots
        if ui == UB:
            uni = choice_rng.random(UB).tolist()
            ui = 0
        size = len(pool)
        i = int(uni[ui] * size)
        ui += 1
        c2 = pool[i]
        last = pool.pop()
        if i < size - 1:
            pool[i] = last
        if free:
            job_slot_append(free.pop())
        else:
            job_slot_append(num_slots)
            num_slots += 1
        k = job_count[c2]
        job_count[c2] = k + 1
        lst = durs[c2]
        if lst is None or k >= len(lst):
            lst = extend(c2, k)
        job_client_append(c2)
        job_row_append(t)
        job_time_append(time)
        return time + lst[k], c2, len(job_client) + Mc - 1

    t = 0
    m = 0
    if refill == "immediate":
        # Every arrival is replaced at once: peek the earliest job, then replace it in the heap by the new one.
        while True:
            time, c, j = heap[0]
            arr_j_append(j)
            arr_t_append(time)
            pending_append(job_slot[j])
            pool_append(c)
            m += 1
            if m == M:
                step_times.append(time)
                t += 1
                m = 0
                free.extend(pending)
                pending.clear()
                if t == T:
                    break
            heapreplace(heap, dispatch(time))
    else:
        # Refill only at step boundaries, M clients at a time (sampled without replacement from the idle pool).
        while True:
            time, c, j = heappop(heap)
            arr_j_append(j)
            arr_t_append(time)
            pending_append(job_slot[j])
            pool_append(c)
            m += 1
            if m < M:
                continue
            step_times.append(time)
            t += 1
            m = 0
            free.extend(pending)
            pending.clear()
            if t == T:
                break
            for _ in range(M):
                heappush(heap, dispatch(time))

    all_client = np.concatenate([init, np.asarray(job_client, dtype=np.int64)])
    all_slot = np.asarray(job_slot, dtype=np.int64)
    all_version = np.concatenate([np.zeros(Mc, dtype=np.int64), np.asarray(job_row, dtype=np.int64)])
    aj = np.asarray(arr_j, dtype=np.int64)
    d_clients, d_slots, d_times = _pad_rows(
        np.asarray(job_row, dtype=np.int64), [all_client[Mc:], all_slot[Mc:], np.asarray(job_time)], T, M,
        [-1, -1, np.nan], [np.int32, np.int32, np.float64])
    return Schedule(
        init_clients=init.astype(np.int32),
        init_slots=np.arange(Mc, dtype=np.int32),
        dispatch_clients=d_clients,
        dispatch_slots=d_slots,
        dispatch_times=d_times,
        arrival_clients=all_client[aj].astype(np.int32).reshape(T, M),
        arrival_slots=all_slot[aj].astype(np.int32).reshape(T, M),
        arrival_versions=all_version[aj].astype(np.int32).reshape(T, M),
        arrival_times=np.asarray(arr_t, dtype=np.float64).reshape(T, M),
        step_times=np.asarray(step_times, dtype=np.float64),
        num_clients=n,
        num_slots=num_slots,
        init_time=t0,
        info=_info("concurrent", n, T, delays, seed, concurrency=Mc, buffer_size=M, refill=refill),
    )


# ---------------------------------------------------------------------- concurrent: vectorized fast path
def _concurrent_fast(n: int, T: int, delays: DelayModel, seed: int, refill: str) -> Schedule:
    """All ``n`` clients always active, one arrival per step (``concurrency == n``, ``buffer_size == 1``).

    Every client is redispatched to itself at each of its arrivals, so client ``i``'s finish times are the cumulative
    sums of its own job durations. The first ``T`` finish times over all clients, in ``(time, client, job)`` order, are
    the arrivals. Client ``i`` keeps slot ``i``; the job that arrives at step ``t`` is followed by a job of version
    ``t+1`` of the same client (the LIFO free list of the event loop makes exactly the same choices).
    """
    table = job_durations_table(n, delays, seed)
    t0 = 0.0
    all_clients = np.arange(n, dtype=np.int64)
    # Known finish times, in levels: level 0 has jobs [0, B0) of every client; level l adds jobs [K_{l-1}, K_l) of the
    # clients that may still have unknown finish times among the first T.
    width = _base_width(n, T + n)
    times_l = [np.cumsum(np.concatenate([np.full((n, 1), t0), table.block(all_clients, 0, width)], axis=1),
                         axis=1)[:, 1:]]
    clients_l = [all_clients]
    first_l = [0]
    last_time = times_l[0][:, -1].copy()
    known = np.full(n, width, dtype=np.int64)  # jobs known per client (last known job = known - 1)
    while True:
        flat_t = np.concatenate([a.ravel() for a in times_l])
        if flat_t.size < T:
            needy = all_clients
        else:
            tau = np.partition(flat_t, T - 1)[T - 1]
            less = int(np.count_nonzero(flat_t < tau))
            # Among known events at time tau, the (T - less)-th in (client, job) order is the T-th event overall.
            tie_c, tie_k = [], []
            for a, cl, f in zip(times_l, clients_l, first_l):
                r, col = np.nonzero(a == tau)
                tie_c.append(cl[r])
                tie_k.append(col + f)
            tie_c = np.concatenate(tie_c)
            tie_k = np.concatenate(tie_k)
            o = np.lexsort((tie_k, tie_c))[T - less - 1]
            c_star, k_star = int(tie_c[o]), int(tie_k[o])
            # A client's unknown jobs come after its last known one; extend those whose last known event precedes
            # the T-th event (time, client, job) = (tau, c_star, k_star).
            last_k = known - 1
            needy = np.flatnonzero((last_time < tau) | ((last_time == tau) & (
                (all_clients < c_star) | ((all_clients == c_star) & (last_k < k_star)))))
            if needy.size == 0:
                break
        # Double the known prefix of each needy client (one level per distinct prefix length; usually one).
        for first in np.unique(known[needy]).tolist():
            group = needy[known[needy] == first]
            block = table.block(group, first, first)
            cums = np.cumsum(np.concatenate([last_time[group, None], block], axis=1), axis=1)[:, 1:]
            times_l.append(cums)
            clients_l.append(group)
            first_l.append(first)
            last_time[group] = cums[:, -1]
            known[group] += first

    # Select the first T events and order them by (time, client, job).
    sel_t, sel_c, sel_k = [], [], []
    for a, cl, f in zip(times_l, clients_l, first_l):
        cc = np.broadcast_to(cl[:, None], a.shape)
        kk = np.broadcast_to(np.arange(f, f + a.shape[1])[None, :], a.shape)
        mask = (a < tau) | ((a == tau) & ((cc < c_star) | ((cc == c_star) & (kk <= k_star))))
        sel_t.append(a[mask])
        sel_c.append(cc[mask])
        sel_k.append(kk[mask])
    ev_t = np.concatenate(sel_t)
    ev_c = np.concatenate(sel_c)
    ev_k = np.concatenate(sel_k)
    assert ev_t.size == T, (ev_t.size, T)
    order = np.lexsort((ev_k, ev_c, ev_t))
    ev_t, ev_c, ev_k = ev_t[order], ev_c[order], ev_k[order]
    # Version of each arrival: 0 for a client's first job, else (step of its previous arrival) + 1.
    steps = np.arange(T, dtype=np.int64)
    by_client = np.lexsort((ev_k, ev_c))
    prev = np.empty(T, dtype=np.int64)
    sc = steps[by_client]
    prev[by_client[1:]] = sc[:-1]
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
        init_time=t0,
        info=_info("concurrent", n, T, delays, seed, concurrency=n, buffer_size=1, refill=refill),
    )


# ---------------------------------------------------------------------- availability, clock: general event loop
class _Clock:
    """Tick times of the server clock: ``(k + 1) * period`` (periodic) or the arrival times of a Poisson process of
    rate ``rate`` (gaps from stream 7, drawn in blocks of :data:`_CLOCK_BLOCK` so any prefix is the same)."""

    def __init__(self, aggregation: str, period: float | None, rate: float | None, seed: int) -> None:
        self.period = period
        self.rate = rate
        self.rng = _rng(seed, 7) if aggregation == "poisson" else None
        self.times: list[float] = []
        self.last = 0.0

    def tick(self, k: int) -> float:
        """Virtual time of the ``k``-th tick (``k = 0, 1, ...``), i.e. of server step ``k``."""
        if self.rng is None:
            return (k + 1) * self.period
        while k >= len(self.times):
            gaps = self.rng.exponential(1.0 / self.rate, size=_CLOCK_BLOCK)
            block = np.cumsum(np.concatenate([[self.last], gaps]))[1:]
            self.times.extend(block.tolist())
            self.last = float(block[-1])
        return self.times[k]


def _dropout_info(n: int, delays: DelayModel, seed: int) -> tuple[list[int], float, dict[str, Any]]:
    """(dropped clients, dropout time, the entries for ``schedule.info``); no clients and ``inf`` when off."""
    if not delays.has_dropouts(n):
        return [], float("inf"), {}
    dropped = dropped_clients(n, delays, seed).tolist()
    time = float(delays.dropout_time)
    return dropped, time, {"dropped_clients": dropped, "dropout_time": time}


def _general_event_loop(protocol: str, n: int, T: int, delays: DelayModel, seed: int, concurrency: int,
                        buffer_size: int | None, refill: str, aggregation: str, period: float | None,
                        rate: float | None) -> Schedule:
    """Discrete-event simulation of ``concurrent`` / ``all_active`` with dropouts, suspensions and a server clock.

    With all of them off it makes the same choices in the same order as :func:`_concurrent_event_loop` (same streams,
    same idle pool, same LIFO slots), so the two give identical schedules (tested). ``all_active`` is the case
    ``concurrency = n``, immediate refill: the only idle client at an arrival is the one that arrived.

    The loop keeps ``target = min(concurrency, live clients)`` jobs in flight: after every event it dispatches clients
    drawn uniformly from the idle pool (live, not training, not suspended) while fewer than ``target`` jobs are in
    flight, not counting, with ``refill="boundary"``, the arrivals of the current step (those are refilled at the
    boundary). A refill that finds the pool empty is made when a client returns from suspension.
    """
    Mc = concurrency
    clock = None if aggregation == "count" else _Clock(aggregation, period, rate, seed)
    M = buffer_size if clock is None else 0
    boundary = clock is None and refill == "boundary"
    table = job_durations_table(n, delays, seed)
    width = _base_width(n, (T * M if clock is None else T) + Mc)
    base = table.block(np.arange(n), 0, width)
    durs: list[list[float] | None] = [None] * n

    def extend(c: int, k: int) -> list[float]:
        lst = durs[c]
        if lst is None:
            lst = durs[c] = base[c].tolist()
        while k >= len(lst):
            lst.extend(table.block(np.array([c]), len(lst), max(len(lst), 64))[0].tolist())
        return lst

    susp = suspension_table(n, delays, seed) if delays.has_suspensions else None
    susp_base = susp.block(np.arange(n), 0, width) if susp is not None else None
    susp_lists: list[list[float] | None] = [None] * n

    def suspension(c: int, u: int) -> float:
        """Length of the suspension after client c's u-th upload (nan: none); lazily extended like the durations."""
        lst = susp_lists[c]
        if lst is None:
            lst = susp_lists[c] = susp_base[c].tolist()
        while u >= len(lst):
            lst.extend(susp.block(np.array([c]), len(lst), max(len(lst), 64))[0].tolist())
        return lst[u]

    dropped, drop_time, drop_info = _dropout_info(n, delays, seed)
    is_dropped = [False] * n
    for c in dropped:
        is_dropped[c] = True

    if Mc == n:
        init = np.arange(n, dtype=np.int64)
    else:
        init = np.sort(_rng(seed, 2).choice(n, size=Mc, replace=False).astype(np.int64))
    IDLE, BUSY, SUSPENDED, GONE = 0, 1, 2, 3
    state = [IDLE] * n
    for c in init.tolist():
        state[c] = BUSY
    pool: list[int] = [c for c in range(n) if state[c] == IDLE]

    choice_rng = _rng(seed, 3)
    UB = _UNIFORM_BLOCK
    uni: list[float] = choice_rng.random(UB).tolist()
    ui = 0
    t0 = 0.0
    job_slot: list[int] = list(range(Mc))
    job_client: list[int] = []
    job_row: list[int] = []
    job_time: list[float] = []
    job_count = [0] * n
    cur_job = [-1] * n  # the job each client has in flight (-1: none)
    cur_finish = [0.0] * n
    # Heap entries (time, kind, client, job); kinds at equal times: 0 dropout, 1 arrival, 2 return, 3 tick.
    heap: list[tuple[float, int, int, int]] = []
    for j, c in enumerate(init.tolist()):
        job_count[c] = 1
        cur_job[c] = j
        cur_finish[c] = t0 + extend(c, 0)[0]
        heap.append((cur_finish[c], 1, c, j))
    if dropped:
        heap.append((drop_time, 0, -1, -1))
    if clock is not None:
        heap.append((clock.tick(0), 3, -1, -1))
    heapq.heapify(heap)
    discarded: set[int] = set()
    free: list[int] = []
    pending: list[int] = []  # slots read during the current step
    discard_pending: list[int] = []  # slots of discarded jobs, released with the current step's
    num_slots = Mc
    arr_j: list[int] = []
    arr_t: list[float] = []
    arr_row: list[int] = []
    step_times: list[float] = []
    uploads = [0] * n
    in_flight = Mc
    live = n
    target = min(Mc, live)
    t = 0
    m = 0  # arrivals of the current step (count aggregation)
    burst_time, burst, burst_limit = float("nan"), 0, 8 * n + 1000
    heappush, heappop = heapq.heappush, heapq.heappop

    def dispatch(time: float) -> None:
        """Starts a job at ``time`` for a client drawn uniformly from the idle pool (as the count event loop)."""
        nonlocal uni, ui, num_slots, in_flight
        if ui == UB:
            uni = choice_rng.random(UB).tolist()
            ui = 0
        size = len(pool)
        i = int(uni[ui] * size)
        ui += 1
        c2 = pool[i]
        last = pool.pop()
        if i < size - 1:
            pool[i] = last
        if free:
            job_slot.append(free.pop())
        else:
            job_slot.append(num_slots)
            num_slots += 1
        k = job_count[c2]
        job_count[c2] = k + 1
        lst = durs[c2]
        if lst is None or k >= len(lst):
            lst = extend(c2, k)
        job_client.append(c2)
        job_row.append(t)
        job_time.append(time)
        j2 = len(job_client) + Mc - 1
        state[c2] = BUSY
        cur_job[c2] = j2
        cur_finish[c2] = time + lst[k]
        in_flight += 1
        heappush(heap, (cur_finish[c2], 1, c2, j2))

    while True:
        if not heap:
            raise ValueError(
                f"cannot complete num_steps={T} (stopped after {t} steps): after the dropout at time {drop_time:g} "
                f"only {live} live client(s) remain, fewer than buffer_size={M} distinct clients that a step needs "
                "with refill='boundary'; lower delays.dropout_fraction or buffer_size, or use refill='immediate'"
            )
        time, kind, c, j = heappop(heap)
        if kind == 1:  # a result arrives
            if j in discarded:
                continue
            arr_j.append(j)
            arr_t.append(time)
            arr_row.append(t)
            pending.append(job_slot[j])
            in_flight -= 1
            cur_job[c] = -1
            u = uploads[c]
            uploads[c] = u + 1
            if is_dropped[c] and time >= drop_time:
                state[c] = GONE
            else:
                length = suspension(c, u) if susp is not None else math.nan
                if length == length:  # suspended
                    state[c] = SUSPENDED
                    heappush(heap, (time + length, 2, c, -1))
                else:
                    state[c] = IDLE
                    pool.append(c)
            if clock is None:
                m += 1
                if m == M:
                    step_times.append(time)
                    t += 1
                    m = 0
                    free.extend(pending)
                    pending.clear()
                    if discard_pending:
                        free.extend(discard_pending)
                        discard_pending.clear()
                    if t == T:
                        break
            else:
                if time == burst_time:
                    burst += 1
                    if burst > burst_limit:
                        raise ValueError(
                            f"aggregation={aggregation!r}: more than {burst_limit} results arrived at virtual time "
                            f"{time:g} without the server clock advancing; the delay model gives zero-length jobs "
                            "(e.g. speed_value=0 with comm_time=0), which never let a clock tick. Use a delay model "
                            "with positive durations or aggregation='count'"
                        )
                else:
                    burst_time, burst = time, 1
        elif kind == 2:  # a client returns from suspension
            if state[c] != SUSPENDED:
                continue  # it left meanwhile
            state[c] = IDLE
            pool.append(c)
        elif kind == 0:  # the dropout
            for c2 in dropped:
                st = state[c2]
                if st == BUSY:
                    if cur_finish[c2] > drop_time:  # its result would arrive after the dropout: discarded
                        j2 = cur_job[c2]
                        discarded.add(j2)
                        discard_pending.append(job_slot[j2])
                        cur_job[c2] = -1
                        in_flight -= 1
                        state[c2] = GONE
                    # else its result arrives at the dropout time itself; it leaves right after
                elif st == IDLE:
                    i = pool.index(c2)
                    last = pool.pop()
                    if i < len(pool):
                        pool[i] = last
                    state[c2] = GONE
                else:
                    state[c2] = GONE
            live -= len(dropped)
            target = min(Mc, live)
        else:  # a tick of the server clock: apply step t with what arrived since the last tick
            step_times.append(time)
            t += 1
            free.extend(pending)
            pending.clear()
            if discard_pending:
                free.extend(discard_pending)
                discard_pending.clear()
            if t == T:
                break
            heappush(heap, (clock.tick(t), 3, -1, -1))
            continue
        need = target - in_flight - (m if boundary else 0)
        while need > 0 and pool:
            dispatch(time)
            need -= 1

    all_client = np.concatenate([init, np.asarray(job_client, dtype=np.int64)])
    all_slot = np.asarray(job_slot, dtype=np.int64)
    all_version = np.concatenate([np.zeros(Mc, dtype=np.int64), np.asarray(job_row, dtype=np.int64)])
    rows = np.asarray(job_row, dtype=np.int64)
    per_row = np.bincount(rows, minlength=T) if rows.size else np.zeros(T, dtype=np.int64)
    width_d = int(max(M if clock is None else 1, per_row.max(initial=0)))
    d_clients, d_slots, d_times = _pad_rows(
        rows, [all_client[Mc:], all_slot[Mc:], np.asarray(job_time, dtype=np.float64)], T, width_d,
        [-1, -1, np.nan], [np.int32, np.int32, np.float64])
    aj = np.asarray(arr_j, dtype=np.int64)
    a_rows = np.asarray(arr_row, dtype=np.int64)
    if clock is None:
        width_a = M
    else:
        width_a = int(max(1, np.bincount(a_rows, minlength=T).max(initial=0))) if a_rows.size else 1
    a_clients, a_slots, a_versions, a_times = _pad_rows(
        a_rows, [all_client[aj], all_slot[aj], all_version[aj], np.asarray(arr_t, dtype=np.float64)], T, width_a,
        [-1, -1, -1, np.nan], [np.int32, np.int32, np.int32, np.float64])
    if clock is None:
        extra: dict[str, Any] = {"concurrency": Mc, "buffer_size": M}
        if protocol == "concurrent":
            extra["refill"] = refill
    else:
        extra = {"concurrency": Mc}
        if protocol == "concurrent":
            extra["refill"] = refill
        extra["aggregation"] = aggregation
        extra["period" if aggregation == "periodic" else "rate"] = period if aggregation == "periodic" else rate
    return Schedule(
        init_clients=init.astype(np.int32),
        init_slots=np.arange(Mc, dtype=np.int32),
        dispatch_clients=d_clients,
        dispatch_slots=d_slots,
        dispatch_times=d_times,
        arrival_clients=a_clients,
        arrival_slots=a_slots,
        arrival_versions=a_versions,
        arrival_times=a_times,
        step_times=np.asarray(step_times, dtype=np.float64),
        num_clients=n,
        num_slots=num_slots,
        init_time=t0,
        info=_info(protocol, n, T, delays, seed, **extra, **drop_info),
    )


# ---------------------------------------------------------------------- synchronous with dropouts / suspensions
def _synchronous_available(n: int, T: int, delays: DelayModel, seed: int, participants: int | None) -> Schedule:
    """Synchronous rounds when clients may drop out or be suspended (a loop over rounds; see :func:`synchronous`)."""
    table = job_durations_table(n, delays, seed)
    susp = suspension_table(n, delays, seed) if delays.has_suspensions else None
    dropped, drop_time, drop_info = _dropout_info(n, delays, seed)
    is_dropped = np.zeros(n, dtype=bool)
    is_dropped[dropped] = True
    back = np.zeros(n)  # time at which each client is available again (after a suspension)
    job_count = np.zeros(n, dtype=np.int64)
    uploads = np.zeros(n, dtype=np.int64)
    rng = _rng(seed, 3)
    t0 = 0.0
    start = t0
    rows_d: list[tuple[np.ndarray, float]] = []
    rows_a: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    step_times = np.empty(T)
    for t in range(T):
        while True:
            gone = is_dropped & (start >= drop_time)
            available = np.flatnonzero(~gone & (back <= start))
            if available.size:
                break
            # Nobody can take part: wait for the first live client to return (there is one: not all clients drop).
            waiting = ~is_dropped | (back < drop_time)
            start = float(back[waiting & (back > start)].min())
        if participants is None or participants >= available.size:
            chosen = available
        else:
            chosen = np.sort(available[rng.choice(available.size, size=participants, replace=False)])
        d = table.durations(chosen, job_count[chosen])
        job_count[chosen] += 1
        finish = start + d
        kept = ~(is_dropped[chosen] & (finish > drop_time))
        arrived = chosen[kept]
        end = float(finish[kept].max()) if arrived.size else -math.inf
        if not kept.all():
            end = max(end, drop_time)  # the server learns that the others left at the dropout time
        if susp is not None and arrived.size:
            lengths = susp.lengths(arrived, uploads[arrived])
            stays = ~(is_dropped[arrived] & (finish[kept] >= drop_time))
            hit = stays & ~np.isnan(lengths)
            back[arrived[hit]] = finish[kept][hit] + lengths[hit]
        uploads[arrived] += 1
        rows_d.append((chosen, start))
        rows_a.append((arrived, np.flatnonzero(kept), finish[kept]))
        step_times[t] = end
        start = end
    width_d = max(1, max(r[0].size for r in rows_d))
    width_a = max(1, max(r[0].size for r in rows_a))
    d_clients = np.full((T, width_d), -1, dtype=np.int32)
    d_slots = np.full((T, width_d), -1, dtype=np.int32)
    d_times = np.full((T, width_d), np.nan)
    a_clients = np.full((T, width_a), -1, dtype=np.int32)
    a_slots = np.full((T, width_a), -1, dtype=np.int32)
    a_versions = np.full((T, width_a), -1, dtype=np.int32)
    a_times = np.full((T, width_a), np.nan)
    for t, ((chosen, when), (arrived, slots, times)) in enumerate(zip(rows_d, rows_a)):
        d_clients[t, :chosen.size] = chosen
        d_slots[t, :chosen.size] = np.arange(chosen.size)
        d_times[t, :chosen.size] = when
        a_clients[t, :arrived.size] = arrived
        a_slots[t, :arrived.size] = slots
        a_versions[t, :arrived.size] = t
        a_times[t, :arrived.size] = times
    m = n if participants is None else participants
    return Schedule(
        init_clients=np.zeros(0, dtype=np.int32),
        init_slots=np.zeros(0, dtype=np.int32),
        dispatch_clients=d_clients,
        dispatch_slots=d_slots,
        dispatch_times=d_times,
        arrival_clients=a_clients,
        arrival_slots=a_slots,
        arrival_versions=a_versions,
        arrival_times=a_times,
        step_times=step_times,
        num_clients=n,
        num_slots=width_d,
        init_time=t0,
        info=_info("synchronous", n, T, delays, seed, participants=m, **drop_info),
    )


# ---------------------------------------------------------------------- public protocols
def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_clock(aggregation: Any, period: Any, rate: Any) -> tuple[str, float | None, float | None]:
    """Validates the server-clock options; returns ``(aggregation, period, rate)``."""
    if not isinstance(aggregation, str) or aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}")
    if aggregation == "periodic":
        if period is None:
            raise ValueError("aggregation='periodic' requires period (the time between server steps, > 0)")
        if not (isinstance(period, numbers.Real) and not isinstance(period, bool) and period == math.inf):
            period = _check_positive("period", period)  # inf: wait for everyone (synchronous rounds)
    elif period is not None:
        raise ValueError(f"period is only used with aggregation='periodic', got period={period!r} with "
                         f"aggregation={aggregation!r}")
    if aggregation == "poisson":
        if rate is None:
            raise ValueError("aggregation='poisson' requires rate (server steps per unit of virtual time, > 0)")
        rate = _check_positive("rate", rate)
    elif rate is not None:
        raise ValueError(f"rate is only used with aggregation='poisson', got rate={rate!r} with "
                         f"aggregation={aggregation!r}")
    return aggregation, period, rate


def _needs_event_loop(n: int, delays: DelayModel, aggregation: str) -> bool:
    """Whether dropouts, suspensions or a server clock are on (then the general event loop builds the schedule)."""
    return aggregation != "count" or delays.has_dropouts(n) or delays.has_suspensions


def concurrent(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
               concurrency: int, buffer_size: int | None = None, refill: str = "immediate",
               aggregation: str = "count", period: float | None = None, rate: float | None = None) -> Schedule:
    """Fixed concurrency ``Mc`` with a buffer of ``M`` results per server step (FedBuff / CA2FL Algorithm 2).

    ``Mc`` distinct clients, sampled uniformly without replacement, start from ``x_0`` at time 0 (``init_clients``,
    sorted by id, slots ``0..Mc-1``). With ``aggregation="count"`` (the default) the server applies step ``t`` at the
    arrival time of its ``M``-th result (``M = buffer_size``, required).

    * ``refill="boundary"`` (CA2FL): right after step ``t`` is applied, ``M`` clients are sampled uniformly without
      replacement from all clients not training (including those that just reported); they start from ``x_{t+1}`` at
      that time and form ``dispatch_clients[t+1]`` (``dispatch_clients[0]`` is empty). Between boundaries only
      ``Mc - M`` .. ``Mc`` clients are in flight; the mean staleness tends to ``(Mc - M) / M``.
    * ``refill="immediate"`` (original FedBuff): every arrival is replaced at once by one client sampled uniformly
      from the idle clients (including the one that arrived). Replacements of arrivals ``1..M-1`` of step ``t`` start
      from ``x_t`` (``dispatch_clients[t]``); the replacement of the ``M``-th starts from ``x_{t+1}``
      (``dispatch_clients[t+1]``). So ``dispatch_clients[0]`` holds ``M-1`` clients, later rows ``M``.

    Dispatch width ``D = M``. Arrivals are listed in time order (ties: by client id). Requires
    ``1 <= buffer_size <= concurrency <= num_clients``. With ``concurrency == num_clients`` and ``buffer_size == 1``
    (both refills coincide) a vectorized path builds the same schedule as the event loop.

    Server clock (``aggregation="periodic"`` with ``period``, or ``"poisson"`` with ``rate``): step ``t`` is applied
    at the ``t``-th tick (``step_times[t] = (t+1) * period``, or the ``t``-th point of a Poisson process of rate
    ``rate``) with every result that arrived in ``(step_times[t-1], step_times[t]]`` (possibly none: an empty step).
    Refill is immediate only (``refill="boundary"`` raises) and ``buffer_size`` must not be given. ``period=inf``
    (a window that waits for everyone) gives synchronous rounds: :func:`synchronous` with ``participants = Mc``
    (all clients when ``Mc = n``; ``info`` then also says ``aggregation="periodic", period="inf"``). The arrival width
    ``M`` is the largest number of arrivals in a step (at least 1), the dispatch width the largest number of
    dispatches; shorter rows are padded with -1.

    Dropouts and suspensions (fields of ``delays``): ``target = min(Mc, live clients)`` jobs are kept in flight. A
    job of a dropped client still in flight at ``dropout_time`` is discarded (its slot is released with the current
    step's) and replaced at once by a job of a live idle client, if any, which starts from the current model ``x_t``
    (``dispatch_clients[t]``, ``t`` = steps applied so far). A suspended client is not in the idle pool until it
    returns; a refill that finds the pool empty is made when a client returns (also mid-step with ``"boundary"``).
    Dispatch rows may then hold more than ``M`` jobs (width: the largest row, at least ``M``). Raises ``ValueError``
    if, with ``refill="boundary"``, fewer than ``buffer_size`` live clients remain to complete the requested steps.
    """
    n, T, delays, seed = _check_common(num_clients, num_steps, delays, seed)
    Mc = _check_int("concurrency", concurrency, 1, n, f"num_clients={n}")
    if not isinstance(refill, str) or refill not in REFILLS:
        raise ValueError(f"refill must be one of {list(REFILLS)}, got {refill!r}")
    aggregation, period, rate = _check_clock(aggregation, period, rate)
    if aggregation == "count":
        if buffer_size is None:
            raise ValueError("buffer_size is required with aggregation='count' (a server step every buffer_size "
                             "arrivals)")
        M = _check_int("buffer_size", buffer_size, 1, Mc, f"concurrency={Mc}")
    else:
        if buffer_size is not None:
            raise ValueError(f"buffer_size must not be given with aggregation={aggregation!r}: the server clock "
                             f"decides when a step is applied (got buffer_size={buffer_size!r})")
        if refill != "immediate":
            raise ValueError(f"refill must be 'immediate' with aggregation={aggregation!r} (an arriving client is "
                             f"replaced at once), got refill={refill!r}")
        M = None
    if period == math.inf:  # a window that waits for every client in flight: synchronous rounds of Mc clients
        return _infinite_window(synchronous(n, T, delays, seed, participants=None if Mc == n else Mc))
    if _needs_event_loop(n, delays, aggregation):
        return _general_event_loop("concurrent", n, T, delays, seed, Mc, M, refill, aggregation, period, rate)
    if Mc == n and M == 1:
        return _concurrent_fast(n, T, delays, seed, refill)
    return _concurrent_event_loop(n, T, delays, seed, Mc, M, refill)


def all_active(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
               aggregation: str = "count", period: float | None = None, rate: float | None = None) -> Schedule:
    """All clients always training, one arrival per server step (ACE, AREA, FedAsync).

    Equal to ``concurrent(n, T, delays, seed, concurrency=n, buffer_size=1)`` (except ``info["protocol"]``): every
    arriving client is immediately sent the new model ``x_{t+1}``. Client ``i`` keeps slot ``i``.

    With a server clock (``aggregation="periodic"``/``"poisson"``, see :func:`concurrent`) an arriving client is
    re-dispatched at once from ``x_t`` (``t`` = steps applied so far) and its result is applied at the next tick.
    With dropouts, a dropped client's job in flight at ``dropout_time`` is discarded and not replaced (no client is
    idle). A suspended client starts its next job when it returns, from the model current at that time, so dispatch
    rows hold a variable number of jobs (padded with -1 to the largest). In these cases slots are handed out from the
    LIFO free list (a client does not keep its slot) and the schedule comes from the general event loop.
    """
    n, T, delays, seed = _check_common(num_clients, num_steps, delays, seed)
    aggregation, period, rate = _check_clock(aggregation, period, rate)
    if period == math.inf:  # a window that waits for everyone: synchronous rounds of all clients
        return _infinite_window(synchronous(n, T, delays, seed))
    if _needs_event_loop(n, delays, aggregation):
        M = 1 if aggregation == "count" else None
        return _general_event_loop("all_active", n, T, delays, seed, n, M, "immediate", aggregation, period, rate)
    schedule = _concurrent_fast(n, T, delays, seed, "immediate")
    return dataclasses.replace(schedule, info=_info("all_active", n, T, delays, seed, concurrency=n, buffer_size=1))


def _infinite_window(schedule: Schedule) -> Schedule:
    """A synchronous schedule standing for a time-window server with ``period = inf``."""
    return dataclasses.replace(schedule, info={**schedule.info, "aggregation": "periodic", "period": "inf"})


def synchronous(num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any], seed: int,
                participants: int | None = None) -> Schedule:
    """Synchronous rounds (FedAvg): the server waits for the slowest participant.

    Round ``t`` starts at ``start_t`` (``start_0 = 0``, ``start_{t+1} = step_times[t]``): ``m = participants`` clients
    (``None``: all ``n``, in id order; else sampled uniformly without replacement, then sorted) start from ``x_t`` and
    all arrive in step ``t`` (staleness 0) at ``start_t + d_i``; ``step_times[t] = start_t + max_i d_i``.
    ``dispatch_clients[t] == arrival_clients[t]`` with slots ``0..m-1``; there are no initial jobs.

    Dropouts and suspensions (fields of ``delays``; a loop over rounds then builds the schedule): a round samples
    only from the clients *available* at its start (not dropped, i.e. start ``< dropout_time``, and not suspended);
    if fewer than ``participants`` are available, all of them take part (``None``: all available, in id order); if
    none is, the round starts when the first one returns. A participant that drops while training never reports; the
    round then ends when every participant has reported or left: ``step_times[t] = max(last arrival,
    dropout_time)``, possibly with no arrival at all. Arrivals stay in client-id order, in the slots of their
    dispatch; the widths are the largest rows (padded with -1).
    """
    n, T, delays, seed = _check_common(num_clients, num_steps, delays, seed)
    m = n if participants is None else _check_int("participants", participants, 1, n, f"num_clients={n}")
    if delays.has_dropouts(n) or delays.has_suspensions:
        return _synchronous_available(n, T, delays, seed, None if participants is None else m)
    table = job_durations_table(n, delays, seed)
    if m == n:
        clients = np.broadcast_to(np.arange(n, dtype=np.int64), (T, n))
        jobs = np.broadcast_to(np.arange(T, dtype=np.int64)[:, None], (T, n))
    else:
        rng = _rng(seed, 3)
        clients = np.sort(np.stack([rng.choice(n, size=m, replace=False) for _ in range(T)]), axis=1)
        flat = clients.ravel()
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=n)
        starts = np.cumsum(counts) - counts
        ranks = np.empty(flat.size, dtype=np.int64)
        ranks[order] = np.arange(flat.size) - np.repeat(starts, counts)
        jobs = ranks.reshape(T, m)
    durations = np.empty((T, m))
    rows = max(1, (1 << 20) // m)  # bounded temporaries
    for r in range(0, T, rows):
        durations[r:r + rows] = table.durations(clients[r:r + rows], jobs[r:r + rows])
    t0 = 0.0
    step_times = np.cumsum(np.concatenate([[t0], durations.max(axis=1)]))
    starts_t = step_times[:-1]
    ids = np.ascontiguousarray(clients, dtype=np.int32)
    slots = np.broadcast_to(np.arange(m, dtype=np.int32), (T, m)).copy()
    return Schedule(
        init_clients=np.zeros(0, dtype=np.int32),
        init_slots=np.zeros(0, dtype=np.int32),
        dispatch_clients=ids,
        dispatch_slots=slots,
        dispatch_times=np.repeat(starts_t[:, None], m, axis=1),
        arrival_clients=ids.copy(),
        arrival_slots=slots.copy(),
        arrival_versions=np.broadcast_to(np.arange(T, dtype=np.int32)[:, None], (T, m)).copy(),
        arrival_times=starts_t[:, None] + durations,
        step_times=step_times[1:],
        num_clients=n,
        num_slots=m,
        init_time=t0,
        info=_info("synchronous", n, T, delays, seed, participants=m),
    )


_OPTIONS = {
    "all_active": (all_active, ("aggregation", "period", "rate")),
    "concurrent": (concurrent, ("concurrency", "buffer_size", "refill", "aggregation", "period", "rate")),
    "synchronous": (synchronous, ("participants",)),
}


def make_schedule(protocol: str, num_clients: int, num_steps: int, delays: DelayModel | Mapping[str, Any],
                  seed: int, **options: Any) -> Schedule:
    """Builds a schedule by protocol name (``"all_active"``, ``"concurrent"``, ``"synchronous"``).

    ``delays`` may be a :class:`DelayModel` or its ``to_dict()`` form; ``options`` are the protocol's keyword
    arguments (``concurrent``: ``concurrency`` (required), ``buffer_size`` (required with the default
    ``aggregation="count"``, not allowed with a clock), ``refill``, ``aggregation``, ``period``, ``rate``;
    ``all_active``: ``aggregation``, ``period``, ``rate``; ``synchronous``: ``participants``).
    """
    if protocol not in _OPTIONS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    fn, valid = _OPTIONS[protocol]
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} for protocol {protocol!r}; valid options are {list(valid)}")
    if protocol == "concurrent":
        required = ["concurrency"]
        if options.get("aggregation", "count") == "count":
            required.append("buffer_size")
        missing = [k for k in required if k not in options]
        if missing:
            raise ValueError(f"protocol 'concurrent' requires option {missing[0]!r}")
    return fn(num_clients, num_steps, delays, seed, **options)
