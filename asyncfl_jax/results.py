"""Results: the History of a run, its files on disk and its plots.

Results schema (one output folder per ``asyncfl run``):

* ``config.json``: the resolved configuration (every option, defaults filled in).
* ``environment.json``: what produced the results: versions of Python, asyncfl_jax, jax, jaxlib, flax, optax and
  numpy, the JAX backend, the device kinds and count, the operating system, and the resolved configuration.
* ``metrics.csv``: one row per (run, replica, evaluation) with columns
  ``run, algorithm, replica, seed, <swept hyper-parameters...>, step, time, uploads, test_accuracy, test_loss,
  train_loss``. ``step`` is the number of server steps applied, ``time`` the virtual time, ``uploads`` the number of
  client results the server has received.
* ``summary.json``: per run: algorithm and options, replicas (seed and hyper-parameters), final and best accuracy,
  divergence step per replica (-1: none), staleness and participation statistics of the schedule, compile and run
  seconds; and, at the top level, ``environment`` (as in environment.json) and ``config``.
* ``schedules/<run>-seed<s>.npz``: the exact arrival schedule of each run and seed (``Schedule.load``; replay it with
  ``runs[i].schedule_files``).
* ``client_metrics/<run>.npz`` (with a per-client test split, ``data.client_test_fraction > 0``): ``steps``,
  ``seeds``, ``client_ids`` and each per-client metric (``client_accuracy``, ``client_loss``) as float [R, E, C]
  (:func:`write_client_metrics`); their summaries (``client_accuracy_mean``, ``client_accuracy_worst10``, ...) are
  columns of ``metrics.csv``, as are ``val_accuracy`` and ``val_loss`` with a validation split.
* ``accuracy.png``: test accuracy against virtual time, server step and client uploads (mean over replicas, min-max
  band).

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
import tempfile
from typing import Any, BinaryIO, Iterator, Sequence

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
      metrics: name -> float [R, E]: whatever the task's evaluator reports (test_accuracy, test_loss, train_loss;
        val_accuracy, val_loss with a validation split; client_accuracy_mean, client_accuracy_worst10, ... with a
        per-client test split, see :func:`asyncfl_jax.task.make_evaluator`).
      seeds: the training seed of each replica; ``hparams`` its hyper-parameters.
      diverged_at: int [R] first server step whose model had a NaN/inf (-1: never).
      schedule_stats: staleness/participation summary of the schedule (one entry, or one per replica).
      num_steps: planned server steps; ``stopped_early`` is True when every replica diverged before the end.
      compile_seconds: time to compile (including running the initial jobs); ``run_seconds``: time of the scan.
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
    message_bits: dict[str, int] | None = None
    realized_schedules: list[Any] | None = None
    lookahead: dict[str, Any] | None = None
    job_steps: np.ndarray | None = None
    client_metrics: dict[str, np.ndarray] | None = None
    client_ids: np.ndarray | None = None

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
                row.update({m: float(v[r, e]) for m, v in self.metrics.items()})
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
            "message_bits": self.message_bits,
            "upload_bits": _floats(self.upload_bits[:, -1]) if self.message_bits else None,
            **({"lookahead": self.lookahead} if self.lookahead else {}),
        }


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, dtype=np.float64)]


# ---------------------------------------------------------------------------------------------------- files
@contextlib.contextmanager
def atomic_file(path: str) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only when the block ends without an error: it is written as a temporary
    file in the same folder, flushed to disk (``fsync``) and renamed over ``path`` (``os.replace``, atomic); the
    folder is then synced so that the rename itself survives a crash. On an error the temporary file is removed and
    ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform where folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: str | bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder, ``fsync`` and an atomic rename."""
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


def write_results(out_dir: str, config: dict[str, Any], histories: Sequence[History], plot: bool = True,
                  environment: dict[str, Any] | None = None) -> list[str]:
    """Writes config.json, environment.json, metrics.csv, summary.json and (optionally) accuracy.png; returns the
    paths. ``environment`` defaults to :func:`environment_info` (package versions, JAX backend, devices)."""
    os.makedirs(out_dir, exist_ok=True)
    environment = environment_info() if environment is None else environment
    paths = {
        "config": os.path.join(out_dir, "config.json"),
        "environment": os.path.join(out_dir, "environment.json"),
        "metrics": os.path.join(out_dir, "metrics.csv"),
        "summary": os.path.join(out_dir, "summary.json"),
    }
    write_atomic(paths["config"], json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_atomic(paths["environment"], environment_json(environment, config))
    write_atomic(paths["metrics"], metrics_csv(histories))
    summary = {"runs": [h.summary() for h in histories], "environment": environment, "config": config}
    write_atomic(paths["summary"], json.dumps(summary, indent=2) + "\n")
    written = list(paths.values())
    if plot:
        png = os.path.join(out_dir, "accuracy.png")
        plot_accuracy(histories, png)
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


# ---------------------------------------------------------------------------------------------------- reproducibility
ENVIRONMENT_PACKAGES = (("asyncfl_jax", "asyncfl-jax"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("flax", "flax"),
                        ("optax", "optax"), ("numpy", "numpy"))


def environment_info() -> dict[str, Any]:
    """What produced a result: versions of Python, this package, jax, jaxlib, flax, optax and numpy, the JAX backend
    and the kinds of its devices, and the operating system."""
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
        if f.name == "realized_schedules":  # written as schedule files by the runner, not part of the History file
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
