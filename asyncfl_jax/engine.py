"""The simulation engine: one compiled ``lax.scan`` over a pre-sampled schedule, vmapped over replicas.

Each server step ``t`` of the scan does, in order (see :mod:`asyncfl_jax.timing.schedule` for the conventions):

1. *dispatch*: every job that starts from ``x_t`` during step ``t`` is trained now, all of them in one ``vmap``
   (a job's result depends only on its start model, client and key, so it can be computed when it is dispatched);
   the algorithm's ``client`` turns each result into a message, which waits in the job's pending slot;
2. *arrival*: the messages of the clients that arrive at step ``t`` are read from their slots and the algorithm's
   ``server`` folds them into the server state, giving ``x_{t+1}``;
3. *divergence check*: the first step at which ``x`` holds a NaN/inf is recorded. :func:`simulate` freezes a
   replica that has diverged from the end of that chunk on: its state (and so its NaN metrics) no longer changes
   while the other replicas of the vmapped program go on.

The scan runs in chunks of ``eval_every`` steps; after each chunk the global model is evaluated (test accuracy/loss,
train loss). :func:`simulate` drives the chunks from a host loop (progress bar, early stop when every replica has
diverged); :func:`make_simulation` returns the same computation as one pure function that callers can ``jit`` and
``vmap`` themselves.

Randomness: the job that client slot ``j`` starts at step ``t`` uses ``fold_in(fold_in(key, t + 1), j)`` (initial
jobs use ``t + 1 = 0``) and the server's own randomness at step ``t`` (stochastic rounding) uses
``fold_in(fold_in(key, t + 1), SERVER_STREAM)``, so results do not depend on the chunking or on how replicas are
batched.

Initialization round: for algorithms with ``init_round`` (ACE, ACED) every client first computes its result at the
task's ``x0`` (client ``i`` with key ``fold_in(fold_in(key, INIT_ROUND_STREAM), i)``) and the server applies one step
with all n messages. The model it produces is the schedule's ``x_0``: the initial jobs start from it and the History's
step 0 is evaluated on it; the n uploads of the round are counted at step 0. The round takes no virtual time.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import os
import sys
import time
import warnings
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax import checkpoint
from asyncfl_jax.algorithms.base import Algorithm, ServerMeta, after, read_rows
from asyncfl_jax.algorithms.compression import message_bits
from asyncfl_jax.client import LOCAL_HPARAMS, LocalConfig, make_local_update
from asyncfl_jax.results import History, swept_names
from asyncfl_jax.task import Task, TaskArrays, make_evaluator, task_arrays
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.stats import schedule_summary

METRIC_NAMES = ("test_accuracy", "test_loss", "train_loss")
INIT_BATCH = 256  # initial jobs are trained in groups of this many (bounds memory when all n clients start at once)
SERVER_STREAM = 0x7FFFFFFF  # fold_in index of the server's key at each step (job j of a step uses index j)
INIT_ROUND_STREAM = 0x7FFFFFFE  # fold_in index of the initialization round's keys (steps use t + 1 >= 0)


class StepArrays(NamedTuple):
    """The per-step part of a schedule (leading axis: server steps)."""

    step: jax.Array  # int32 [T]
    time: jax.Array  # float32 [T]
    dispatch_clients: jax.Array  # int32 [T, D]
    dispatch_slots: jax.Array  # int32 [T, D]
    arrival_clients: jax.Array  # int32 [T, M]
    arrival_slots: jax.Array  # int32 [T, M]
    staleness: jax.Array  # int32 [T, M]
    plan: Any = ()  # LookaheadPlan with lookahead batching, else ()


class ScheduleArrays(NamedTuple):
    """A :class:`Schedule` as device arrays, in the form the scan consumes (a pytree; may have a replica axis)."""

    init_clients: jax.Array  # int32 [D0] jobs started from x_0 before step 0
    init_slots: jax.Array  # int32 [D0]
    steps: StepArrays


class Carry(NamedTuple):
    """What the scan carries from step to step."""

    server: Any  # the algorithm's server state
    clients: Any  # the algorithm's per-client state (leading client axis)
    pending: Any  # messages of jobs in flight, [S, ...]
    diverged_at: jax.Array  # int32: first server step whose result had a NaN/inf, -1 if none
    deferred: Any = ()  # lookahead batching: the jobs dispatched since the last flush (:class:`DeferredJobs`)


class DeferredJobs(NamedTuple):
    """Jobs dispatched but not trained yet (lookahead batching), one row per server step since the last flush."""

    x: jax.Array  # [L, d] the model x_t each row's jobs start from
    step: jax.Array  # int32 [L] the step t of each row (its jobs' keys are fold_in(fold_in(key, t + 1), j))
    clients: jax.Array  # int32 [L, D] (-1: none)
    slots: jax.Array  # int32 [L, D]
    hp: Any  # the rows' job hyper-parameters ([L] per name)
    steps: Any  # int32 [L, D] local step counts (algorithms with job_steps), else ()


class LookaheadPlan(NamedTuple):
    """Host-computed control of lookahead batching, per server step (shared by every replica)."""

    position: jax.Array  # int32 [T] the buffer row step t's dispatches go to
    flush: jax.Array  # bool [T] train the buffered jobs at step t, before its arrivals


class SimulationOutput(NamedTuple):
    """Result of :func:`make_simulation`'s function: final model, evaluations and divergence step."""

    params: jax.Array  # final global model, flat [d]
    metrics: dict[str, jax.Array]  # each [num_evals]: after steps 0, E, 2E, ..., T
    diverged_at: jax.Array  # int32, -1 if the run stayed finite
    carry: Carry


def schedule_arrays(schedule: Schedule, num_slots: int | None = None, init_width: int | None = None) -> ScheduleArrays:
    """Converts a schedule to the arrays the scan reads; pads the initial jobs to ``init_width`` if given."""
    d0 = schedule.init_clients.shape[0] if init_width is None else init_width
    init_clients = np.full((d0,), -1, np.int32)
    init_slots = np.full((d0,), -1, np.int32)
    init_clients[: schedule.init_clients.shape[0]] = schedule.init_clients
    init_slots[: schedule.init_slots.shape[0]] = schedule.init_slots
    staleness = schedule.staleness
    steps = StepArrays(
        step=jnp.arange(schedule.num_steps, dtype=jnp.int32),
        time=jnp.asarray(schedule.step_times, jnp.float32),
        dispatch_clients=jnp.asarray(schedule.dispatch_clients, jnp.int32),
        dispatch_slots=jnp.asarray(schedule.dispatch_slots, jnp.int32),
        arrival_clients=jnp.asarray(schedule.arrival_clients, jnp.int32),
        arrival_slots=jnp.asarray(schedule.arrival_slots, jnp.int32),
        staleness=jnp.asarray(np.maximum(staleness, 0), jnp.int32),
    )
    return ScheduleArrays(init_clients=jnp.asarray(init_clients), init_slots=jnp.asarray(init_slots), steps=steps)


def stack_schedules(schedules: Sequence[Schedule]) -> tuple[ScheduleArrays, int]:
    """Stacks per-replica schedules (same T, M, D) on a leading axis; returns the arrays and the slot count."""
    first = schedules[0]
    for i, s in enumerate(schedules):
        if (s.num_steps, s.buffer_width, s.dispatch_width, s.num_clients) != (
            first.num_steps, first.buffer_width, first.dispatch_width, first.num_clients
        ):
            raise ValueError(
                f"schedule {i} has (T, M, D, n) = {(s.num_steps, s.buffer_width, s.dispatch_width, s.num_clients)}, "
                f"schedule 0 has {(first.num_steps, first.buffer_width, first.dispatch_width, first.num_clients)}; "
                "replicas must share shapes"
            )
    d0 = max(s.init_clients.shape[0] for s in schedules)
    arrays = [schedule_arrays(s, init_width=d0) for s in schedules]
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *arrays)
    return stacked, max(s.num_slots for s in schedules)


def lookahead_plan(schedules: Sequence[Schedule], lookahead: int) -> tuple[np.ndarray, np.ndarray]:
    """(position int32 [T], flush bool [T]): the lookahead-batching control, valid for every schedule given.

    Step ``t``'s dispatched jobs go to buffer row ``position[t]``; at a step with ``flush[t]`` the buffer (jobs of
    steps ``t - position[t] .. t``) is trained before the step's arrivals are read. A flush happens at the first step
    at which some buffered job arrives (in any of the schedules), or when the buffer is full (``lookahead`` rows).
    """
    T = schedules[0].num_steps
    first_arrival = np.full(T, np.iinfo(np.int64).max, dtype=np.int64)  # earliest arrival of a job dispatched at t
    for schedule in schedules:
        for job in _job_arrivals(schedule):
            t, arrival = job
            if arrival < first_arrival[t]:
                first_arrival[t] = arrival
    position = np.zeros(T, np.int32)
    flush = np.zeros(T, bool)
    row, earliest = 0, np.iinfo(np.int64).max
    for t in range(T):
        position[t] = row
        earliest = min(earliest, int(first_arrival[t]))
        row += 1
        if earliest <= t or row == lookahead:
            flush[t] = True
            row, earliest = 0, np.iinfo(np.int64).max
    return position, flush


def _lookahead_summary(lookahead: int, flush: Any) -> dict[str, Any]:
    windows = lookahead_windows(np.asarray(flush))
    return {"L": int(lookahead), "num_windows": int(windows.size),
            "mean_window": float(windows.mean()) if windows.size else 0.0,
            "max_window": int(windows.max(initial=0)),
            "window_histogram": [int(c) for c in np.bincount(windows, minlength=lookahead + 1)[1:]]}


def _job_arrivals(schedule: Schedule) -> list[tuple[int, int]]:
    """(dispatch step, arrival step) of every job of the dispatch rows that arrives (replaying the slots)."""
    holder: dict[int, int] = {}
    out = []
    for t in range(schedule.num_steps):
        for c, slot in zip(schedule.dispatch_clients[t].tolist(), schedule.dispatch_slots[t].tolist()):
            if c >= 0:
                holder[slot] = t
        for c, slot in zip(schedule.arrival_clients[t].tolist(), schedule.arrival_slots[t].tolist()):
            if c >= 0 and slot in holder:
                out.append((holder.pop(slot), t))
    return out


def lookahead_windows(flush: np.ndarray) -> np.ndarray:
    """The lengths of the lookahead windows (steps between two flushes) of a plan."""
    ends = np.flatnonzero(flush)
    return np.diff(np.concatenate([[-1], ends])) if ends.size else np.zeros(0, np.int64)


def _slice_steps(steps: StepArrays, start: int, stop: int, replica_axis: bool) -> StepArrays:
    """Steps [start, stop) of the per-step arrays."""
    return jax.tree_util.tree_map(lambda a: a[:, start:stop] if replica_axis else a[start:stop], steps)


# ---------------------------------------------------------------------------------------------------- hyper-parameters
def default_hparams(algorithm: Algorithm) -> dict[str, float]:
    """Every hyper-parameter the run reads (local training + the algorithm's), with its default."""
    return {**LOCAL_HPARAMS, **dict(algorithm.hyperparams)}


def resolve_hparams(algorithm: Algorithm, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults updated with ``overrides``; an unknown name is an error that suggests the closest valid one."""
    known = default_hparams(algorithm)
    for name in overrides or {}:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"hyper-parameter {name!r} is not used by {algorithm.name} (known: {sorted(known)}){hint}"
            )
    return {**known, **dict(overrides or {})}


@dataclasses.dataclass(frozen=True)
class Replica:
    """One simulated run of a sweep: a training seed and scalar hyper-parameters."""

    seed: int
    hparams: dict[str, float]


def make_replicas(algorithm: Algorithm, seeds: Sequence[int], hparams: Mapping[str, Any] | None = None) -> list[Replica]:
    """The cartesian product of ``seeds`` and every hyper-parameter given as a list (a sweep); scalars are shared.

    Example: ``seeds=[0, 1]``, ``hparams={"client_lr": [0.01, 0.1], "server_lr": 1.0}`` gives 4 replicas.
    """
    if len(seeds) == 0:
        raise ValueError("seeds must not be empty")
    resolved = resolve_hparams(algorithm, hparams)
    swept = {k: list(v) for k, v in resolved.items() if isinstance(v, (list, tuple, np.ndarray))}
    for k, v in swept.items():
        if len(v) == 0:
            raise ValueError(f"hyper-parameter {k!r} has an empty list of values")
    fixed = {k: float(v) for k, v in resolved.items() if k not in swept}
    replicas = []
    for seed in seeds:
        for combo in itertools.product(*swept.values()):
            replicas.append(Replica(seed=int(seed), hparams={**fixed, **{k: float(c) for k, c in zip(swept, combo)}}))
    return replicas


def stack_hparams(replicas: Sequence[Replica]) -> dict[str, jax.Array]:
    return {k: jnp.asarray([r.hparams[k] for r in replicas], jnp.float32) for k in replicas[0].hparams}


# ---------------------------------------------------------------------------------------------------- the compiled step
@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """The pure pieces of one experiment (one task, algorithm and local-training setting), not yet vmapped.

    ``init(sched, hp, key, data) -> Carry`` (``sched``: :class:`ScheduleArrays`); ``advance(carry, steps, hp, key,
    data) -> (Carry, outputs)`` runs a chunk of server steps (``steps``: :class:`StepArrays` of the chunk's steps;
    ``outputs``: per-step records, empty here); ``evaluate(flat, data) -> metrics``; ``chunk`` is ``advance`` then
    ``evaluate`` (its outputs joined to the metrics). ``data`` is the task's :class:`TaskArrays`, an argument so that
    compiled programs do not embed the dataset. None of them has a replica axis. ``frozen_advance`` and
    ``frozen_chunk`` leave a replica marked diverged unchanged (the host loop switches to them once a replica has
    diverged). :func:`simulate` evaluates separately, one replica after the other. ``train``, ``initialization_round`` and
    ``job_hparams`` are the building blocks the in-scan event clock (:mod:`asyncfl_jax.clocked`) reuses.
    """

    init: Callable[..., Carry]
    advance: Callable[..., tuple[Carry, dict[str, jax.Array]]]
    evaluate: Callable[[jax.Array, TaskArrays], dict[str, jax.Array]]
    frozen_advance: Callable[..., tuple[Carry, dict[str, jax.Array]]]
    chunk: Callable[..., tuple[Carry, dict[str, jax.Array]]] | None = None
    frozen_chunk: Callable[..., tuple[Carry, dict[str, jax.Array]]] | None = None
    train: Callable[..., tuple[Any, Any]] | None = None
    initialization_round: Callable[..., Any] | None = None
    job_hparams: Callable[..., Any] | None = None


def local_update(task: Task, algorithm: Algorithm, local: LocalConfig) -> Callable[..., jax.Array]:
    """The local-training function of ``algorithm``'s jobs (with a per-job step count when it sets ``job_steps``)."""
    if algorithm.job_steps is None:
        return make_local_update(task.model, local, output=algorithm.local_output)
    if algorithm.max_job_steps is None:
        raise ValueError(f"{algorithm.name} sets job_steps but not max_job_steps")
    return make_local_update(task.model, local, output=algorithm.local_output, max_steps=algorithm.max_job_steps)


def build_program(
    task: Task, algorithm: Algorithm, local: LocalConfig, num_slots: int, job_sharding: Any = None,
    lookahead: int = 1,
) -> Program:
    """Builds the per-replica ``init`` and ``chunk`` functions (pure; vmappable over replicas).

    ``job_sharding`` (a ``jax.sharding.Sharding`` of a 1-D array, optional) spreads the jobs trained together at a
    step over devices; everything else stays replicated. Results equal the unsharded program up to float rounding.

    ``lookahead = L > 1`` turns on lookahead batching: a step's dispatched jobs are not trained at once but recorded
    (with the model they start from) in a buffer of ``L`` rows, and the filled rows are trained in one vmapped call
    at the steps the schedule's :class:`LookaheadPlan` marks (before any buffered job is needed, or when the buffer is
    full). The steps' ``plan`` must then be given (:func:`lookahead_plan`).
    """
    n = task.num_clients
    local_fn = local_update(task, algorithm, local)
    evaluate = make_evaluator(task.model)

    def job_hparams(server: Any, hp):
        """The hyper-parameters of jobs dispatched now (the algorithm may set them from its state)."""
        return hp if algorithm.local_hparams is None else algorithm.local_hparams(server, hp)

    def train(x: jax.Array, clients: jax.Array, valid: jax.Array, keys: jax.Array, carry: Carry, hp,
              data: TaskArrays, job_hp=None, steps: jax.Array | None = None):
        """Trains the jobs of ``clients`` (only ``valid`` ones count) from ``x``: their messages and the clients'
        memory after them. ``job_hp`` and ``steps`` (the jobs' hyper-parameters and local step counts) default to what
        the server state says now (:func:`job_hparams`, ``algorithm.job_steps``)."""
        if job_sharding is not None:
            clients = jax.lax.with_sharding_constraint(clients, job_sharding)
            keys = jax.lax.with_sharding_constraint(keys, job_sharding)
        hp = job_hparams(carry.server, hp) if job_hp is None else job_hp
        if algorithm.job_steps is not None and steps is None:  # local steps per job, set by the server (AsyncFedED)
            steps = algorithm.job_steps(carry.server, clients, hp)
        results = local_results(x, clients, keys, hp, data.train, steps, per_job=False)
        if not jax.tree_util.tree_leaves(carry.clients):  # no client memory: every job is independent
            messages, _ = jax.vmap(algorithm.client, in_axes=(None, 0, None, None))(x, results, carry.clients, hp)
            return messages, carry.clients
        return client_steps_in_order(x, clients, valid, results, carry.clients, hp)

    def local_results(x: jax.Array, clients: jax.Array, keys: jax.Array, hp, train_data, steps, per_job: bool):
        """The jobs' local-training results in one vmapped call. ``x`` and ``hp`` are shared by the jobs, or with
        ``per_job`` have a leading job axis (lookahead: jobs of several steps); ``steps`` (one per job) is read only
        when the algorithm sets ``job_steps``."""
        shared = 0 if per_job else None
        if algorithm.job_steps is None:
            return jax.vmap(local_fn, in_axes=(shared, 0, 0, shared, None))(x, clients, keys, hp, train_data)
        return jax.vmap(local_fn, in_axes=(shared, 0, 0, shared, None, 0))(x, clients, keys, hp, train_data, steps)

    def client_steps_in_order(x: jax.Array, clients: jax.Array, valid: jax.Array, results: jax.Array, memory: Any,
                              hp, per_job: bool = False):
        """Runs ``algorithm.client`` job by job in dispatch order, so that a client dispatched twice at one step
        (possible with immediate refill) reads the memory its first job left. O(d) per job. With ``per_job``, ``x``
        and ``hp`` have a leading job axis (lookahead batching: jobs of several steps)."""

        def one(state, item):
            client, ok, result, x_j, hp_j = item
            # The row is read through a gather and written after it (read_rows, after): with a client index shared
            # by the replicas (one schedule for all), a plain c[client] is a dynamic-slice, and XLA:CPU then copied
            # the whole n x d memory at every job rather than write the row in place (AREA ran at half speed).
            row = jax.tree_util.tree_map(lambda c: read_rows(c, client[None])[0], state)
            message, new_row = algorithm.client(x_j, result, row, hp_j)
            new_row = jax.tree_util.tree_map(lambda new, old: after(jnp.where(ok, new, old), old), new_row, row)
            state = jax.tree_util.tree_map(lambda c, r: c.at[client].set(r), state, new_row)
            return state, message

        if per_job:
            memory, messages = jax.lax.scan(one, memory, (clients, valid, results, x, hp))
        else:
            memory, messages = jax.lax.scan(lambda st, it: one(st, (*it, x, hp)), memory, (clients, valid, results))
        return messages, memory

    def run_jobs(x: jax.Array, clients: jax.Array, slots: jax.Array, keys: jax.Array, carry: Carry, hp,
                 data: TaskArrays) -> Carry:
        """Trains the jobs ``clients`` (-1 = none) from ``x`` and stores their messages in ``slots``."""
        valid = clients >= 0
        messages, memory = train(x, jnp.where(valid, clients, 0), valid, keys, carry, hp, data)
        slot_idx = jnp.where(valid, slots, num_slots)  # out of range -> dropped
        pending = jax.tree_util.tree_map(lambda p, m: p.at[slot_idx].set(m, mode="drop"), carry.pending, messages)
        return carry._replace(pending=pending, clients=memory)

    def job_keys(key: jax.Array, step_plus_one: jax.Array, jobs: jax.Array) -> jax.Array:
        """``fold_in(fold_in(key, t + 1), j)`` for the jobs ``j`` of a dispatch row (row 0: the initial jobs)."""
        base = jax.random.fold_in(key, step_plus_one)
        return jax.vmap(lambda j: jax.random.fold_in(base, j))(jobs)

    def server_key(key: jax.Array, step_plus_one: jax.Array) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(key, step_plus_one), SERVER_STREAM)

    def initialization_round(carry: Carry, hp, key: jax.Array, data: TaskArrays) -> Carry:
        """Every client computes its result at ``x0`` and the server applies one step with all n messages.

        The clients are trained in groups of ``INIT_BATCH``. With ``algorithm.init_round_in_groups`` each group's
        messages go to the server at once (``server_lr = 0`` but for the last group), so no n x d buffer of messages
        exists; else the n messages are gathered and the server takes them in one call."""
        base = jax.random.fold_in(key, INIT_ROUND_STREAM)
        server_key = jax.random.fold_in(base, SERVER_STREAM)

        def train_group(c: Carry, ids: jax.Array):  # ids >= n: padding of the last group
            valid = ids < n
            clients = jnp.where(valid, ids, 0)
            keys = jax.vmap(lambda j: jax.random.fold_in(base, j))(clients)
            messages, memory = train(data.x0, clients, valid, keys, c, hp, data)
            return messages, memory, clients, valid

        def meta(clients: jax.Array, valid: jax.Array, key: jax.Array) -> ServerMeta:
            return ServerMeta(clients=clients, mask=valid, staleness=jnp.zeros(clients.shape, jnp.int32),
                              step=jnp.int32(-1), time=jnp.float32(0.0), key=key)

        ids = (jnp.arange(n, dtype=jnp.int32),)
        if algorithm.init_round_in_groups:
            def absorb(c: Carry, group):
                (group_ids,) = group
                messages, memory, clients, valid = train_group(c, group_ids)
                last = group_ids[-1] >= n - 1  # the last group steps; the others only fill the server's memory
                group_hp = {**hp, "server_lr": jnp.where(last, hp["server_lr"], 0.0)}
                key_g = jnp.where(group_ids[0] == 0, server_key, jax.random.fold_in(server_key, group_ids[0]))
                server = algorithm.server(c.server, messages, meta(clients, valid, key_g), group_hp)
                return c._replace(server=server, clients=memory), None

            return _in_groups(absorb, carry, ids, fills=(n,))[0]

        def group(c: Carry, job):
            messages, memory, _, _ = train_group(c, job[0])
            return c._replace(clients=memory), messages

        carry, messages = _in_groups(group, carry, ids, fills=(n,))
        messages = jax.tree_util.tree_map(lambda m: m[:n], messages)
        return carry._replace(server=algorithm.server(carry.server, messages, meta(ids[0], jnp.ones((n,), bool),
                                                                                     server_key), hp))

    def init(sched: ScheduleArrays, hp, key: jax.Array, data: TaskArrays) -> Carry:
        x0 = data.x0
        server = algorithm.init(x0, n)
        clients = algorithm.init_clients(x0, n)
        message_shape = jax.eval_shape(
            lambda: algorithm.client(x0, jnp.zeros_like(x0), jax.tree_util.tree_map(lambda c: c[0], clients), hp)[0]
        )
        pending = jax.tree_util.tree_map(lambda s: jnp.zeros((num_slots, *s.shape), s.dtype), message_shape)
        carry = Carry(server=server, clients=clients, pending=pending, diverged_at=jnp.int32(-1))
        if lookahead > 1:
            carry = carry._replace(deferred=empty_buffer(server, x0, hp, int(sched.steps.dispatch_clients.shape[-1])))
        if algorithm.init_round:
            carry = initialization_round(carry, hp, key, data)
            x0 = algorithm.params(carry.server)  # the schedule's x_0
        d0 = int(sched.init_clients.shape[0])

        def group(c, job):  # initial jobs, all from x_0, in bounded groups
            index, clients, slots = job
            keys = job_keys(key, jnp.int32(0), index)
            return run_jobs(x0, clients, slots, keys, c, hp, data), None

        jobs = (jnp.arange(d0, dtype=jnp.int32), sched.init_clients, sched.init_slots)
        carry, _ = _in_groups(group, carry, jobs, fills=(0, -1, -1))
        return carry

    def empty_buffer(server: Any, x0: jax.Array, hp, width: int) -> DeferredJobs:
        job_hp = job_hparams(server, hp)
        return DeferredJobs(
            x=jnp.zeros((lookahead, *x0.shape), x0.dtype), step=jnp.zeros((lookahead,), jnp.int32),
            clients=jnp.full((lookahead, width), -1, jnp.int32), slots=jnp.full((lookahead, width), -1, jnp.int32),
            hp=jax.tree_util.tree_map(lambda v: jnp.zeros((lookahead,), jnp.asarray(v).dtype), job_hp),
            steps=jnp.zeros((lookahead, width), jnp.int32) if algorithm.job_steps is not None else (),
        )

    def defer(carry: Carry, s: StepArrays, hp) -> Carry:
        """Records step t's dispatches, with x_t and their hyper-parameters, in buffer row ``plan.position``."""
        buf, row = carry.deferred, s.plan.position
        clients = s.dispatch_clients
        job_hp = job_hparams(carry.server, hp)
        buf = buf._replace(
            x=buf.x.at[row].set(algorithm.params(carry.server)), step=buf.step.at[row].set(s.step),
            clients=buf.clients.at[row].set(clients), slots=buf.slots.at[row].set(s.dispatch_slots),
            hp=jax.tree_util.tree_map(lambda b, v: b.at[row].set(v), buf.hp, job_hp),
        )
        if algorithm.job_steps is not None:
            steps = algorithm.job_steps(carry.server, jnp.where(clients >= 0, clients, 0), hp)
            buf = buf._replace(steps=buf.steps.at[row].set(steps))
        return carry._replace(deferred=buf)

    buckets = flush_buckets(lookahead)

    def train_first_rows(x_jobs: jax.Array, clients: jax.Array, keys: jax.Array, hp_jobs, steps, train_data,
                         rows: int, width: int) -> jax.Array:
        """The local results of the jobs of the first ``rows`` buffer rows (``rows x D`` jobs, one vmapped call),
        zero-padded to the whole buffer's ``L x D``."""
        first = rows * width
        head = jax.tree_util.tree_map(lambda a: a[:first], (x_jobs, clients, keys, hp_jobs, steps))
        x_h, clients_h, keys_h, hp_h, steps_h = head
        results = local_results(x_h, clients_h, keys_h, hp_h, train_data, steps_h, per_job=True)
        padding = x_jobs.shape[0] - first
        return jnp.concatenate([results, jnp.zeros((padding, *results.shape[1:]), results.dtype)]) if padding \
            else results

    def flush(carry: Carry, s: StepArrays, key: jax.Array, data: TaskArrays) -> Carry:
        """Trains the buffered jobs, each from its row's model, and empties the buffer; the messages go to the jobs'
        slots. Only the rows filled so far (``0 .. plan.position``) are trained, rounded up to a bucket of
        :func:`flush_buckets` (a ``lax.switch`` over static row counts), so a short window trains few jobs; the
        cheap O(d) parts (client rule, slot writes) run over the whole buffer with the empty rows masked."""
        buf = carry.deferred
        rows, width = buf.clients.shape
        clients = buf.clients.reshape(-1)
        valid = clients >= 0
        clients = jnp.where(valid, clients, 0)
        row_of_job = jnp.repeat(jnp.arange(rows), width)
        x_jobs = buf.x[row_of_job]
        keys = jax.vmap(lambda t, j: jax.random.fold_in(jax.random.fold_in(key, t + 1), j))(
            buf.step[row_of_job], jnp.tile(jnp.arange(width), rows))
        hp_jobs = jax.tree_util.tree_map(lambda v: v[row_of_job], buf.hp)
        steps = buf.steps.reshape(-1) if algorithm.job_steps is not None else jnp.zeros_like(clients)
        if job_sharding is not None:
            clients = jax.lax.with_sharding_constraint(clients, job_sharding)
        bucket = jnp.searchsorted(jnp.asarray(buckets), s.plan.position + 1)  # the first bucket >= filled rows
        branches = [functools.partial(train_first_rows, rows=r, width=width) for r in buckets]
        # Only the training is inside the switch: a switch whose branches write the carry would copy it.
        results = jax.lax.switch(bucket, branches, x_jobs, clients, keys, hp_jobs, steps, data.train)
        if not jax.tree_util.tree_leaves(carry.clients):
            messages, _ = jax.vmap(algorithm.client, in_axes=(0, 0, None, 0))(x_jobs, results, carry.clients, hp_jobs)
            memory = carry.clients
        else:
            messages, memory = client_steps_in_order(x_jobs, clients, valid, results, carry.clients, hp_jobs,
                                                     per_job=True)
        slot_idx = jnp.where(valid, buf.slots.reshape(-1), num_slots)  # out of range -> dropped
        pending = jax.tree_util.tree_map(lambda p, m: p.at[slot_idx].set(m, mode="drop"), carry.pending, messages)
        buf = buf._replace(clients=jnp.full_like(buf.clients, -1))
        return carry._replace(pending=pending, clients=memory, deferred=buf)

    def step(carry: Carry, s: StepArrays, hp, key: jax.Array, data: TaskArrays) -> Carry:
        if lookahead > 1:  # 1. dispatch: record now, train with the buffer when the plan says so
            carry = defer(carry, s, hp)
            carry = jax.lax.cond(s.plan.flush, lambda c: flush(c, s, key, data), lambda c: c, carry)
        else:  # 1. dispatch: train now
            x_t = algorithm.params(carry.server)
            keys = job_keys(key, s.step + 1, jnp.arange(s.dispatch_clients.shape[0]))
            carry = run_jobs(x_t, s.dispatch_clients, s.dispatch_slots, keys, carry, hp, data)
        mask = s.arrival_clients >= 0
        read = jnp.where(mask, s.arrival_slots, 0)
        messages = jax.tree_util.tree_map(lambda p: p[read], carry.pending)  # 2. arrivals
        meta = ServerMeta(clients=s.arrival_clients, mask=mask, staleness=jnp.where(mask, s.staleness, 0),
                          step=s.step, time=s.time, key=server_key(key, s.step + 1))
        server = algorithm.server(carry.server, messages, meta, hp)
        finite = jnp.all(jnp.isfinite(algorithm.params(server)))  # 3. divergence check
        diverged_at = jnp.where((carry.diverged_at < 0) & ~finite, s.step, carry.diverged_at)
        return carry._replace(server=server, diverged_at=diverged_at)

    def advance(carry: Carry, steps: StepArrays, hp, key: jax.Array, data: TaskArrays) -> Carry:
        def body(c, s):
            return step(c, s, hp, key, data), None

        return jax.lax.scan(body, carry, steps)[0]

    def advance_chunk(carry: Carry, steps: StepArrays, hp, key: jax.Array, data: TaskArrays):
        return advance(carry, steps, hp, key, data), {}

    def frozen_advance(carry: Carry, steps: StepArrays, hp, key: jax.Array, data: TaskArrays):
        """``advance``, except that a replica that diverged in an earlier chunk keeps its state unchanged. It keeps the
        old state beside the new one (one copy of the state per chunk), so it is only used once a replica diverged."""
        return keep_if_diverged(carry, advance(carry, steps, hp, key, data)), {}

    return with_evaluation(Program(init=init, advance=advance_chunk, frozen_advance=frozen_advance, evaluate=evaluate,
                                   train=train, initialization_round=initialization_round, job_hparams=job_hparams),
                           algorithm)


def keep_if_diverged(old: Any, new: Any) -> Any:
    """``new``, or ``old`` unchanged for a replica that had already diverged (``old.diverged_at >= 0``): how a
    diverged replica is frozen while the others go on."""
    frozen = old.diverged_at >= 0
    return jax.tree_util.tree_map(lambda o, n: jnp.where(frozen, o, n), old, new)

def flush_buckets(lookahead: int) -> tuple[int, ...]:
    """The buffer sizes a lookahead flush is compiled for: powers of two below ``L``, and ``L``."""
    return tuple(sorted({min(2 ** i, lookahead) for i in range(max(1, lookahead).bit_length() + 1)}))


def _in_groups(fn: Callable[[Any, tuple], tuple[Any, Any]], carry: Any, arrays: tuple[jax.Array, ...],
               fills: tuple[int, ...], size: int | None = None) -> tuple[Any, Any]:
    """``lax.scan`` of ``fn(carry, rows) -> (carry, out)`` over ``arrays`` in groups of ``size`` rows (the last group
    padded with ``fills``), so that ``n`` initial jobs compile to one loop body and never hold more than ``size`` jobs'
    intermediates at once (``size`` defaults to ``INIT_BATCH``). Returns the final carry and the outputs concatenated
    over the (padded) rows."""
    size = INIT_BATCH if size is None else size
    length = int(arrays[0].shape[0])
    if length <= size:
        return fn(carry, arrays) if length else (carry, None)
    groups = -(-length // size)
    padded = tuple(
        jnp.concatenate([a, jnp.full((groups * size - length, *a.shape[1:]), f, a.dtype)]).reshape(groups, size,
                                                                                                     *a.shape[1:])
        for a, f in zip(arrays, fills))
    carry, out = jax.lax.scan(fn, carry, padded)
    return carry, jax.tree_util.tree_map(lambda o: o.reshape(groups * size, *o.shape[2:]), out)


def with_evaluation(program: Program, algorithm: Algorithm) -> Program:
    """``program`` with ``chunk`` / ``frozen_chunk``: ``advance`` / ``frozen_advance`` followed by an evaluation of the
    global model (the metrics joined to the other outputs)."""

    def evaluated(advance_fn):
        def chunk(carry, inputs, hp, key, data):
            carry, outputs = advance_fn(carry, inputs, hp, key, data)
            return carry, {**program.evaluate(algorithm.params(carry.server), data), **outputs}

        return chunk

    return dataclasses.replace(program, chunk=evaluated(program.advance),
                               frozen_chunk=evaluated(program.frozen_advance))


def make_simulation(
    task: Task,
    algorithm: Algorithm,
    local: LocalConfig,
    num_steps: int,
    num_slots: int,
    eval_every: int,
) -> Callable[[ScheduleArrays, Mapping[str, jax.Array], jax.Array, TaskArrays], SimulationOutput]:
    """The whole simulation as one pure function ``run(schedule_arrays, hparams, key, data) -> SimulationOutput``.

    ``run`` has no Python side effects: ``jax.jit(run)`` compiles it and ``jax.vmap(run, in_axes=(None, 0, 0,
    None))`` runs it for a batch of hyper-parameters and keys. ``data`` is ``task_arrays(task)`` (an argument, so the
    compiled program does not embed the dataset). The model is evaluated after steps 0, E, 2E, ... and after the last
    step (``E = eval_every``). ``hparams`` must hold every name of :func:`default_hparams` as a scalar.
    """
    if not 1 <= eval_every:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}")
    program = build_program(task, algorithm, local, num_slots)
    full, rest = divmod(num_steps, eval_every)

    def run(sched: ScheduleArrays, hp: Mapping[str, jax.Array], key: jax.Array, data: TaskArrays) -> SimulationOutput:
        carry = program.init(sched, hp, key, data)
        first = program.evaluate(algorithm.params(carry.server), data)
        blocks = jax.tree_util.tree_map(
            lambda a: a[: full * eval_every].reshape(full, eval_every, *a.shape[1:]), sched.steps
        )

        def outer(c, block):
            return program.chunk(c, block, hp, key, data)

        carry, metrics = jax.lax.scan(outer, carry, blocks)
        metrics = {k: jnp.concatenate([first[k][None], v]) for k, v in metrics.items()}
        if rest:
            tail = jax.tree_util.tree_map(lambda a: a[full * eval_every:], sched.steps)
            carry, last = program.chunk(carry, tail, hp, key, data)
            metrics = {k: jnp.concatenate([v, last[k][None]]) for k, v in metrics.items()}
        return SimulationOutput(algorithm.params(carry.server), metrics, carry.diverged_at, carry)

    return run


# ---------------------------------------------------------------------------------------------------- host driver
def simulate(
    task: Task,
    algorithm: Algorithm,
    schedules: Schedule | Sequence[Schedule],
    local: LocalConfig | None = None,
    seeds: Sequence[int] = (0,),
    hparams: Mapping[str, Any] | None = None,
    eval_every: int = 100,
    progress: bool = True,
    label: str | None = None,
    shard_jobs: bool = False,
    shard_replicas: bool = False,
    shard_clients: bool = False,
    lookahead: int = 1,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
) -> History:
    """Runs an experiment (all replicas as one vmapped program) and returns its :class:`History`.

    Args:
      task: model and data.
      algorithm: the federated algorithm.
      schedules: one schedule shared by every replica, or one per seed (in the order of ``seeds``).
      local: local-training settings (default: ``LocalConfig()``).
      seeds: training seeds; each seed is combined with every point of the hyper-parameter grid.
      hparams: hyper-parameter values; a list sweeps over its values (see :func:`make_replicas`).
      eval_every: evaluate the global model every this many server steps (and at the end).
      progress: show a progress bar.
      label: name of the run in the History (default: the algorithm's name).
      shard_jobs: spread the jobs trained together at each step over all devices (``jax.devices()``); on a CPU,
        start Python with ``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>`` to get one device per core.
        Results equal the unsharded run up to float rounding.
      shard_replicas: spread the replicas (seeds x hyper-parameter points) over all devices (``jax.devices()``, one
        ``jax.sharding.Mesh`` axis): each device runs its share of the vmapped replicas; the data is replicated. The
        number of replicas must be a multiple of the number of devices. Results equal the single-device run up to
        float rounding (tested with 4 host devices). Not combinable with ``shard_jobs``.
      shard_clients: spread the per-client state (the n x d caches of CA2FL, ACE, MIFA..., error-feedback residuals,
        client memories; every leaf with a leading client axis) over all devices along its client axis, and the
        messages of the jobs in flight along their slot axis when it splits evenly; the model and the data are
        replicated. Each device then holds ``n / devices`` clients' rows, which is what lets a cache larger than one
        accelerator's memory run on several (see :func:`client_shardings`).
        ``n`` must be a multiple of the number of devices. Results equal the single-device run up to float rounding.
        Not combinable with ``shard_jobs`` or ``shard_replicas``.
      lookahead: lookahead batching (``L > 1``, pre-sampled schedules only): the jobs dispatched over up to ``L``
        server steps are trained together in one vmapped call (of the filled rows' jobs, rounded up to a power of
        two rows), when the schedule shows that none of them is needed before (see :func:`lookahead_plan`);
        ``History.lookahead`` reports the window lengths
        achieved. The same results as ``L = 1`` up to float rounding (a batched matmul may sum in another order).
      checkpoint_dir: a folder for checkpoints (:mod:`asyncfl_jax.checkpoint`): the scan state is saved there every
        ``checkpoint_every`` chunks (of ``eval_every`` steps), after the last chunk, and when Ctrl-C (SIGINT) or
        SIGTERM stops the run: while the chunks run, the first Ctrl-C or a SIGTERM lets the current chunk finish,
        saves, and raises :class:`~asyncfl_jax.checkpoint.SimulationInterrupted` (a ``KeyboardInterrupt``); a second
        Ctrl-C stops at once. None (default): no checkpoints, and the signals keep their usual effect.
      checkpoint_every: chunks between two checkpoints (>= 1).
      resume: continue from the checkpoint in ``checkpoint_dir`` when there is one (else start from the beginning).
        The checkpoint must come from this same run (schedules, replicas, algorithm and options, local training,
        task shapes and ``x0``, ``eval_every``), else :class:`~asyncfl_jax.checkpoint.CheckpointMismatchError` says
        what differs. The History then equals that of an uninterrupted run bit for bit (metrics, final parameters;
        not the timings). With ``resume=False`` an existing checkpoint is ignored and replaced.
    """
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    if isinstance(lookahead, bool) or not isinstance(lookahead, (int, np.integer)) or lookahead < 1:
        raise ValueError(f"lookahead must be an integer >= 1 (1: off), got {lookahead!r}")
    lookahead = int(lookahead)
    spread = [name for name, on in (("shard_jobs", shard_jobs), ("shard_replicas", shard_replicas),
                                     ("shard_clients", shard_clients)) if on]
    if len(spread) > 1:
        raise ValueError(f"{' and '.join(spread)} cannot be combined: choose one axis to spread over the devices")
    if lookahead > 1 and shard_jobs:
        raise ValueError("lookahead > 1 cannot be combined with shard_jobs (the buffered jobs are not placed over the "
                         "devices); use one of them, or shard_replicas")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir to resume from")
    local = local or LocalConfig()
    name = label or algorithm.name
    replicas = make_replicas(algorithm, seeds, hparams)
    if local.use_momentum is False and any(r.hparams["momentum"] != 0 for r in replicas):
        local = dataclasses.replace(local, use_momentum=True)
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}")

    clocks = _clocks_per_replica(schedules, seeds, replicas, task.num_clients)
    sharding = job_sharding() if shard_jobs else None
    if clocks is not None:  # the in-scan event clock: durations may depend on the state
        from asyncfl_jax import clocked
        from asyncfl_jax.timing.clock import stack_tables

        if lookahead > 1:
            raise ValueError("lookahead batching needs a pre-sampled schedule; the event clock trains each job when "
                             "it arrives (use lookahead=1)")
        per_replica, shared = [], False
        T = clocks[0].num_steps
        program = clocked.build_clocked_program(task, algorithm, local, job_sharding=sharding)
        sched, sched_axis, chunk_axis, num_slots = _initial_tables(clocks), 0, clocked.ClockChunk(None, 0), 1

        def chunk_inputs(start: int, stop: int, carry: Any) -> Any:
            jobs, uploads = np.asarray(carry.clock.jobs), np.asarray(carry.clock.uploads)
            tables = stack_tables([c.tables(jobs[r], uploads[r], eval_every + 1) for r, c in enumerate(clocks)])
            return clocked.ClockChunk(jnp.arange(start, stop, dtype=jnp.int32), tables)
    else:
        per_replica, shared = _schedules_per_replica(schedules, seeds, replicas, task.num_clients)
        if shared:
            sched, num_slots, sched_axis = schedule_arrays(per_replica[0]), per_replica[0].num_slots, None
        else:
            (sched, num_slots), sched_axis = stack_schedules(per_replica), 0
        chunk_axis = sched_axis
        T = per_replica[0].num_steps
        program = build_program(task, algorithm, local, num_slots, job_sharding=sharding, lookahead=lookahead)
        if lookahead > 1:  # the plan is shared by the replicas (one plan valid for every replica's schedule)
            position, flush = lookahead_plan(per_replica[:1] if shared else per_replica, lookahead)
            sched = sched._replace(steps=sched.steps._replace(plan=LookaheadPlan(jnp.asarray(position),
                                                                                 jnp.asarray(flush))))
            if sched_axis == 0:
                chunk_axis = StepArrays(*([0] * (len(StepArrays._fields) - 1)), plan=None)
                sched_axis = ScheduleArrays(0, 0, chunk_axis)

        def chunk_inputs(start: int, stop: int, carry: Any) -> Any:
            del carry
            steps = sched.steps._replace(plan=())
            part = _slice_steps(steps, start, stop, replica_axis=not shared)
            if lookahead > 1:
                part = part._replace(plan=jax.tree_util.tree_map(lambda a: a[start:stop], sched.steps.plan))
            return part
    hp = stack_hparams(replicas)
    keys = jnp.stack([jax.random.PRNGKey(r.seed) for r in replicas])

    data = task_arrays(task)
    init_vmapped = jax.vmap(program.init, in_axes=(sched_axis, 0, 0, None))
    carry_shape = jax.eval_shape(init_vmapped, sched, hp, keys, data)
    # Where each carry leaf lives: None (one device), or a sharding per leaf (its shards' sizes give the budget).
    carry_placement, init_placed, chunk_placed = None, {}, {}
    if shard_clients:  # the per-client leaves over the devices, everything else replicated
        server_flags, client_flags = per_client_leaves(algorithm, task.model.flat_params, task.num_clients)
        carry_placement, everywhere = client_shardings(carry_shape, server_flags, client_flags, task.num_clients)
        hp, keys, data, sched = jax.device_put((hp, keys, data, sched), everywhere)
        init_placed, chunk_placed = {"out_shardings": carry_placement}, {"out_shardings": (carry_placement, everywhere)}
    if shard_replicas:  # the replica axis over the devices, everything else replicated
        over, everywhere = replica_shardings(len(replicas))
        carry_placement = jax.tree_util.tree_map(lambda _: over, carry_shape)
        # With shard_replicas every output (carry, per-step records) keeps its replica axis spread over the devices.
        init_placed = chunk_placed = {"out_shardings": over}
        hp, keys, data = jax.device_put(hp, over), jax.device_put(keys, over), jax.device_put(data, everywhere)
        if clocks is None and lookahead > 1:  # the plan is shared by the replicas: on every device
            plan = sched.steps.plan
            sched = jax.device_put(sched._replace(steps=sched.steps._replace(plan=())), everywhere if shared else over)
            sched = sched._replace(steps=sched.steps._replace(plan=jax.device_put(plan, everywhere)))
        else:
            sched = jax.device_put(sched, everywhere if shared else over)
    budget = memory_budget(program, sched, hp, keys, data, sched_axis, placement=carry_placement,
                           carry_shape=carry_shape)
    if progress:
        print(f"{name}: {budget.describe()}", file=sys.stderr, flush=True)
    budget.check()
    init_fn = jax.jit(init_vmapped, **init_placed)
    chunk_fn = jax.jit(jax.vmap(program.advance, in_axes=(0, chunk_axis, 0, 0, None)), donate_argnums=(0,),
                       **chunk_placed)
    frozen_chunk_fn = jax.jit(jax.vmap(program.frozen_advance, in_axes=(0, chunk_axis, 0, 0, None)),
                              donate_argnums=(0,), **chunk_placed)

    @jax.jit
    def eval_fn(server: Any, data: TaskArrays) -> dict[str, jax.Array]:
        # One replica after the other (lax.map, not vmap): a replica's evaluation is then the same computation
        # whatever the number of replicas beside it (its metrics depend only on its own model).
        params = jax.vmap(algorithm.params)(server)
        return jax.lax.map(lambda p: program.evaluate(p, data), params)

    num_chunks = -(-T // eval_every)
    identity, state = None, None
    if checkpoint_dir is not None:
        timing = sched if clocks is None else (sched, _clock_descriptions(clocks))
        identity = checkpoint.run_identity(
            label=name, algorithm=algorithm, local=local, replicas=replicas, schedules=timing, num_slots=num_slots,
            num_steps=T, eval_every=eval_every, task=task, data=data, carry_shape=carry_shape, shard_jobs=shard_jobs,
            shard_replicas=shard_replicas, shard_clients=shard_clients,
        )
        if resume:
            state = checkpoint.load(checkpoint_dir, identity, carry_shape)
    saved_chunk = None  # next_chunk of the checkpoint on disk, if it is this run's current state
    t0 = time.perf_counter()
    if state is None:
        carry = init_fn(sched, hp, keys, data)
        first = eval_fn(carry.server, data)
        jax.block_until_ready(first)
        state = checkpoint.LoopState(
            next_chunk=0, eval_steps=[0], metrics={k: [np.asarray(first[k])] for k in METRIC_NAMES}, reported=set(),
            stopped_early=False, compile_seconds=time.perf_counter() - t0, run_seconds=0.0, carry=carry,
        )
    else:  # the same device placement as a fresh run's carry, so the chunks compile to the same programs
        sharded = shard_jobs or shard_replicas or shard_clients
        shardings = init_fn.lower(sched, hp, keys, data).compile().output_shardings if sharded else None
        state.carry = jax.device_put(state.carry, shardings)
        state.compile_seconds += time.perf_counter() - t0
        saved_chunk = state.next_chunk
        if progress:
            print(f"{name}: resuming from the checkpoint in {checkpoint_dir} after server step "
                  f"{state.eval_steps[-1]} of {T}", file=sys.stderr, flush=True)

    compiled: dict[int, Any] = {}
    loop_compile_seconds = 0.0
    checkpoint_seconds = 0.0
    compile_before, run_before = state.compile_seconds, state.run_seconds
    bar = _progress_bar(T, progress, name, initial=state.eval_steps[-1])
    start_wall = time.perf_counter()

    def save_checkpoint() -> None:
        nonlocal checkpoint_seconds, saved_chunk
        ts = time.perf_counter()
        state.compile_seconds = compile_before + loop_compile_seconds
        state.run_seconds = run_before + ts - start_wall - loop_compile_seconds - checkpoint_seconds
        checkpoint.save(checkpoint_dir, identity, state, num_chunks)
        saved_chunk = state.next_chunk
        checkpoint_seconds += time.perf_counter() - ts

    with checkpoint.stop_on_signals(enabled=checkpoint_dir is not None) as stop:
        try:
            while state.next_chunk < num_chunks and not state.stopped_early:
                start = state.next_chunk * eval_every
                stop_step = min(start + eval_every, T)
                part = chunk_inputs(start, stop_step, state.carry)
                # Once a replica has diverged, it is frozen: its state stays as it was (see Program.frozen_chunk).
                freeze = bool(state.reported)
                variant = (stop_step - start, freeze)
                if variant not in compiled:
                    tc = time.perf_counter()
                    fn = frozen_chunk_fn if freeze else chunk_fn
                    compiled[variant] = fn.lower(state.carry, part, hp, keys, data).compile()
                    loop_compile_seconds += time.perf_counter() - tc
                new_carry, out = compiled[variant](state.carry, part, hp, keys, data)
                out = {**out, **eval_fn(new_carry.server, data)}
                traces = {k: np.asarray(v) for k, v in out.items() if k not in METRIC_NAMES}
                out = {k: np.asarray(out[k]) for k in METRIC_NAMES}
                diverged = np.asarray(new_carry.diverged_at)
                newly = sorted(set(np.flatnonzero(diverged >= 0).tolist()) - state.reported)
                state = dataclasses.replace(  # one assignment: the state is always that of a whole number of chunks
                    state, carry=new_carry, next_chunk=state.next_chunk + 1, eval_steps=[*state.eval_steps, stop_step],
                    metrics={k: [*v, out[k]] for k, v in state.metrics.items()}, reported=state.reported | set(newly),
                    traces={k: [*state.traces.get(k, []), v] for k, v in traces.items()},
                    stopped_early=bool((diverged >= 0).all()),
                )
                bar.update(stop_step - start)
                accuracy = out["test_accuracy"]
                if np.isfinite(accuracy).any():
                    bar.set_postfix(acc=f"{float(np.mean(accuracy[np.isfinite(accuracy)])):.3f}")
                for r in newly:
                    warnings.warn(
                        f"{name}: replica {r} (seed={replicas[r].seed}, {_swept_description(replicas, r)}) diverged: "
                        f"the global model became NaN/inf at server step {int(diverged[r])}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                finished = state.stopped_early or state.next_chunk >= num_chunks
                if checkpoint_dir is not None and (
                    stop.reason or finished or state.next_chunk % checkpoint_every == 0
                ):
                    save_checkpoint()
                if stop.reason:
                    raise checkpoint.SimulationInterrupted(name, stop.reason, state.eval_steps[-1], T, checkpoint_dir,
                                                           saved=True)
        except KeyboardInterrupt as e:  # raised outside the signal handler (or a second Ctrl-C)
            if isinstance(e, checkpoint.SimulationInterrupted) or checkpoint_dir is None:
                raise
            saved = saved_chunk == state.next_chunk
            alive = not any(getattr(leaf, "is_deleted", lambda: False)()
                            for leaf in jax.tree_util.tree_leaves(state.carry))  # a donated carry is gone
            if not saved and alive:
                save_checkpoint()
                saved = True
            raise checkpoint.SimulationInterrupted(name, "KeyboardInterrupt", state.eval_steps[-1], T,
                                                   checkpoint_dir, saved=saved) from e
        finally:
            bar.close()
    if checkpoint_dir is not None and saved_chunk != state.next_chunk:  # e.g. resumed from a finished checkpoint
        save_checkpoint()
    run_seconds = run_before + time.perf_counter() - start_wall - loop_compile_seconds - checkpoint_seconds
    compile_seconds = compile_before + loop_compile_seconds
    carry, eval_steps, metrics, stopped_early = state.carry, state.eval_steps, state.metrics, state.stopped_early

    steps = np.asarray(eval_steps)
    realized = None
    if clocks is not None:  # the schedules the clocked replicas went through
        realized = _realized_schedules(clocks, state.traces, carry, int(steps[-1]))
        per_replica = realized
    times = np.stack([_times_at(s, steps) for s in per_replica])
    init_uploads = task.num_clients if algorithm.init_round else 0
    uploads = np.stack([_uploads_at(s, steps) + init_uploads for s in per_replica])
    summaries = [schedule_summary(s) for s in (per_replica[:1] if shared else per_replica)]
    return History(
        label=name,
        algorithm=algorithm.name,
        algorithm_options=dict(algorithm.options),
        steps=steps,
        times=times,
        uploads=uploads,
        message_bits=_message_bits(algorithm, task),
        metrics={k: np.stack(v, axis=1) for k, v in metrics.items()},
        seeds=[r.seed for r in replicas],
        hparams=[dict(r.hparams) for r in replicas],
        diverged_at=np.asarray(carry.diverged_at),
        schedule_stats=summaries,
        num_steps=T,
        stopped_early=stopped_early,
        compile_seconds=compile_seconds,
        run_seconds=run_seconds,
        final_params=np.asarray(jax.vmap(algorithm.params)(carry.server)),
        memory=budget.as_dict(),
        realized_schedules=realized,
        lookahead=(_lookahead_summary(lookahead, sched.steps.plan.flush) if clocks is None and lookahead > 1
                   else None),
        job_steps=_job_steps(state.traces, int(steps[-1])) if clocks is not None else None,
    )


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """Bytes the simulation state needs on the device, known before anything is compiled.

    Attributes:
      server: the algorithms' server states of all replicas (the model, and n x d caches where there are).
      clients: per-client state of all replicas (AREA's client memory, ...).
      pending: messages of the jobs in flight (``num_slots`` per replica).
      data: the task's arrays (training set, evaluation sets), shared by the replicas.
      replicas: number of replicas.
      available: bytes one device can hold (physical memory on a CPU, the allocator limit on a GPU), or None.
      devices: number of devices the state is placed on (``shard_replicas``, ``shard_clients``), 1 otherwise.
      device_state: bytes of the state the most loaded device holds (its shards and the replicated leaves);
        ``None``: all of it (one device).
      shared_memory: the devices share one memory (host devices of a CPU), so ``available`` holds all of them.
    """

    server: int
    clients: int
    pending: int
    data: int
    replicas: int
    available: int | None
    devices: int = 1
    device_state: int | None = None
    shared_memory: bool = False

    @property
    def state(self) -> int:
        return self.server + self.clients + self.pending

    @property
    def total(self) -> int:
        return self.state + self.data

    @property
    def state_per_device(self) -> int:
        """Bytes of the state on the most loaded device (all of it on one device)."""
        return self.state if self.device_state is None else self.device_state

    @property
    def per_device(self) -> int:
        """Bytes one device holds: its share of the state and a copy of the data."""
        return self.state_per_device + self.data

    def describe(self) -> str:
        room = f" of {_gib(self.available)} available" if self.available else ""
        text = (f"memory budget {_gib(self.total)}{room}: state {_gib(self.state)} for {self.replicas} replica(s) "
                f"(server {_gib(self.server)}, clients {_gib(self.clients)}, in-flight messages "
                f"{_gib(self.pending)}), data {_gib(self.data)}")
        if self.devices > 1:
            text += f"; over {self.devices} devices: {_gib(self.per_device)} per device (state share and data)"
        return text

    def check(self, fraction: float = 0.9) -> None:
        """Raises ``MemoryError`` (before compiling) when the state cannot fit the device(s)."""
        # The scan carry is double-buffered while a chunk runs: the state is counted twice.
        state = self.state_per_device
        needed = 2 * state + self.data
        where = "the device has"
        if self.devices > 1:
            where = f"each of the {self.devices} devices has"
            if self.shared_memory:  # host devices of one CPU: all their shares in one memory
                needed, where = self.devices * needed, f"the {self.devices} devices share"
        if self.available and needed > fraction * self.available:
            raise MemoryError(
                f"this run needs about {_gib(needed)} (twice the simulation state of {_gib(state)}"
                f"{' per device' if self.devices > 1 else ''}, plus {_gib(self.data)} of data"
                f"{' on each device' if self.devices > 1 else ''}) but {where} {_gib(self.available)}: use fewer "
                "replicas or clients, a smaller per-client cache (an algorithm option cache='bfloat16' or 'int8'), "
                "or spread the per-client state over several accelerators (shard_clients)"
            )

    def as_dict(self) -> dict[str, Any]:
        return {"server_bytes": self.server, "clients_bytes": self.clients, "pending_bytes": self.pending,
                "data_bytes": self.data, "replicas": self.replicas, "available_bytes": self.available,
                "devices": self.devices, "device_state_bytes": self.device_state}


def _gib(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    if nbytes >= 2**28:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _tree_bytes(tree: Any) -> int:
    return int(sum(np.prod(leaf.shape, dtype=np.int64) * np.dtype(leaf.dtype).itemsize
                   for leaf in jax.tree_util.tree_leaves(tree)))


def device_memory_bytes(device: Any = None) -> int | None:
    """Memory one device can hold: the allocator limit of an accelerator, physical memory for the CPU."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend reports statistics
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None
    return None


def memory_budget(program: Program, sched: ScheduleArrays, hp: Mapping[str, jax.Array], keys: jax.Array,
                  data: TaskArrays, sched_axis: int | None, placement: Any = None,
                  carry_shape: Any = None) -> MemoryBudget:
    """The :class:`MemoryBudget` of running ``program`` for the replicas of ``hp``/``keys`` (shapes only).

    ``placement``: the carry's shardings (a pytree of ``jax.sharding.Sharding`` matching the carry) when it is spread
    over several devices; each leaf then counts its largest shard on the device that holds it. ``carry_shape``: the
    vmapped ``init``'s output shapes when the caller has them already (else they are traced here).
    """
    carry = carry_shape if carry_shape is not None else jax.eval_shape(
        jax.vmap(program.init, in_axes=(sched_axis, 0, 0, None)), sched, hp, keys, data)
    states = (carry.server, carry.clients,
              # jobs in flight: their messages, or under the event clock their start models and times
              carry.clock if hasattr(carry, "clock") else carry.pending)
    devices, device_state, shared = 1, None, False
    if placement is not None:
        places = (placement.server, placement.clients, placement.clock if hasattr(carry, "clock") else placement.pending)
        device_state = sum(_tree_bytes(jax.tree_util.tree_map(_one_shard, tree, where)) for tree, where in
                           zip(states, places))
        devices = len(jax.tree_util.tree_leaves(placement)[0].device_set)
        shared = jax.devices()[0].platform == "cpu"
    return MemoryBudget(server=_tree_bytes(states[0]), clients=_tree_bytes(states[1]), pending=_tree_bytes(states[2]),
                        data=_tree_bytes(data), replicas=int(keys.shape[0]), available=device_memory_bytes(),
                        devices=devices, device_state=device_state, shared_memory=shared)


def _one_shard(leaf: jax.ShapeDtypeStruct, sharding: Any) -> jax.ShapeDtypeStruct:
    """The shape of the largest shard of ``leaf`` under ``sharding``."""
    return jax.ShapeDtypeStruct(sharding.shard_shape(leaf.shape), leaf.dtype)


def _schedules_per_replica(
    schedules: Schedule | Sequence[Schedule], seeds: Sequence[int], replicas: Sequence[Replica], num_clients: int
) -> tuple[list[Schedule], bool]:
    """The schedule of every replica (one shared, or one per seed) and whether they are all the same one."""
    if isinstance(schedules, Schedule):
        per_replica, shared = [schedules] * len(replicas), True
    else:
        schedules = list(schedules)
        if len(schedules) != len(seeds):
            raise ValueError(f"got {len(schedules)} schedules for {len(seeds)} seeds; give one per seed or one in all")
        if len(schedules) > 1:
            _distinct_seeds(seeds, "schedules")
        by_seed = dict(zip([int(s) for s in seeds], schedules))
        per_replica, shared = [by_seed[r.seed] for r in replicas], len(schedules) == 1
    for s in per_replica:
        if s.num_clients != num_clients:
            raise ValueError(f"the schedule has {s.num_clients} clients but the task has {num_clients}")
    return per_replica, shared


def _distinct_seeds(seeds: Sequence[int], what: str) -> None:
    """One schedule (or clock) per seed needs distinct seeds (else two of them would be matched to one seed)."""
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a seed, so the {what} given one per seed cannot be matched to "
                         "them; use distinct seeds")


def _clocks_per_replica(schedules: Any, seeds: Sequence[int], replicas: Sequence[Replica], num_clients: int):
    """The :class:`~asyncfl_jax.timing.clock.EventClock` of every replica, or None when ``schedules`` are schedules."""
    from asyncfl_jax.timing.clock import EventClock

    items = [schedules] if isinstance(schedules, (Schedule, EventClock)) else list(schedules)
    if not any(isinstance(c, EventClock) for c in items):
        return None
    if not all(isinstance(c, EventClock) for c in items):
        raise ValueError("schedules must be all Schedule or all EventClock, not a mix")
    if len(items) == 1:
        per_replica = items * len(replicas)
    elif len(items) == len(seeds):
        _distinct_seeds(seeds, "event clocks")
        by_seed = dict(zip([int(s) for s in seeds], items))
        per_replica = [by_seed[r.seed] for r in replicas]
    else:
        raise ValueError(f"got {len(items)} event clocks for {len(seeds)} seeds; give one per seed or one in all")
    for c in per_replica:
        if c.num_clients != num_clients:
            raise ValueError(f"the event clock has {c.num_clients} clients but the task has {num_clients}")
        if c.num_steps != per_replica[0].num_steps:
            raise ValueError("the event clocks of the replicas must have the same num_steps")
    return per_replica


def _initial_tables(clocks: Sequence[Any]) -> Any:
    """The tables of the initial jobs (job 0 of every client), stacked over replicas."""
    from asyncfl_jax.timing.clock import stack_tables

    n = clocks[0].num_clients
    zeros = np.zeros(n, dtype=np.int64)
    return stack_tables([c.tables(zeros, zeros, 1) for c in clocks])


def _clock_descriptions(clocks: Sequence[Any]) -> np.ndarray:
    import json

    return np.frombuffer(json.dumps([c.info for c in clocks], sort_keys=True).encode(), dtype=np.uint8)


def _job_steps(traces: Mapping[str, list[np.ndarray]], num_steps: int) -> np.ndarray:
    """int [R, T]: the local step count of the job applied at each step (-1 once a replica was frozen)."""
    steps = np.concatenate(traces["steps"], axis=1)[:, :num_steps]
    clients = np.concatenate(traces["client"], axis=1)[:, :num_steps]
    return np.where(np.minimum.accumulate(clients, axis=1) < 0, -1, steps)


def _realized_schedules(clocks: Sequence[Any], traces: Mapping[str, list[np.ndarray]], carry: Any,
                        num_steps: int) -> list[Schedule]:
    """Rebuilds each clocked replica's schedule from the per-step traces and the jobs that never arrived."""
    from asyncfl_jax.timing.clock import OpenJobs, Trace, realized_schedule

    trace = {k: np.concatenate(v, axis=1)[:, :num_steps] for k, v in traces.items()}
    clock = jax.device_get(carry.clock)
    out = []
    for r, c in enumerate(clocks):
        frozen = np.flatnonzero(trace["client"][r] < 0)  # a diverged replica is frozen: its schedule stops there
        end = int(frozen[0]) if frozen.size else trace["client"].shape[1]
        start = trace["start_hi"][r][:end].astype(np.float64) + trace["start_lo"][r][:end]
        arrival = trace["arrival_hi"][r][:end].astype(np.float64) + trace["arrival_lo"][r][:end]
        recorded = Trace(*(trace[k][r][:end] for k in ("client", "row", "col", "steps")), start, arrival)
        in_flight = np.isfinite(clock.finish.hi[r])
        lost = clock.discarded_row[r] >= 0
        open_jobs = OpenJobs(
            client=np.concatenate([np.flatnonzero(in_flight), np.flatnonzero(lost)]),
            row=np.concatenate([clock.row[r][in_flight], clock.discarded_row[r][lost]]),
            col=np.concatenate([clock.col[r][in_flight], clock.discarded_col[r][lost]]),
            start=np.concatenate([clock.start.hi[r][in_flight].astype(np.float64) + clock.start.lo[r][in_flight],
                                  clock.discarded_start.hi[r][lost].astype(np.float64)
                                  + clock.discarded_start.lo[r][lost]]),
        )
        out.append(realized_schedule(c, recorded, open_jobs))
    return out


def replica_shardings(num_replicas: int) -> tuple[Any, Any]:
    """(replica axis over every device, replicated) shardings; raises ``ValueError`` when ``num_replicas`` is not a
    multiple of the number of devices."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    if num_replicas % len(devices):
        raise ValueError(f"shard_replicas needs a number of replicas (seeds x hyper-parameter points) that is a "
                         f"multiple of the {len(devices)} devices, got {num_replicas}")
    mesh = Mesh(np.array(devices), ("replicas",))
    return NamedSharding(mesh, PartitionSpec("replicas")), NamedSharding(mesh, PartitionSpec())


def per_client_leaves(algorithm: Algorithm, x0: Any, num_clients: int) -> tuple[Any, Any]:
    """Which leaves of the server state and of the client state have a leading client axis (two pytrees of bools).

    A leaf is per-client when its leading dimension follows ``num_clients``: it is found by building both states
    (shapes only) for ``num_clients`` and ``num_clients + 1`` clients, so no algorithm has to declare it.
    """
    x0 = jax.ShapeDtypeStruct(np.shape(x0), x0.dtype)

    def flags(init: Callable[[jax.Array, int], Any]) -> Any:
        a = jax.eval_shape(lambda x: init(x, num_clients), x0)
        b = jax.eval_shape(lambda x: init(x, num_clients + 1), x0)
        return jax.tree_util.tree_map(lambda u, v: u.shape[:1] != v.shape[:1], a, b)

    return flags(algorithm.init), flags(algorithm.init_clients)


def client_shardings(carry_shape: Any, server_flags: Any, client_flags: Any, num_clients: int) -> tuple[Any, Any]:
    """(carry sharding, replicated sharding) that spread the per-client state over every device.

    The leaves flagged by :func:`per_client_leaves` (shape ``[replicas, n, ...]`` in the vmapped carry) are split along
    their client axis, and so are the messages of the jobs in flight (``[replicas, slots, ...]``; as many slots as
    clients when every client is active, as in ACE) when the number of slots is a multiple of the number of devices.
    Everything else (the model, the data) is replicated. A server step then reads and writes each arriving client's
    row on the device that holds it (XLA partitions the gather and the scatter: a masked local gather and an
    all-reduce of the rows read, O(M d) per step), so no device ever holds all ``n`` rows. Raises ``ValueError`` when
    ``num_clients`` is not a multiple of the number of devices.
    """
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.devices()
    if num_clients % len(devices):
        raise ValueError(f"shard_clients needs a number of clients that is a multiple of the {len(devices)} devices, "
                         f"got {num_clients}")
    mesh = Mesh(np.array(devices), ("clients",))
    spread, everywhere = NamedSharding(mesh, PartitionSpec(None, "clients")), NamedSharding(mesh, PartitionSpec())

    def by_flag(per_client: bool) -> Any:
        return spread if per_client else everywhere

    def by_slots(leaf: jax.ShapeDtypeStruct) -> Any:
        return spread if leaf.ndim >= 2 and leaf.shape[1] % len(devices) == 0 else everywhere

    placed = jax.tree_util.tree_map(lambda _: everywhere, carry_shape)
    placed = placed._replace(server=jax.tree_util.tree_map(by_flag, server_flags),
                             clients=jax.tree_util.tree_map(by_flag, client_flags))
    if isinstance(carry_shape, Carry):  # (the event clock keeps its jobs' start models in its own state)
        placed = placed._replace(pending=jax.tree_util.tree_map(by_slots, carry_shape.pending))
    return placed, everywhere


def job_sharding() -> Any:
    """A sharding that splits a 1-D array of jobs over every device."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()), ("jobs",)), PartitionSpec("jobs"))


def _swept_description(replicas: Sequence[Replica], r: int) -> str:
    varying = swept_names([rep.hparams for rep in replicas])
    return ", ".join(f"{k}={replicas[r].hparams[k]:g}" for k in varying) or "no swept hyper-parameters"


def _times_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    """Virtual time after ``steps`` server steps (the initial time for 0)."""
    times = np.concatenate([[schedule.init_time], schedule.step_times])
    return times[np.minimum(steps, schedule.num_steps)].astype(np.float64)  # a frozen clocked replica stops early


def _message_bits(algorithm: Algorithm, task: Task) -> dict[str, int]:
    """Bits of one upload: float32 vectors of the model's size, or the compressor's cost."""
    payload, index = message_bits(algorithm, int(task.model.num_params))
    return {"payload": int(payload), "index": int(index)}


def _uploads_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    cumulative = np.concatenate([[0], np.cumsum(schedule.uploads_per_step)])
    return cumulative[np.minimum(steps, schedule.num_steps)].astype(np.int64)


def _progress_bar(total: int, enabled: bool, desc: str, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="step", leave=False,
                dynamic_ncols=True)
