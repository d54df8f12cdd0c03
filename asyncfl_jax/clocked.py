"""The engine with the in-scan event clock (:mod:`asyncfl_jax.timing.clock`): the next arrival is decided in the scan.

Each server step ``t`` of the scan:

1. handles the events before the next arrival, in time order: the dropout (at most once) and returns from
   suspension; a returning client starts a job from the current model ``x_t`` (dispatch row ``t + 1``);
2. takes the earliest finish time (ties: the lowest client id) as the arrival of step ``t``; trains that job, from the
   model it started from (kept per client) with the key, hyper-parameters and local step count fixed when it was
   dispatched, then applies the algorithm's ``client`` and ``server`` steps (one message), giving ``x_{t+1}``;
3. re-dispatches the arriving client at the arrival time from ``x_{t+1}`` (row ``t + 2``), unless it is suspended
   (it will return later) or has left; the job's duration follows its local step count (``algorithm.job_steps``).

A job's result depends only on its start model, client, key, hyper-parameters and step count, so training it when it
arrives gives what training it at dispatch gives (the pre-sampled engine does the latter). Job keys are those of the
pre-sampled engine: ``fold_in(fold_in(key, row), col)`` for the job at position ``col`` of dispatch row ``row`` (row 0:
the initial jobs, one per client, ``col`` = client id), so with state-independent durations a clocked run and a
pre-sampled ``all_active`` run train the same jobs.

Times are double-float pairs (see :mod:`asyncfl_jax.timing.clock`); every step records a :class:`StepRecord` so that
the host can rebuild the realized schedule.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import Algorithm, ServerMeta
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import SERVER_STREAM, Program, build_program, keep_if_diverged, with_evaluation
from asyncfl_jax.task import Task, TaskArrays
from asyncfl_jax.timing.clock import ClockTables

TRACE_NAMES = ("client", "row", "col", "steps", "start_hi", "start_lo", "arrival_hi", "arrival_lo")


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


NEVER = (jnp.inf, 0.0)


# ---------------------------------------------------------------------------------------------------- the carry
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
    x_start: jax.Array  # [n, d] the model each client's job in flight started from
    job_hp: Any  # hyper-parameters of each client's job in flight ([n] per name)
    discarded_row: jax.Array  # int32 [n] the job discarded at the dropout (-1: none)
    discarded_col: jax.Array
    discarded_start: Time


class ClockedCarry(NamedTuple):
    server: Any
    clients: Any
    clock: ClockState
    diverged_at: jax.Array


class ClockChunk(NamedTuple):
    """The inputs of one chunk: its server steps (int32 [E]) and the per-replica :class:`ClockTables`."""

    steps: jax.Array
    tables: ClockTables


def build_clocked_program(task: Task, algorithm: Algorithm, local: LocalConfig, job_sharding: Any = None) -> Program:
    """The pure pieces of a clocked run (a :class:`~asyncfl_jax.engine.Program`, not vmapped; see the module
    docstring). ``init(tables, hp, key, data)`` takes the tables of the initial jobs (``W >= 1``); ``advance(carry,
    ClockChunk, hp, key, data)`` returns the carry and, per step, the trace (:data:`TRACE_NAMES`, each [E]);
    ``chunk`` adds the evaluation metrics."""
    base = build_program(task, algorithm, local, num_slots=1, job_sharding=job_sharding)
    n = task.num_clients
    nominal = float(local.steps)

    def job_plan(server: Any, clients: jax.Array, hp) -> tuple[Any, jax.Array]:
        """Hyper-parameters and local step counts of jobs dispatched now to ``clients``."""
        job_hp = base.job_hparams(server, hp)
        if algorithm.job_steps is None:
            return job_hp, jnp.full(clients.shape, local.steps, jnp.int32)
        return job_hp, algorithm.job_steps(server, clients, hp).astype(jnp.int32)

    def duration(tables: ClockTables, clock: ClockState, i: jax.Array, steps: jax.Array) -> Time:
        """``comm + (K / local.steps) * compute`` of client i's next job (the table's duration when K = local.steps)."""
        w = clock.jobs[i] - tables.base_jobs[i]
        full = Time(tables.full_hi[i, w], tables.full_lo[i, w])
        work = steps.astype(jnp.float32) / nominal
        scaled = time_add(Time(work * tables.compute_hi[i, w], work * tables.compute_lo[i, w]),
                          Time(tables.comm_hi, tables.comm_lo))
        same = steps == local.steps
        return Time(jnp.where(same, full.hi, scaled.hi), jnp.where(same, full.lo, scaled.lo))

    def dispatch(clock: ClockState, server: Any, hp, tables: ClockTables, i: jax.Array, when: Time, row: jax.Array,
                 col: jax.Array, x: jax.Array, do: jax.Array) -> ClockState:
        """Client ``i`` starts a job at ``when`` from ``x`` (only where ``do``)."""
        job_hp, steps = job_plan(server, i[None], hp)
        steps = steps[0]
        finish = time_add(when, duration(tables, clock, i, steps))

        def put(a, v):
            return a.at[i].set(jnp.where(do, v, a[i]))

        return clock._replace(
            finish=_set(clock.finish, i, finish, do),
            start=_set(clock.start, i, when, do),
            row=put(clock.row, row), col=put(clock.col, col), steps=put(clock.steps, steps),
            jobs=put(clock.jobs, clock.jobs[i] + 1),
            x_start=clock.x_start.at[i].set(jnp.where(do, x, clock.x_start[i])),
            job_hp=jax.tree_util.tree_map(lambda a, v: put(a, v), clock.job_hp, job_hp),
        )

    def init(tables: ClockTables, hp, key: jax.Array, data: TaskArrays) -> ClockedCarry:
        x0 = data.x0
        carry = ClockedCarry(server=algorithm.init(x0, n), clients=algorithm.init_clients(x0, n), clock=None,
                             diverged_at=jnp.int32(-1))
        if algorithm.init_round:
            carry = base.initialization_round(carry, hp, key, data)
            x0 = algorithm.params(carry.server)  # the run's x_0
        clients = jnp.arange(n, dtype=jnp.int32)
        job_hp, steps = job_plan(carry.server, clients, hp)
        zeros = jnp.zeros((n,), jnp.float32)
        full = Time(jnp.full((n,), jnp.inf, jnp.float32), zeros)
        clock = ClockState(
            finish=full, returns=full, start=Time(zeros, zeros), row=jnp.zeros((n,), jnp.int32), col=clients,
            steps=steps, jobs=jnp.zeros((n,), jnp.int32), uploads=jnp.zeros((n,), jnp.int32),
            row_count=jnp.int32(0), dropout_done=jnp.bool_(False), x_start=jnp.broadcast_to(x0, (n, *x0.shape)),
            job_hp=jax.tree_util.tree_map(lambda v: jnp.broadcast_to(jnp.asarray(v, jnp.float32), (n,)), job_hp),
            discarded_row=jnp.full((n,), -1, jnp.int32), discarded_col=jnp.full((n,), -1, jnp.int32),
            discarded_start=Time(zeros, zeros),
        )
        # Every client starts its first job at time 0 from x_0 (row 0, column = client id).
        first = jax.vmap(lambda i, k: duration(tables, clock, i, k))(clients, steps)
        clock = clock._replace(finish=time_add(Time(zeros, zeros), first), jobs=jnp.ones((n,), jnp.int32))
        return carry._replace(clock=clock)

    def next_other_event(clock: ClockState, tables: ClockTables) -> tuple[jax.Array, jax.Array, Time]:
        """The earliest event that is not an arrival: (is it the dropout, the returning client, its time)."""
        i, back = earliest(clock.returns)
        dropout = Time(tables.dropout_hi, tables.dropout_lo)
        is_dropout = ~clock.dropout_done & jnp.isfinite(dropout.hi) & ~time_before(back, dropout)
        when = Time(jnp.where(is_dropout, dropout.hi, back.hi), jnp.where(is_dropout, dropout.lo, back.lo))
        return is_dropout, i, when

    def apply_dropout(clock: ClockState, tables: ClockTables) -> ClockState:
        """Dropped clients leave: a job that would finish after the dropout is discarded; no suspension ends."""
        dropout = Time(tables.dropout_hi, tables.dropout_lo)
        lost = tables.dropped & jnp.isfinite(clock.finish.hi) & time_before(dropout, clock.finish)
        inf = jnp.full_like(clock.finish.hi, jnp.inf)
        zero = jnp.zeros_like(clock.finish.lo)
        return clock._replace(
            finish=Time(jnp.where(lost, inf, clock.finish.hi), jnp.where(lost, zero, clock.finish.lo)),
            returns=Time(jnp.where(tables.dropped, inf, clock.returns.hi),
                         jnp.where(tables.dropped, zero, clock.returns.lo)),
            discarded_row=jnp.where(lost, clock.row, clock.discarded_row),
            discarded_col=jnp.where(lost, clock.col, clock.discarded_col),
            discarded_start=Time(jnp.where(lost, clock.start.hi, clock.discarded_start.hi),
                                 jnp.where(lost, clock.start.lo, clock.discarded_start.lo)),
            dropout_done=jnp.bool_(True),
        )

    def before_arrival(carry: ClockedCarry, t: jax.Array, tables: ClockTables, hp) -> ClockedCarry:
        """Handles the dropout and the returns that come before the next arrival (returns at the arrival's time
        come after it)."""

        def pending(c: ClockedCarry) -> jax.Array:
            is_dropout, _, when = next_other_event(c.clock, tables)
            _, arrival = earliest(c.clock.finish)
            first = jnp.where(is_dropout, ~time_before(arrival, when), time_before(when, arrival))
            return first & jnp.isfinite(when.hi)

        def handle(c: ClockedCarry) -> ClockedCarry:
            is_dropout, i, when = next_other_event(c.clock, tables)
            clock = c.clock
            back = ~is_dropout
            after_return = clock._replace(returns=_set(clock.returns, i, Time(*NEVER), back),
                                          row_count=clock.row_count + back.astype(jnp.int32))
            after_return = dispatch(after_return, c.server, hp, tables, i, when, t + 1, clock.row_count,
                                    algorithm.params(c.server), back)
            dropped = apply_dropout(clock, tables)
            clock = jax.tree_util.tree_map(lambda d, r: jnp.where(is_dropout, d, r), dropped, after_return)
            return c._replace(clock=clock)

        return jax.lax.while_loop(pending, handle, carry)

    def step(carry: ClockedCarry, t: jax.Array, tables: ClockTables, hp, key: jax.Array, data: TaskArrays):
        carry = before_arrival(carry, t, tables, hp)  # 1.
        clock = carry.clock
        i, arrival = earliest(clock.finish)  # 2. the arrival of step t
        row, col, steps = clock.row[i], clock.col[i], clock.steps[i]
        job_key = jax.random.fold_in(jax.random.fold_in(key, row), col)
        job_hp = jax.tree_util.tree_map(lambda a: a[i], clock.job_hp)
        messages, memory = base.train(clock.x_start[i], i[None], jnp.ones((1,), bool), job_key[None], carry, hp,
                                      data, job_hp=job_hp, steps=steps[None])
        version = jnp.maximum(row - 1, 0)
        meta = ServerMeta(clients=i[None].astype(jnp.int32), mask=jnp.ones((1,), bool),
                          staleness=(t - version)[None].astype(jnp.int32), step=t, time=arrival.hi,
                          key=jax.random.fold_in(jax.random.fold_in(key, t + 1), SERVER_STREAM))
        server = algorithm.server(carry.server, messages, meta, hp)
        finite = jnp.all(jnp.isfinite(algorithm.params(server)))
        diverged_at = jnp.where((carry.diverged_at < 0) & ~finite, t, carry.diverged_at)
        # 3. the arriving client leaves, is suspended, or starts its next job from x_{t+1}.
        upload = clock.uploads[i]
        dropout = Time(tables.dropout_hi, tables.dropout_lo)
        gone = tables.dropped[i] & ~time_before(arrival, dropout)
        w = upload - tables.base_uploads[i]
        pause = Time(tables.suspension_hi[i, w], tables.suspension_lo[i, w])
        suspended = ~gone & ~jnp.isnan(pause.hi)
        again = ~gone & ~suspended
        clock = clock._replace(
            uploads=clock.uploads.at[i].set(upload + 1),
            finish=_set(clock.finish, i, Time(*NEVER), jnp.bool_(True)),
            returns=_set(clock.returns, i, time_add(arrival, pause), suspended),
            row_count=again.astype(jnp.int32),
        )
        clock = dispatch(clock, server, hp, tables, i, arrival, t + 2, jnp.int32(0), algorithm.params(server), again)
        record = (i.astype(jnp.int32), row, col, steps, _at(carry.clock.start, i), arrival)
        return ClockedCarry(server=server, clients=memory, clock=clock, diverged_at=diverged_at), record

    def advance(carry: ClockedCarry, chunk: ClockChunk, hp, key: jax.Array, data: TaskArrays):
        def body(c, t):
            c, (client, row, col, steps, start, arrival) = step(c, t, chunk.tables, hp, key, data)
            return c, (client, row, col, steps, start.hi, start.lo, arrival.hi, arrival.lo)

        carry, trace = jax.lax.scan(body, carry, chunk.steps)
        return carry, dict(zip(TRACE_NAMES, trace))

    def frozen_advance(carry: ClockedCarry, part: ClockChunk, hp, key: jax.Array, data: TaskArrays):
        """``advance``, except that a replica that diverged earlier keeps its state (its records say client -1)."""
        new, trace = advance(carry, part, hp, key, data)
        return keep_if_diverged(carry, new), {**trace, "client": jnp.where(carry.diverged_at >= 0, -1, trace["client"])}

    return with_evaluation(Program(init=init, advance=advance, frozen_advance=frozen_advance,
                                   evaluate=base.evaluate), algorithm)
