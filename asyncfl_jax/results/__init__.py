"""Results: the History of a run, its files on disk and its plots.

The package, by concern: :mod:`~asyncfl_jax.results.history` (:class:`History`), its feature records
(:mod:`~asyncfl_jax.results.records`), hyper-parameter points and their statistics over seeds
(:mod:`~asyncfl_jax.results.points`), tables (:mod:`~asyncfl_jax.results.tables`: ``metrics.csv``, DataFrames), the
result files (:mod:`~asyncfl_jax.results.writing`, :mod:`~asyncfl_jax.results.loading`), the History files
(:mod:`~asyncfl_jax.results.history_files`), the environment (:mod:`~asyncfl_jax.results.environment`) and plots
(:mod:`~asyncfl_jax.results.plots`); every name is importable from ``asyncfl_jax.results``.

Results schema (one output folder per ``asyncfl run``):

* ``config.json``: the resolved configuration (every option, defaults filled in).
* ``environment.json``: what produced the results: versions of Python, asyncfl_jax, jax, jaxlib, flax, optax and
  numpy, the JAX backend, the device kinds and count, the operating system, and the resolved configuration.
* ``metrics.csv``: one row per (run, replica, evaluation) with columns
  ``run, algorithm, replica, seed, <label keys...>, <swept hyper-parameters...>, point, step, time, uploads,
  local_steps, <metrics...>, diverged_at``. ``point`` numbers the replica's hyper-parameter point within its run (0, 1, ... in first-seen
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

Every file is written atomically (temporary file in the same folder, ``fsync``, then rename:
:mod:`asyncfl_jax.outputs.atomic`).
"""

from asyncfl_jax.outputs.atomic import atomic_file, save_figure, write_atomic
from asyncfl_jax.results.environment import (ENVIRONMENT_PACKAGES, VOLATILE_ENVIRONMENT, environment_info,
                                             environment_json, git_state, invocation_info)
from asyncfl_jax.results.history import FIRST_LAYOUT, History
from asyncfl_jax.results.history_files import HISTORY_FORMAT, load_history, remove_history, save_history
from asyncfl_jax.results.loading import load_results
from asyncfl_jax.results.plots import plot_accuracy, point_curves
from asyncfl_jax.results.points import (METRIC_COLUMNS, Point, SeedStats, headline_metric, lower_is_better,
                                        point_name, label_name, seed_stats, swept_names)
from asyncfl_jax.results.records import ClientEvaluation, EventClockRecord, LookaheadWindows, RunCost
from asyncfl_jax.results.tables import INTEGER_COLUMNS, histories_dataframe, metrics_csv, read_metrics_csv
from asyncfl_jax.results.writing import (TRAJECTORY_KEY, read_trajectory, write_client_metrics, write_results,
                                         write_trajectory)

__all__ = [
    "ENVIRONMENT_PACKAGES", "FIRST_LAYOUT", "HISTORY_FORMAT", "INTEGER_COLUMNS", "METRIC_COLUMNS", "TRAJECTORY_KEY",
    "VOLATILE_ENVIRONMENT", "ClientEvaluation", "EventClockRecord", "History", "LookaheadWindows", "Point",
    "RunCost", "SeedStats", "atomic_file", "environment_info", "environment_json", "git_state", "headline_metric",
    "histories_dataframe", "invocation_info", "load_history", "load_results", "lower_is_better", "metrics_csv",
    "plot_accuracy", "point_curves", "point_name", "label_name", "read_metrics_csv", "read_trajectory", "remove_history",
    "save_figure", "save_history", "seed_stats", "swept_names", "write_atomic", "write_client_metrics",
    "write_results", "write_trajectory",
]
