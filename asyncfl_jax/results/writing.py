"""Writing the result files of an output folder: ``config.json``, ``environment.json``, ``metrics.csv``,
``summary.json`` and ``accuracy.png`` (:func:`write_results`), the per-client metrics and the trajectories (each
written atomically, :mod:`asyncfl_jax.outputs.atomic`)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from asyncfl_jax.outputs import atomic
from asyncfl_jax.results.environment import (VOLATILE_ENVIRONMENT, environment_info, environment_json,
                                             invocation_info)
from asyncfl_jax.results.history import History
from asyncfl_jax.results.plots import plot_accuracy
from asyncfl_jax.results.tables import metrics_csv


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
    atomic.write_atomic(paths["config"], json.dumps(config, indent=2, sort_keys=True) + "\n")
    atomic.write_atomic(paths["environment"], environment_json(environment, config))
    atomic.write_atomic(paths["metrics"], metrics_csv(histories))
    stable = {k: v for k, v in environment.items() if k not in VOLATILE_ENVIRONMENT}
    summary = {"runs": [h.summary() for h in histories], "environment": stable, "config": config}
    atomic.write_atomic(paths["summary"], json.dumps(summary, indent=2) + "\n")
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
    with atomic.atomic_file(path) as f:
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
    with atomic.atomic_file(path) as f:
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
