"""Results: the History of a run, its files on disk and its plots.

Results schema (one output folder per ``asyncfl run``):

* ``config.json``: the resolved configuration (every option, defaults filled in).
* ``environment.json``: what produced the results: versions of Python, asyncfl_jax, jax, jaxlib, flax, optax and
  numpy, the JAX backend, the device kinds and count, the operating system, and the resolved configuration.
* ``metrics.csv``: one row per (run, replica, evaluation) with columns
  ``run, algorithm, replica, seed, <label keys...>, <swept hyper-parameters...>, point, step, time, uploads, local_steps, <metrics...>,
  diverged_at``. ``point`` numbers the replica's hyper-parameter point within its run (0, 1, ... in first-seen
  order; the swept columns name it), ``step`` is the number of server steps applied, ``time`` the virtual time,
  ``uploads`` the number of client results the server has received, ``local_steps`` the local steps (minibatch
  gradients) the clients trained for them (:attr:`History.local_steps`); the metrics are every name of
  ``History.metrics`` (e.g. ``test_accuracy, test_loss, train_loss``); ``diverged_at`` is the server step at which
  the replica's model became NaN/inf (-1: never; a diverged replica's later rows hold its frozen, non-finite values).
* ``summary.json``: per run: algorithm and options, ``metric`` (the headline metric: ``test_accuracy`` when the task
  has it, else the first loss), replicas (seed and hyper-parameters), ``final_<metric>`` per replica for every metric
  and ``best_<metric>`` for the headline one, divergence step per replica (-1: none), ``points`` (per hyper-parameter
  point: its hyper-parameters, swept values, seeds, mean/std/n over its finite non-diverged seeds of the final and
  best headline metric, and its diverged seeds with their steps; see :meth:`History.point_summaries`), staleness and
  participation statistics of the schedule, compile and run seconds; and, at the top level, ``environment`` (as in
  environment.json, without the per-invocation ``command`` and ``started_utc``) and ``config``.
* ``environment.json``: additionally ``git`` (commit and whether tracked files were modified, for the repository
  holding the package or else the working folder; absent outside a repository), ``command`` (``sys.argv``) and
  ``started_utc`` (when this process started writing the results, ISO 8601).
* ``schedules/<run>-seed<s>.npz``: the exact arrival schedule of each run and seed (``Schedule.load``; replay it with
  ``runs[i].schedule_files``).
* ``client_metrics/<run>.npz`` (with a per-client test split, ``data.client_test_fraction > 0``): ``steps``,
  ``seeds``, ``client_ids`` and each per-client metric (``client_accuracy``, ``client_loss``) as float [R, E, C]
  (:func:`write_client_metrics`); their summaries (``client_accuracy_mean``, ``client_accuracy_worst10``, ...) are
  columns of ``metrics.csv``, as are ``val_accuracy`` and ``val_loss`` with a validation split.
* ``accuracy.png``: the headline metric against client uploads, virtual time and local steps trained
  (:func:`plot_accuracy`): one line per (run, hyper-parameter point) with a colour of its own in every panel, the
  mean over its non-diverged seeds with a min-max band over them, one legend, the y-axis fitted to the data and
  the setting in the title (:mod:`asyncfl_jax.figures`).

:func:`load_results` reads a folder back into Histories (see its docstring for what is not recoverable).

* ``checkpoints/<run>/``: ``history.npz`` + ``history.json`` of each finished run (reused by ``asyncfl run --resume``)
  and, while a run is unfinished, its checkpoint (``checkpoint.json`` + the orbax folder ``state-<chunk>/``, see
  :mod:`asyncfl_jax.checkpoint`).

Every file is written atomically (temporary file in the same folder, ``fsync``, then rename).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import os
import platform
import warnings
from typing import Any, Sequence

import numpy as np

from asyncfl_jax.atomic import atomic_file

METRIC_COLUMNS = ("test_accuracy", "test_loss", "train_loss")  # the classification task's metrics (not exhaustive)


def swept_names(hparams: Sequence[dict[str, float]]) -> list[str]:
    """Names of the hyper-parameters whose value differs between replicas."""
    return [k for k in hparams[0] if len({h[k] for h in hparams}) > 1]


def headline_metric(names: Sequence[str]) -> str:
    """The metric a result is summarised by: ``test_accuracy`` when present, else ``test_loss``, else the first name
    ending in ``loss``, else the first name."""
    names = list(names)
    if not names:
        raise ValueError("no metrics to choose a headline metric from")
    for preferred in ("test_accuracy", "test_loss"):
        if preferred in names:
            return preferred
    return next((n for n in names if n.endswith("loss")), names[0])


def lower_is_better(metric: str) -> bool:
    """True for losses (names ending in ``loss``): their best value is the smallest."""
    return metric.endswith("loss")


def point_name(swept: dict[str, float]) -> str:
    """``name=value, ...`` of a point's swept hyper-parameters (``""`` when nothing is swept)."""
    return ", ".join(f"{k}={v:g}" for k, v in swept.items())


def label_name(label: dict[str, Any]) -> str:
    """``delays=lognormal, P=0.5`` of a replica's label (a string label, key ``setting``, by itself)."""
    return ", ".join(str(v) if k == "setting" else f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in label.items())


@dataclasses.dataclass(frozen=True)
class Point:
    """One hyper-parameter point of a run: the replicas that share every hyper-parameter value (they differ by seed).

    Attributes:
      index: position among the run's points (first-seen order of the replicas).
      hparams: every hyper-parameter value of the point; ``swept``: those that differ between the run's points.
      replicas: indices of its replicas (into ``History.seeds``); ``seeds``: their seeds, in the same order.
      label: the label its replicas share (explicit replicas, ``History.labels``); ``{}`` without labels.
    """

    index: int
    hparams: dict[str, float]
    swept: dict[str, float]
    replicas: tuple[int, ...]
    seeds: tuple[int, ...]
    label: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """``alpha=0.3, server_lr=1`` (the swept values), after the label's values (``delays=lognormal``; a string
        label by itself); ``""`` when the run sweeps nothing and has no labels."""
        return ", ".join(filter(None, [label_name(self.label), point_name(self.swept)]))


@dataclasses.dataclass(frozen=True)
class SeedStats:
    """A statistic of one point over its seeds. ``mean``/``std`` (population std, ``ddof=0``) and ``n`` are over
    the seeds that did not diverge and whose value is finite; ``mean``/``std`` are None when ``n == 0`` (e.g. every
    seed diverged). ``diverged``: ``(seed, server step)`` of the point's diverged seeds, never averaged in;
    ``non_finite``: seeds that did not diverge but whose value is NaN/inf (left out too)."""

    mean: float | None
    std: float | None
    n: int
    seeds: tuple[int, ...]
    diverged: tuple[tuple[int, int], ...]
    non_finite: tuple[int, ...] = ()

    def describe(self, digits: int = 4) -> str:
        """``0.8123 ± 0.0040 (n=3 seeds)``, or ``no value (every seed diverged)``."""
        if self.n == 0:
            why = "every seed diverged" if len(self.diverged) == len(self.seeds) else "no finite value"
            return f"no value ({why})"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (n=1 seed)"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} (n={self.n} seeds)"


def seed_stats(values: np.ndarray, seeds: Sequence[int], diverged_at: np.ndarray) -> SeedStats:
    """Mean, std and count of ``values`` (one per seed of a point) over the finite values of the non-diverged
    seeds (``diverged_at < 0``); see :class:`SeedStats`."""
    values = np.asarray(values, dtype=np.float64)
    diverged_at = np.asarray(diverged_at)
    alive = diverged_at < 0
    finite = np.isfinite(values)
    kept = values[alive & finite]
    mean = float(np.mean(kept)) if kept.size else None
    std = float(np.std(kept)) if kept.size else None
    return SeedStats(mean, std, int(kept.size), tuple(int(s) for s in seeds),
                     tuple((int(s), int(d)) for s, d in zip(seeds, diverged_at) if d >= 0),
                     tuple(int(s) for s, a, f in zip(seeds, alive, finite) if a and not f))


@dataclasses.dataclass(eq=False)
class History:
    """Metrics of one experiment (all its replicas) against server step, virtual time and uploads.

    Attributes:
      label: run name (e.g. "fedbuff").
      algorithm: algorithm name; ``algorithm_options`` its static options.
      steps: int [E] server steps at which the model was evaluated (0 = the initial model).
      times: float [R, E] virtual time at those steps, per replica.
      uploads: int [R, E] client results received by then.
      metrics: name -> float [R, E]: whatever the task's evaluator reports (test_accuracy, test_loss, train_loss;
        val_accuracy, val_loss with a validation split; client_accuracy_mean, client_accuracy_worst10, ... with a
        per-client test split, see :func:`asyncfl_jax.task.make_evaluator`).
      seeds: the training seed of each replica; ``hparams`` its hyper-parameters.
      labels: with explicit replicas (``simulate(..., replicas=[ReplicaSpec(...)])``), each replica's label, a dict
        of plain values naming its setting (a column per key in :meth:`rows`, ``to_dataframe()`` and
        ``metrics.csv``); None without labels.
      diverged_at: int [R] first server step whose model had a NaN/inf (-1: never).
      schedule_stats: staleness/participation summary of the schedule (one entry, or one per replica).
      num_steps: planned server steps; ``stopped_early`` is True when every replica diverged before the end.
      compile_seconds: time to compile (including running the initial jobs); ``run_seconds``: time of the scan,
        the evaluations and the waits for checkpoint saves; ``checkpoint_seconds``: the part of ``run_seconds`` the
        run waited for checkpoint saves (0 without checkpoints).
      final_params: float [R, d] final global models (kept in memory, not written to the CSV).
      memory: the memory budget printed before the run (bytes of server, client and in-flight state, data).
      message_bits: bits of one upload, ``{"payload": ..., "index": ...}`` (index: the positions a sparsifying
        compressor sends; 0 otherwise); ``upload_bits`` / ``upload_bits_with_index`` are the cumulative totals.
      realized_schedules: under the in-scan event clock, the schedule each replica went through (its events were
        decided during the run); None with pre-sampled schedules. Not in the History file (``asyncfl run`` writes
        them to ``schedules/``).
      lookahead: with lookahead batching, ``{"L", "num_windows", "mean_window", "max_window", "window_histogram"}``
        (steps trained together per flush; histogram over lengths 1..L); None otherwise.
      job_steps: int [R, T] under the event clock, the local step count of the job applied at each server step
        (AsyncFedED's K); None otherwise.
      client_metrics: with a per-client test split, name -> float [R, E, C] (``client_accuracy``, ``client_loss``):
        each evaluated client's metric on its own test examples at every evaluation; None otherwise.
      client_ids: int [C], the ids of the evaluated clients (the last axis of ``client_metrics``); None otherwise.
      precision: the run's float precision, ``"float32"`` or ``"float64"`` (:mod:`asyncfl_jax.precision`).
      local_steps: float [R, E] the local steps (minibatch gradients) clients trained for the uploads received by
        each evaluation (one per upload for gradient uploads, ``local.steps`` per upload otherwise, the job's own
        count under the event clock or with ``local.epochs``; :func:`~asyncfl_jax.engine.history.local_steps_at`);
        the client-computation axis of the figures. None for a History from older files.
      trajectory: with ``simulate(..., trajectory=...)``, the record of the global model at every server step: an
        array ``[R, T + 1, ...]`` (or a pytree of them, as the record function returns), ``[:, t]`` being the record
        of ``x_t`` (``t = 0``: the initial model, after the initialization round); None otherwise. Not in the
        History file (``asyncfl run --trajectory`` writes ``trajectory/<run>.npz``, :func:`write_trajectory`).
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
    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    memory: dict[str, Any] | None = None
    final_params: np.ndarray | None = None
    message_bits: dict[str, int] | None = None
    realized_schedules: list[Any] | None = None
    lookahead: dict[str, Any] | None = None
    job_steps: np.ndarray | None = None
    client_metrics: dict[str, np.ndarray] | None = None
    client_ids: np.ndarray | None = None
    precision: str = "float32"
    trajectory: Any = None
    local_steps: np.ndarray | None = None
    labels: list[dict[str, Any]] | None = None

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


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64)]


# ---------------------------------------------------------------------------------------------------- files
def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``data`` to ``path`` atomically through :func:`atomic_file` (this module's name for it, so that the
    fault-injection tests that replace ``results.atomic_file`` reach every result file)."""
    with atomic_file(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def save_figure(fig: Any, path: str, dpi: int = 120) -> None:
    """Saves a matplotlib figure as PNG at ``path`` atomically (:func:`atomic_file`) and closes it."""
    import matplotlib.pyplot as plt

    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=dpi)
    plt.close(fig)

def metrics_csv(histories: Sequence[History]) -> str:
    """All histories' rows as CSV text (columns: the union of every history's columns, in first-seen order)."""
    rows = [row for h in histories for row in h.rows()]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def read_metrics_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("History.to_dataframe needs pandas, which is not installed: pip install pandas (or "
                          "pip install -e \".[pandas]\" from a clone)") from None
    return pandas


INTEGER_COLUMNS = ("replica", "seed", "point", "step", "uploads", "diverged_at")


def histories_dataframe(histories: Sequence[History]) -> Any:
    """One pandas DataFrame of every history's :meth:`History.rows` (columns: the union, in first-seen order; a
    column one run lacks, e.g. a hyper-parameter swept only in another run, is NaN in its rows)."""
    pandas = _pandas()
    rows = [row for h in histories for row in h.rows()]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    frame = pandas.DataFrame(rows, columns=columns)
    return frame.astype({c: "int64" for c in INTEGER_COLUMNS if c in frame.columns})


# ---------------------------------------------------------------------------------------------------- loading
_ROW_KEYS = ("run", "algorithm", "replica", "seed", "point", "step", "time", "uploads", "local_steps",
             "diverged_at")


def load_results(folder: str) -> list[History]:
    """The Histories of a results folder written by ``asyncfl run`` (or :func:`write_results`), in run order.

    Each run is rebuilt from ``summary.json`` (algorithm, options, replicas' seeds and hyper-parameters, divergence
    steps, schedule statistics, memory, message bits, lookahead, timings) and ``metrics.csv`` (steps, virtual
    times, uploads and every metric, per replica and evaluation); values are equal to the History the run returned
    (metrics as float64). What these files do not hold is None: ``final_params``, ``realized_schedules`` (the
    event clock's schedules are in ``schedules/``) and ``job_steps``; ``compile_seconds``/``run_seconds`` are
    rounded to milliseconds. When the folder also holds the run's saved History (``checkpoints/<run>/``, written
    when checkpointing was on) and it agrees with the files, that History is returned instead, complete with
    ``final_params`` and ``job_steps``.

    Raises:
      FileNotFoundError: the folder lacks ``summary.json`` or ``metrics.csv`` (an unfinished or foreign folder).
      ValueError: the two files do not fit together (a run's rows are missing or incomplete).
    """
    paths = {name: os.path.join(folder, name) for name in ("summary.json", "metrics.csv")}
    missing = [name for name, path in paths.items() if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(f"{folder} is not a finished results folder: it has no {' and no '.join(missing)} "
                                "(written by asyncfl run when every run has finished)")
    with open(paths["summary.json"]) as f:
        summary = json.load(f)
    rows = read_metrics_csv(paths["metrics.csv"])
    histories = []
    for entry in summary["runs"]:
        history = _history_from_files(entry, [r for r in rows if r["run"] == entry["run"]], paths["metrics.csv"])
        saved = load_history(os.path.join(folder, "checkpoints", entry["run"]))
        chosen = saved if saved is not None and _same_values(saved, history) else history
        trajectory = os.path.join(folder, "trajectory", f"{entry['run']}.npz")
        if os.path.isfile(trajectory):
            chosen = dataclasses.replace(chosen, trajectory=read_trajectory(trajectory))
        histories.append(chosen)
    return histories


def _history_from_files(entry: dict[str, Any], rows: list[dict[str, str]], path: str) -> History:
    """One run's History from its ``summary.json`` entry and its ``metrics.csv`` rows."""
    name = entry["run"]
    seeds = [int(r["seed"]) for r in entry["replicas"]]
    hparams = [dict(r["hparams"]) for r in entry["replicas"]]
    labels = [dict(r["label"]) for r in entry["replicas"]] if any("label" in r for r in entry["replicas"]) else None
    swept = set(swept_names(hparams)) | {k for label in labels or [] for k in label}
    by_replica: dict[int, list[dict[str, str]]] = {}
    for row in rows:
        by_replica.setdefault(int(row["replica"]), []).append(row)
    if sorted(by_replica) != list(range(len(seeds))):
        raise ValueError(f"{path}: run {name!r} has rows for replicas {sorted(by_replica)}, summary.json lists "
                         f"{len(seeds)} replicas")
    steps = [int(row["step"]) for row in by_replica[0]]
    if any([int(row["step"]) for row in by_replica[r]] != steps for r in by_replica):
        raise ValueError(f"{path}: the replicas of run {name!r} were not evaluated at the same steps")
    metric_names = [k for k in rows[0] if k not in _ROW_KEYS and k not in swept
                    and all(row.get(k) not in (None, "") for row in rows)]
    if any(k not in rows[0] for k in ("time", "uploads")) or not metric_names:
        raise ValueError(f"{path}: run {name!r} has no time/uploads/metric columns")
    ordered = [by_replica[r] for r in range(len(seeds))]
    table = lambda key, dtype: np.array([[float(row[key]) for row in rs] for rs in ordered]).astype(dtype)
    return History(
        label=name, algorithm=entry["algorithm"], algorithm_options=entry["algorithm_options"],
        steps=np.asarray(steps, dtype=np.int64), times=table("time", np.float64), uploads=table("uploads", np.int64),
        metrics={m: table(m, np.float64) for m in metric_names}, seeds=seeds, hparams=hparams, labels=labels,
        diverged_at=np.asarray(entry["diverged_at"], dtype=np.int64), schedule_stats=entry["schedule"],
        num_steps=int(entry["num_steps"]), stopped_early=bool(entry["stopped_early"]),
        compile_seconds=float(entry["compile_seconds"]), run_seconds=float(entry["run_seconds"]),
        checkpoint_seconds=float(entry.get("checkpoint_seconds", 0.0)),
        memory=entry.get("memory"), message_bits=entry.get("message_bits"), lookahead=entry.get("lookahead"),
        precision=entry.get("precision", "float32"),
        local_steps=(table("local_steps", np.float64)
                     if all(row.get("local_steps") not in (None, "") for row in rows) else None))


def _same_values(saved: History, rebuilt: History) -> bool:
    """Whether a saved History holds the same evaluations as the one rebuilt from the result files."""
    def equal(a: Any, b: Any) -> bool:
        return np.shape(a) == np.shape(b) and np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                                             equal_nan=True)

    return (saved.label == rebuilt.label and saved.seeds == rebuilt.seeds and saved.hparams == rebuilt.hparams
            and saved.labels == rebuilt.labels
            and set(saved.metrics) == set(rebuilt.metrics) and equal(saved.steps, rebuilt.steps)
            and equal(saved.times, rebuilt.times) and equal(saved.uploads, rebuilt.uploads)
            and equal(saved.diverged_at, rebuilt.diverged_at)
            and all(equal(saved.metrics[k], rebuilt.metrics[k]) for k in saved.metrics))


def write_results(out_dir: str, config: dict[str, Any], histories: Sequence[History], plot: bool = True,
                  environment: dict[str, Any] | None = None) -> list[str]:
    """Writes config.json, environment.json, metrics.csv, summary.json and (optionally) accuracy.png; returns the
    paths. ``environment`` defaults to :func:`environment_info` with :func:`invocation_info` (package versions, JAX
    backend, devices, git state, command line, start time); summary.json embeds it without the per-invocation
    fields (:data:`VOLATILE_ENVIRONMENT`), so that a resumed run writes the same summary.json as an uninterrupted
    one."""
    os.makedirs(out_dir, exist_ok=True)
    environment = {**environment_info(), **invocation_info()} if environment is None else environment
    paths = {
        "config": os.path.join(out_dir, "config.json"),
        "environment": os.path.join(out_dir, "environment.json"),
        "metrics": os.path.join(out_dir, "metrics.csv"),
        "summary": os.path.join(out_dir, "summary.json"),
    }
    write_atomic(paths["config"], json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_atomic(paths["environment"], environment_json(environment, config))
    write_atomic(paths["metrics"], metrics_csv(histories))
    stable = {k: v for k, v in environment.items() if k not in VOLATILE_ENVIRONMENT}
    summary = {"runs": [h.summary() for h in histories], "environment": stable, "config": config}
    write_atomic(paths["summary"], json.dumps(summary, indent=2) + "\n")
    written = list(paths.values())
    if plot:
        from asyncfl_jax.figures import run_settings, setting_title

        png = os.path.join(out_dir, "accuracy.png")
        protocols = run_settings(config)
        plot_accuracy(histories, png, title=setting_title(config),
                      labels=[f"{h.label} ({protocols[h.label]})" if h.label in protocols else h.label
                              for h in histories])
        written.append(png)
    return written


def write_client_metrics(out_dir: str, history: History) -> str | None:
    """Writes ``<out_dir>/client_metrics/<run>.npz`` (atomically) when ``history`` has per-client metrics: ``steps``
    [E], ``seeds`` [R], ``client_ids`` [C] and every per-client metric [R, E, C] (e.g. ``client_accuracy``), as in
    ``History.client_metrics``; returns the path, or None (nothing written) without per-client metrics."""
    if not history.client_metrics:
        return None
    path = os.path.join(out_dir, "client_metrics", f"{history.label}.npz")
    arrays = {"steps": np.asarray(history.steps), "seeds": np.asarray(history.seeds, np.int64),
              "client_ids": np.asarray(history.client_ids, np.int64), **history.client_metrics}
    with atomic_file(path) as f:
        np.savez(f, **arrays)
    return path


TRAJECTORY_KEY = "trajectory"  # the npz entry of a trajectory that is one array (the flat model of --trajectory)


def write_trajectory(out_dir: str, history: History) -> str | None:
    """Writes ``<out_dir>/trajectory/<run>.npz`` (atomically) when ``history`` has a trajectory: ``seeds`` [R] and
    the trajectory: one array ``trajectory`` [R, T + 1, ...] (``asyncfl run --trajectory``: the flat global model
    ``x_t`` of every replica at every step ``t``), or, for a pytree record, one entry per leaf named by its key path
    (``jax.tree_util.keystr``, e.g. ``['norm']``). Returns the path, or None (nothing written) without a trajectory.
    :func:`read_trajectory` reads it back."""
    if history.trajectory is None:
        return None
    path = os.path.join(out_dir, "trajectory", f"{history.label}.npz")
    arrays = {"seeds": np.asarray(history.seeds, np.int64), **_trajectory_arrays(history.trajectory)}
    with atomic_file(path) as f:
        np.savez(f, **arrays)
    return path


def _trajectory_arrays(trajectory: Any) -> dict[str, np.ndarray]:
    import jax

    if isinstance(trajectory, np.ndarray):
        return {TRAJECTORY_KEY: trajectory}
    leaves = jax.tree_util.tree_flatten_with_path(trajectory)[0]
    out = {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}
    if TRAJECTORY_KEY in out or "seeds" in out or len(out) != len(leaves):
        raise ValueError(f"the trajectory's leaves cannot be named apart in a file: {sorted(out)}")
    return out


def read_trajectory(path: str) -> Any:
    """The trajectory of a file written by :func:`write_trajectory`: the array ``[R, T + 1, ...]``, or a dict from
    each leaf's key path to its array for a pytree record."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files if k != "seeds"}
    return arrays[TRAJECTORY_KEY] if list(arrays) == [TRAJECTORY_KEY] else arrays


# ---------------------------------------------------------------------------------------------------- reproducibility
ENVIRONMENT_PACKAGES = (("asyncfl_jax", "asyncfl-jax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"),
                        ("optax", "optax"), ("numpy", "numpy"))


VOLATILE_ENVIRONMENT = ("command", "started_utc")  # per invocation: in environment.json, not in summary.json


def git_state(folder: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` of the git repository holding ``folder`` (dirty: a tracked file differs
    from the commit; untracked files do not count); None when ``folder`` is in no repository, git is missing, or
    it does not answer within ``timeout`` seconds."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=timeout,
                                 check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def invocation_info() -> dict[str, Any]:
    """The per-invocation part of ``environment.json``: ``command`` (``sys.argv``) and ``started_utc`` (now, UTC,
    ISO 8601 to the second)."""
    import datetime
    import sys

    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {"command": list(sys.argv), "started_utc": now.isoformat()}


def environment_info() -> dict[str, Any]:
    """What produced a result: versions of Python, this package, jax, jaxlib, flax, optax and numpy, the JAX backend
    and the kinds of its devices, the operating system, and ``git`` (:func:`git_state` of the repository holding the
    package, else of the working folder; absent outside a repository)."""
    import importlib.metadata as metadata
    import sys

    import jax

    info: dict[str, Any] = {"python": platform.python_version()}
    for module, dist in ENVIRONMENT_PACKAGES:
        version = None
        loaded = sys.modules.get(module)
        if loaded is not None:
            version = getattr(loaded, "__version__", None)
        if version is None:
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "not installed"
        info[module] = str(version)
    devices = jax.devices()
    info.update(jax_backend=jax.default_backend(), device_kinds=sorted({d.device_kind for d in devices}),
                device_count=len(devices), platform=platform.platform())
    package = os.path.dirname(os.path.abspath(__file__))
    git = git_state(package) or git_state(os.getcwd())
    if git is not None:
        info["git"] = git
    return info


def environment_json(environment: dict[str, Any], config: dict[str, Any]) -> str:
    """The text of ``environment.json``: the environment and the resolved configuration."""
    return json.dumps({**environment, "config": config}, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------------- History files
HISTORY_FORMAT = 1


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def save_history(history: History, directory: str, meta: Any = None) -> list[str]:
    """Saves ``history`` as ``history.npz`` (its arrays, bit for bit) and ``history.json`` (everything else, the
    SHA-256 of the npz and ``meta``, any JSON value), both atomically, the JSON last; :func:`load_history` reads them
    back."""
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    array_dicts: dict[str, list[str]] = {}
    for f in dataclasses.fields(History):
        value = getattr(history, f.name)
        if f.name in ("realized_schedules", "trajectory"):  # written as files of their own by the runner
            continue
        if isinstance(value, np.ndarray):
            arrays[f"array__{f.name}"] = value
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            array_dicts[f.name] = list(value)
            arrays.update({f"dict__{f.name}__{k}": v for k, v in value.items()})
        else:
            fields[f.name] = value
    npz = os.path.join(directory, "history.npz")
    with atomic_file(npz) as fh:
        np.savez(fh, **arrays)
    with open(npz, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    record = {"format": HISTORY_FORMAT, "fields": fields, "array_dicts": array_dicts, "npz_sha256": digest,
              "meta": meta}
    path = os.path.join(directory, "history.json")
    write_atomic(path, json.dumps(record, indent=1, default=_json_default) + "\n")
    return [npz, path]


def load_history(directory: str, meta: Any = None) -> History | None:
    """The History saved by :func:`save_history` in ``directory``; None when there is none, it is incomplete, or
    (when ``meta`` is given) it was saved with another ``meta``."""
    path = os.path.join(directory, "history.json")
    npz = os.path.join(directory, "history.npz")
    try:
        with open(path) as f:
            record = json.load(f)
        with open(npz, "rb") as f:
            blob = f.read()
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("format") != HISTORY_FORMAT or hashlib.sha256(blob).hexdigest() != record.get("npz_sha256"):
        return None
    if meta is not None and record.get("meta") != json.loads(json.dumps(meta, default=_json_default)):
        return None
    kwargs = dict(record["fields"])
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        for key in z.files:
            if key.startswith("array__"):
                kwargs[key[len("array__"):]] = z[key]
        for name, keys in record["array_dicts"].items():
            kwargs[name] = {k: z[f"dict__{name}__{k}"] for k in keys}
    return History(**kwargs)


def remove_history(directory: str) -> None:
    """Deletes the History files of ``directory`` (if any)."""
    for name in ("history.json", "history.npz"):  # the record first: a lone npz is never read
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))


# ---------------------------------------------------------------------------------------------------- plots
def point_curves(history: History, metric: str | None = None) -> list[dict[str, Any]]:
    """The curves :func:`plot_accuracy` draws for one History, one per hyper-parameter point: ``label``, ``point``
    (:class:`Point`), ``n`` (seeds averaged), ``mean``/``lo``/``hi`` (float [E]: mean, min and max over the point's
    non-diverged seeds; NaN where none is finite), the x axes ``time``/``step``/``uploads`` (the mean over those
    seeds; over all the point's seeds when every one diverged) and ``diverged`` (``(seed, step)`` pairs)."""
    metric = history._metric(metric)
    out = []
    points = history.points()
    for p in points:
        idx = np.asarray(p.replicas)
        alive = idx[history.diverged_at[idx] < 0]
        values = np.asarray(history.metrics[metric][alive], dtype=np.float64)
        values = np.where(np.isfinite(values), values, np.nan)
        axis_rows = alive if alive.size else idx
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # columns without a finite value give NaN
            mean = np.nanmean(values, axis=0) if alive.size else np.full(len(history.steps), np.nan)
            lo = np.nanmin(values, axis=0) if alive.size else mean
            hi = np.nanmax(values, axis=0) if alive.size else mean
        name = history.label if len(points) == 1 or not p.name else f"{history.label} {p.name}"
        out.append({"label": name, "point": p, "n": int(alive.size), "mean": mean, "lo": lo, "hi": hi,
                    "time": np.mean(history.times[axis_rows], axis=0), "step": np.asarray(history.steps),
                    "uploads": np.mean(history.uploads[axis_rows], axis=0),
                    "diverged": [(int(history.seeds[r]), int(history.diverged_at[r])) for r in idx
                                 if history.diverged_at[r] >= 0]})
    return out


def plot_accuracy(histories: Sequence[History], path: str | None = None, metric: str | None = None,
                  title: str | None = None, band: str = "minmax", axes: Sequence[str] | None = None,
                  labels: Sequence[str] | None = None):
    """The figure comparing the methods of ``histories`` (one or several runs, of one or several results folders):
    ``metric`` (default: each History's :attr:`~History.headline`) against client uploads, virtual time and local
    steps trained, one panel each; one line per (run, hyper-parameter point) with a band over its non-diverged seeds
    (``band``: ``"minmax"``, the default, or ``"std"`` = mean ± std), a colour per method kept across the panels, one legend for
    the figure, the y-axis fitted to the data, ``title`` (e.g. :func:`asyncfl_jax.figures.setting_title` of the
    configuration) above. See :func:`asyncfl_jax.figures.plot_comparison`. Returns the matplotlib figure; with
    ``path`` it is also saved (atomically): ``.png``, ``.pdf``, or both when ``path`` has no suffix."""
    from asyncfl_jax.figures import DEFAULT_AXES, plot_comparison

    return plot_comparison(histories, path, metric=metric, axes=tuple(axes or DEFAULT_AXES), band=band, title=title,
                           labels=labels)
