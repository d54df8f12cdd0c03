"""Reading a results folder back into Histories (:func:`load_results`)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from asyncfl_jax.results.history import History
from asyncfl_jax.results.history_files import load_history
from asyncfl_jax.results.points import swept_names
from asyncfl_jax.results.records import LookaheadWindows, RunCost
from asyncfl_jax.results.tables import read_metrics_csv
from asyncfl_jax.results.writing import read_trajectory

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
        cost=RunCost(compile_seconds=float(entry["compile_seconds"]), run_seconds=float(entry["run_seconds"]),
                     checkpoint_seconds=float(entry.get("checkpoint_seconds", 0.0)), memory=entry.get("memory"),
                     message_bits=entry.get("message_bits")),
        windows=None if entry.get("lookahead") is None else LookaheadWindows.from_dict(entry["lookahead"]),
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
