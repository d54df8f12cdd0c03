"""What every reproduction runs its experiments with: one runner (:func:`run_grid`) and one command skeleton
(:func:`command_main`).

A paper's experiment is a few compiled programs (one per algorithm and local-training setup); each program is a grid
of settings (delay models, suspension probabilities, protocols, hyper-parameter variants) x seeds, written as
explicit replicas (:class:`~asyncfl_jax.engine.replicas.ReplicaSpec`: each replica's own schedule or event clock,
training seed, hyper-parameters and a label naming its setting). :func:`run_grid` runs one program and returns its
evaluations as a pandas DataFrame (``History.to_dataframe()``: one row per replica and evaluation, one column per
label key), to which a module may add per-replica columns; :func:`replica_runs` turns it into one record per replica
(the ``runs`` of a ``results.json``). The engine pads the replicas' schedules to common widths and refuses what
cannot share a program, so no module pads or matches schedules to seeds itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine.replicas import ReplicaSpec
from asyncfl_jax.engine.simulate import simulate
from asyncfl_jax.reproduce.data import DataUnavailable
from asyncfl_jax.reproduce.report import log_program
from asyncfl_jax.results import History
from asyncfl_jax.task import Task

SETTING_SEED_STRIDE = 1000
"""The training seed of seed ``s`` in setting ``j`` of a program is ``1000 j + s`` (:func:`setting_seed`)."""


def setting_seed(setting_index: int, seed: int) -> int:
    """The training seed of seed ``seed`` (``0 <= seed < 1000``) in the ``setting_index``-th setting of a program:
    ``1000 j + s``, so that the settings of one program draw independent minibatches (and the results stay those of
    the earlier versions of the reproductions). Only a training seed: a replica's schedule and setting are its own
    (:class:`~asyncfl_jax.engine.replicas.ReplicaSpec`), never decoded from the seed."""
    return SETTING_SEED_STRIDE * setting_index + seed


def run_grid(task: Task, algorithm: Algorithm, replicas: Sequence[ReplicaSpec], *, local: LocalConfig | None = None,
             name: str | None = None, per_replica: Callable[[History], Mapping[str, Sequence[Any]]] | None = None,
             log_width: int = 40, **options: Any) -> Any:
    """Runs ``replicas`` as one program (``simulate(task, algorithm, replicas=replicas, ...)``) and returns its
    evaluations as a pandas DataFrame: ``History.to_dataframe()`` (columns ``run, algorithm, replica, seed``, the
    labels' keys, the swept hyper-parameters, ``point, step, time, uploads, local_steps``, the metrics,
    ``diverged_at``) plus, with ``per_replica``, the columns ``per_replica(history)`` returns (name -> one value per
    replica, e.g. a statistic of its realized schedule or of its final model), repeated on each of its rows. One line on stderr says the program's
    replicas, steps and times. ``options`` are :func:`~asyncfl_jax.engine.simulate.simulate`'s other keywords
    (``eval_every``...); the progress bar is off."""
    started = time.perf_counter()
    history = simulate(task, algorithm, local=local, label=name, progress=False, replicas=replicas, **options)
    log_program(name or algorithm.name, history, time.perf_counter() - started, width=log_width)
    frame = history.to_dataframe()
    frame.attrs["run"] = run_info(history)
    if per_replica is not None:
        for key, values in per_replica(history).items():
            values = list(values)
            if len(values) != history.num_replicas:
                raise ValueError(f"per_replica gave {len(values)} values of {key!r} for {history.num_replicas} "
                                 "replicas")
            frame[key] = np.array([values[r] for r in frame["replica"]], dtype=object)  # None stays None
    return frame


def run_info(history: History) -> dict[str, Any]:
    """What a run's DataFrame keeps of its History beside the rows (``frame.attrs["run"]``): the algorithm and its
    options, the bits of one upload, the steps planned, whether it stopped early (every replica diverged), the
    precision, and the compile and run seconds."""
    return {"algorithm": history.algorithm, "algorithm_options": dict(history.algorithm_options),
            "message_bits": history.message_bits, "num_steps": history.num_steps,
            "stopped_early": history.stopped_early, "precision": history.precision,
            "compile_seconds": history.compile_seconds, "run_seconds": history.run_seconds}


def replica_arrays(frame: Any, columns: Mapping[str, str], dtypes: Mapping[str, Any] | None = None) -> dict:
    """Columns of a :func:`run_grid` frame as arrays [R, E] (replica x evaluation), ``name: column`` for each of
    ``columns``; ``dtypes`` casts some back (e.g. a float32 run's metrics to float32, exactly: the frame holds them
    as float64). Every replica has the same evaluations (one program)."""
    out = {}
    for name, column in columns.items():
        table = frame.pivot(index="replica", columns="step", values=column).to_numpy()
        out[name] = table.astype((dtypes or {}).get(name, table.dtype))
    return out


def metric_dtype(frame: Any) -> Any:
    """The dtype of the metrics of the run behind ``frame`` (float32, or float64 in a float64 run)."""
    return np.float64 if frame.attrs["run"]["precision"] == "float64" else np.float32


def plain(value: Any) -> Any:
    """A DataFrame cell as a plain Python value (numpy scalars to int / float / bool; NaN stays a float)."""
    return value.item() if isinstance(value, np.generic) else value


def replica_runs(frame: Any, keep: Sequence[str], series: Mapping[str, str]) -> list[dict[str, Any]]:
    """One record per replica of a :func:`run_grid` frame, in replica order: the columns ``keep`` (one value per
    replica: labels, seed, per-replica columns) and, for each ``name: column`` of ``series``, the column's values at
    the replica's evaluations as a list (e.g. ``{"times": "time", "accuracy": "test_accuracy"}``)."""
    out = []
    for _, rows in frame.groupby("replica", sort=True):
        record = {k: plain(rows[k].iloc[0]) for k in keep}
        record.update({name: [plain(v) for v in rows[column]] for name, column in series.items()})
        out.append(record)
    return out


def command_main(argv: list[str] | None, parse_args: Callable[[list[str] | None], argparse.Namespace],
                 run: Callable[[argparse.Namespace, Any], Any],
                 report: Callable[[argparse.Namespace, Any, float], str],
                 load: Callable[[argparse.Namespace], Any] | None = None,
                 early: Callable[[argparse.Namespace], int | None] | None = None) -> int:
    """The command of a reproduction: ``args = parse_args(argv)``; ``inputs = load(args)`` (the data; a
    :class:`~asyncfl_jax.reproduce.data.DataUnavailable` is printed as ``error: ...`` and returns 2, before anything
    is written); ``results = run(args, inputs)``; ``report(args, results, seconds)`` writes the tables, JSON and
    figures into ``args.out`` and returns the table, which is printed. Returns 0. ``early(args)`` (optional) handles
    what runs nothing (``--dry-run``, ``--from-results``): an exit code ends the command there, None goes on."""
    args = parse_args(argv)
    if early is not None:
        code = early(args)
        if code is not None:
            return code
    try:
        inputs = load(args) if load is not None else None
    except DataUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    results = run(args, inputs)
    table = report(args, results, time.perf_counter() - started)
    print(table)
    return 0


__all__ = ["SETTING_SEED_STRIDE", "command_main", "metric_dtype", "plain", "replica_arrays", "replica_runs", "run_grid",
           "run_info", "setting_seed"]
