"""The :class:`History` of a run: its evaluations per replica, the run's cost and its feature data (records of
:mod:`asyncfl_jax.results.records`), with the summaries every output is made of (final/best values, the
hyper-parameter points and their statistics over seeds, the rows of ``metrics.csv``, the entry of
``summary.json``)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from asyncfl_jax.results.points import Point, SeedStats, headline_metric, lower_is_better, seed_stats, swept_names
from asyncfl_jax.results.records import (ClientEvaluation, EventClockRecord, LookaheadWindows, RunCost,
                                         grouped_fields)



@dataclasses.dataclass(eq=False, init=False)
class History:
    """Metrics of one experiment (all its replicas) against server step, virtual time and uploads.

    Core attributes (every run has them):
      label: run name (e.g. "fedbuff").
      algorithm: algorithm name; ``algorithm_options`` its static options.
      steps: int [E] server steps at which the model was evaluated (0 = the initial model).
      times: float [R, E] virtual time at those steps, per replica.
      uploads: int [R, E] client results received by then.
      metrics: name -> float [R, E]: whatever the task's evaluator reports (test_accuracy, test_loss, train_loss;
        val_accuracy, val_loss with a validation split; client_accuracy_mean, client_accuracy_worst10, ... with a
        per-client test split, see :func:`asyncfl_jax.task.make_evaluator`).
      seeds: the training seed of each replica; ``hparams`` its hyper-parameters.
      diverged_at: int [R] first server step whose model had a NaN/inf (-1: never).
      schedule_stats: staleness/participation summary of the schedule (one entry, or one per replica).
      num_steps: planned server steps; ``stopped_early`` is True when every replica diverged before the end.
      precision: the run's float precision, ``"float32"`` or ``"float64"`` (:mod:`asyncfl_jax.precision`).
      local_steps: float [R, E] the local steps (minibatch gradients) clients trained for the uploads received by
        each evaluation (one per upload for gradient uploads, ``local.steps`` per upload otherwise, the job's own
        count under the event clock or with ``local.epochs``; :func:`~asyncfl_jax.engine.history.local_steps_at`);
        the client-computation axis of the figures. None for a History from older files.
      final_params: float [R, d] final global models (kept in memory, not written to the CSV).
      cost: :class:`~asyncfl_jax.results.records.RunCost`: compile, run and checkpoint seconds, the memory budget,
        the bits of one upload (``upload_bits`` / ``upload_bits_with_index`` are the cumulative totals).

    Feature data (None when the run did not have the feature):
      clients: :class:`~asyncfl_jax.results.records.ClientEvaluation`, with a per-client test split: each evaluated
        client's metrics [R, E, C] and the clients' ids.
      clock: :class:`~asyncfl_jax.results.records.EventClockRecord`, under the in-scan event clock: the schedule each
        replica went through (not in the History file: ``asyncfl run`` writes them to ``schedules/``) and the local
        step count of the job applied at each server step.
      windows: :class:`~asyncfl_jax.results.records.LookaheadWindows`, with lookahead batching: the steps trained
        together per flush.
      trajectory: with ``simulate(..., trajectory=...)``, the record of the global model at every server step: an
        array ``[R, T + 1, ...]`` (or a pytree of them, as the record function returns), ``[:, t]`` being the record
        of ``x_t`` (``t = 0``: the initial model, after the initialization round). Not in the History file
        (``asyncfl run --trajectory`` writes ``trajectory/<run>.npz``,
        :func:`~asyncfl_jax.results.writing.write_trajectory`).

    The names of the first layout stay readable (read-only properties): ``compile_seconds``, ``run_seconds``,
    ``checkpoint_seconds``, ``memory``, ``message_bits`` (of ``cost``), ``client_metrics``, ``client_ids`` (of
    ``clients``), ``realized_schedules``, ``job_steps`` (of ``clock``) and ``lookahead`` (the dict of ``windows``);
    ``History(...)`` and ``dataclasses.replace`` accept them as keywords too.
    """

    label: str
    algorithm: str
    algorithm_options: dict[str, Any]
    steps: np.ndarray
    times: np.ndarray
    uploads: np.ndarray
    metrics: dict[str, np.ndarray]
    seeds: list[int]
    hparams: list[dict[str, float]]
    diverged_at: np.ndarray
    schedule_stats: list[dict[str, Any]]
    num_steps: int
    stopped_early: bool = False
    precision: str = "float32"
    local_steps: np.ndarray | None = None
    final_params: np.ndarray | None = None
    cost: RunCost = RunCost()
    clients: ClientEvaluation | None = None
    clock: EventClockRecord | None = None
    windows: LookaheadWindows | None = None
    trajectory: Any = None
    labels: list[dict[str, Any]] | None = None

    def __init__(self, label: str, algorithm: str, algorithm_options: dict[str, Any], steps: np.ndarray,
                 times: np.ndarray, uploads: np.ndarray, metrics: dict[str, np.ndarray], seeds: list[int],
                 hparams: list[dict[str, float]], diverged_at: np.ndarray, schedule_stats: list[dict[str, Any]],
                 num_steps: int, stopped_early: bool = False, precision: str = "float32",
                 local_steps: np.ndarray | None = None, final_params: np.ndarray | None = None,
                 cost: RunCost | None = None, clients: ClientEvaluation | None = None,
                 clock: EventClockRecord | None = None, windows: LookaheadWindows | None = None,
                 trajectory: Any = None, labels: list[dict[str, Any]] | None = None, **first_layout: Any) -> None:
        """The fields above; ``first_layout``: flat fields of the first layout (e.g. ``compile_seconds=...``,
        ``client_metrics=...``), each replacing its part of the record
        (:func:`~asyncfl_jax.results.records.grouped_fields`). A field added to the class must be added here too."""
        self.label, self.algorithm, self.algorithm_options = label, algorithm, algorithm_options
        self.steps, self.times, self.uploads, self.metrics = steps, times, uploads, metrics
        self.seeds, self.hparams, self.diverged_at = seeds, hparams, diverged_at
        self.schedule_stats, self.num_steps, self.stopped_early = schedule_stats, num_steps, stopped_early
        self.precision, self.local_steps, self.final_params = precision, local_steps, final_params
        self.trajectory, self.labels = trajectory, labels
        for name, value in grouped_fields(cost, clients, clock, windows, first_layout).items():
            setattr(self, name, value)

    # ------------------------------------------------------------------------------------- the first layout's names
    compile_seconds = property(lambda self: self.cost.compile_seconds, doc="``cost.compile_seconds``.")
    run_seconds = property(lambda self: self.cost.run_seconds, doc="``cost.run_seconds``.")
    checkpoint_seconds = property(lambda self: self.cost.checkpoint_seconds, doc="``cost.checkpoint_seconds``.")
    memory = property(lambda self: self.cost.memory, doc="``cost.memory``.")
    message_bits = property(lambda self: self.cost.message_bits, doc="``cost.message_bits``.")
    client_metrics = property(lambda self: self.clients.metrics if self.clients else None,
                              doc="``clients.metrics`` (None without a per-client test split).")
    client_ids = property(lambda self: self.clients.client_ids if self.clients else None,
                          doc="``clients.client_ids`` (None without a per-client test split).")
    realized_schedules = property(lambda self: self.clock.schedules if self.clock else None,
                                  doc="``clock.schedules`` (None without the event clock).")
    job_steps = property(lambda self: self.clock.job_steps if self.clock else None,
                         doc="``clock.job_steps`` (None without the event clock).")
    lookahead = property(lambda self: self.windows.as_dict() if self.windows else None,
                         doc="``windows`` as the dict ``{\"L\", \"num_windows\", \"mean_window\", \"max_window\", "
                             "\"window_histogram\"}`` (None without lookahead batching).")

    def flat_fields(self) -> dict[str, Any]:
        """Every field in the first (flat) layout, in its order: the core fields and each record's parts under their
        old names (what the History file holds, :func:`~asyncfl_jax.results.history_files.save_history`)."""
        return {name: getattr(self, name) for name in FIRST_LAYOUT}

    @property
    def num_replicas(self) -> int:
        return len(self.seeds)

    @property
    def swept(self) -> list[str]:
        """Hyper-parameters that differ between replicas."""
        return swept_names(self.hparams)

    @property
    def upload_bits(self) -> np.ndarray:
        """float [R, E]: bits uploaded by then (payload only)."""
        bits = (self.message_bits or {"payload": 0})["payload"]
        return self.uploads.astype(np.float64) * bits

    @property
    def upload_bits_with_index(self) -> np.ndarray:
        """float [R, E]: bits uploaded by then, including the index cost of sparse messages."""
        m = self.message_bits or {"payload": 0, "index": 0}
        return self.uploads.astype(np.float64) * (m["payload"] + m["index"])

    def to_reach(self, target: float, metric: str = "test_accuracy", by: str = "upload_bits") -> np.ndarray:
        """float [R]: the first ``by`` (``"upload_bits"``, ``"upload_bits_with_index"``, ``"uploads"``, ``"time"``
        or ``"step"``) at which ``metric`` reached ``target`` (``>=``; ``<=`` for losses), per replica; NaN if never.

        E.g. ``history.to_reach(0.8)`` is the upload volume needed to reach 80% test accuracy (the measure of the
        compressed-FL papers' tables).
        """
        axes = {"upload_bits": self.upload_bits, "upload_bits_with_index": self.upload_bits_with_index,
                "uploads": self.uploads, "time": self.times, "step": np.broadcast_to(self.steps, self.uploads.shape)}
        if by not in axes:
            raise ValueError(f"by must be one of {sorted(axes)}, got {by!r}")
        values = self.metrics[metric]
        reached = values <= target if metric.endswith("loss") else values >= target
        first = np.argmax(reached, axis=1)
        out = np.asarray(axes[by], dtype=np.float64)[np.arange(values.shape[0]), first]
        return np.where(reached.any(axis=1), out, np.nan)

    def final(self, metric: str | None = None) -> np.ndarray:
        """The metric at the last evaluation, per replica (default: :attr:`headline`)."""
        return self.metrics[self._metric(metric)][:, -1]

    def best(self, metric: str | None = None) -> np.ndarray:
        """The best value of the metric over the evaluations, per replica: the largest, or the smallest for a loss
        (NaN/inf evaluations ignored; NaN when none is finite). Default metric: :attr:`headline`."""
        metric = self._metric(metric)
        values = np.asarray(self.metrics[metric], dtype=np.float64)
        values = np.where(np.isfinite(values), values, np.nan)
        reduce = np.nanmin if lower_is_better(metric) else np.nanmax
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows give NaN
            return reduce(values, axis=1)

    @property
    def headline(self) -> str:
        """The metric results are summarised by (:func:`headline_metric`: ``test_accuracy`` when present, else the
        first loss)."""
        return headline_metric(list(self.metrics))

    def _metric(self, metric: str | None) -> str:
        metric = self.headline if metric is None else metric
        if metric not in self.metrics:
            raise KeyError(f"{self.label}: no metric {metric!r}; the History has {sorted(self.metrics)}")
        return metric

    def replica_label(self, r: int) -> dict[str, Any]:
        """Replica ``r``'s label (``{}`` without labels)."""
        return dict(self.labels[r]) if self.labels else {}

    def points(self) -> list[Point]:
        """The hyper-parameter points of the run: replicas grouped by their label and all their hyper-parameter
        values (so by seed within a point), in first-seen order; each point is named by its label and swept
        values."""
        swept = self.swept
        groups: dict[tuple, list[int]] = {}
        for r, h in enumerate(self.hparams):
            key = (tuple(sorted(self.replica_label(r).items(), key=lambda kv: kv[0])), tuple(sorted(h.items())))
            groups.setdefault(key, []).append(r)
        return [Point(i, dict(self.hparams[rs[0]]), {k: self.hparams[rs[0]][k] for k in swept}, tuple(rs),
                      tuple(int(self.seeds[r]) for r in rs), self.replica_label(rs[0]))
                for i, rs in enumerate(groups.values())]

    def point_index(self) -> np.ndarray:
        """int [R]: the point (index into :meth:`points`) of each replica."""
        out = np.zeros(self.num_replicas, dtype=np.int64)
        for p in self.points():
            out[list(p.replicas)] = p.index
        return out

    def point_stats(self, metric: str | None = None, which: str = "final") -> list[SeedStats]:
        """Per point, :class:`SeedStats` of the ``final`` or ``best`` value (:meth:`final`, :meth:`best`) of
        ``metric`` (default: :attr:`headline`) over the point's seeds; diverged seeds are reported apart, never
        averaged in."""
        values = {"final": self.final, "best": self.best}
        if which not in values:
            raise ValueError(f"which must be 'final' or 'best', got {which!r}")
        per_replica = values[which](metric)
        return [seed_stats(per_replica[list(p.replicas)], p.seeds, self.diverged_at[list(p.replicas)])
                for p in self.points()]

    def point_summaries(self, metric: str | None = None) -> list[dict[str, Any]]:
        """The ``points`` list of ``summary.json``: per point its ``hparams``, ``swept`` values, ``name``,
        ``replicas``, ``seeds``, ``final`` and ``best`` (``{"mean", "std", "n"}`` of ``metric`` over the finite,
        non-diverged seeds; None mean/std when n = 0) and ``diverged`` (``[{"seed", "step"}]``)."""
        metric = self._metric(metric)
        out = []
        for p, final, best in zip(self.points(), self.point_stats(metric, "final"), self.point_stats(metric, "best")):
            out.append({
                "point": p.index, "name": p.name, **({"label": p.label} if self.labels else {}),
                "hparams": p.hparams, "swept": p.swept,
                "replicas": list(p.replicas), "seeds": list(p.seeds), "metric": metric,
                "final": {"mean": final.mean, "std": final.std, "n": final.n},
                "best": {"mean": best.mean, "std": best.std, "n": best.n},
                "diverged": [{"seed": s, "step": d} for s, d in final.diverged],
            })
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (replica, evaluation): the rows of ``metrics.csv`` (run, algorithm, replica, seed, the label's
        keys, swept values, point, step, time, uploads, every metric, diverged_at)."""
        out = []
        swept, points = self.swept, self.point_index()
        for r in range(self.num_replicas):
            for e, step in enumerate(self.steps):
                row = {"run": self.label, "algorithm": self.algorithm, "replica": r, "seed": self.seeds[r],
                       **self.replica_label(r)}
                row.update({k: self.hparams[r][k] for k in swept})
                row.update({"point": int(points[r]), "step": int(step), "time": float(self.times[r, e]),
                            "uploads": int(self.uploads[r, e])})
                if self.local_steps is not None:
                    row["local_steps"] = float(self.local_steps[r, e])
                row.update({m: float(v[r, e]) for m, v in self.metrics.items()})
                row["diverged_at"] = int(self.diverged_at[r])
                out.append(row)
        return out

    def to_dataframe(self) -> Any:
        """A pandas DataFrame with one row per (replica, evaluation): the columns of :meth:`rows` (run, algorithm,
        replica, seed, each swept value, point, step, time, uploads, every metric, diverged_at). Needs pandas
        (``pip install -e ".[pandas]"`` from a clone). Group by ``["run", "point", "step"]`` for per-point curves;
        filter ``diverged_at < 0`` first to leave diverged replicas out."""
        from asyncfl_jax.results.tables import histories_dataframe

        return histories_dataframe([self])

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the entry of ``summary.json``)."""
        metric = self.headline
        return {
            "run": self.label,
            "algorithm": self.algorithm,
            "algorithm_options": self.algorithm_options,
            "num_steps": self.num_steps,
            "steps_done": int(self.steps[-1]),
            "stopped_early": self.stopped_early,
            "metric": metric,
            "replicas": [{"seed": s, "hparams": h, **({"label": self.replica_label(r)} if self.labels else {})}
                         for r, (s, h) in enumerate(zip(self.seeds, self.hparams))],
            **{f"final_{m}": _floats(self.final(m)) for m in self.metrics},
            f"best_{metric}": _floats(self.best(metric)),
            "points": self.point_summaries(metric),
            "diverged_at": [int(d) for d in self.diverged_at],
            "schedule": self.schedule_stats,
            "compile_seconds": round(self.compile_seconds, 3),
            "run_seconds": round(self.run_seconds, 3),
            "checkpoint_seconds": round(self.checkpoint_seconds, 3),
            "memory": self.memory,
            "message_bits": self.message_bits,
            "upload_bits": _floats(self.upload_bits[:, -1]) if self.message_bits else None,
            **({"lookahead": self.lookahead} if self.lookahead else {}),
            **({"precision": self.precision} if self.precision != "float32" else {}),
        }


FIRST_LAYOUT = ("label", "algorithm", "algorithm_options", "steps", "times", "uploads", "metrics", "seeds", "hparams",
                "diverged_at", "schedule_stats", "num_steps", "stopped_early", "compile_seconds", "run_seconds",
                "checkpoint_seconds", "memory", "final_params", "message_bits", "realized_schedules", "lookahead",
                "job_steps", "client_metrics", "client_ids", "precision", "trajectory", "local_steps")
"""The fields of the first, flat History layout, in its order (the History file's entries are named and ordered by
it)."""


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64)]
