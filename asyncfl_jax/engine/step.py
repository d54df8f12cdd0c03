"""The one scan step and the pure program around it: initialization, the chunk of steps, the freeze of a diverged
replica, evaluation.

Server step ``t`` (:func:`Program.server_step`) is the same for every clock and store:

1. *dispatch*: the clock says which jobs start from ``x_t`` (a pre-sampled dispatch row, or the event clock's
   restarts and returns); the store keeps their work (trains them now, records them for a lookahead flush, or keeps
   their inputs until they arrive);
2. *arrival*: the clock says which results arrive at step ``t``; the store hands over their messages;
3. *server*: the algorithm's ``server`` folds the messages into its state, giving ``x_{t+1}``;
4. *divergence*: the first step whose ``x_{t+1}`` holds a NaN/inf or an entry beyond ``DIVERGENCE_BOUND`` (1e10) is
   recorded.

A chunk is a ``lax.scan`` of that step; :func:`freeze_diverged` wraps a chunk so that a replica that diverged in an
earlier chunk keeps its state (as ``optax.apply_if_finite`` keeps its parameters). The initialization round (ACE,
ACED, MIFA with ``init_round``) and the initial jobs come before step 0 (:meth:`Program.init`). None of these has a
replica axis: the host loop vmaps them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import Algorithm, ServerMeta
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import jobs as jobs_lib
from asyncfl_jax.engine.clocks import PresampledClock
from asyncfl_jax.engine.jobs import (INIT_ROUND_STREAM, SERVER_STREAM, Jobs, Trainer, arrival_sizes, in_groups,
                                     make_trainer)
from asyncfl_jax.engine.stores import StoreFactory, TrainAtDispatch, as_store_factory, presampled_store
from asyncfl_jax.task import Task, TaskArrays, make_evaluator


class Carry(NamedTuple):
    """What the scan carries from step to step."""

    server: Any  # the algorithm's server state
    clients: Any  # the algorithm's per-client state (leading client axis)
    clock: Any  # the clock's state (the event clock's per-client times; () for a pre-sampled schedule)
    store: Any  # the store's state (messages in flight, lookahead buffer, or the inputs of jobs in flight)
    diverged_at: jax.Array  # int32: first server step whose result diverged (NaN/inf, |x| > 1e10), -1 if none


DIVERGENCE_BOUND = 1e10
"""A model with an entry larger than this in absolute value has diverged (as one with a NaN/inf has): no model a
federated run trains has parameters near 1e10, while an exploding one (``client_lr = 1e30``) would otherwise run to
its end with finite, meaningless parameters and no warning."""


def first_divergence(diverged_at: jax.Array, x_next: jax.Array, step: jax.Array) -> jax.Array:
    """``step`` if ``x_next`` is the first diverged model, else ``diverged_at`` unchanged: a model has diverged when
    an entry is NaN or inf or ``max_i |x_i| > DIVERGENCE_BOUND`` (a NaN compares false, so ``max |x| <= bound``
    holds exactly for the finite models within the bound)."""
    within = jnp.max(jnp.abs(x_next)) <= DIVERGENCE_BOUND
    return jnp.where((diverged_at < 0) & ~within, step, diverged_at)


TRAJECTORY_PREFIX = "trajectory/"  # the per-step records of the trajectory: one entry per leaf of the record


def trajectory_entries(record: Any) -> dict[str, jax.Array]:
    """The leaves of one trajectory record as per-step records named ``trajectory/000``, ``trajectory/001``, ...
    (in ``jax.tree_util`` leaf order; :func:`is_trajectory_entry` tells them from the clock's records)."""
    return {f"{TRAJECTORY_PREFIX}{i:03d}": leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(record))}


def is_trajectory_entry(name: str) -> bool:
    """Whether a per-step record is a leaf of the trajectory (not one of the clock's records)."""
    return name.startswith(TRAJECTORY_PREFIX)


def keep_if_diverged(old: Any, new: Any) -> Any:
    """``new``, or ``old`` unchanged for a replica that had already diverged (``old.diverged_at >= 0``)."""
    frozen = old.diverged_at >= 0
    return jax.tree_util.tree_map(lambda o, n: jnp.where(frozen, o, n), old, new)


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """The pure pieces of one experiment (task, algorithm, local training, clock, store), not yet vmapped.

    ``init(inputs, hp, key, data) -> Carry`` (``inputs``: the clock's initial inputs, a
    :class:`~asyncfl_jax.engine.inputs.ScheduleArrays` or the event clock's first tables); ``advance(carry, chunk,
    hp, key, data) -> (Carry, records)`` runs a chunk of server steps (``records``: the clock's per-step records, a
    dict); ``frozen_advance`` does the same but leaves a replica that had diverged unchanged; ``evaluate(flat, data)
    -> metrics``; ``chunk`` / ``frozen_chunk`` are the advances followed by an evaluation of the global model.
    ``data`` is the task's :class:`TaskArrays`, an argument so that compiled programs do not embed the dataset.
    """

    algorithm: Algorithm
    trainer: Trainer
    clock: Any
    store: Any
    num_clients: int
    evaluate: Callable[[jax.Array, TaskArrays], dict[str, jax.Array]]
    init_batch: int = jobs_lib.INIT_BATCH  # the initialization round trains the clients in groups of this many
    record: Callable[[jax.Array], Any] | None = None  # the trajectory: record(x_{t+1}) is a per-step output of step t

    def trajectory_record(self, server: Any) -> dict[str, jax.Array]:
        """``record(params(server))`` as named leaves (:func:`trajectory_entries`); ``{}`` without a trajectory."""
        if self.record is None:
            return {}
        return trajectory_entries(self.record(self.algorithm.params(server)))

    # -------------------------------------------------------------------------------------------- the step
    def server_step(self, carry: Carry, inputs: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        """Server step ``t`` (module docstring): dispatch from ``x_t``, arrivals, ``x_{t+1}``, divergence."""
        algorithm, clock, store = self.algorithm, self.clock, self.store
        x_t = algorithm.params(carry.server)
        server_now = carry.server

        def plan(clients: jax.Array) -> tuple[Any, jax.Array]:
            return self.trainer.plan(server_now, clients, hp)

        def start(c: Carry, jobs: Jobs) -> Carry:
            return store.dispatch(c, jobs, x_t, inputs, key, data)

        carry = clock.dispatch(carry, inputs, plan, start)  # 1. jobs from x_t
        carry, arrivals = clock.arrivals(carry, inputs)  # 2. results of step t
        carry, messages = store.collect(carry, arrivals, inputs, key, data)
        server = algorithm.server(carry.server, messages, arrivals.meta(key, data.train.counts), hp)  # 3. x_{t+1}
        diverged_at = first_divergence(carry.diverged_at, algorithm.params(server), arrivals.step)  # 4.
        records = arrivals.record
        if self.record is not None:  # the trajectory: x_{t+1} (or the user's function of it) as a per-step output
            records = {**records, **self.trajectory_record(server)}
        return carry._replace(server=server, diverged_at=diverged_at), records

    def advance(self, carry: Carry, chunk: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        """A chunk of server steps (one ``lax.scan``)."""

        def body(c: Carry, x: Any) -> tuple[Carry, Any]:
            return self.server_step(c, self.clock.at(chunk, x), hp, key, data)

        return jax.lax.scan(body, carry, self.clock.steps_of(chunk))

    def frozen_advance(self, carry: Carry, chunk: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        """:meth:`advance` with :func:`freeze_diverged`; a frozen replica's trajectory repeats its kept model."""
        new, records = freeze_diverged(self.advance, self.clock)(carry, chunk, hp, key, data)
        if self.record is not None:
            frozen, kept = carry.diverged_at >= 0, self.trajectory_record(carry.server)
            records = {k: jnp.where(frozen, kept[k][None], v) if is_trajectory_entry(k) else v
                       for k, v in records.items()}
        return new, records

    def chunk(self, carry: Carry, chunk: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        """:meth:`advance`, then the evaluation of the global model (joined to the records)."""
        carry, records = self.advance(carry, chunk, hp, key, data)
        return carry, {**self.evaluate(self.algorithm.params(carry.server), data), **records}

    def frozen_chunk(self, carry: Carry, chunk: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        carry, records = self.frozen_advance(carry, chunk, hp, key, data)
        return carry, {**self.evaluate(self.algorithm.params(carry.server), data), **records}

    # -------------------------------------------------------------------------------------------- before step 0
    def init(self, inputs: Any, hp, key: jax.Array, data: TaskArrays) -> Carry:
        """The carry before step 0: the algorithm's states, the initialization round, the initial jobs."""
        algorithm, n, x0 = self.algorithm, self.num_clients, data.x0
        server, clients = algorithm.init(x0, n), algorithm.init_clients(x0, n)
        message_shape = jax.eval_shape(
            lambda: algorithm.client(x0, jnp.zeros_like(x0), jax.tree_util.tree_map(lambda c: c[0], clients), hp)[0])
        job_hp, _ = self.trainer.plan(server, jnp.zeros((1,), jnp.int32), hp)
        store = self.store.init(x0, job_hp, message_shape, self.clock.dispatch_width(inputs))
        carry = Carry(server=server, clients=clients, clock=(), store=store, diverged_at=jnp.int32(-1))
        if algorithm.init_round is not None:
            carry = self.initialization_round(carry, hp, key, data)
        x_0 = algorithm.params(carry.server)  # the schedule's x_0

        def plan(ids: jax.Array) -> tuple[Any, jax.Array]:
            return self.trainer.plan(carry.server, ids, hp)

        def start(c: Carry, jobs: Jobs) -> Carry:
            return self.store.dispatch_initial(c, jobs, x_0, key, data)

        return self.clock.initial_jobs(carry, inputs, plan, start)

    def initialization_round(self, carry: Carry, hp, key: jax.Array, data: TaskArrays) -> Carry:
        """Every client computes its result at ``x0`` and the server applies one step with all n messages.

        Client ``i`` uses the key ``fold_in(fold_in(key, INIT_ROUND_STREAM), i)``. The clients are trained in groups
        of ``init_batch``. When the algorithm's :class:`~asyncfl_jax.algorithms.base.InitRound` can ``absorb`` a
        group, every group but the last is absorbed as it is trained and the server steps with the last one, so no
        n x d buffer of messages exists; else the n messages are gathered and the server takes them in one call.
        The round takes no virtual time."""
        algorithm, trainer, n, size = self.algorithm, self.trainer, self.num_clients, self.init_batch
        server_key = jax.random.fold_in(jax.random.fold_in(key, INIT_ROUND_STREAM), SERVER_STREAM)

        def train_group(c: Carry, ids: jax.Array) -> tuple[Carry, Any, ServerMeta]:
            """The group's messages (ids >= n: padding) and the meta of a server call on them."""
            valid = ids < n
            clients = jnp.where(valid, ids, 0)
            job_hp, steps = trainer.plan(c.server, clients, hp)
            jobs = Jobs(jnp.where(valid, ids, -1), clients, jnp.int32(INIT_ROUND_STREAM), clients, job_hp, steps)
            messages, memory = trainer.train(data.x0, jobs, c.clients, key, data.train)
            group_key = jnp.where(ids[0] == 0, server_key, jax.random.fold_in(server_key, ids[0]))
            meta = ServerMeta(clients=clients, mask=valid, staleness=jnp.zeros(clients.shape, jnp.int32),
                              step=jnp.int32(-1), time=jnp.float32(0.0), key=group_key,
                              sizes=arrival_sizes(data.train.counts, clients, valid))
            return c._replace(clients=memory), messages, meta

        ids = jnp.arange(n, dtype=jnp.int32)
        absorb = algorithm.init_round.absorb
        if absorb is not None:
            last = (n - 1) // size * size  # the first id of the last group

            def absorb_group(c: Carry, rows: tuple[jax.Array]) -> tuple[Carry, None]:
                c, messages, meta = train_group(c, rows[0])
                return c._replace(server=absorb(c.server, messages, meta, hp)), None

            carry = in_groups(absorb_group, carry, (ids[:last],), fills=(n,), size=size)[0]
            tail = ids[last:] if n <= size else jnp.arange(last, last + size, dtype=jnp.int32)
            carry, messages, meta = train_group(carry, tail)
            return carry._replace(server=algorithm.server(carry.server, messages, meta, hp))

        def group(c: Carry, rows: tuple[jax.Array]) -> tuple[Carry, Any]:
            c, messages, _ = train_group(c, rows[0])
            return c, messages

        carry, messages = in_groups(group, carry, (ids,), fills=(n,), size=size)
        messages = jax.tree_util.tree_map(lambda m: m[:n], messages)
        meta = ServerMeta(clients=ids, mask=jnp.ones((n,), bool), staleness=jnp.zeros((n,), jnp.int32),
                          step=jnp.int32(-1), time=jnp.float32(0.0), key=server_key,
                          sizes=data.train.counts.astype(jnp.float32))
        return carry._replace(server=algorithm.server(carry.server, messages, meta, hp))


def freeze_diverged(advance: Callable[..., tuple[Carry, Any]], clock: Any) -> Callable[..., tuple[Carry, Any]]:
    """``advance``, except that a replica that diverged in an earlier chunk keeps its state unchanged (and its
    records say so). It keeps the old state beside the new one (one copy of the state per chunk), so the host loop
    switches to it only once a replica has diverged."""

    def frozen(carry: Carry, chunk: Any, hp, key: jax.Array, data: TaskArrays) -> tuple[Carry, Any]:
        new, records = advance(carry, chunk, hp, key, data)
        return keep_if_diverged(carry, new), clock.freeze_record(records, carry.diverged_at >= 0)

    return frozen


def make_program(task: Task, algorithm: Algorithm, local: LocalConfig, clock: Any,
                 make_store: StoreFactory | str = TrainAtDispatch, num_slots: int = 1, lookahead: int = 1,
                 constrain_jobs: Callable[[jax.Array], jax.Array] | None = None,
                 init_batch: int | None = None, record: Callable[[jax.Array], Any] | None = None,
                 executor: Any = None, differentiable_steps: bool = False, *,
                 store_kind: str | None = None) -> Program:
    """The :class:`Program` of a run: ``clock`` (:class:`PresampledClock` or :class:`InScanClock`) and its store,
    made by ``make_store(trainer, num_slots)``, a factory the caller chooses (:mod:`asyncfl_jax.engine.stores`:
    :class:`TrainAtDispatch`, train at dispatch; :func:`~asyncfl_jax.engine.stores.presampled_store` ``(L)``,
    lookahead batching over ``L`` steps; :class:`~asyncfl_jax.engine.stores.TrainAtArrival`, train at arrival; the
    class ``Lookahead`` takes ``lookahead`` steps). ``store_kind`` (or a string ``make_store``): the same by name,
    ``"dispatch"``, ``"lookahead"`` or ``"arrival"``.
    ``constrain_jobs`` places a 1-D array of jobs over the devices. ``init_batch``: the group size
    of the jobs started before step 0 (default ``engine.jobs.INIT_BATCH``, read now). ``record``: the trajectory's
    function of the flat global model, recorded after every step (None: no trajectory, the program unchanged).
    ``executor``: how the jobs of a step are laid out (:mod:`asyncfl_jax.engine.executors`; default vmapped).
    ``differentiable_steps``: per-job step counts as masked loops (reverse-mode differentiable, see
    :func:`~asyncfl_jax.client.make_local_update`)."""
    if store_kind is not None and make_store is not TrainAtDispatch:
        raise ValueError(f"give the store as make_store or as store_kind, not both (got {make_store!r} and "
                         f"{store_kind!r})")
    make_store = as_store_factory(make_store if store_kind is None else store_kind, lookahead)
    init_batch = jobs_lib.INIT_BATCH if init_batch is None else init_batch
    if isinstance(clock, PresampledClock):
        clock = dataclasses.replace(clock, init_batch=init_batch)
    trainer = make_trainer(task, algorithm, local, constrain_jobs, executor, differentiable_steps=differentiable_steps)
    return Program(algorithm=algorithm, trainer=trainer, clock=clock, store=make_store(trainer, num_slots),
                   num_clients=task.num_clients, evaluate=make_evaluator(task.model, loss=task.loss),
                   init_batch=init_batch, record=record)


def build_program(task: Task, algorithm: Algorithm, local: LocalConfig, num_slots: int, job_sharding: Any = None,
                  lookahead: int = 1, constrain_jobs: Callable[[jax.Array], jax.Array] | None = None,
                  executor: Any = None, differentiable_steps: bool = False) -> Program:
    """The program of a run over a pre-sampled schedule with ``num_slots`` pending slots: train at dispatch, or
    lookahead batching when ``lookahead > 1`` (:func:`~asyncfl_jax.engine.stores.presampled_store`; the steps'
    ``plan`` must then be given, see :func:`~asyncfl_jax.engine.inputs.lookahead_plan`). ``job_sharding`` (a
    sharding of a 1-D array) spreads the jobs trained together at a step over devices (or ``constrain_jobs``, a
    placement's hook, places them)."""
    constrain = constrain_jobs
    if job_sharding is not None:
        constrain = lambda a: jax.lax.with_sharding_constraint(a, job_sharding)  # noqa: E731
    return make_program(task, algorithm, local, PresampledClock(), presampled_store(lookahead), num_slots=num_slots,
                        constrain_jobs=constrain, executor=executor, differentiable_steps=differentiable_steps)


class SimulationOutput(NamedTuple):
    """Result of :func:`make_simulation`'s function: final model, evaluations and divergence step."""

    params: jax.Array  # final global model, flat [d]
    metrics: dict[str, jax.Array]  # each [num_evals] ([num_evals, C] per-client): after steps 0, E, 2E, ..., T
    diverged_at: jax.Array  # int32, -1 if the run stayed finite
    carry: Carry


def make_simulation(task: Task, algorithm: Algorithm, local: LocalConfig, num_steps: int, num_slots: int,
                    eval_every: int) -> Callable[..., SimulationOutput]:
    """The whole simulation as one pure function ``run(schedule_arrays, hparams, key, data) -> SimulationOutput``.

    ``run`` has no Python side effects: ``jax.jit(run)`` compiles it and ``jax.vmap(run, in_axes=(None, 0, 0,
    None))`` runs it for a batch of hyper-parameters and keys. ``data`` is ``task_arrays(task)`` (an argument, so the
    compiled program does not embed the dataset). The model is evaluated after steps 0, E, 2E, ... and after the last
    step (``E = eval_every``). ``hparams`` must hold every name of ``default_hparams`` as a scalar.
    """
    if not 1 <= eval_every:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}")
    program = build_program(task, algorithm, local, num_slots)
    full, rest = divmod(num_steps, eval_every)

    def run(sched: Any, hp: Mapping[str, jax.Array], key: jax.Array, data: TaskArrays) -> SimulationOutput:
        carry = program.init(sched, hp, key, data)
        first = program.evaluate(algorithm.params(carry.server), data)
        blocks = jax.tree_util.tree_map(
            lambda a: a[: full * eval_every].reshape(full, eval_every, *a.shape[1:]), sched.steps)

        def outer(c: Carry, block: Any) -> tuple[Carry, Any]:
            return program.chunk(c, block, hp, key, data)

        carry, metrics = jax.lax.scan(outer, carry, blocks)
        metrics = {k: jnp.concatenate([first[k][None], v]) for k, v in metrics.items()}
        if rest:
            tail = jax.tree_util.tree_map(lambda a: a[full * eval_every:], sched.steps)
            carry, last = program.chunk(carry, tail, hp, key, data)
            metrics = {k: jnp.concatenate([v, last[k][None]]) for k, v in metrics.items()}
        return SimulationOutput(algorithm.params(carry.server), metrics, carry.diverged_at, carry)

    return run
