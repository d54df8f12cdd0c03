"""``simulate``: the keywords of an experiment mapped onto the engine's pieces (prepare, host loop, callbacks)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.arguments import check_instance
from asyncfl_jax.checkpoint import cadence
from asyncfl_jax.engine.arguments import check_simulate
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine.callbacks import Checkpoints, DivergenceWarnings, ProgressBar, StopWhenAllDiverged
from asyncfl_jax.engine.executors import parse_job_executor
from asyncfl_jax.engine.history import make_history
from asyncfl_jax.engine.hparams import Replica
from asyncfl_jax.engine.replicas import ReplicaSpec, explicit_run_inputs
from asyncfl_jax.engine.loop import HostLoop, prepare_run
from asyncfl_jax.engine.placement import make_placement
from asyncfl_jax.precision import check_precision, precision_scope
from asyncfl_jax.results import History
from asyncfl_jax.task import Task

logger = logging.getLogger(__name__)


def simulate(task: Task, algorithm: Algorithm, schedules: Any = None, local: LocalConfig | None = None,
             seeds: Sequence[int] = (0,), hparams: Mapping[str, Any] | None = None,
             eval_every: int | None = None, progress: bool = True, label: str | None = None, shard_jobs: bool = False,
             shard_replicas: bool = False, shard_clients: bool = False, lookahead: int = 1,
             checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
             checkpoint_interval: float | None = None, resume: bool = False, callbacks: Sequence[Any] = (),
             final_checkpoint: bool = True, precision: str = "float32",
             trajectory: bool | Callable[[Any], Any] | None = None, replica_batch: int | None = None,
             job_executor: str = "auto", replicas: Sequence[ReplicaSpec] | None = None) -> History:
    """Runs an experiment (all replicas as one vmapped program) and returns its :class:`History`.

    Args:
      task: model and data.
      algorithm: the federated algorithm.
      schedules: one :class:`~asyncfl_jax.timing.schedule.Schedule` shared by every replica, or one per seed (in the
        order of ``seeds``); or :class:`~asyncfl_jax.timing.clock.EventClock` objects for the in-scan event clock
        (job durations that depend on the training state).
      local: local-training settings (default: ``LocalConfig()``).
      seeds: training seeds; each seed is combined with every point of the hyper-parameter grid.
      hparams: hyper-parameter values; a list sweeps over its values (see :func:`make_replicas`).
      replicas: explicit :class:`~asyncfl_jax.engine.replicas.ReplicaSpec` replicas instead of schedules/seeds/hparams.
      eval_every: evaluate the global model every this many server steps (and at the end); None (default): 30
        evaluations per run, ``ceil(T / 30)`` steps apart, as ``asyncfl run`` and a configuration file do
        (:data:`~asyncfl_jax.algorithms.defaults.EVAL_POINTS`).
      progress: show a progress bar when stderr is a terminal (otherwise at most ten INFO lines per run on the
        ``asyncfl_jax`` logger; see :class:`~asyncfl_jax.engine.callbacks.ProgressBar`). The memory budget and a
        resume are logged at INFO on the ``asyncfl_jax`` logger (silent unless logging is configured).
      label: name of the run in the History (default: the algorithm's name).
      shard_jobs, shard_replicas, shard_clients: spread the jobs of a step, the replicas, or the per-client state
        over all devices (at most one; see :mod:`asyncfl_jax.engine.placement`). Results equal the single-device run
        up to float rounding. ``shard_replicas`` needs a number of replicas, ``shard_clients`` a number of clients,
        that is a multiple of the number of devices.
      lookahead: lookahead batching (``L > 1``, pre-sampled schedules only): the jobs dispatched over up to ``L``
        server steps are trained together in one vmapped call when the schedule shows that none of them is needed
        before (see :func:`lookahead_plan`); ``History.lookahead`` reports the windows. The same results as
        ``L = 1`` up to float rounding (a batched matmul may sum in another order).
      checkpoint_dir: a folder for checkpoints (:class:`~asyncfl_jax.engine.callbacks.Checkpoints`): saved every
        ``checkpoint_interval`` seconds of wall time (default 60, checked after each chunk) or every
        ``checkpoint_every`` chunks, written in the background while the next chunks run; also after the last chunk
        and when Ctrl-C or SIGTERM stops the run (which then raises
        :class:`~asyncfl_jax.checkpoint.SimulationInterrupted`). None: no checkpoints, and the signals keep their
        usual effect. ``History.checkpoint_seconds`` is the time the run waited for saves (in ``run_seconds``).
      checkpoint_every: save every this many chunks (>= 1) instead of by interval.
      checkpoint_interval: seconds of wall time between two saves (> 0; default
        :data:`~asyncfl_jax.checkpoint.DEFAULT_INTERVAL`, 60). At most one of the two; neither is accepted without
        a ``checkpoint_dir``.
      final_checkpoint: also save after the last chunk (default). ``asyncfl run`` turns it off: it saves the finished
        run's History in the checkpoint folder instead (a save under way still finishes).
      resume: continue from the checkpoint in ``checkpoint_dir`` when there is one of this same run (else
        :class:`~asyncfl_jax.checkpoint.CheckpointMismatchError` says what differs); the History then equals that
        of an uninterrupted run bit for bit (not the timings). With ``resume=False`` a checkpoint is replaced.
      callbacks: called after each evaluated chunk (:mod:`asyncfl_jax.engine.callbacks`): a function
        ``fn(update)`` with the :class:`~asyncfl_jax.engine.loop.ChunkUpdate` (``update.metrics``, ``update.step``,
        ``update.history()``...), or an object with ``on_start`` / ``on_chunk`` / ``on_end`` hooks, e.g.
        ``CSVLogger(path)``.
      precision: ``"float32"`` (default) or ``"float64"``: the float precision of the data, the model, the server
        and client states, the updates, the staleness weights, the hyper-parameters and the metrics (see
        :mod:`asyncfl_jax.precision`). The run is made with ``jax_enable_x64`` set to match, for its duration
        only (``jax.enable_x64``; restored afterwards), so a float64 run leaves later float32 runs unchanged.
      trajectory: record the global model at every server step (small runs): ``True`` records the flat model ``x_t``
        [d], a function ``fn(x)`` of the flat model (``task.model.unravel(x)`` gives the parameter pytree) records
        what it returns (an array or a pytree of arrays, e.g. ``lambda x: x[:10]`` or ``lambda x: {"norm":
        jnp.linalg.norm(x)}``). ``History.trajectory`` is then ``[R, T + 1, ...]``, index ``t`` the record of ``x_t``
        (``t = 0``: the initial model). Recorded inside the compiled scan (its per-step outputs; off: the program is
        unchanged) and kept in host memory; refused before compiling when ``R x (T + 1) x`` one record's bytes exceeds
        ``engine.loop.MAX_TRAJECTORY_BYTES`` (1 GiB). Works with any ``eval_every``, ``lookahead`` and with
        checkpoints (the trajectory so far is saved with the state, so a resumed run's trajectory equals the
        uninterrupted one's). A diverged replica's trajectory repeats the model it keeps once it is frozen.
      replica_batch: compute the replicas ``g`` at a time in each chunk (the vmapped chunk of ``g`` replicas,
        called by the host on each group: :mod:`~asyncfl_jax.engine.replica_groups`); ``g`` >= the number of
        replicas: all together. None (default): all together on an accelerator, and on a CPU groups sized from the
        local training of a step (one MLP replica at a time, logistic regression in groups of a few, light steps all
        together), where a vmap over many replicas is slower than the replicas one after another (see
        docs/benchmarks.md). The same results up to float rounding; one device only (not with ``shard_*``).
      job_executor: how the jobs trained together at a step are laid out in the program
        (:mod:`asyncfl_jax.engine.executors`): ``"vmap"`` (one vmapped call), ``"unrolled"`` (written out one after
        another), ``"grouped:G"`` (vmapped groups of ``G``), or ``"auto"`` (default: ``unrolled`` for convolutional
        and recurrent models on the CPU backend, where a vmapped convolution runs as a slow grouped convolution;
        ``vmap`` otherwise). The same results up to float rounding.
    """
    schedules, explicit = _explicit_replicas(algorithm, schedules, seeds, hparams, replicas)
    check_simulate(task, algorithm, schedules, local, seeds, hparams, eval_every, progress, label, shard_jobs,
                   shard_replicas, shard_clients, lookahead, checkpoint_dir, checkpoint_every, resume, callbacks,
                   precision, trajectory, replica_batch)  # types first: a clear error naming the argument
    cadence(checkpoint_every, checkpoint_interval)  # invalid values or both: a ValueError before anything runs
    if not isinstance(final_checkpoint, bool):
        raise TypeError(f"final_checkpoint must be True or False, got {type(final_checkpoint).__name__} "
                        f"{final_checkpoint!r}")
    parse_job_executor(job_executor)
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir to resume from")
    given = [f"{name} = {value!r}" for name, value in (("checkpoint_every", checkpoint_every),
                                                       ("checkpoint_interval", checkpoint_interval)) if value is not None]
    if given and checkpoint_dir is None:
        raise ValueError(f"{given[0]} needs a checkpoint_dir (without one no checkpoint is saved)")
    with precision_scope(check_precision(precision)):  # a restored float64 checkpoint needs x64 too
        return _simulate(task, algorithm, schedules, local, seeds, hparams, eval_every, progress, label,
                         make_placement(shard_jobs, shard_replicas, shard_clients), lookahead, checkpoint_dir,
                         (checkpoint_every, checkpoint_interval, final_checkpoint), resume, callbacks, precision,
                         trajectory, replica_batch, job_executor, explicit)


def _explicit_replicas(algorithm: Algorithm, schedules: Any, seeds: Sequence[int], hparams: Any,
                       replicas: Any) -> tuple[Any, list[Replica] | None]:
    """The per-replica timing and the engine replicas of ``simulate(..., replicas=[...])``; ``schedules``, ``seeds``
    and ``hparams`` must then be left out (they would be ignored). Without ``replicas``: ``schedules`` and None."""
    if replicas is None:
        return schedules, None
    check_instance("algorithm", algorithm, Algorithm, "an Algorithm (e.g. afl.fedbuff(), afl.get_algorithm(name))")
    given = [name for name, value in (("schedules", schedules), ("hparams", hparams)) if value is not None]
    if list(seeds) != [0]:
        given.append("seeds")
    if given:
        raise ValueError(f"replicas= gives each replica its schedule, seed and hyper-parameters; {given[0]} would be "
                         "ignored: leave it out (or drop replicas= for the seeds x hparams shorthand)")
    return explicit_run_inputs(algorithm, replicas)


def _simulate(task: Task, algorithm: Algorithm, schedules: Any, local: LocalConfig | None, seeds: Sequence[int],
              hparams: Mapping[str, Any] | None, eval_every: int | None, progress: bool, label: str | None,
              placement: Any, lookahead: int, checkpoint_dir: str | None, checkpoint_options: tuple[Any, Any, bool],
              resume: bool, callbacks: Sequence[Any], precision: str, trajectory: Any, replica_batch: int | None,
              job_executor: str = "auto", replicas: Sequence[Replica] | None = None) -> History:
    run = prepare_run(task, algorithm, schedules, local, seeds, hparams, eval_every, label, placement, lookahead,
                      replicas=replicas, precision=precision, trajectory=trajectory, replica_batch=replica_batch,
                      job_executor=job_executor)
    budget = run.budget()
    logger.info("%s: %s", run.label, budget.describe())
    budget.check()
    chain = [ProgressBar(progress), DivergenceWarnings(), StopWhenAllDiverged(), *callbacks]
    state = None
    if checkpoint_dir is not None:
        every, interval, at_end = checkpoint_options
        saver = Checkpoints(checkpoint_dir, run, every, interval, at_end=at_end)
        chain.append(saver)
        state = saver.restore() if resume else None
        if state is not None:
            logger.info("%s: resuming from the checkpoint in %s after server step %d of %d", run.label,
                        checkpoint_dir, state.eval_steps[-1], run.num_steps)
    return make_history(run, HostLoop(run, chain).run(state))
