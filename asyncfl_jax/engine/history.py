"""The :class:`~asyncfl_jax.results.History` of a run, assembled from the host loop's state."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from asyncfl_jax.algorithms.compression import message_bits
from asyncfl_jax.distributed import to_host
from asyncfl_jax.engine.state import LoopState
from asyncfl_jax.engine.step import is_trajectory_entry
from asyncfl_jax.precision import precision_scope
from asyncfl_jax.results import ClientEvaluation, EventClockRecord, History, LookaheadWindows, RunCost
from asyncfl_jax.timing.schedule import Schedule


def make_history(run: Any, state: LoopState) -> History:
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


def _make_history(run: Any, state: LoopState) -> History:
    steps = np.asarray(state.eval_steps)
    timeline, algorithm, task = run.timeline, run.algorithm, run.task
    # Device values are gathered from every process in a multi-process run (a collective: every process builds the
    # History; so does timeline.realized for the event clock's counters).
    final_params, diverged_at = to_host((jax.vmap(algorithm.params)(state.carry.server), state.carry.diverged_at))
    traces = {k: v for k, v in state.traces.items() if not is_trajectory_entry(k)}  # the clock's records
    realized = timeline.realized(traces, state.carry, int(steps[-1]))
    init_uploads = task.num_clients if algorithm.init_round is not None else 0
    payload, index = message_bits(algorithm, int(task.model.num_params))
    job_steps = timeline.job_steps(traces, int(steps[-1]))  # under the event clock; None otherwise
    schedules = realized if timeline.records_schedules else None  # the event clock's (decided during the run)
    windows = timeline.lookahead_info()
    return History(
        label=run.label,
        algorithm=algorithm.name,
        algorithm_options=dict(algorithm.options),
        steps=steps,
        times=np.stack([_times_at(s, steps) for s in realized]),
        uploads=np.stack([_uploads_at(s, steps) + init_uploads for s in realized]),
        metrics={k: np.stack(state.metrics[k], axis=1) for k in run.metric_names},
        seeds=[r.seed for r in run.replicas],
        hparams=[dict(r.hparams) for r in run.replicas],
        labels=replica_labels(run.replicas),
        diverged_at=diverged_at,
        schedule_stats=timeline.summaries(realized),
        num_steps=run.num_steps,
        stopped_early=state.stopped_early,
        precision=run.precision,
        local_steps=local_steps_at(run, realized, steps, job_steps, init_uploads),
        final_params=final_params,
        cost=RunCost(compile_seconds=state.compile_seconds, run_seconds=state.run_seconds,
                     checkpoint_seconds=state.checkpoint_seconds, memory=run.budget().as_dict(),
                     message_bits={"payload": int(payload), "index": int(index)}),
        clients=_client_evaluation(run, state),
        clock=None if schedules is None and job_steps is None else EventClockRecord(schedules, job_steps),
        windows=None if windows is None else LookaheadWindows.from_dict(windows),
        trajectory=trajectory_of(run, state.traces, int(steps[-1])),
    )


def _client_evaluation(run: Any, state: LoopState) -> ClientEvaluation | None:
    """The per-client metrics [R, E, C] of the evaluations of ``state`` and the evaluated clients' ids (None
    without a per-client test split)."""
    ids = run.task.eval_client_ids
    metrics = ({k: np.stack(state.metrics[k], axis=1) for k in run.client_metric_names}
               if run.client_metric_names else None)
    if metrics is None and ids is None:
        return None
    return ClientEvaluation(metrics, None if ids is None else np.asarray(ids, np.int64))


def replica_labels(replicas: list[Any]) -> list[dict[str, Any]] | None:
    """``History.labels``: each replica's label (explicit replicas, :mod:`~asyncfl_jax.engine.replicas`), None when
    no replica has one (the seeds x hyper-parameters shorthand)."""
    if not any(getattr(r, "label", None) for r in replicas):
        return None
    return [dict(r.label or {}) for r in replicas]


def progress_axes(run: Any, state: LoopState) -> dict[str, np.ndarray]:
    """Where every replica stands at the last evaluation of ``state`` on the axes that compare runs with different
    uploads per step: ``time`` (virtual), ``uploads`` and ``local_steps`` (:func:`local_steps_at`), each float [R];
    the History's values, without building the whole History (no parameters copied, no schedule statistics)."""
    with precision_scope(run.precision):
        last = np.asarray(state.eval_steps)[-1:]
        traces = {k: v for k, v in state.traces.items() if not is_trajectory_entry(k)}
        realized = run.timeline.realized(traces, state.carry, int(last[0]))
        init_uploads = run.task.num_clients if run.algorithm.init_round is not None else 0
        job_steps = run.timeline.job_steps(traces, int(last[0]))
        return {"time": np.stack([_times_at(s, last) for s in realized])[:, 0],
                "uploads": np.stack([_uploads_at(s, last) + init_uploads for s in realized])[:, 0],
                "local_steps": local_steps_at(run, realized, last, job_steps, init_uploads)[:, 0]}


def _times_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    """Virtual time after ``steps`` server steps (the initial time for 0)."""
    times = np.concatenate([[schedule.init_time], schedule.step_times])
    return times[np.minimum(steps, schedule.num_steps)].astype(np.float64)  # a frozen clocked replica stops early


def _uploads_at(schedule: Schedule, steps: np.ndarray) -> np.ndarray:
    cumulative = np.concatenate([[0], np.cumsum(schedule.uploads_per_step)])
    return cumulative[np.minimum(steps, schedule.num_steps)].astype(np.int64)


def local_steps_at(run: Any, realized: list[Schedule], steps: np.ndarray, job_steps: np.ndarray | None,
                   init_uploads: int) -> np.ndarray:
    """float [R, E]: the local steps (minibatch gradients) the clients trained for the uploads the server received
    by each evaluation, the initialization round included: the uploads for a gradient upload (one gradient each),
    the cumulative per-job step counts under the event clock (AsyncFedED's adaptive K), ``sum K_i`` over the
    arriving clients with ``local.epochs`` (``K_i = min(local.steps, ceil(epochs ceil(n_i / B)))``), else the
    uploads times ``local.steps``. The measure of client computation on which one-gradient and K-step methods can
    be compared."""
    uploads = np.stack([_uploads_at(s, steps) + init_uploads for s in realized]).astype(np.float64)
    local = run.local
    if run.algorithm.upload == "gradient":
        return uploads
    if job_steps is not None:
        per_step = np.where(job_steps > 0, job_steps, 0).astype(np.float64)
        cumulative = np.concatenate([np.zeros((per_step.shape[0], 1)), np.cumsum(per_step, axis=1)], axis=1)
        return cumulative[:, np.minimum(steps, per_step.shape[1])]
    if local.epochs is None:
        return uploads * local.steps
    counts = np.asarray(run.task.train.counts, np.float64)
    k = np.clip(np.ceil(local.epochs * np.ceil(counts / local.batch_size)), 1, local.steps)  # K_i
    out = []
    for s in realized:
        arrived = np.where(s.arrival_clients >= 0, k[np.maximum(s.arrival_clients, 0)], 0.0).sum(axis=1)
        cumulative = np.concatenate([[0.0], np.cumsum(arrived)]) + (k.sum() if init_uploads else 0.0)
        out.append(cumulative[np.minimum(steps, s.num_steps)])
    return np.stack(out)
