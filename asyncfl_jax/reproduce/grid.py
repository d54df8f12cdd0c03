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

import dataclasses
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine.replicas import ReplicaSpec
from asyncfl_jax.engine.simulate import simulate
from asyncfl_jax.reproduce.data import DataUnavailable
from asyncfl_jax.reproduce.report import log_program
from asyncfl_jax.results import History
from asyncfl_jax.task import Task

SettingsT = TypeVar("SettingsT")  # a reproduction's settings (e.g. AceSettings), with an ``out`` folder

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
    replica, e.g. a statistic of its schedule or of its final model), repeated on each of its rows;
    ``frame.attrs["run"]`` holds the run-level values (:func:`run_info`).

    One line on stderr says the program's replicas, steps and times. A program over the memory budget (the engine's
    ``MemoryError``, raised before anything is compiled) runs as two programs of half the replicas each, and so on
    (:func:`run_in_parts`). ``options`` are :func:`~asyncfl_jax.engine.simulate.simulate`'s other keywords
    (``eval_every``...); the progress bar is off."""
    history = run_in_parts(task, algorithm, list(replicas), local=local, label=name, log_width=log_width, **options)
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


def run_in_parts(task: Task, algorithm: Algorithm, replicas: list[ReplicaSpec], *, label: str | None,
                 log_width: int = 40, **options: Any) -> History:
    """``simulate(task, algorithm, replicas=replicas, ...)``; when the memory budget refuses the program
    (``MemoryError``), the replicas run in two halves, each split again as needed, and their Histories are joined
    along the replica axis (:func:`join_replicas`). Each replica's result is the one it gets in any program (to
    float rounding)."""
    pending, done = [replicas], []
    name = label or algorithm.name
    while pending:
        part = pending.pop(0)
        started = time.perf_counter()
        try:
            history = simulate(task, algorithm, label=label, progress=False, replicas=part, **options)
        except MemoryError as e:
            if len(part) == 1:
                raise
            half = len(part) // 2
            print(f"{name}: {len(part)} replicas do not fit ({str(e).splitlines()[0]}); running {half} and "
                  f"{len(part) - half} apart", file=sys.stderr, flush=True)
            pending[:0] = [part[:half], part[half:]]
            continue
        log_program(name, history, time.perf_counter() - started, width=log_width)
        done.append(history)
    return done[0] if len(done) == 1 else join_replicas(done)


def join_replicas(histories: Sequence[History]) -> History:
    """The Histories of programs evaluated at the same steps joined along the replica axis (in order): per-replica
    arrays and lists concatenated, compile and run seconds summed; the trajectory, the memory budget and the
    lookahead windows are those of the first."""
    first = histories[0]
    if any(not np.array_equal(h.steps, first.steps) for h in histories):
        raise ValueError("the programs were evaluated at different steps; their replicas cannot be joined")

    def arrays(name: str) -> Any:
        values = [getattr(h, name) for h in histories]
        return None if any(v is None for v in values) else np.concatenate(values)

    def lists(name: str) -> Any:
        values = [getattr(h, name) for h in histories]
        return None if any(v is None for v in values) else [x for v in values for x in v]

    def dicts(name: str) -> Any:
        values = [getattr(h, name) for h in histories]
        return None if any(v is None for v in values) else {k: np.concatenate([v[k] for v in values])
                                                            for k in values[0]}

    labels = lists("labels") if any(h.labels for h in histories) else None
    return dataclasses.replace(
        first, times=arrays("times"), uploads=arrays("uploads"), metrics=dicts("metrics"),
        client_metrics=dicts("client_metrics"), seeds=lists("seeds"), hparams=lists("hparams"), labels=labels,
        diverged_at=arrays("diverged_at"), schedule_stats=lists("schedule_stats"), final_params=arrays("final_params"),
        realized_schedules=lists("realized_schedules"), job_steps=arrays("job_steps"),
        local_steps=arrays("local_steps"), stopped_early=all(h.stopped_early for h in histories),
        compile_seconds=sum(h.compile_seconds for h in histories), run_seconds=sum(h.run_seconds for h in histories),
        checkpoint_seconds=sum(h.checkpoint_seconds for h in histories))


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


def command_main(argv: list[str] | None, parse_args: Callable[[list[str] | None], SettingsT],
                 run: Callable[[SettingsT, Any], Any],
                 report: Callable[[SettingsT, Any, float], str],
                 load: Callable[[SettingsT], Any] | None = None,
                 early: Callable[[SettingsT], int | None] | None = None) -> int:
    """The command of a reproduction: ``settings = parse_args(argv)`` (the module's settings, e.g.
    :class:`~asyncfl_jax.reproduce.ace.AceSettings`: anything with an ``out`` folder); ``inputs = load(settings)``
    (the data; a :class:`~asyncfl_jax.reproduce.data.DataUnavailable` is printed as ``error: ...`` and returns 2,
    before anything is written); ``results = run(settings, inputs)``; ``report(settings, results, seconds)`` writes
    the tables, JSON and figures into ``settings.out`` and returns the table, which is printed. Returns 0.
    ``early(settings)`` (optional) handles what runs nothing (``--dry-run``, ``--from-results``): an exit code ends
    the command there, None goes on."""
    settings = parse_args(argv)
    if early is not None:
        code = early(settings)
        if code is not None:
            return code
    try:
        inputs = load(settings) if load is not None else None
    except DataUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(settings.out, exist_ok=True)
    started = time.perf_counter()
    results = run(settings, inputs)
    table = report(settings, results, time.perf_counter() - started)
    print(table)
    return 0


__all__ = ["SETTING_SEED_STRIDE", "command_main", "join_replicas", "metric_dtype", "plain", "replica_arrays", "replica_runs", "run_grid",
           "run_in_parts", "run_info", "setting_seed"]
