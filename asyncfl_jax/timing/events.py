"""The one discrete-event loop that turns a delay model and three policies into a :class:`Schedule`.

:func:`simulate_events` runs it; :mod:`asyncfl_jax.timing.policies` defines the policies (refill, aggregation,
availability) and :mod:`asyncfl_jax.timing.protocols` maps every protocol and option onto them.

Events. The loop keeps a heap of ``(time, kind, client, job)``. Kinds, in the order they are handled at equal times:

0. the dropout (``Availability.dropout_time``);
1. a client goes offline at the end of an availability window (device traces; by client id): it leaves the idle
   pool, a job still in flight is discarded, but a result that arrives at that very instant is kept;
2. a result arrives (ties: by client id; after a zero-length job the same client may be dispatched and arrive again
   at the same instant: it is then ordered again by its id). A client never has two jobs in flight;
3. a client returns from a suspension, or comes online at the start of an availability window (by client id);
4. the server acts: a tick of a :class:`~asyncfl_jax.timing.policies.Clock`, or the start of a
   :class:`~asyncfl_jax.timing.policies.Rounds` round.

So a job dispatched at a tick's time starts from the model before that tick, an arrival at a tick's time belongs to
that tick's step, and a round starts once everyone who returns at that instant is back.

After each event the aggregation policy says whether step ``t`` is applied now (then its arrival and dispatch rows
are closed and the slots it read are released); then the refill policy dispatches clients. Every job's duration is
the client's next one in :func:`~asyncfl_jax.timing.streams.job_durations_table` (a pure function of
``(seed, client, job index)``), so the event order alone decides the schedule.

Slots. Pending-buffer slots are handed out from a LIFO free list: the slots read at step ``t`` (and those of jobs
discarded at the dropout during step ``t``) are released when step ``t`` is applied, so only jobs of version
``>= t+1`` reuse them. ``num_slots`` is the largest number of slots ever held. Rounds use slots ``0, 1, ...`` in each
round instead.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, Callable

import numpy as np

from asyncfl_jax.timing.delays import JobDurations
from asyncfl_jax.timing.policies import (Aggregation, AllInFlight, Availability, Boundary, Clock, Count, Immediate,
                                         KeepInFlight, Refill, Rounds)
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.streams import ClientSequences, base_width, timing_rng

DROPOUT, OFFLINE, ARRIVAL, RETURN, SERVER = 0, 1, 2, 3, 4
UNIFORM_BLOCK = 1 << 16  # uniforms drawn per rng call for the refill's client choices


@dataclasses.dataclass
class EventLog:
    """What the loop recorded (Python lists; :func:`~asyncfl_jax.timing.fast.rounds_log` fills it with arrays). Jobs
    are numbered in dispatch order, the initial jobs first.

    Attributes:
      num_initial: jobs started before the first event (from ``x_0``, not in any dispatch row).
      job_client, job_slot, job_time: per job: client, pending slot, start time.
      arrival_job, arrival_time: per arrival, in event order: the job and its time.
      dispatch_ends, arrival_ends: per step ``t``: jobs / arrivals recorded when step ``t`` was applied (so row
        ``t`` holds jobs ``dispatch_ends[t-1] .. dispatch_ends[t] - 1``, after the initial ones).
      step_times: per step: the time it was applied.
      num_slots: pending slots used.
      discard_times: per job discarded when its client went offline (device traces), the time it was discarded.
    """

    num_initial: int
    job_client: list[int] | np.ndarray
    job_slot: list[int] | np.ndarray
    job_time: list[float] | np.ndarray
    arrival_job: list[int] | np.ndarray
    arrival_time: list[float] | np.ndarray
    dispatch_ends: list[int] | np.ndarray
    arrival_ends: list[int] | np.ndarray
    step_times: list[float]
    num_slots: int
    discard_times: list[float] = dataclasses.field(default_factory=list)


class _EventLoop:
    """The state of one run of the loop: :meth:`run` is the loop, the other methods handle steps and rare events.

    ``owed`` counts the jobs the refill owes: ``target - in flight - (arrivals of the current step under Boundary)``.
    After every event the loop dispatches while ``owed > 0`` and a client is idle.
    """

    def __init__(self, n: int, T: int, table: JobDurations, seed: int, refill: Refill, aggregation: Aggregation,
                 availability: Availability) -> None:
        _check_policies(refill, aggregation)
        self.T, self.refill, self.aggregation, self.availability = T, refill, aggregation, availability
        windows = availability.windows
        online = None if windows is None else np.asarray([c for c in range(n) if windows.current(c)[0] <= 0.0],
                                                         dtype=np.int64)
        init = refill.initial_clients(n, seed) if online is None else refill.initial_among(online, n, seed)
        self.initial_owed = 0 if online is None else refill.target(n) - len(init)  # clients offline at time 0
        width = base_width(n, _expected_jobs(n, T, refill, aggregation))
        susp = availability.suspensions
        self.suspensions = ClientSequences(susp.block, n, width) if susp is not None else None
        self.is_dropped = [False] * n
        for c in availability.dropped:
            self.is_dropped[c] = True
        self.live = n
        self.uploads = [0] * n
        busy = np.zeros(n, dtype=bool)
        busy[init] = True
        if online is not None:
            busy[np.setdiff1d(np.arange(n), online)] = True  # offline: not in the pool until their window starts
        self.pool: list[int] = np.flatnonzero(~busy).tolist()  # idle clients, in an order only determinism relies on
        self.windows = windows
        self.window_end = [math.inf] * n  # end of each client's current window (device traces)
        self.choice_rng = timing_rng(seed, 3)
        self.ticks = aggregation.ticks(seed) if isinstance(aggregation, Clock) else None
        self.waiting = False  # a round found nobody available: start it when a client returns
        self.rounds = isinstance(refill, Rounds)
        self.round_left = 0  # jobs of the current round still in flight
        self.free: list[int] = []  # LIFO free list of released slots
        self.discarded_slots: list[int] = []  # slots of jobs discarded during the current step
        self.log = EventLog(len(init), [], [], [], [], [], [], [], [], 0)
        self.dispatch = _dispatcher(ClientSequences(table.block, n, width), self.pool, self.free, self.choice_rng,
                                    self.log)
        self.heap = [self.dispatch(0.0, c, slot) for slot, c in enumerate(init.tolist())]
        if availability.dropped:
            self.heap.append((availability.dropout_time, DROPOUT, -1, -1))
        if self.ticks is not None:
            self.heap.append((self.ticks(0), SERVER, -1, -1))
        if self.rounds:
            self.heap.append((0.0, SERVER, -1, -1))
        if windows is not None:
            for c in range(n):
                start, end = windows.current(c)
                if start <= 0.0:
                    self.window_end[c] = end
                    if end < math.inf:
                        self.heap.append((end, OFFLINE, c, -1))
                elif start < math.inf:
                    self.heap.append((start, RETURN, c, -1))
        heapq.heapify(self.heap)
        self.burst_time, self.burst, self.burst_limit = math.nan, 0, 8 * n + 1000

    def run(self) -> EventLog:
        """Handles events until ``T`` steps are applied (see the module docstring)."""
        T, heap, pool, free, dispatch, log = self.T, self.heap, self.pool, self.free, self.dispatch, self.log
        arrival_job, arrival_time, job_slot, job_client = log.arrival_job, log.arrival_time, log.job_slot, log.job_client
        step_times, dispatch_ends, arrival_ends = log.step_times, log.dispatch_ends, log.arrival_ends
        discarded_slots, pending = self.discarded_slots, []  # slots read by step t's arrivals
        heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
        aggregation = self.aggregation
        counting, clock, rounds = (isinstance(aggregation, Count), isinstance(aggregation, Clock),
                                   isinstance(aggregation, AllInFlight))
        size = aggregation.size if counting else 0
        replaces = 1 if isinstance(self.refill, Immediate) else 0  # an arrival is owed a job at once
        owed_at_close = size if isinstance(self.refill, Boundary) else 0  # ... or when its step is applied
        always, arrival = self.availability.always, ARRIVAL
        t = m = 0  # steps applied; arrivals of step t (Count)
        owed = self.initial_owed  # jobs the refill owes
        while True:  # not `while heap`: CPython 3.11 only specializes a running loop at unconditional back-jumps
            try:
                time, kind, c, j = heap[0]
            except IndexError:
                raise self.stuck_error() from None
            if kind == arrival:  # it stays on the heap until the first job it frees replaces it
                head = True
                arrival_job.append(j)
                arrival_time.append(time)
                pending.append(job_slot[j])
                if always:
                    pool.append(c)
                else:
                    self.after_upload(c, time)
                owed += replaces
                if counting:
                    m += 1
                    closes = m == size
                elif clock:
                    closes = self.check_burst(time)
                else:
                    self.round_left -= 1
                    closes = self.round_left == 0
            else:
                head = closes = False
                heappop(heap)
                if kind == SERVER:
                    if rounds:
                        self.start_round(time)
                    else:
                        closes = True
                elif kind == RETURN:
                    self.give_back(c, time)
                elif kind == OFFLINE:
                    owed_change, closes = self.go_offline(c, time)
                    owed += owed_change
                else:
                    owed_change, closes = self.dropout(time)
                    owed += owed_change
            if closes:  # apply step t: close its rows, release the slots it read (and those discarded during it)
                t += 1
                free.extend(pending)
                pending.clear()
                if discarded_slots:
                    free.extend(discarded_slots)
                    discarded_slots.clear()
                step_times.append(time)
                dispatch_ends.append(len(job_client))
                arrival_ends.append(len(arrival_job))
                if t == T:
                    return log
                m = 0
                owed += owed_at_close
                if not counting:
                    self.next_server_event(time, t)
            if head:
                if owed > 0 and pool:
                    heapreplace(heap, dispatch(time))
                    owed -= 1
                else:
                    heappop(heap)
            while owed > 0 and pool:
                heappush(heap, dispatch(time))
                owed -= 1

    # ------------------------------------------------------------------ the server's events
    def next_server_event(self, time: float, t: int) -> None:
        """After step ``t - 1`` was applied at ``time``: schedules the clock's next tick, or the next round (at once,
        after the returns of this instant)."""
        if self.ticks is not None:
            heapq.heappush(self.heap, (self.ticks(t), SERVER, -1, -1))
        else:
            heapq.heappush(self.heap, (time, SERVER, -1, -1))

    def start_round(self, time: float) -> None:
        """Starts a round with clients from the idle pool, or waits for one to return."""
        if not self.pool:
            self.waiting = True
            return
        available = np.sort(np.asarray(self.pool, dtype=np.int64))
        chosen = self.refill.choose(available, self.choice_rng)
        self.pool[:] = np.setdiff1d(available, chosen, assume_unique=True).tolist()  # (order: no matter for rounds)
        for slot, c in enumerate(chosen.tolist()):
            heapq.heappush(self.heap, self.dispatch(time, c, slot))
        self.round_left = chosen.size

    def check_burst(self, time: float) -> bool:
        """Refuses delay models whose zero-length jobs would keep a clock from ever ticking; returns ``False`` (an
        arrival never applies a step under a clock)."""
        if time != self.burst_time:
            self.burst_time, self.burst = time, 1
            return False
        self.burst += 1
        if self.burst > self.burst_limit:
            raise ValueError(
                f"aggregation='{'periodic' if self.aggregation.period is not None else 'poisson'}': more than "
                f"{self.burst_limit} results arrived at virtual time {time:g} without the server clock advancing; "
                "the delay model gives zero-length jobs (e.g. speed_value=0 with comm_time=0), which never let a "
                "clock tick. Use a delay model with positive durations or aggregation='count'"
            )
        return False

    def stuck_error(self) -> ValueError:
        """The error when no event is left before ``T`` steps (boundary refill with too few live clients, or device
        traces whose availability has ended)."""
        if self.windows is not None:
            last = max(self.log.step_times, default=0.0)
            return ValueError(
                f"cannot complete num_steps={self.T} (stopped after {len(self.log.step_times)} steps, at virtual time "
                f"{last:g}): the device traces leave no client that is available and can finish a job (their "
                "availability windows end and do not repeat, or every window is shorter than the job). Give the "
                "trace a period, longer windows, or ask for fewer steps"
            )
        return ValueError(
            f"cannot complete num_steps={self.T} (stopped after {len(self.log.step_times)} steps): after the dropout "
            f"at time {self.availability.dropout_time:g} only {self.live} live client(s) remain, fewer than "
            f"buffer_size={self.aggregation.size} distinct clients that a step needs with refill='boundary'; lower "
            "delays.dropout_fraction or buffer_size, or use refill='immediate'"
        )

    # ------------------------------------------------------------------ availability
    def after_upload(self, c: int, time: float) -> None:
        """Client ``c`` uploaded at ``time``: it leaves (dropped, at or after the dropout time), is suspended, or
        rejoins the idle pool."""
        u = self.uploads[c]
        self.uploads[c] = u + 1
        if self.is_dropped[c] and time >= self.availability.dropout_time:
            return
        if time >= self.window_end[c]:  # uploaded as its window ends (its OFFLINE event came first): stays offline
            return
        length = math.nan
        if self.suspensions is not None:
            lst = self.suspensions.lists[c]
            if u >= len(lst):
                lst = self.suspensions.extend(c, u)
            length = lst[u]
        if length == length:
            heapq.heappush(self.heap, (time + length, RETURN, c, -1))
        else:
            self.pool.append(c)

    def give_back(self, c: int, time: float) -> None:
        """Client ``c``'s suspension ends, or its availability window starts, at ``time``: it rejoins the idle pool
        unless it has left meanwhile."""
        if self.is_dropped[c] and time >= self.availability.dropout_time:
            return
        if self.windows is not None:
            end = self.windows.current(c)[1]
            self.window_end[c] = end
            if end < math.inf:
                heapq.heappush(self.heap, (end, OFFLINE, c, -1))
        self.pool.append(c)
        if self.waiting:
            self.waiting = False
            heapq.heappush(self.heap, (time, SERVER, -1, -1))

    def go_offline(self, c: int, time: float) -> tuple[int, bool]:
        """Client ``c``'s availability window ends at ``time``, and so do those of the clients whose OFFLINE events
        are next at the same instant (all handled before anyone is dispatched): each leaves the idle pool, or its job
        in flight (which would arrive later) is discarded, as at a dropout; it comes back at the start of its next
        window. Returns the change in the jobs the refill owes and whether that ended the current round."""
        heap, pool = self.heap, self.pool
        discarded = 0
        while True:
            if c in pool:
                i = pool.index(c)
                last = pool.pop()
                if i < len(pool):
                    pool[i] = last
            else:
                for k, e in enumerate(heap):
                    if e[1] == ARRIVAL and e[2] == c:
                        if e[0] > time:
                            discarded += 1
                            self.discarded_slots.append(self.log.job_slot[e[3]])
                            self.log.discard_times.append(time)
                            heap[k] = heap[-1]
                            heap.pop()
                            heapq.heapify(heap)
                        break
            start = self.windows.advance(c)[0]
            self.window_end[c] = time  # offline: a result arriving at this instant is kept, it does not rejoin the pool
            if start < math.inf:
                heapq.heappush(heap, (start, RETURN, c, -1))
            if heap and heap[0][0] == time and heap[0][1] == OFFLINE:
                c = heapq.heappop(heap)[2]
                continue
            break
        if self.rounds:
            self.round_left -= discarded
            return 0, discarded > 0 and self.round_left == 0
        return discarded, False

    def dropout(self, time: float) -> tuple[int, bool]:
        """The dropped clients leave at ``time``. Returns the change in the jobs the refill owes (the discarded jobs,
        less the drop in the target) and whether that ended the current round."""
        dropped = self.availability.dropped
        doomed = set(dropped)
        flying = {e[2]: e for e in self.heap if e[1] == ARRIVAL and e[2] in doomed}
        position = {c: i for i, c in enumerate(self.pool)}
        pool, discarded = self.pool, set()
        for c in dropped:  # in id order: the order of the released slots and of the pool's swap-removes
            entry = flying.get(c)
            if entry is not None and entry[0] > time:  # its result would arrive after the dropout: discarded
                discarded.add(entry[3])
                self.discarded_slots.append(self.log.job_slot[entry[3]])
            elif c in position:  # idle: leaves the pool
                i = position.pop(c)
                last = pool.pop()
                if i < len(pool):
                    pool[i] = last
                    position[last] = i
        if discarded:
            self.heap[:] = [e for e in self.heap if not (e[1] == ARRIVAL and e[3] in discarded)]
            heapq.heapify(self.heap)
        old_target = self.refill.target(self.live)
        self.live -= len(dropped)
        if self.rounds:
            self.round_left -= len(discarded)
            return 0, bool(discarded) and self.round_left == 0
        return len(discarded) + self.refill.target(self.live) - old_target, False


def _dispatcher(durations: ClientSequences, pool: list[int], free: list[int], choice_rng: np.random.Generator,
                log: EventLog) -> Callable[..., tuple[float, int, int, int]]:
    """``dispatch(time, client=-1, slot=-1)``: starts a job at ``time`` and returns its arrival event.

    With ``client = -1`` the client is drawn uniformly from the idle ``pool`` (a uniform ``u`` of stream 3, drawn in
    blocks, picks index ``int(u * len(pool))``, removed by swapping in the last one) and the slot is the most recently
    released one (``free``) or a new one. The job's duration is the client's next one. (A closure: the loop calls it
    once per job.)
    """
    lists, extend = durations.lists, durations.extend
    job_count = [0] * len(lists)
    job_client, job_slot, job_time = log.job_client, log.job_slot, log.job_time
    uni: list[float] = []
    ui = UB = UNIFORM_BLOCK

    def dispatch(time: float, client: int = -1, slot: int = -1) -> tuple[float, int, int, int]:
        nonlocal uni, ui
        if client < 0:
            if ui == UB:
                uni = choice_rng.random(UB).tolist()
                ui = 0
            size = len(pool)
            i = int(uni[ui] * size)  # < size for doubles u < 1
            ui += 1
            client = pool[i]
            last = pool.pop()
            if i < size - 1:
                pool[i] = last
            if free:
                slot = free.pop()
            else:
                slot = log.num_slots
                log.num_slots = slot + 1
        elif slot >= log.num_slots:
            log.num_slots = slot + 1
        k = job_count[client]
        job_count[client] = k + 1
        lst = lists[client]
        if k >= len(lst):
            lst = extend(client, k)
        job = len(job_client)
        job_client.append(client)
        job_slot.append(slot)
        job_time.append(time)
        return time + lst[k], ARRIVAL, client, job

    return dispatch


def _check_policies(refill: Refill, aggregation: Aggregation) -> None:
    """Refuses combinations that no protocol defines."""
    if isinstance(refill, Rounds) != isinstance(aggregation, AllInFlight):
        raise ValueError(f"Rounds refill goes with AllInFlight aggregation only, got {refill} and {aggregation}")
    if isinstance(refill, Boundary) and not isinstance(aggregation, Count):
        raise ValueError(f"Boundary refill needs Count aggregation, got {aggregation}")
    if not isinstance(refill, (KeepInFlight, Rounds)) or type(refill) is KeepInFlight:
        raise ValueError(f"refill must be Immediate, Boundary or Rounds, got {refill!r}")


def _expected_jobs(n: int, T: int, refill: Refill, aggregation: Aggregation) -> int:
    """About how many jobs a run starts (only sizes the first vectorized block of durations)."""
    if isinstance(refill, Rounds):
        return T * (n if refill.participants is None else refill.participants)
    per_step = aggregation.size if isinstance(aggregation, Count) else 1
    return T * per_step + refill.concurrency


def simulate_events(n: int, T: int, table: JobDurations, seed: int, refill: Refill, aggregation: Aggregation,
                    availability: Availability = Availability()) -> EventLog:
    """Runs the event loop for ``T`` server steps of ``n`` clients (arguments already validated)."""
    return _EventLoop(n, T, table, seed, refill, aggregation, availability).run()


# ---------------------------------------------------------------------- from the log to a Schedule
def pad_rows(counts: np.ndarray, values: list[np.ndarray], width: int, fills: list[Any],
             dtypes: list[Any]) -> list[np.ndarray]:
    """Scatters flat per-entry values, ``counts[t]`` of them for row ``t`` in order, into ``[T, width]`` arrays padded
    with ``fills``."""
    full = bool((counts == width).all())
    mask = None if full else np.arange(width) < counts[:, None]  # row-major order is the order of the values
    out = []
    for v, fill, dtype in zip(values, fills, dtypes):
        if full:
            out.append(np.asarray(v, dtype=dtype).reshape(counts.size, width))
            continue
        a = np.full((counts.size, width), fill, dtype=dtype)
        a[mask] = v
        out.append(a)
    return out


def to_schedule(log: EventLog, n: int, aggregation: Aggregation, info: dict[str, Any]) -> Schedule:
    """The :class:`Schedule` of a run. Rows are at least ``size`` wide under :class:`Count` (arrival rows exactly),
    at least 1 otherwise; arrivals are in event order, or in dispatch order (by client id) under
    :class:`AllInFlight`."""
    D0 = log.num_initial
    min_width = aggregation.size if isinstance(aggregation, Count) else 1
    job_client = np.asarray(log.job_client, dtype=np.int64)
    job_slot = np.asarray(log.job_slot, dtype=np.int64)
    d_counts = np.diff(np.asarray(log.dispatch_ends, dtype=np.int64), prepend=D0)
    job_version = np.concatenate([np.zeros(D0, dtype=np.int64), np.repeat(np.arange(d_counts.size), d_counts)])
    d_clients, d_slots, d_times = pad_rows(
        d_counts, [job_client[D0:], job_slot[D0:], np.asarray(log.job_time[D0:], dtype=np.float64)],
        int(max(min_width, d_counts.max(initial=0))), [-1, -1, np.nan], [np.int32, np.int32, np.float64])
    a_counts = np.diff(np.asarray(log.arrival_ends, dtype=np.int64), prepend=0)
    aj = np.asarray(log.arrival_job, dtype=np.int64)
    a_times = np.asarray(log.arrival_time, dtype=np.float64)
    if isinstance(aggregation, AllInFlight):  # in dispatch order: a round dispatches its clients by id
        order = np.argsort(aj, kind="stable")
        aj, a_times = aj[order], a_times[order]
    a_clients, a_slots, a_versions, a_times = pad_rows(
        a_counts, [job_client[aj], job_slot[aj], job_version[aj], a_times],
        int(max(min_width, a_counts.max(initial=0))), [-1, -1, -1, np.nan],
        [np.int32, np.int32, np.int32, np.float64])
    return Schedule(
        init_clients=job_client[:D0].astype(np.int32),
        init_slots=job_slot[:D0].astype(np.int32),
        dispatch_clients=d_clients,
        dispatch_slots=d_slots,
        dispatch_times=d_times,
        arrival_clients=a_clients,
        arrival_slots=a_slots,
        arrival_versions=a_versions,
        arrival_times=a_times,
        step_times=np.asarray(log.step_times, dtype=np.float64),
        num_clients=n,
        num_slots=log.num_slots,
        init_time=0.0,
        info=info,
    )
