"""Jobs and their training: what the clocks hand to the stores, and the one vmapped local-training call.

A *job* is client ``i`` training from a model ``x`` it was sent; its result depends only on ``(x, i, key,
hyper-parameters, local step count)``, so it can be trained whenever convenient between its dispatch and its arrival
(see :mod:`asyncfl_jax.engine.stores`). The job at position ``col`` of dispatch row ``row`` uses the key
``fold_in(fold_in(key, row), col)``: row 0 holds the initial jobs, row ``t + 1`` the jobs started during server step
``t`` (from ``x_t``), and the initialization round uses the row :data:`INIT_ROUND_STREAM`. The server's own randomness
at step ``t`` uses ``fold_in(fold_in(key, t + 1), SERVER_STREAM)``. Results therefore do not depend on chunking, on
how replicas are batched, or on when a job is trained.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import UPLOADS, Algorithm, ServerMeta, after, read_rows
from asyncfl_jax.client import LocalConfig, make_local_update
from asyncfl_jax.engine.executors import JobExecutor, VmapJobs
from asyncfl_jax.task import Task

INIT_BATCH = 256  # jobs started before step 0 are trained in groups of this many (bounds memory when all n start)
SERVER_STREAM = 0x7FFFFFFF  # fold_in index of the server's key at each step (job j of a step uses index j)
INIT_ROUND_STREAM = 0x7FFFFFFE  # fold_in row of the initialization round's keys (steps use t + 1 >= 0)


class Jobs(NamedTuple):
    """Jobs that start from one model, as the clock dispatches them (a fixed width ``W``; client -1: none).

    Attributes:
      clients: int32 [W] the clients (-1: no job in this position).
      slots: int32 [W] where each job's message waits until it arrives.
      row: int32 scalar, the dispatch row (the jobs' keys are ``fold_in(fold_in(key, row), cols)``).
      cols: int32 [W] each job's position in its row.
      hp: the jobs' hyper-parameters (scalars; the algorithm may set them from its state when they start).
      steps: int32 [W] their local step counts (the algorithm's ``JobPolicy.steps``; ``local.steps`` otherwise).
    """

    clients: jax.Array
    slots: jax.Array
    row: jax.Array
    cols: jax.Array
    hp: Any
    steps: jax.Array


class Arrivals(NamedTuple):
    """The results that arrive at server step ``t`` (width ``M``; client -1: padding), as the clock says.

    ``record`` holds what the clock records per step (the event clock's trace; empty for a pre-sampled schedule)."""

    clients: jax.Array  # int32 [M]
    slots: jax.Array  # int32 [M] where their messages wait
    staleness: jax.Array  # int32 [M] t - version (0 for padding)
    step: jax.Array  # int32 scalar t
    time: jax.Array  # float32 scalar, the virtual time of the step
    record: Any = ()

    def meta(self, key: jax.Array, counts: jax.Array) -> ServerMeta:
        """The :class:`ServerMeta` of this step (``key``: the run's key; the step's server key is derived;
        ``counts``: int32 [n], every client's number of training examples)."""
        mask = self.clients >= 0
        return ServerMeta(clients=self.clients, mask=mask, staleness=jnp.where(mask, self.staleness, 0),
                          step=self.step, time=self.time, key=server_key(key, self.step + 1),
                          sizes=arrival_sizes(counts, self.clients, mask))


def arrival_sizes(counts: jax.Array, clients: jax.Array, mask: jax.Array) -> jax.Array:
    """float32 [M]: ``counts[clients[k]]`` for the real arrivals, 0 for padding (:attr:`ServerMeta.sizes`)."""
    return jnp.where(mask, counts[jnp.where(mask, clients, 0)], 0).astype(jnp.float32)


def job_keys(key: jax.Array, row: jax.Array, cols: jax.Array) -> jax.Array:
    """``fold_in(fold_in(key, row), col)`` for the jobs ``cols`` of dispatch row ``row``."""
    base = jax.random.fold_in(key, row)
    return jax.vmap(lambda j: jax.random.fold_in(base, j))(cols)


def server_key(key: jax.Array, step_plus_one: jax.Array) -> jax.Array:
    """The server's key at step ``t`` (``step_plus_one = t + 1``)."""
    return jax.random.fold_in(jax.random.fold_in(key, step_plus_one), SERVER_STREAM)


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
    """Local training of jobs and the algorithm's client rule, for one task, algorithm and local setting.

    ``constrain`` places a 1-D array of jobs over the devices (the identity unless jobs are sharded); ``executor``
    lays the jobs' local training out in the program (:mod:`asyncfl_jax.engine.executors`: vmapped, written out one
    after another, or in groups).
    """

    algorithm: Algorithm
    local: LocalConfig
    local_fn: Callable[..., jax.Array]
    constrain: Callable[[jax.Array], jax.Array] = lambda a: a
    executor: JobExecutor = VmapJobs()

    def plan(self, server: Any, clients: jax.Array, hp) -> tuple[Any, jax.Array]:
        """The hyper-parameters and local step counts of jobs that ``clients`` start now (``server``: the state)."""
        policy = self.algorithm.jobs
        job_hp = hp if policy.hparams is None else policy.hparams(server, hp)
        if policy.steps is None:
            return job_hp, jnp.full(clients.shape, self.local.steps, jnp.int32)
        return job_hp, policy.steps(server, clients, hp).astype(jnp.int32)

    def results(self, x: jax.Array, clients: jax.Array, keys: jax.Array, hp, steps: jax.Array, train_data: Any,
                per_job: bool = False) -> jax.Array:
        """The jobs' local-training results, laid out by the executor (one vmapped call by default). ``x`` and ``hp``
        are shared by the jobs, or with ``per_job`` have a leading job axis (jobs of several steps); ``steps`` is
        read only when the algorithm's job policy sets the step counts."""
        shared = 0 if per_job else None
        if self.algorithm.jobs.steps is None:
            return self.executor.map(self.local_fn, (shared, 0, 0, shared, None), x, clients, keys, hp, train_data)
        return self.executor.map(self.local_fn, (shared, 0, 0, shared, None, 0), x, clients, keys, hp, train_data,
                                 steps)

    def messages(self, x: jax.Array, clients: jax.Array, valid: jax.Array, results: jax.Array, memory: Any, hp,
                 per_job: bool = False) -> tuple[Any, Any]:
        """The algorithm's ``client`` rule on each result: the messages and the clients' memory after them.

        Without client memory every job is independent (one vmap). With it, jobs run in dispatch order, so that a
        client dispatched twice at one step (possible with immediate refill) reads the memory its first job left;
        O(d) per job. With ``per_job``, ``x`` and ``hp`` have a leading job axis."""
        client = self.algorithm.client
        if not jax.tree_util.tree_leaves(memory):
            shared = 0 if per_job else None
            messages, _ = jax.vmap(client, in_axes=(shared, 0, None, shared))(x, results, memory, hp)
            return messages, memory

        def one(state, item):
            i, ok, result, x_j, hp_j = item
            # The row is read through a gather and written after it (read_rows, after): with a client index shared
            # by the replicas (one schedule for all), a plain c[i] is a dynamic-slice, and XLA:CPU then copied the
            # whole n x d memory at every job rather than write the row in place.
            row = jax.tree_util.tree_map(lambda c: read_rows(c, i[None])[0], state)
            message, new_row = client(x_j, result, row, hp_j)
            new_row = jax.tree_util.tree_map(lambda new, old: after(jnp.where(ok, new, old), old), new_row, row)
            return jax.tree_util.tree_map(lambda c, r: c.at[i].set(r), state, new_row), message

        if per_job:
            memory, messages = jax.lax.scan(one, memory, (clients, valid, results, x, hp))
        else:
            memory, messages = jax.lax.scan(lambda st, it: one(st, (*it, x, hp)), memory, (clients, valid, results))
        return messages, memory

    def train(self, x: jax.Array, jobs: Jobs, memory: Any, key: jax.Array, train_data: Any) -> tuple[Any, Any]:
        """Trains ``jobs`` (all from ``x``) in one vmapped call: their messages and the clients' memory after them."""
        valid = jobs.clients >= 0
        clients = self.constrain(jnp.where(valid, jobs.clients, 0))
        keys = self.constrain(job_keys(key, jobs.row, jobs.cols))
        results = self.results(x, clients, keys, jobs.hp, jobs.steps, train_data)
        return self.messages(x, clients, valid, results, memory, jobs.hp)


def make_trainer(task: Task, algorithm: Algorithm, local: LocalConfig,
                 constrain: Callable[[jax.Array], jax.Array] | None = None,
                 executor: JobExecutor | None = None, differentiable_steps: bool = False) -> Trainer:
    """The :class:`Trainer` of ``algorithm``'s jobs (with a per-job step count when its job policy sets one;
    ``differentiable_steps``: that count as a masked loop of ``max_steps`` steps, see :func:`make_local_update`);
    ``executor``: how the jobs are laid out (default one vmapped call)."""
    policy = algorithm.jobs
    if algorithm.upload not in UPLOADS:
        raise ValueError(f"{algorithm.name}: upload must be one of {list(UPLOADS)}, got {algorithm.upload!r}")
    if policy.steps is None:
        local_fn = make_local_update(task.model, local, output=algorithm.local_output, loss=task.loss)
    elif policy.max_steps is None:
        raise ValueError(f"{algorithm.name}: its JobPolicy sets steps but not max_steps")
    else:
        local_fn = make_local_update(task.model, local, output=algorithm.local_output, max_steps=policy.max_steps,
                                     loss=task.loss, differentiable_steps=differentiable_steps)
    return Trainer(algorithm, local, local_fn, constrain or (lambda a: a), executor or VmapJobs())


def put_messages(pending: Any, slots: jax.Array, valid: jax.Array, messages: Any) -> Any:
    """Writes the messages of the ``valid`` jobs into their ``slots`` of ``pending`` (the others are dropped)."""
    num_slots = jax.tree_util.tree_leaves(pending)[0].shape[0]
    index = jnp.where(valid, slots, num_slots)  # out of range -> dropped
    return jax.tree_util.tree_map(lambda p, m: p.at[index].set(m, mode="drop"), pending, messages)


def in_groups(fn: Callable[[Any, tuple], tuple[Any, Any]], carry: Any, arrays: tuple[jax.Array, ...],
              fills: tuple[int, ...], size: int) -> tuple[Any, Any]:
    """``lax.scan`` of ``fn(carry, rows) -> (carry, out)`` over ``arrays`` in groups of ``size`` rows (the last group
    padded with ``fills``), so that ``n`` jobs compile to one loop body and never hold more than ``size`` jobs'
    intermediates at once. Returns the final carry and the outputs concatenated over the (padded) rows."""
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
