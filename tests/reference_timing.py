"""A plain, unoptimized reference for the ``concurrent`` protocol with a buffer of ``M`` arrivals per step and every
client always available, written from the documented semantics.

It shares only the random streams with the package (``timing_rng``, ``job_durations_table``): one job per heap entry
``(finish time, client, job id)``, the idle pool as a Python list with the documented O(1) swap-remove draw, slots
from a LIFO free list that receives a step's slots when the step is applied. Everything is recomputed per event
(no lazily extended per-client lists, no peeking at the heap), so it is slow, and independent of the event loop's
bookkeeping.
"""

from __future__ import annotations

import heapq

import numpy as np

from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.streams import job_durations_table, schedule_info, timing_rng


def concurrent_reference(n: int, T: int, delays: DelayModel, seed: int, Mc: int, M: int, refill: str) -> Schedule:
    """The schedule ``concurrent(n, T, delays, seed, concurrency=Mc, buffer_size=M, refill=refill)`` must give."""
    table = job_durations_table(n, delays, seed)
    init = np.arange(n) if Mc == n else np.sort(timing_rng(seed, 2).choice(n, size=Mc, replace=False))
    busy = set(init.tolist())
    pool = [c for c in range(n) if c not in busy]
    uniforms = timing_rng(seed, 3)
    block: list[float] = []
    jobs: list[dict] = []  # client, slot, version, start
    counts = [0] * n
    heap: list[tuple[float, int, int]] = []
    free: list[int] = []
    next_slot = 0

    def start(client: int, slot: int, time: float, version: int) -> None:
        jobs.append({"client": client, "slot": slot, "version": version, "start": time})
        finish = time + float(table.durations(client, counts[client]))
        counts[client] += 1
        heapq.heappush(heap, (finish, client, len(jobs) - 1))

    def draw(time: float, version: int) -> None:
        nonlocal block, next_slot
        if not block:
            block = uniforms.random(1 << 16).tolist()[::-1]
        i = int(block.pop() * len(pool))
        client = pool[i]
        pool[i] = pool[-1]
        pool.pop()
        slot = free.pop() if free else next_slot
        next_slot = max(next_slot, slot + 1)
        start(client, slot, time, version)

    for slot, c in enumerate(init.tolist()):
        start(c, slot, 0.0, 0)
    next_slot = Mc
    arrivals: list[list[tuple[int, float]]] = [[] for _ in range(T)]
    step_times = []
    for t in range(T):
        while len(arrivals[t]) < M:
            time, client, j = heapq.heappop(heap)
            arrivals[t].append((j, time))
            pool.append(client)
            if len(arrivals[t]) == M:
                step_times.append(time)
                free.extend(jobs[a]["slot"] for a, _ in arrivals[t])
            if refill == "immediate" and (len(arrivals[t]) < M or t + 1 < T):
                draw(time, t if len(arrivals[t]) < M else t + 1)
        if refill == "boundary" and t + 1 < T:
            for _ in range(M):
                draw(step_times[t], t + 1)
    return _schedule(n, T, M, init, jobs, arrivals, step_times, next_slot,
                     schedule_info("concurrent", n, T, delays, seed, concurrency=Mc, buffer_size=M, refill=refill))


def _schedule(n: int, T: int, M: int, init: np.ndarray, jobs: list[dict], arrivals: list[list[tuple[int, float]]],
              step_times: list[float], num_slots: int, info: dict) -> Schedule:
    d_clients = np.full((T, M), -1, np.int32)
    d_slots = np.full((T, M), -1, np.int32)
    d_times = np.full((T, M), np.nan)
    fill = [0] * T
    for job in jobs[init.size:]:
        v = job["version"]
        d_clients[v, fill[v]], d_slots[v, fill[v]], d_times[v, fill[v]] = job["client"], job["slot"], job["start"]
        fill[v] += 1
    a = {k: np.array([[jobs[j][k] for j, _ in row] for row in arrivals], np.int32) for k in ("client", "slot",
                                                                                           "version")}
    return Schedule(
        init_clients=init.astype(np.int32),
        init_slots=np.arange(init.size, dtype=np.int32),
        dispatch_clients=d_clients,
        dispatch_slots=d_slots,
        dispatch_times=d_times,
        arrival_clients=a["client"],
        arrival_slots=a["slot"],
        arrival_versions=a["version"],
        arrival_times=np.array([[time for _, time in row] for row in arrivals], np.float64),
        step_times=np.array(step_times, np.float64),
        num_clients=n,
        num_slots=num_slots,
        init_time=0.0,
        info=info,
    )
