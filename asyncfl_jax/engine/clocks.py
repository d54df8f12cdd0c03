"""Clocks: which jobs start and which results arrive at each server step.

A clock has the pure functions the step body calls (none has a replica axis):

* ``initial_jobs(carry, inputs, plan, start)``: the jobs that start from ``x_0`` before step 0;
* ``dispatch(carry, step_inputs, plan, start)``: the jobs that start from ``x_t`` during step ``t``;
* ``arrivals(carry, step_inputs) -> (carry, Arrivals)``: the results that arrive at step ``t``;

where ``plan(clients) -> (hp, steps)`` gives the hyper-parameters and local step counts of jobs started now, and
``start(carry, jobs)`` hands the jobs to the store. ``steps_of(chunk)`` / ``at(chunk, x)`` split a chunk's inputs into
the per-step values the scan runs over; ``freeze_record`` marks the records of a frozen (diverged) replica.

* :class:`PresampledClock` reads row ``t`` of a pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule`.
* :class:`InScanClock` decides the next arrival inside the scan (:class:`~asyncfl_jax.timing.clock.EventClock`): every
  client has one job in flight (or is suspended, or has left); each step applies the earliest finish (ties: the lowest
  client id). Step ``t`` first starts the jobs that begin at ``x_t``: the client that arrived at step ``t - 1`` (sent
  ``x_t`` at its arrival time, unless it was suspended or has left), then, in time order, the dropout (at most once)
  and the clients returning from suspension before the next arrival. A job of ``K`` local steps takes
  ``comm + (K / local.steps) * compute`` (the algorithm's ``JobPolicy.steps``), so durations may depend on the training state.
  The job at position ``col`` of dispatch row ``row`` uses the pre-sampled engine's key (row 0: the initial jobs,
  column = client id), so with state-independent durations a clocked run and a pre-sampled ``all_active`` run train
  the same jobs. Times are double-float pairs (see :mod:`asyncfl_jax.timing.clock`); each step records a trace
  (:data:`TRACE_NAMES`) from which the host rebuilds the realized schedule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.engine.inputs import ScheduleArrays, StepArrays
from asyncfl_jax.engine.jobs import INIT_BATCH, Arrivals, Jobs, in_groups
from asyncfl_jax.timing.clock import ClockTables

TRACE_NAMES = ("client", "row", "col", "steps", "start_hi", "start_lo", "arrival_hi", "arrival_lo")

Plan = Callable[[jax.Array], tuple[Any, jax.Array]]
Start = Callable[[Any, Jobs], Any]


# ---------------------------------------------------------------------------------------------------- pre-sampled
@dataclasses.dataclass(frozen=True)
class PresampledClock:
    """Reads the schedule: step ``t``'s dispatch row (jobs from ``x_t``, dispatch row ``t + 1``) and arrivals."""

    init_batch: int = INIT_BATCH

    def dispatch_width(self, sched: ScheduleArrays) -> int:
        return int(sched.steps.dispatch_clients.shape[-1])

    def initial_jobs(self, carry: Any, sched: ScheduleArrays, plan: Plan, start: Start) -> Any:
        """The schedule's initial jobs (dispatch row 0), started in groups of ``init_batch``."""

        def group(c: Any, rows: tuple[jax.Array, ...]) -> tuple[Any, None]:
            index, clients, slots = rows
            hp, steps = plan(jnp.where(clients >= 0, clients, 0))
            return start(c, Jobs(clients, slots, jnp.int32(0), index, hp, steps)), None

        rows = (jnp.arange(sched.init_clients.shape[0], dtype=jnp.int32), sched.init_clients, sched.init_slots)
        return in_groups(group, carry, rows, fills=(0, -1, -1), size=self.init_batch)[0]

    def dispatch(self, carry: Any, s: StepArrays, plan: Plan, start: Start) -> Any:
        hp, steps = plan(jnp.where(s.dispatch_clients >= 0, s.dispatch_clients, 0))
        cols = jnp.arange(s.dispatch_clients.shape[0], dtype=jnp.int32)
        return start(carry, Jobs(s.dispatch_clients, s.dispatch_slots, s.step + 1, cols, hp, steps))

    def arrivals(self, carry: Any, s: StepArrays) -> tuple[Any, Arrivals]:
        return carry, Arrivals(s.arrival_clients, s.arrival_slots, s.staleness, s.step, s.time, record={})

    def steps_of(self, chunk: StepArrays) -> StepArrays:
        return chunk

    def at(self, chunk: StepArrays, s: StepArrays) -> StepArrays:
        del chunk
        return s

    def freeze_record(self, record: Any, frozen: jax.Array) -> Any:
        del frozen
        return record


# ---------------------------------------------------------------------------------------------------- double-floats
class Time(NamedTuple):
    """A virtual time (or an array of them) as ``hi + lo`` float32 (``lo = 0`` where ``hi`` is inf)."""

    hi: jax.Array
    lo: jax.Array


def time_add(a: Time, b: Time) -> Time:
    """``a + b`` in double-float arithmetic (Knuth's two-sum, then renormalization); inf stays inf with ``lo = 0``."""
    s = a.hi + b.hi
    v = s - a.hi
    err = (a.hi - (s - v)) + (b.hi - v) + a.lo + b.lo
    hi = s + err
    lo = err - (hi - s)
    finite = jnp.isfinite(hi)
    return Time(jnp.where(finite, hi, s), jnp.where(finite, lo, 0.0))


def time_before(a: Time, b: Time) -> jax.Array:
    """``a < b`` (lexicographic on (hi, lo))."""
    return (a.hi < b.hi) | ((a.hi == b.hi) & (a.lo < b.lo))


def earliest(times: Time) -> tuple[jax.Array, Time]:
    """Index and value of the smallest time (ties: the lowest index)."""
    smallest_hi = jnp.min(times.hi)
    lo = jnp.where(times.hi == smallest_hi, times.lo, jnp.inf)
    smallest_lo = jnp.min(lo)
    index = jnp.argmax((times.hi == smallest_hi) & (lo == smallest_lo))
    return index, Time(smallest_hi, smallest_lo)


def _at(times: Time, i: jax.Array) -> Time:
    return Time(times.hi[i], times.lo[i])


def _set(times: Time, i: jax.Array, value: Time, where: jax.Array) -> Time:
    return Time(times.hi.at[i].set(jnp.where(where, value.hi, times.hi[i])),
                times.lo.at[i].set(jnp.where(where, value.lo, times.lo[i])))


def _select(where: jax.Array, a: Time, b: Time) -> Time:
    return Time(jnp.where(where, a.hi, b.hi), jnp.where(where, a.lo, b.lo))


NEVER = (jnp.inf, 0.0)


# ---------------------------------------------------------------------------------------------------- in-scan clock
class ClockState(NamedTuple):
    """Per-client event state carried by the scan (arrays [n] unless said)."""

    finish: Time  # finish time of the job in flight (inf: none)
    returns: Time  # return time from a suspension (inf: not suspended)
    start: Time  # start time of the job in flight
    row: jax.Array  # int32 dispatch row of the job in flight (its key's row; version = max(row - 1, 0))
    col: jax.Array  # int32 its position in that row
    steps: jax.Array  # int32 its local step count
    jobs: jax.Array  # int32 jobs started so far
    uploads: jax.Array  # int32 results applied so far
    row_count: jax.Array  # int32 scalar: jobs started so far in the current dispatch row
    dropout_done: jax.Array  # bool scalar
    discarded_row: jax.Array  # int32 [n] the job discarded at the dropout (-1: none)
    discarded_col: jax.Array
    discarded_start: Time
    restart: jax.Array  # int32 scalar: the client that arrived at the last step and starts again now (-1: none)
    restart_at: Time  # scalar: that arrival's time


class ClockStep(NamedTuple):
    """The inputs of one clocked step: its index and the chunk's per-replica :class:`ClockTables`."""

    t: jax.Array
    tables: ClockTables


class ClockChunk(NamedTuple):
    """The inputs of one chunk: its server steps (int32 [E]) and the per-replica :class:`ClockTables`."""

    steps: jax.Array
    tables: ClockTables


@dataclasses.dataclass(frozen=True)
class InScanClock:
    """The in-scan event clock (see the module docstring) for ``num_clients`` clients of ``local_steps`` steps."""

    num_clients: int
    local_steps: int

    def dispatch_width(self, tables: ClockTables) -> int:
        del tables
        return 1

    def duration(self, tables: ClockTables, clock: ClockState, i: jax.Array, steps: jax.Array) -> Time:
        """``comm + (K / local.steps) * compute`` of client i's next job (the table's duration when K = local.steps)."""
        w = clock.jobs[i] - tables.base_jobs[i]
        full = Time(tables.full_hi[i, w], tables.full_lo[i, w])
        work = steps.astype(jnp.float32) / float(self.local_steps)
        scaled = time_add(Time(work * tables.compute_hi[i, w], work * tables.compute_lo[i, w]),
                          Time(tables.comm_hi, tables.comm_lo))
        return _select(steps == self.local_steps, full, scaled)

    def initial_jobs(self, carry: Any, tables: ClockTables, plan: Plan, start: Start) -> Any:
        """Every client starts its first job at time 0 from ``x_0`` (dispatch row 0, column = client id)."""
        n = self.num_clients
        clients = jnp.arange(n, dtype=jnp.int32)
        hp, steps = plan(clients)
        zeros = jnp.zeros((n,), jnp.float32)
        never = Time(jnp.full((n,), jnp.inf, jnp.float32), zeros)
        clock = ClockState(
            finish=never, returns=never, start=Time(zeros, zeros), row=jnp.zeros((n,), jnp.int32), col=clients,
            steps=steps, jobs=jnp.zeros((n,), jnp.int32), uploads=jnp.zeros((n,), jnp.int32),
            row_count=jnp.int32(0), dropout_done=jnp.bool_(False), discarded_row=jnp.full((n,), -1, jnp.int32),
            discarded_col=jnp.full((n,), -1, jnp.int32), discarded_start=Time(zeros, zeros),
            restart=jnp.int32(-1), restart_at=Time(jnp.float32(0.0), jnp.float32(0.0)))
        first = jax.vmap(lambda i, k: self.duration(tables, clock, i, k))(clients, steps)
        clock = clock._replace(finish=time_add(Time(zeros, zeros), first), jobs=jnp.ones((n,), jnp.int32))
        return start(carry._replace(clock=clock), Jobs(clients, clients, jnp.int32(0), clients, hp, steps))

    def start_job(self, carry: Any, tables: ClockTables, plan: Plan, start: Start, i: jax.Array, when: Time,
                  row: jax.Array, col: jax.Array, do: jax.Array) -> Any:
        """Client ``i`` starts a job at ``when`` (only where ``do``): its finish time, and the job to the store."""
        clock = carry.clock
        hp, steps = plan(i[None])
        finish = time_add(when, self.duration(tables, clock, i, steps[0]))

        def put(a: jax.Array, v: jax.Array) -> jax.Array:
            return a.at[i].set(jnp.where(do, v, a[i]))

        clock = clock._replace(finish=_set(clock.finish, i, finish, do), start=_set(clock.start, i, when, do),
                               row=put(clock.row, row), col=put(clock.col, col), steps=put(clock.steps, steps[0]),
                               jobs=put(clock.jobs, clock.jobs[i] + 1))
        jobs = Jobs(jnp.where(do, i, -1)[None].astype(jnp.int32), i[None].astype(jnp.int32), row, col[None], hp,
                    steps)
        return start(carry._replace(clock=clock), jobs)

    def dispatch(self, carry: Any, s: ClockStep, plan: Plan, start: Start) -> Any:
        """The last step's arriving client starts again (column 0 of row ``t + 1``), then the dropout and the returns
        that come before the next arrival, in time order (returns at the arrival's time come after it)."""
        clock = carry.clock
        again = clock.restart >= 0
        carry = carry._replace(clock=clock._replace(row_count=again.astype(jnp.int32), restart=jnp.int32(-1)))
        carry = self.start_job(carry, s.tables, plan, start, jnp.maximum(clock.restart, 0), clock.restart_at,
                               s.t + 1, jnp.int32(0), again)

        def pending(c: Any) -> jax.Array:
            is_dropout, _, when = self.next_other_event(c.clock, s.tables)
            _, arrival = earliest(c.clock.finish)
            first = jnp.where(is_dropout, ~time_before(arrival, when), time_before(when, arrival))
            return first & jnp.isfinite(when.hi)

        def handle(c: Any) -> Any:
            is_dropout, i, when = self.next_other_event(c.clock, s.tables)
            back = ~is_dropout
            clock = c.clock
            returned = clock._replace(returns=_set(clock.returns, i, Time(*NEVER), back),
                                      row_count=clock.row_count + back.astype(jnp.int32))
            c = self.start_job(c._replace(clock=returned), s.tables, plan, start, i, when, s.t + 1, clock.row_count,
                               back)
            dropped = self.apply_dropout(clock, s.tables)
            return c._replace(clock=jax.tree_util.tree_map(lambda d, r: jnp.where(is_dropout, d, r), dropped,
                                                           c.clock))

        return jax.lax.while_loop(pending, handle, carry)

    def next_other_event(self, clock: ClockState, tables: ClockTables) -> tuple[jax.Array, jax.Array, Time]:
        """The earliest event that is not an arrival: (is it the dropout, the returning client, its time)."""
        i, back = earliest(clock.returns)
        dropout = Time(tables.dropout_hi, tables.dropout_lo)
        is_dropout = ~clock.dropout_done & jnp.isfinite(dropout.hi) & ~time_before(back, dropout)
        return is_dropout, i, _select(is_dropout, dropout, back)

    def apply_dropout(self, clock: ClockState, tables: ClockTables) -> ClockState:
        """Dropped clients leave: a job that would finish after the dropout is discarded; no suspension ends."""
        dropout = Time(tables.dropout_hi, tables.dropout_lo)
        lost = tables.dropped & jnp.isfinite(clock.finish.hi) & time_before(dropout, clock.finish)
        never = Time(jnp.full_like(clock.finish.hi, jnp.inf), jnp.zeros_like(clock.finish.lo))
        return clock._replace(
            finish=_select(lost, never, clock.finish), returns=_select(tables.dropped, never, clock.returns),
            discarded_row=jnp.where(lost, clock.row, clock.discarded_row),
            discarded_col=jnp.where(lost, clock.col, clock.discarded_col),
            discarded_start=_select(lost, clock.start, clock.discarded_start), dropout_done=jnp.bool_(True))

    def arrivals(self, carry: Any, s: ClockStep) -> tuple[Any, Arrivals]:
        """The earliest finish arrives; its client leaves, is suspended, or starts again at the next step."""
        clock, tables = carry.clock, s.tables
        i, arrival = earliest(clock.finish)
        row, col, steps = clock.row[i], clock.col[i], clock.steps[i]
        upload = clock.uploads[i]
        gone = tables.dropped[i] & ~time_before(arrival, Time(tables.dropout_hi, tables.dropout_lo))
        w = upload - tables.base_uploads[i]
        pause = Time(tables.suspension_hi[i, w], tables.suspension_lo[i, w])
        suspended = ~gone & ~jnp.isnan(pause.hi)
        again = ~gone & ~suspended
        record = (i.astype(jnp.int32), row, col, steps, *_at(clock.start, i), *arrival)
        clock = clock._replace(
            uploads=clock.uploads.at[i].set(upload + 1),
            finish=_set(clock.finish, i, Time(*NEVER), jnp.bool_(True)),
            returns=_set(clock.returns, i, time_add(arrival, pause), suspended),
            restart=jnp.where(again, i, -1).astype(jnp.int32), restart_at=arrival)
        version = jnp.maximum(row - 1, 0)
        client = i[None].astype(jnp.int32)
        arrivals = Arrivals(client, client, (s.t - version)[None].astype(jnp.int32), s.t, arrival.hi,
                            record=dict(zip(TRACE_NAMES, record)))
        return carry._replace(clock=clock), arrivals

    def steps_of(self, chunk: ClockChunk) -> jax.Array:
        return chunk.steps

    def at(self, chunk: ClockChunk, t: jax.Array) -> ClockStep:
        return ClockStep(t, chunk.tables)

    def freeze_record(self, record: dict, frozen: jax.Array) -> dict:
        """A frozen replica's records say client -1 (its realized schedule stops there)."""
        return {**record, "client": jnp.where(frozen, -1, record["client"])}
