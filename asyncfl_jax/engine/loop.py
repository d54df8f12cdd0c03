"""The host loop: a prepared :class:`Run`, compiled once, driven chunk by chunk with callbacks.

:func:`prepare_run` validates the options, matches schedules to replicas, builds the program and places its inputs
(all before anything is compiled; :meth:`Run.budget` is known then). :class:`HostLoop` jits the vmapped pieces
(donating the carry), starts from the initial state or a restored one, and runs the chunks of ``eval_every`` steps:
after each chunk it evaluates every replica's model and calls the callbacks (:mod:`asyncfl_jax.engine.callbacks`):
progress, divergence warnings, early stop, checkpoints, metric writers, or the user's own. Scripts and benchmarks use
the same loop (``HostLoop(run, callbacks).run()``), so nothing of the driver is written twice.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from asyncfl_jax import _signals
from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.client import LocalConfig, check_optimizer_hparams
from asyncfl_jax.distributed import check_same_everywhere, largest_everywhere, to_host
from asyncfl_jax.errors import InputError
from asyncfl_jax.engine.budget import MemoryBudget, check_compiled, memory_budget
from asyncfl_jax.engine.executors import make_job_executor
from asyncfl_jax.engine.history import make_history
from asyncfl_jax.engine.hparams import Replica, make_replicas, replica_keys, stack_hparams
from asyncfl_jax.engine.options import EngineOptions
from asyncfl_jax.engine.placement import Placed, Placement, ShardJobs, check_processes
from asyncfl_jax.engine.replica_groups import GroupedChunk, auto_replica_batch, local_flops_per_step
from asyncfl_jax.engine.state import LoopState
from asyncfl_jax.engine.step import Program
from asyncfl_jax.engine.timelines import make_timeline
from asyncfl_jax.option_rules import check_unread_hparams
from asyncfl_jax.precision import cast_task, precision_dtype, precision_scope
from asyncfl_jax.task import Task, task_arrays

MAX_TRAJECTORY_BYTES = 1 << 30  # the largest trajectory (replicas x (steps + 1) x one record) a run may record


def trajectory_function(trajectory: Any) -> Callable[[jax.Array], Any] | None:
    """The record function of the ``trajectory`` option: None or False (off), True (the flat global model), or a
    function of the flat global model returning an array or a pytree of arrays; anything else is refused."""
    if trajectory is None or trajectory is False:
        return None
    if trajectory is True:
        return _flat_model
    if callable(trajectory):
        return trajectory
    raise ValueError(f"trajectory must be True, False/None, or a function of the flat global model (e.g. "
                     f"lambda x: x[:10]), got {trajectory!r}")


def _flat_model(flat: jax.Array) -> jax.Array:
    return flat


def trajectory_shape(record: Callable[[jax.Array], Any], x0: jax.Array, num_replicas: int, num_steps: int,
                     limit: int | None = None) -> Any:
    """The shapes of one record of ``record(x0)`` (``jax.eval_shape``; nothing is compiled), after checking that
    the whole trajectory, ``num_replicas x (num_steps + 1) x`` the record's bytes, stays within ``limit`` (default
    :data:`MAX_TRAJECTORY_BYTES`, 1 GiB: the trajectory is kept in host memory and each chunk's part on the device
    before it is copied out)."""
    limit = MAX_TRAJECTORY_BYTES if limit is None else limit
    try:
        shape = jax.eval_shape(record, jax.ShapeDtypeStruct(x0.shape, x0.dtype))
    except Exception as e:  # noqa: BLE001  (whatever the user's function raises while traced)
        raise ValueError(f"the trajectory function cannot be traced on the flat model (float [{x0.shape[0]}]): "
                         f"{type(e).__name__}: {e}") from None
    leaves = jax.tree_util.tree_leaves(shape)
    if not leaves or not all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves):
        raise ValueError("the trajectory function must return an array or a pytree of arrays, got "
                         f"{jax.tree_util.tree_structure(shape)}")
    per_record = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in leaves)
    total = num_replicas * (num_steps + 1) * per_record
    if total > limit:
        raise InputError(f"the trajectory would take {total / 2**20:.1f} MiB ({num_replicas} replicas x "
                         f"{num_steps + 1} models x {per_record} bytes), more than the limit of {limit / 2**20:.0f} "
                         "MiB: record fewer values (trajectory=lambda x: x[:k], or a summary such as a norm), fewer "
                         "steps or fewer replicas")
    return shape


def _evaluate_replicas(params: Callable[[Any], jax.Array], evaluate: Callable[..., dict[str, jax.Array]],
                       server: Any, data: Any) -> dict[str, jax.Array]:
    """``evaluate(params(server_r), data)`` for every replica ``r`` of the vmapped ``server``: metric -> [R, ...].

    One replica after the other (``lax.map``, not ``vmap``): a replica's evaluation is then the same computation
    whatever the number of replicas beside it (its metrics depend only on its own model)."""
    return jax.lax.map(lambda p: evaluate(p, data), jax.vmap(params)(server))


#: The evaluation of every replica, jitted once for the process: ``params`` (``Algorithm.params``) and ``evaluate``
#: (``Program.evaluate``, a :class:`~asyncfl_jax.task.Evaluator` that compares equal for the same model and loss) are
#: static, so runs of one experiment with the same shapes (the algorithms of the default experiment, the seeds of a
#: sweep run one after the other) trace and compile it once between them.
evaluate_replicas = jax.jit(_evaluate_replicas, static_argnums=(0, 1))


def metric_shapes(program: Program, data: Any, num_clients: int,
                  server_shape: Any = None) -> dict[str, tuple[int, ...]]:
    """The names and shapes of what ``program.evaluate`` returns for one replica (traced, nothing is compiled):
    scalars ``()`` are the run's metrics (``History.metrics``), vectors ``(C,)`` the per-client ones
    (``History.client_metrics``, C = the evaluated clients). Raises ``ValueError`` for any other shape.

    ``server_shape`` (the vmapped server state's shapes, ``Run.carry_shape.server``) traces the evaluation the host
    loop runs (:data:`evaluate_replicas`), so that its trace is reused when it is compiled; without it
    ``program.evaluate`` is traced on ``data.x0`` alone."""
    if server_shape is None:
        shapes = jax.eval_shape(program.evaluate, data.x0, data)
    else:
        traced = evaluate_replicas.trace(program.algorithm.params, program.evaluate, server_shape, data)
        shapes = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in traced.out_info.items()}
    out = {}
    for name, s in shapes.items():
        if len(s.shape) > 1 or (len(s.shape) == 1 and not 1 <= s.shape[0] <= num_clients):
            raise ValueError(f"the evaluator's metric {name!r} has shape {tuple(s.shape)}: a metric must be a scalar "
                             f"or a per-client vector of at most {num_clients} entries")
        out[name] = tuple(int(d) for d in s.shape)
    return out


def check_model_outputs(task: Task) -> None:
    """A ValueError naming ``task.model`` when, for classification (integer labels), the model's output for one
    example is not ``[1, num_classes]`` logits (``jax.eval_shape``: nothing is computed). A model built for another
    number of classes would otherwise train and report accuracies against labels it cannot output."""
    if not np.issubdtype(np.dtype(task.test_y.dtype), np.integer):
        return  # regression: the loss compares output and target shapes itself
    out = jax.eval_shape(task.model.apply_fn, task.model.init_params, task.test_x[:1])
    shape = tuple(getattr(out, "shape", ()))
    if shape != (1, task.num_classes):
        raise ValueError(f"task.model ({task.model.name}) outputs shape {shape} for one example, but the task has "
                         f"{task.num_classes} classes: the model must output [batch, {task.num_classes}] logits "
                         f"(e.g. make_model(..., num_classes={task.num_classes}))")


def check_count(name: str, value: Any, low: int = 1, note: str = "") -> int:
    """``value`` as an int >= ``low``, else a ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{note}, got {value!r}")
    return int(value)


@dataclasses.dataclass
class Run:
    """One experiment, prepared: replicas, timeline, program, placement and the carry's shapes (nothing compiled)."""

    label: str
    task: Task
    algorithm: Algorithm
    local: LocalConfig
    replicas: list[Replica]
    timeline: Any
    program: Program
    placement: Placement
    placed: Placed
    carry_shape: Any
    eval_every: int
    metrics: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # name -> shape (metric_shapes)
    precision: str = "float32"  # the run's float precision (asyncfl_jax.precision)
    trajectory: Any = None  # the shapes of one trajectory record (trajectory_shape), None when off
    replica_batch: int | None = None  # replicas computed together in a chunk (GroupedChunk); None: all of them
    init: Any = dataclasses.field(default=None, repr=False)  # the jitted vmapped init plan traced (or None)
    options: EngineOptions = dataclasses.field(default_factory=EngineOptions)  # the checked engine options

    @property
    def job_executor(self) -> str:
        """How the jobs of a step are laid out (``"vmap"``, ``"unrolled"``, ``"grouped:G"``; engine.executors)."""
        return self.program.trainer.executor.name

    @property
    def num_steps(self) -> int:
        return self.timeline.num_steps

    @property
    def num_chunks(self) -> int:
        return -(-self.num_steps // self.eval_every)

    @property
    def metric_names(self) -> list[str]:
        """The scalar metrics each evaluation records (``History.metrics``), in the evaluator's order."""
        return [k for k, shape in self.metrics.items() if shape == ()]

    @property
    def client_metric_names(self) -> list[str]:
        """The per-client vectors each evaluation records (``History.client_metrics``)."""
        return [k for k, shape in self.metrics.items() if shape != ()]

    def precision_scope(self) -> Any:
        """The context in which the run's arrays exist (``jax.enable_x64`` set to its precision;
        :func:`~asyncfl_jax.precision.precision_scope`)."""
        return precision_scope(self.precision)

    def budget(self) -> MemoryBudget:
        """The memory the run's state and data need (per device when placed over several)."""
        from asyncfl_jax.engine.activations import run_activation_bytes  # noqa: PLC0415

        return dataclasses.replace(memory_budget(self.carry_shape, self.placed.data, len(self.replicas),
                                                 self.placed.carry), activations=run_activation_bytes(self))


def prepare_run(task: Task, algorithm: Algorithm, schedules: Any, local: LocalConfig | None = None,
                seeds: Sequence[int] = (0,), hparams: Mapping[str, Any] | None = None,
                eval_every: int | None = None, label: str | None = None, placement: Placement | None = None, *,
                replicas: Sequence[Replica] | None = None, **options: Any) -> Run:
    """:func:`plan` with the engine options as keywords (``lookahead=4``, ``replica_batch=2``...: the fields of
    :class:`~asyncfl_jax.engine.options.EngineOptions`; see :func:`~asyncfl_jax.engine.simulate.simulate`).
    ``placement``: a placement object (:func:`~asyncfl_jax.engine.placement.make_placement`) instead of the
    ``shard_*`` switches."""
    if placement is not None and placement.name:
        options = {**options, placement.name: True}
    return plan(task, algorithm, schedules, EngineOptions.from_keywords(options, "prepare_run()"), local=local,
                seeds=seeds, hparams=hparams, eval_every=eval_every, label=label, replicas=replicas)


def plan(task: Task, algorithm: Algorithm, schedules: Any, options: EngineOptions | None = None, *,
         local: LocalConfig | None = None, seeds: Sequence[int] = (0,), hparams: Mapping[str, Any] | None = None,
         eval_every: int | None = None, label: str | None = None,
         replicas: Sequence[Replica] | None = None) -> Run:
    """The one planning pass: checks the engine ``options`` (:class:`~asyncfl_jax.engine.options.EngineOptions`,
    each rule once), matches schedules to replicas, builds the program and places its inputs; returns the
    :class:`Run`, complete (nothing is compiled; :meth:`Run.budget` is known). ``simulate``, ``prepare_run``, the
    configuration's runs (:func:`~asyncfl_jax.experiment.run_experiment`) and ``asyncfl run`` all come here.

    ``replicas`` (optional) gives the replicas directly (e.g. from :func:`make_replicas`) instead of ``seeds`` x
    ``hparams``; schedules given one per seed are then matched to the replicas' distinct seeds in order. The task is
    converted to the options' precision (:func:`~asyncfl_jax.precision.cast_task`) inside the precision's scope."""
    options = (options or EngineOptions()).checked()
    with precision_scope(options.precision):
        return _build_run(task, algorithm, schedules, local, seeds, hparams, eval_every, label, replicas, options)


def default_replica_batch(num_replicas: int, timeline: Any, task: Task, local: LocalConfig) -> int | None:
    """The replica grouping of a run on one device that does not set ``replica_batch``: all replicas together (None)
    on an accelerator; on a CPU, groups sized from the local training of a server step
    (:func:`~asyncfl_jax.engine.replica_groups.auto_replica_batch`)."""
    schedules = getattr(timeline, "schedules", None)
    jobs = float(np.mean(schedules[0].uploads_per_step)) if schedules else 1.0  # the event clock: one per step
    work = local_flops_per_step(task.num_params, jobs, local.steps, local.batch_size or 32)
    return auto_replica_batch(num_replicas, jax.default_backend(), work)


def replica_grouping(options: EngineOptions, num_replicas: int, timeline: Any, task: Task,
                     local: LocalConfig) -> int | None:
    """The run's replica groups (None: every replica together, the plain vmap): the ``replica_batch`` option when
    given (a group of every replica is the plain vmap), none when placed over several devices, else the backend's
    default (:func:`default_replica_batch`)."""
    if options.replica_batch is not None:
        return None if options.replica_batch >= num_replicas else options.replica_batch
    if options.placement.name:  # shard_*: the placement lays the replicas out
        return None
    return default_replica_batch(num_replicas, timeline, task, local)


def _replicas_and_local(algorithm: Algorithm, local: LocalConfig | None, seeds: Sequence[int],
                        hparams: Mapping[str, Any] | None,
                        replicas: Sequence[Replica] | None) -> tuple[list[Replica], list[int], LocalConfig]:
    """The replicas (``seeds`` x ``hparams``, or those given), their distinct seeds and the local setting, checked
    against each other (momentum turned on when a replica sets it)."""
    local = local or LocalConfig()
    if replicas is None:
        replicas = make_replicas(algorithm, seeds, hparams)
    else:
        replicas = list(replicas)
        seeds = list(dict.fromkeys(r.seed for r in replicas))
    local.validate()
    check_optimizer_hparams(local, replicas)
    check_unread_hparams(algorithm, local, replicas)  # a swept or set option the algorithm does not read
    if local.use_momentum is False and any(r.hparams["momentum"] != 0 for r in replicas):
        local = dataclasses.replace(local, use_momentum=True)
    return replicas, list(seeds), local


def _build_run(task: Task, algorithm: Algorithm, schedules: Any, local: LocalConfig | None, seeds: Sequence[int],
               hparams: Mapping[str, Any] | None, eval_every: int | None, label: str | None,
               replicas: Sequence[Replica] | None, options: EngineOptions) -> Run:
    check_model_outputs(task)
    placement, precision = options.placement, options.precision
    replicas, seeds, local = _replicas_and_local(algorithm, local, seeds, hparams, replicas)
    eval_every = check_count("eval_every", default_eval_every(schedules) if eval_every is None else eval_every)
    timeline = make_timeline(schedules, seeds, replicas, task.num_clients, eval_every, options.lookahead)
    placement.check(len(replicas), task.num_clients)
    check_processes(placement)
    task = cast_task(task, precision)
    shards = jax.device_count() if isinstance(placement, ShardJobs) else 1
    executor = make_job_executor(options.job_executor, task.model, task.train.features[:1], shards=shards)
    program = timeline.program(task, algorithm, local, placement.constrain_jobs, executor)
    data = task_arrays(task)
    record, record_shape = trajectory_function(options.trajectory), None
    if record is not None:
        record_shape = trajectory_shape(record, data.x0, len(replicas), timeline.num_steps)
        program = dataclasses.replace(program, record=record)
    hp, keys = stack_hparams(replicas, precision_dtype(precision)), replica_keys(replicas)
    check_same_everywhere("run inputs (data, schedules or clocks, seeds, hyper-parameters)",
                          (hp, keys, data, timeline.inputs))
    # Traced once here for the carry's shapes; the host loop compiles this same jitted function, whose trace (and
    # lowering) JAX then reuses, when the placement adds no shardings (init_jit = {}).
    init = jax.jit(jax.vmap(program.init, in_axes=(timeline.input_axes, 0, 0, None)))
    carry_shape = init.trace(timeline.inputs, hp, keys, data).out_info
    placed = placement.place(carry_shape, hp, keys, data, timeline.inputs, timeline.input_axes, program)
    metrics = metric_shapes(program, data, task.num_clients, carry_shape.server)
    return Run(label or algorithm.name, task, algorithm, local, replicas, timeline, program, placement, placed,
               carry_shape, eval_every, metrics, precision, record_shape,
               replica_grouping(options, len(replicas), timeline, task, local), init=init, options=options)


def default_eval_every(schedules: Any) -> int:
    """``eval_every`` when none is given: :data:`~asyncfl_jax.algorithms.defaults.EVAL_POINTS` (30) evaluations per
    run, ``ceil(T / 30)`` server steps apart, as ``asyncfl run`` and a configuration file do."""
    from asyncfl_jax.algorithms.defaults import eval_every_for

    items = [schedules] if hasattr(schedules, "num_steps") else list(schedules)
    if not items or not all(isinstance(getattr(c, "num_steps", None), numbers.Integral) for c in items):
        return 1  # make_timeline refuses what is not a schedule or an event clock, with its own message
    return eval_every_for(int(max(c.num_steps for c in items)))


@dataclasses.dataclass
class ChunkUpdate:
    """What a callback is told after each chunk: the evaluation at ``step`` of every replica.

    Attributes:
      label: the run's name.
      step: server steps done; ``num_steps``: the run's total.
      steps_done: server steps in this chunk.
      seconds: wall time of the chunk's compiled program (its evaluation and compilation excluded).
      metrics: name -> float array [R], this evaluation of every replica (NaN for a diverged one); the names are
        whatever the task's evaluator returns (``Run.metric_names``).
      client_metrics: name -> float array [R, C], the per-client metrics of the evaluated clients
        (``Task.eval_client_ids``); empty without a per-client test split.
      replicas: the replicas (seed and hyper-parameters of each).
      diverged_at: int [R], the step at which each replica diverged (-1: finite).
      newly_diverged: replicas whose divergence was found in this chunk.
      loop: the :class:`HostLoop` (``loop.history()`` is the History so far).
    """

    label: str
    step: int
    num_steps: int
    steps_done: int
    seconds: float
    metrics: dict[str, np.ndarray]
    replicas: list[Replica]
    diverged_at: np.ndarray
    newly_diverged: list[int]
    loop: "HostLoop"
    client_metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def history(self) -> Any:
        """The :class:`~asyncfl_jax.results.History` of the evaluations so far."""
        return self.loop.history()


def chunk_function(fn: Callable[..., Any], in_axes: tuple[Any, ...], replica_batch: int | None, num_replicas: int,
                   jit_kwargs: Mapping[str, Any]) -> Any:
    """The jitted chunk over the replica axis (the carry donated): the plain vmap, or with ``replica_batch = g``
    the vmapped chunk of ``g`` replicas called by the host on each group (:class:`GroupedChunk`)."""
    if replica_batch is None:
        return jax.jit(jax.vmap(fn, in_axes=in_axes), donate_argnums=(0,), **jit_kwargs)
    return GroupedChunk(fn, in_axes, replica_batch, num_replicas)


class HostLoop:
    """Runs a prepared :class:`Run` chunk by chunk (see the module docstring).

    Callbacks are objects with any of ``on_start(loop)``, ``on_chunk(loop, update)``, ``on_interrupt(loop, error)``
    (a ``KeyboardInterrupt`` while the chunks run; may raise another one) and ``on_end(loop, completed)``; a plain
    function is called as ``fn(update)`` after each chunk. A callback may call :meth:`stop` to end the run early.
    """

    def __init__(self, run: Run, callbacks: Sequence[Any] = ()) -> None:
        self.run_spec = run
        self.callbacks = [c if hasattr(c, "on_chunk") or hasattr(c, "on_start") else _FunctionCallback(c)
                          for c in callbacks]
        program, timeline, placed = run.program, run.timeline, run.placed
        if run.init is not None and not placed.init_jit:
            self.init_fn = run.init  # traced by prepare_run: JAX reuses that trace
        else:
            self.init_fn = jax.jit(jax.vmap(program.init, in_axes=(timeline.input_axes, 0, 0, None)),
                                   **placed.init_jit)
        chunk_axes = (0, timeline.chunk_axes, 0, 0, None)
        self.chunk_fns = {frozen: chunk_function(fn, chunk_axes, run.replica_batch, len(run.replicas),
                                                 placed.chunk_jit)
                          for frozen, fn in ((False, program.advance), (True, program.frozen_advance))}
        self.eval_fn = functools.partial(evaluate_replicas, run.algorithm.params, program.evaluate)
        self.record_fn = jax.jit(jax.vmap(program.trajectory_record))  # x_0's record (the trajectory's first)
        self.state: LoopState | None = None
        self.compiled: dict[tuple[int, bool], Any] = {}
        self.loop_compile_seconds = 0.0
        self.excluded_seconds = 0.0

    # ------------------------------------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        state = self.state
        return state.stopped_early or state.next_chunk >= self.run_spec.num_chunks

    def stop(self) -> None:
        """Ends the run after the current chunk (the History says ``stopped_early``; callbacks later in the list
        already see it)."""
        self.state.stopped_early = True

    def initial_state(self, carry: Any = None) -> LoopState:
        """Compiles and runs the initialization (or starts from ``carry``, a vmapped carry of the run's shapes); the
        first evaluation (step 0)."""
        placed = self.run_spec.placed
        t0 = time.perf_counter()
        if carry is None:  # compiled first, so that XLA's memory analysis refuses what cannot fit before it runs
            compiled = self.init_fn.lower(placed.inputs, placed.hp, placed.keys, placed.data).compile()
            check_compiled(compiled, self.run_spec.label, what="initialization")
            _signals.check()
            carry = compiled(placed.inputs, placed.hp, placed.keys, placed.data)
        first = to_host(self.eval_fn(carry.server, placed.data))
        traces = {}
        if self.run_spec.trajectory is not None:  # x_0's record: the trajectory's step axis starts at 0
            traces = {k: [np.asarray(v)[:, None]] for k, v in to_host(self.record_fn(carry.server)).items()}
        return LoopState(
            next_chunk=0, eval_steps=[0], metrics={k: [np.asarray(first[k])] for k in self.run_spec.metrics},
            reported=set(),
            stopped_early=False, compile_seconds=time.perf_counter() - t0, run_seconds=0.0, carry=carry,
            traces=traces)

    def restored(self, state: LoopState) -> LoopState:
        """A restored state with its carry on the devices a fresh run's carry would be (the same programs)."""
        placed = self.run_spec.placed
        t0 = time.perf_counter()
        shardings = None
        if placed.carry is not None:
            shardings = self.init_fn.lower(placed.inputs, placed.hp, placed.keys, placed.data).compile().output_shardings
        state.carry = jax.device_put(state.carry, shardings)
        state.compile_seconds += time.perf_counter() - t0
        return state

    def update_times(self) -> None:
        """Writes the compile and run seconds so far into the state (before it is saved or reported)."""
        now = time.perf_counter()
        self.state.compile_seconds = self._compile_before + self.loop_compile_seconds
        self.state.run_seconds = (self._run_before + now - self._start_wall - self.loop_compile_seconds
                                  - self.excluded_seconds)

    def count_in_run_time(self, seconds: float) -> None:
        """Counts ``seconds`` that a callback spent (which the loop leaves out of ``run_seconds``) in the run time
        after all: the time the loop waited for a checkpoint save belongs to the run."""
        self.excluded_seconds -= seconds

    def history(self) -> Any:
        """The :class:`~asyncfl_jax.results.History` of the evaluations so far."""
        self.update_times()
        return make_history(self.run_spec, self.state)

    # ------------------------------------------------------------------------------------------------ running
    def run(self, state: LoopState | None = None) -> LoopState:
        """Runs the remaining chunks from ``state`` (restored) or from the start; returns the final state (in the
        run's precision scope, :func:`~asyncfl_jax.precision.precision_scope`)."""
        agreeing = jax.process_count() > 1  # every process stops after the same chunk: on the signal they agree on
        if agreeing:
            _signals.start_agreement()
        try:
            with self.run_spec.precision_scope():
                return self._run(state)
        finally:
            if agreeing:
                _signals.end_agreement()

    def _run(self, state: LoopState | None) -> LoopState:
        self.state = self.initial_state() if state is None else self.restored(state)
        self._compile_before, self._run_before = self.state.compile_seconds, self.state.run_seconds
        self._start_wall = time.perf_counter()
        completed = False
        processes = jax.process_count()
        self._call("on_start")
        try:
            while not self.finished:
                _signals.check()  # a signal the command recorded (its handlers only set a flag): stop here
                update = self.run_chunk()
                if processes > 1:
                    _signals.agree(largest_everywhere(_signals.pending() or 0))
                self._call("on_chunk", update)
            _signals.check()
            completed = True
        except KeyboardInterrupt as e:
            self._call("on_interrupt", e)
            raise
        finally:
            self._call("on_end", completed)
        self.update_times()
        return self.state

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            fn = getattr(callback, hook, None)
            if fn is not None:
                t0 = time.perf_counter()
                try:
                    fn(self, *args)
                finally:
                    self.excluded_seconds += time.perf_counter() - t0

    def run_chunk(self) -> ChunkUpdate:
        """One chunk of server steps for every replica, its evaluation, and the new loop state."""
        run, placed, state = self.run_spec, self.run_spec.placed, self.state
        start = state.next_chunk * run.eval_every
        stop = min(start + run.eval_every, run.num_steps)
        part = run.placement.place_chunk(run.timeline.chunk_inputs(placed.inputs, start, stop, state.carry),
                                         run.timeline.chunk_axes)
        frozen = bool(state.reported)  # once a replica has diverged it is frozen (Program.frozen_advance)
        variant = (stop - start, frozen)
        if variant not in self.compiled:
            tc = time.perf_counter()
            compiled = self.chunk_fns[frozen].lower(state.carry, part, placed.hp, placed.keys, placed.data).compile()
            check_compiled(compiled, run.label)  # XLA's own count, temporaries included, before the chunk runs
            self.compiled[variant] = compiled
            self.loop_compile_seconds += time.perf_counter() - tc
            _signals.check()  # a signal during the compilation: stop before the chunk runs
        t0 = time.perf_counter()
        carry, records = self.compiled[variant](state.carry, part, placed.hp, placed.keys, placed.data)
        jax.block_until_ready(carry)
        seconds = time.perf_counter() - t0
        # Gathered from every process in a multi-process run (one collective; every process calls it).
        metrics, diverged, records = to_host((self.eval_fn(carry.server, placed.data), carry.diverged_at, records))
        newly = sorted(set(np.flatnonzero(diverged >= 0).tolist()) - state.reported)
        self.state = dataclasses.replace(  # one assignment: the state is always that of a whole number of chunks
            state, carry=carry, next_chunk=state.next_chunk + 1, eval_steps=[*state.eval_steps, stop],
            metrics={k: [*v, metrics[k]] for k, v in state.metrics.items()}, reported=state.reported | set(newly),
            traces={k: [*state.traces.get(k, []), np.asarray(v)] for k, v in records.items()})
        return ChunkUpdate(run.label, stop, run.num_steps, stop - start, seconds,
                           {k: metrics[k] for k in run.metric_names}, run.replicas, diverged, newly, self,
                           {k: metrics[k] for k in run.client_metric_names})


@dataclasses.dataclass
class _FunctionCallback:
    fn: Callable[[ChunkUpdate], Any]

    def on_chunk(self, loop: HostLoop, update: ChunkUpdate) -> None:
        del loop
        self.fn(update)
