"""The :class:`~asyncfl_jax.results.History` of a run, assembled from the host loop's state."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from asyncfl_jax import checkpoint
from asyncfl_jax.algorithms.compression import message_bits
from asyncfl_jax.distributed import to_host
from asyncfl_jax.engine.step import is_trajectory_entry
from asyncfl_jax.precision import precision_scope
from asyncfl_jax.results import History
from asyncfl_jax.timing.schedule import Schedule


def make_history(run: Any, state: checkpoint.LoopState) -> History:
    """The History of ``run`` (an :class:`~asyncfl_jax.engine.loop.Run`) after the evaluations of ``state`` (virtual times and uploads read from each replica's
    schedule: the given one, or the one the event clock realized)."""
    with precision_scope(run.precision):
        return _make_history(run, state)


def trajectory_of(run: Any, traces: dict[str, list[np.ndarray]], num_steps: int) -> Any:
    """The recorded trajectory, ``[R, num_steps + 1, ...]`` per leaf of the record (``[:, t]``: the record of
    ``x_t``), or None when the run records none."""
    if run.trajectory is None:
        return None
    treedef = jax.tree_util.tree_structure(run.trajectory)
    leaves = [np.concatenate(traces[f"trajectory/{i:03d}"], axis=1)[:, :num_steps + 1]
              for i in range(treedef.num_leaves)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _make_history(run: Any, state: checkpoint.LoopState) -> History:
    steps = np.asarray(state.eval_steps)
    timeline, algorithm, task = run.timeline, run.algorithm, run.task
    # Device values are gathered from every process in a multi-process run (a collective: every process builds the
    # History; so does timeline.realized for the event clock's counters).
    final_params, diverged_at = to_host((jax.vmap(algorithm.params)(state.carry.server), state.carry.diverged_at))
    traces = {k: v for k, v in state.traces.items() if not is_trajectory_entry(k)}  # the clock's records
    realized = timeline.realized(traces, state.carry, int(steps[-1]))
    init_uploads = task.num_clients if algorithm.init_round is not None else 0
    payload, index = message_bits(algorithm, int(task.model.num_params))
    return History(
        label=run.label,
        algorithm=algorithm.name,
        algorithm_options=dict(algorithm.options),
        steps=steps,
        times=np.stack([_times_at(s, steps) for s in realized]),
        uploads=np.stack([_uploads_at(s, steps) + init_uploads for s in realized]),
        message_bits={"payload": int(payload), "index": int(index)},
        metrics={k: np.stack(state.metrics[k], axis=1) for k in run.metric_names},
        client_metrics=({k: np.stack(state.metrics[k], axis=1) for k in run.client_metric_names}
                        if run.client_metric_names else None),
        client_ids=None if task.eval_client_ids is None else np.asarray(task.eval_client_ids, np.int64),
        seeds=[r.seed for r in run.replicas],
        hparams=[dict(r.hparams) for r in run.replicas],
        diverged_at=diverged_at,
        schedule_stats=timeline.summaries(realized),
        num_steps=run.num_steps,
        stopped_early=state.stopped_early,
        compile_seconds=state.compile_seconds,
        run_seconds=state.run_seconds,
        checkpoint_seconds=state.checkpoint_seconds,
        final_params=final_params,
        memory=run.budget().as_dict(),
        realized_schedules=realized if timeline.records_schedules else None,
        lookahead=timeline.lookahead_info(),
        job_steps=timeline.job_steps(traces, int(steps[-1])),
        precision=run.precision,
        trajectory=trajectory_of(run, state.traces, int(steps[-1])),
    )


def _times_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    """Virtual time after ``steps`` server steps (the initial time for 0)."""
    times = np.concatenate([[schedule.init_time], schedule.step_times])
    return times[np.minimum(steps, schedule.num_steps)].astype(np.float64)  # a frozen clocked replica stops early


def _uploads_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    cumulative = np.concatenate([[0], np.cumsum(schedule.uploads_per_step)])
    return cumulative[np.minimum(steps, schedule.num_steps)].astype(np.int64)
