"""Stores: where a dispatched job's work waits until its result arrives.

A job's result depends only on what it was given at dispatch (see :mod:`asyncfl_jax.engine.jobs`), so a store may
train it at any moment before its arrival. Each store has four pure functions over the scan carry:

* ``init(x0, hp, message_shape) -> state``: the store's part of the carry;
* ``dispatch_initial(carry, jobs, x0, key, data)``: the jobs that start before step 0;
* ``dispatch(carry, jobs, x_t, inputs, key, data)``: the jobs that start from ``x_t`` during step ``t``;
* ``collect(carry, arrivals, inputs, key, data) -> (carry, messages)``: the messages of the step's arrivals.

The three stores:

* :class:`TrainAtDispatch` trains a step's jobs when they start (one vmapped call) and keeps their messages in
  ``pending`` slots until they arrive;
* :class:`Lookahead` (lookahead batching, ``L > 1``) records the jobs of up to ``L`` steps with the models they start
  from and trains them together in one vmapped call at the steps the host's
  :class:`~asyncfl_jax.engine.inputs.LookaheadPlan` marks (before any of them is needed); the results equal
  :class:`TrainAtDispatch`'s up to float rounding (a wider batched matmul may sum in another order);
* :class:`TrainAtArrival` keeps each job's inputs (start model, hyper-parameters, key, step count) per slot and trains
  the job when it arrives: the in-scan event clock's store, where only one job arrives per step.
"""

from __future__ import annotations

import dataclasses
import functools
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.engine.jobs import Arrivals, Jobs, Trainer, job_keys, put_messages
from asyncfl_jax.engine.inputs import flush_buckets


def _zeros(width: int, shape: Any) -> Any:
    return jax.tree_util.tree_map(lambda s: jnp.zeros((width, *s.shape), s.dtype), shape)


def _per_job(width: int, hp: Any) -> Any:
    return jax.tree_util.tree_map(lambda v: jnp.zeros((width,), jnp.asarray(v).dtype), hp)


def _read(pending: Any, arrivals: Arrivals) -> Any:
    read = jnp.where(arrivals.clients >= 0, arrivals.slots, 0)
    return jax.tree_util.tree_map(lambda p: p[read], pending)


# ---------------------------------------------------------------------------------------------------- at dispatch
@dataclasses.dataclass(frozen=True, eq=False)
class TrainAtDispatch:
    """Train a step's jobs when they start; their messages wait in ``num_slots`` pending slots."""

    trainer: Trainer
    num_slots: int

    def init(self, x0: jax.Array, hp, message_shape: Any, width: int) -> Any:
        del x0, hp, width
        return _zeros(self.num_slots, message_shape)

    def pending(self, state: Any) -> Any:
        return state

    def slot_leaves(self, state: Any) -> Any:
        """Which leaves of the store's state have a leading slot axis (``shard_clients`` may split them)."""
        return jax.tree_util.tree_map(lambda _: True, state)

    def with_pending(self, state: Any, pending: Any) -> Any:
        del state
        return pending

    def dispatch_initial(self, carry: Any, jobs: Jobs, x0: jax.Array, key: jax.Array, data: Any) -> Any:
        return self.train_now(carry, jobs, x0, key, data)

    def dispatch(self, carry: Any, jobs: Jobs, x: jax.Array, inputs: Any, key: jax.Array, data: Any) -> Any:
        del inputs
        return self.train_now(carry, jobs, x, key, data)

    def train_now(self, carry: Any, jobs: Jobs, x: jax.Array, key: jax.Array, data: Any) -> Any:
        """Trains ``jobs`` from ``x`` and puts their messages in their slots."""
        messages, memory = self.trainer.train(x, jobs, carry.clients, key, data.train)
        pending = put_messages(self.pending(carry.store), jobs.slots, jobs.clients >= 0, messages)
        return carry._replace(clients=memory, store=self.with_pending(carry.store, pending))

    def collect(self, carry: Any, arrivals: Arrivals, inputs: Any, key: jax.Array, data: Any) -> tuple[Any, Any]:
        del inputs, key, data
        return carry, _read(self.pending(carry.store), arrivals)


# ---------------------------------------------------------------------------------------------------- lookahead
class DeferredJobs(NamedTuple):
    """Jobs dispatched but not trained yet (lookahead batching), one row per server step since the last flush."""

    x: jax.Array  # [L, d] the model each row's jobs start from
    row: jax.Array  # int32 [L] each row's dispatch row (its jobs' keys are fold_in(fold_in(key, row), col))
    clients: jax.Array  # int32 [L, D] (-1: none)
    slots: jax.Array  # int32 [L, D]
    cols: jax.Array  # int32 [L, D]
    hp: Any  # the rows' job hyper-parameters ([L] per name)
    steps: jax.Array  # int32 [L, D] local step counts


class LookaheadState(NamedTuple):
    pending: Any  # messages of the trained jobs in flight, [S, ...]
    deferred: DeferredJobs


@dataclasses.dataclass(frozen=True, eq=False)
class Lookahead(TrainAtDispatch):
    """Lookahead batching: record up to ``lookahead`` steps' jobs, train them together when the plan says so.

    Step ``t``'s jobs go to buffer row ``plan.position[t]``; at a step with ``plan.flush[t]`` the filled rows are
    trained in one vmapped call before the step's arrivals are read. Only the filled rows are trained, rounded up to a
    bucket of :func:`~asyncfl_jax.engine.inputs.flush_buckets` (a ``lax.switch`` over static row counts holding the
    training alone: a switch whose branches write the carry would copy it). The initial jobs are trained at once.
    """

    lookahead: int = 2

    def init(self, x0: jax.Array, hp, message_shape: Any, width: int) -> LookaheadState:
        L = self.lookahead
        deferred = DeferredJobs(
            x=jnp.zeros((L, *x0.shape), x0.dtype), row=jnp.zeros((L,), jnp.int32),
            clients=jnp.full((L, width), -1, jnp.int32), slots=jnp.full((L, width), -1, jnp.int32),
            cols=jnp.zeros((L, width), jnp.int32), hp=_per_job(L, hp), steps=jnp.zeros((L, width), jnp.int32))
        return LookaheadState(pending=_zeros(self.num_slots, message_shape), deferred=deferred)

    def pending(self, state: LookaheadState) -> Any:
        return state.pending

    def slot_leaves(self, state: LookaheadState) -> Any:
        return LookaheadState(pending=jax.tree_util.tree_map(lambda _: True, state.pending),
                              deferred=jax.tree_util.tree_map(lambda _: False, state.deferred))

    def with_pending(self, state: LookaheadState, pending: Any) -> LookaheadState:
        return state._replace(pending=pending)

    def dispatch(self, carry: Any, jobs: Jobs, x: jax.Array, inputs: Any, key: jax.Array, data: Any) -> Any:
        """Records step t's jobs, with ``x_t`` and their hyper-parameters, in buffer row ``plan.position``."""
        del key, data
        buf, at = carry.store.deferred, inputs.plan.position
        buf = buf._replace(
            x=buf.x.at[at].set(x), row=buf.row.at[at].set(jobs.row), clients=buf.clients.at[at].set(jobs.clients),
            slots=buf.slots.at[at].set(jobs.slots), cols=buf.cols.at[at].set(jobs.cols),
            hp=jax.tree_util.tree_map(lambda b, v: b.at[at].set(v), buf.hp, jobs.hp),
            steps=buf.steps.at[at].set(jobs.steps))
        return carry._replace(store=carry.store._replace(deferred=buf))

    def collect(self, carry: Any, arrivals: Arrivals, inputs: Any, key: jax.Array, data: Any) -> tuple[Any, Any]:
        carry = jax.lax.cond(inputs.plan.flush, lambda c: self.flush(c, inputs.plan.position, key, data),
                             lambda c: c, carry)
        return carry, _read(carry.store.pending, arrivals)

    def flush(self, carry: Any, position: jax.Array, key: jax.Array, data: Any) -> Any:
        """Trains the buffered jobs (rows ``0 .. position``), each from its row's model, and empties the buffer; the
        cheap O(d) parts (client rule, slot writes) run over the whole buffer with the empty rows masked."""
        buf = carry.store.deferred
        rows, width = buf.clients.shape
        clients = buf.clients.reshape(-1)
        valid = clients >= 0
        clients = self.trainer.constrain(jnp.where(valid, clients, 0))
        row_of_job = jnp.repeat(jnp.arange(rows), width)
        x_jobs = buf.x[row_of_job]
        keys = jax.vmap(lambda r, j: job_keys(key, r, j[None])[0])(buf.row[row_of_job], buf.cols.reshape(-1))
        hp_jobs = jax.tree_util.tree_map(lambda v: v[row_of_job], buf.hp)
        steps = buf.steps.reshape(-1)
        buckets = flush_buckets(self.lookahead)
        bucket = jnp.searchsorted(jnp.asarray(buckets), position + 1)  # the first bucket >= filled rows
        branches = [functools.partial(self._train_first_rows, rows=r, width=width) for r in buckets]
        results = jax.lax.switch(bucket, branches, x_jobs, clients, keys, hp_jobs, steps, data.train)
        messages, memory = self.trainer.messages(x_jobs, clients, valid, results, carry.clients, hp_jobs,
                                                 per_job=True)
        pending = put_messages(carry.store.pending, buf.slots.reshape(-1), valid, messages)
        buf = buf._replace(clients=jnp.full_like(buf.clients, -1))
        return carry._replace(clients=memory, store=LookaheadState(pending=pending, deferred=buf))

    def _train_first_rows(self, x_jobs: jax.Array, clients: jax.Array, keys: jax.Array, hp_jobs, steps, train_data,
                          rows: int, width: int) -> jax.Array:
        """The local results of the jobs of the first ``rows`` buffer rows (``rows x D`` jobs, one vmapped call),
        zero-padded to the whole buffer's ``L x D``."""
        first = rows * width
        x_h, clients_h, keys_h, hp_h, steps_h = jax.tree_util.tree_map(lambda a: a[:first],
                                                                       (x_jobs, clients, keys, hp_jobs, steps))
        results = self.trainer.results(x_h, clients_h, keys_h, hp_h, steps_h, train_data, per_job=True)
        padding = x_jobs.shape[0] - first
        return jnp.concatenate([results, jnp.zeros((padding, *results.shape[1:]), results.dtype)]) if padding \
            else results


# ---------------------------------------------------------------------------------------------------- at arrival
class StartInputs(NamedTuple):
    """What each slot's job in flight was given when it started (arrays with a leading slot axis)."""

    x: jax.Array  # [S, d] its start model
    hp: Any  # its hyper-parameters ([S] per name)
    row: jax.Array  # int32 [S] its dispatch row (key)
    col: jax.Array  # int32 [S] its position in that row (key)
    steps: jax.Array  # int32 [S] its local step count


@dataclasses.dataclass(frozen=True, eq=False)
class TrainAtArrival:
    """Keep each job's inputs in its slot; train it when it arrives (one arrival per step)."""

    trainer: Trainer
    num_slots: int

    def init(self, x0: jax.Array, hp, message_shape: Any, width: int) -> StartInputs:
        del message_shape, width
        S = self.num_slots
        return StartInputs(x=jnp.zeros((S, *x0.shape), x0.dtype), hp=_per_job(S, hp),
                           row=jnp.zeros((S,), jnp.int32), col=jnp.zeros((S,), jnp.int32),
                           steps=jnp.zeros((S,), jnp.int32))

    def slot_leaves(self, state: StartInputs) -> Any:
        return jax.tree_util.tree_map(lambda _: True, state)

    def dispatch_initial(self, carry: Any, jobs: Jobs, x0: jax.Array, key: jax.Array, data: Any) -> Any:
        return self.dispatch(carry, jobs, x0, None, key, data)

    def dispatch(self, carry: Any, jobs: Jobs, x: jax.Array, inputs: Any, key: jax.Array, data: Any) -> Any:
        del inputs, key, data
        store = carry.store
        index = jnp.where(jobs.clients >= 0, jobs.slots, self.num_slots)  # out of range -> dropped

        def put(a: jax.Array, v: jax.Array) -> jax.Array:
            return a.at[index].set(jnp.broadcast_to(v, index.shape + a.shape[1:]), mode="drop")

        store = StartInputs(x=put(store.x, x), hp=jax.tree_util.tree_map(put, store.hp, jobs.hp),
                            row=put(store.row, jobs.row), col=put(store.col, jobs.cols),
                            steps=put(store.steps, jobs.steps))
        return carry._replace(store=store)

    def collect(self, carry: Any, arrivals: Arrivals, inputs: Any, key: jax.Array, data: Any) -> tuple[Any, Any]:
        del inputs
        if arrivals.clients.shape != (1,):
            raise ValueError("TrainAtArrival trains one arrival per step")
        store, slot = carry.store, arrivals.slots[0]
        jobs = Jobs(clients=arrivals.clients, slots=arrivals.slots, row=store.row[slot], cols=store.col[slot][None],
                    hp=jax.tree_util.tree_map(lambda a: a[slot], store.hp), steps=store.steps[slot][None])
        messages, memory = self.trainer.train(store.x[slot], jobs, carry.clients, key, data.train)
        return carry._replace(clients=memory), messages


# ---------------------------------------------------------------------------------------------- choosing a store
StoreFactory = Callable[[Trainer, int], Any]
"""How a program makes its store: ``factory(trainer, num_slots) -> store``; a store class (:class:`TrainAtDispatch`,
:class:`TrainAtArrival`) is one, and :func:`presampled_store` gives the pre-sampled clock's."""

STORE_KINDS: Mapping[str, type] = MappingProxyType(
    {"dispatch": TrainAtDispatch, "lookahead": Lookahead, "arrival": TrainAtArrival})
"""The stores by the names ``make_program(..., store_kind=...)`` accepted before stores were passed as values."""


def presampled_store(lookahead: int = 1) -> StoreFactory:
    """The store of a pre-sampled schedule: train at dispatch (``lookahead == 1``), or lookahead batching over
    ``lookahead`` steps."""
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
        raise ValueError(f"lookahead must be an integer >= 1, got {lookahead!r}")
    return TrainAtDispatch if lookahead == 1 else functools.partial(Lookahead, lookahead=lookahead)


def as_store_factory(store: Any, lookahead: int = 1) -> StoreFactory:
    """``store`` as a :data:`StoreFactory`: a factory as is; the class :class:`Lookahead` (or one of the names of
    :data:`STORE_KINDS`) with ``lookahead`` steps. Anything else is a ``ValueError`` naming what is allowed."""
    if isinstance(store, str):
        if store not in STORE_KINDS:
            raise ValueError(f"store_kind must be one of {sorted(STORE_KINDS)}, got {store!r}")
        store = STORE_KINDS[store]
    if store is Lookahead:
        return functools.partial(Lookahead, lookahead=lookahead)
    if not callable(store):
        raise ValueError("make_store must be a store class (TrainAtDispatch, Lookahead, TrainAtArrival) or a function "
                         f"(trainer, num_slots) -> store, got {store!r}")
    return store
