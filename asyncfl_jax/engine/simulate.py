"""``simulate``: an experiment's keywords mapped onto the engine: :func:`~asyncfl_jax.engine.loop.plan` (with the
engine options, :class:`~asyncfl_jax.engine.options.EngineOptions`), the host loop and its callbacks."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.arguments import check_instance
from asyncfl_jax.engine.arguments import check_checkpoints, check_simulate
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine.callbacks import Checkpoints, DivergenceWarnings, ProgressBar, StopWhenAllDiverged
from asyncfl_jax.engine.hparams import Replica
from asyncfl_jax.engine.history import make_history
from asyncfl_jax.engine.loop import HostLoop, Run, plan
from asyncfl_jax.engine.options import EngineOptions
from asyncfl_jax.engine.replicas import ReplicaSpec, explicit_run_inputs
from asyncfl_jax.results import History
from asyncfl_jax.task import Task

logger = logging.getLogger(__name__)


def simulate(task: Task, algorithm: Algorithm, schedules: Any = None, local: LocalConfig | None = None,
             seeds: Sequence[int] = (0,), hparams: Mapping[str, Any] | None = None,
             eval_every: int | None = None, progress: bool = True, label: str | None = None, *,
             checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
             checkpoint_interval: float | None = None, resume: bool = False, callbacks: Sequence[Any] = (),
             final_checkpoint: bool = True, replicas: Sequence[ReplicaSpec] | None = None,
             **options: Any) -> History:
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
      **options: the engine options as keywords (``shard_jobs``, ``shard_replicas``, ``shard_clients``,
        ``lookahead``, ``replica_batch``, ``job_executor``, ``precision``, ``trajectory``): the fields of
        :class:`~asyncfl_jax.engine.options.EngineOptions`, which says what each does; an unknown keyword is a
        ``TypeError`` naming it.
    """
    schedules, explicit = _explicit_replicas(algorithm, schedules, seeds, hparams, replicas)
    check_simulate(task, algorithm, schedules, local, seeds, hparams, eval_every, progress, label, checkpoint_dir,
                   resume, callbacks)  # types first: a clear error naming the argument
    engine = EngineOptions.from_keywords(options).checked()  # each option's rule, before anything is built
    checkpoints = check_checkpoints(checkpoint_dir, checkpoint_every, checkpoint_interval, final_checkpoint, resume)
    run = plan(task, algorithm, schedules, engine, local=local, seeds=seeds, hparams=hparams, eval_every=eval_every,
               label=label, replicas=explicit)
    with run.precision_scope():  # a restored float64 checkpoint needs x64 too
        return run_with_callbacks(run, progress, callbacks, checkpoint_dir, checkpoints, resume)


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


def run_with_callbacks(run: Run, progress: bool, callbacks: Sequence[Any], checkpoint_dir: str | None,
                       checkpoints: tuple[Any, Any, bool], resume: bool) -> History:
    """Checks the memory budget, runs the host loop with the default callbacks (and the checkpoints, restored first
    when ``resume``), and returns the History."""
    budget = run.budget()
    logger.info("%s: %s", run.label, budget.describe())
    budget.check()
    chain = [ProgressBar(progress), DivergenceWarnings(), StopWhenAllDiverged(), *callbacks]
    state = None
    if checkpoint_dir is not None:
        every, interval, at_end = checkpoints
        saver = Checkpoints(checkpoint_dir, run, every, interval, at_end=at_end)
        chain.append(saver)
        state = saver.restore() if resume else None
        if state is not None:
            logger.info("%s: resuming from the checkpoint in %s after server step %d of %d", run.label,
                        checkpoint_dir, state.eval_steps[-1], run.num_steps)
    return make_history(run, HostLoop(run, chain).run(state))
