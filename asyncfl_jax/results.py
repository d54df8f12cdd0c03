"""Results: the History of a run, its files on disk and its plots.

Results schema (one output folder per ``asyncfl run``):

* ``config.json``: the resolved configuration (every option, defaults filled in).
* ``metrics.csv``: one row per (run, replica, evaluation) with columns
  ``run, algorithm, replica, seed, <swept hyper-parameters...>, step, time, uploads, test_accuracy, test_loss,
  train_loss``. ``step`` is the number of server steps applied, ``time`` the virtual time, ``uploads`` the number of
  client results the server has received.
* ``summary.json``: per run: algorithm and options, replicas (seed and hyper-parameters), final and best accuracy,
  divergence step per replica (-1: none), staleness and participation statistics of the schedule, compile and run
  seconds.
* ``schedules/<run>-seed<s>.npz``: the exact arrival schedule of each run and seed (``Schedule.load``; replay it with
  ``runs[i].schedule_files``).
* ``accuracy.png``: test accuracy against virtual time, server step and client uploads (mean over replicas, min-max
  band).

Every file is written atomically (temporary file in the same folder, then rename).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import tempfile
from typing import Any, Sequence

import numpy as np

METRIC_COLUMNS = ("test_accuracy", "test_loss", "train_loss")


def swept_names(hparams: Sequence[dict[str, float]]) -> list[str]:
    """Names of the hyper-parameters whose value differs between replicas."""
    return [k for k in hparams[0] if len({h[k] for h in hparams}) > 1]


@dataclasses.dataclass(eq=False)
class History:
    """Metrics of one experiment (all its replicas) against server step, virtual time and uploads.

    Attributes:
      label: run name (e.g. "fedbuff").
      algorithm: algorithm name; ``algorithm_options`` its static options.
      steps: int [E] server steps at which the model was evaluated (0 = the initial model).
      times: float [R, E] virtual time at those steps, per replica.
      uploads: int [R, E] client results received by then.
      metrics: name -> float [R, E] (test_accuracy, test_loss, train_loss).
      seeds: the training seed of each replica; ``hparams`` its hyper-parameters.
      diverged_at: int [R] first server step whose model had a NaN/inf (-1: never).
      schedule_stats: staleness/participation summary of the schedule (one entry, or one per replica).
      num_steps: planned server steps; ``stopped_early`` is True when every replica diverged before the end.
      compile_seconds: time to compile (including running the initial jobs); ``run_seconds``: time of the scan.
      final_params: float [R, d] final global models (kept in memory, not written to the CSV).
      memory: the memory budget printed before the run (bytes of server, client and in-flight state, data).
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
    memory: dict[str, Any] | None = None
    final_params: np.ndarray | None = None

    @property
    def num_replicas(self) -> int:
        return len(self.seeds)

    @property
    def swept(self) -> list[str]:
        """Hyper-parameters that differ between replicas."""
        return swept_names(self.hparams)

    def final(self, metric: str = "test_accuracy") -> np.ndarray:
        """The metric at the last evaluation, per replica."""
        return self.metrics[metric][:, -1]

    def best(self, metric: str = "test_accuracy") -> np.ndarray:
        return np.nanmax(self.metrics[metric], axis=1)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per (replica, evaluation): the rows of ``metrics.csv``."""
        out = []
        for r in range(self.num_replicas):
            for e, step in enumerate(self.steps):
                row = {"run": self.label, "algorithm": self.algorithm, "replica": r, "seed": self.seeds[r]}
                row.update({k: self.hparams[r][k] for k in self.swept})
                row.update({"step": int(step), "time": float(self.times[r, e]), "uploads": int(self.uploads[r, e])})
                row.update({m: float(self.metrics[m][r, e]) for m in METRIC_COLUMNS})
                out.append(row)
        return out

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the entry of ``summary.json``)."""
        return {
            "run": self.label,
            "algorithm": self.algorithm,
            "algorithm_options": self.algorithm_options,
            "num_steps": self.num_steps,
            "steps_done": int(self.steps[-1]),
            "stopped_early": self.stopped_early,
            "replicas": [{"seed": s, "hparams": h} for s, h in zip(self.seeds, self.hparams)],
            "final_test_accuracy": _floats(self.final("test_accuracy")),
            "best_test_accuracy": _floats(self.best("test_accuracy")),
            "final_train_loss": _floats(self.final("train_loss")),
            "diverged_at": [int(d) for d in self.diverged_at],
            "schedule": self.schedule_stats,
            "compile_seconds": round(self.compile_seconds, 3),
            "run_seconds": round(self.run_seconds, 3),
            "memory": self.memory,
        }


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64)]


# ---------------------------------------------------------------------------------------------------- files
def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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


def write_results(out_dir: str, config: dict[str, Any], histories: Sequence[History], plot: bool = True) -> list[str]:
    """Writes config.json, metrics.csv, summary.json and (optionally) accuracy.png; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "config": os.path.join(out_dir, "config.json"),
        "metrics": os.path.join(out_dir, "metrics.csv"),
        "summary": os.path.join(out_dir, "summary.json"),
    }
    write_atomic(paths["config"], json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_atomic(paths["metrics"], metrics_csv(histories))
    write_atomic(paths["summary"], json.dumps({"runs": [h.summary() for h in histories]}, indent=2) + "\n")
    written = list(paths.values())
    if plot:
        png = os.path.join(out_dir, "accuracy.png")
        plot_accuracy(histories, png)
        written.append(png)
    return written


# ---------------------------------------------------------------------------------------------------- plots
def plot_accuracy(histories: Sequence[History], path: str | None = None, metric: str = "test_accuracy"):
    """Three panels: ``metric`` against virtual time, server step and client uploads; mean over replicas with a
    min-max band, and a dotted line where a replica diverged.

    Returns the matplotlib figure; with ``path`` it is also saved (atomically) as PNG.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for h in histories:
        values = h.metrics[metric]
        with np.errstate(all="ignore"):
            mean = np.nanmean(np.where(np.isfinite(values), values, np.nan), axis=0)
            lo, hi = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
        xs = (np.nanmean(h.times, axis=0), h.steps, np.mean(h.uploads, axis=0))
        for ax, x in zip(axes, xs):
            (line,) = ax.plot(x, mean, label=h.label)
            if h.num_replicas > 1:
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2)
            for d in h.diverged_at[h.diverged_at >= 0]:  # dotted line where a replica diverged
                e = min(int(np.searchsorted(h.steps, d)), len(h.steps) - 1)
                ax.axvline(x[e], color=line.get_color(), ls=":", lw=1)
    label = metric.replace("_", " ")
    for ax, xlabel in zip(axes, ("virtual time", "server step", "client uploads")):
        ax.set(xlabel=xlabel, ylabel=label, title=f"{label} vs {xlabel}")
        ax.grid(alpha=0.3)
        ax.legend()
    if path is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        write_atomic(path, buf.getvalue())
        plt.close(fig)
    return fig
