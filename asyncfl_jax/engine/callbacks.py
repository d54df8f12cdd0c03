"""Callbacks of the host loop (:class:`~asyncfl_jax.engine.loop.HostLoop`): everything a run does between chunks.

A callback has any of the hooks ``on_start(loop)``, ``on_chunk(loop, update)`` (``update``: a
:class:`~asyncfl_jax.engine.loop.ChunkUpdate`), ``on_interrupt(loop, error)`` and ``on_end(loop, completed)``; a plain
function ``fn(update)`` is called after each chunk. :func:`~asyncfl_jax.engine.simulate.simulate` runs, in order,
:class:`ProgressBar`, :class:`DivergenceWarnings`, :class:`StopWhenAllDiverged`, the user's callbacks, and
:class:`Checkpoints` (when a checkpoint folder is given), so a checkpoint holds what every other callback decided.

:class:`CSVLogger` and :class:`JSONLinesLogger` stream every evaluation of every replica to a file (one row per
replica and evaluation, with its seed and hyper-parameters), for users who follow runs with their own tools;
:class:`TensorBoardLogger` writes them as TensorBoard scalars (optional ``tensorboardX``).

Messages go to the ``asyncfl_jax`` logger (INFO), never to ``print``; warnings (divergence) through ``warnings``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import sys
import time
import warnings
from typing import Any, TextIO

import numpy as np

from asyncfl_jax import checkpoint
from asyncfl_jax.engine.history import progress_axes as run_progress_axes
from asyncfl_jax.engine.state import LoopState
from asyncfl_jax.results import headline_metric, label_name, lower_is_better, point_name, swept_names


logger = logging.getLogger(__name__)


def progress_bar(total: int, enabled: bool, desc: str, initial: int = 0) -> Any:
    """A tqdm progress bar of server steps (disabled: a no-op bar)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="step", leave=False,
                dynamic_ncols=True)


def stderr_is_terminal() -> bool:
    """Whether ``sys.stderr`` is an interactive terminal (progress bars are drawn only then)."""
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # e.g. a closed stream
        return False


def point_progress(replicas: list[Any], metrics: dict[str, np.ndarray], diverged_at: np.ndarray) -> str:
    """A short text of one evaluation for a progress bar: the headline metric (``test_accuracy`` when present, else
    the first loss) averaged per hyper-parameter point over its finite, non-diverged replicas: ``acc=0.812`` for a
    single point, ``acc best=0.812 (alpha=0.3) worst=0.700 (alpha=0.6)`` for several (best: largest accuracy,
    smallest loss), then ``diverged=1/6`` when replicas diverged."""
    metric = headline_metric(list(metrics))
    short = "acc" if metric == "test_accuracy" else metric
    values = np.asarray(metrics[metric], dtype=np.float64)
    diverged_at = np.asarray(diverged_at)
    swept = swept_names([r.hparams for r in replicas])
    groups: dict[tuple, list[int]] = {}
    for i, replica in enumerate(replicas):
        label = getattr(replica, "label", None) or {}  # explicit replicas: a point per label too
        groups.setdefault((tuple(label.items()), tuple(sorted(replica.hparams.items()))), []).append(i)
    means = []
    for members in groups.values():
        kept = [values[i] for i in members if diverged_at[i] < 0 and np.isfinite(values[i])]
        if kept:
            first = replicas[members[0]]
            name = ", ".join(filter(None, [label_name(getattr(first, "label", None) or {}),
                                           point_name({k: first.hparams[k] for k in swept})]))
            means.append((float(np.mean(kept)), name))
    parts = []
    if len(groups) == 1 and means:
        parts.append(f"{short}={means[0][0]:.3f}")
    elif means:
        means.sort(key=lambda m: m[0], reverse=not lower_is_better(metric))
        parts.append(f"{short} best={means[0][0]:.3f} ({means[0][1]})")
        if len(means) > 1:
            parts.append(f"worst={means[-1][0]:.3f} ({means[-1][1]})")
    diverged = int((diverged_at >= 0).sum())
    if diverged:
        parts.append(f"diverged={diverged}/{len(replicas)}")
    return " ".join(parts)


class ProgressBar:
    """Progress of server steps with the headline metric per hyper-parameter point (:func:`point_progress`).

    On a terminal (``sys.stderr`` is a TTY) it is a tqdm bar; otherwise (logs redirected to a file) no bar is drawn
    and at most ten INFO lines per run go to the ``asyncfl_jax`` logger, at every tenth of the steps. The bar comes
    from :func:`progress_bar` in both cases (a disabled one without a terminal).
    """

    LOG_LINES = 10

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.terminal = False
        self.next_log = 0

    def on_start(self, loop: Any) -> None:
        run = loop.run_spec
        self.terminal = self.enabled and stderr_is_terminal()
        done = int(loop.state.eval_steps[-1])
        self.bar = progress_bar(run.num_steps, self.terminal, run.label, initial=done)
        self.next_log = self._next_log_after(done, run.num_steps)

    def _next_log_after(self, done: int, total: int) -> int:
        tenth = max(1, -(-total // self.LOG_LINES))
        return min(total, (done // tenth + 1) * tenth)

    def on_chunk(self, loop: Any, update: Any) -> None:
        self.bar.update(update.steps_done)
        text = point_progress(update.replicas, update.metrics, update.diverged_at)
        saving = loop.state.checkpoint_seconds
        if saving > 0:  # the wall time spent waiting for checkpoint saves so far (part of the run time)
            text = f"{text} saving={saving:.1f}s".strip()
        if self.terminal:
            if text:
                self.bar.set_postfix_str(text)
        elif self.enabled and update.step >= self.next_log:
            logger.info("%s: step %d/%d%s", update.label, update.step, update.num_steps, f", {text}" if text else "")
            self.next_log = self._next_log_after(update.step, update.num_steps)

    def on_end(self, loop: Any, completed: bool) -> None:
        del loop, completed
        if self.bar is not None:
            self.bar.close()


def describe_replica(replicas: list[Any], r: int) -> str:
    """``seed=..., <swept name>=<value>...`` of replica ``r``."""
    varying = swept_names([rep.hparams for rep in replicas])
    swept = ", ".join(f"{k}={replicas[r].hparams[k]:g}" for k in varying) or "no swept hyper-parameters"
    label = label_name(getattr(replicas[r], "label", None) or {})
    return f"seed={replicas[r].seed}, {label + ', ' if label else ''}{swept}"


class DivergenceWarnings:
    """A ``RuntimeWarning`` for each replica whose model became NaN/inf, with the server step."""

    def on_chunk(self, loop: Any, update: Any) -> None:
        del loop
        for r in update.newly_diverged:
            warnings.warn(
                f"{update.label}: replica {r} ({describe_replica(update.replicas, r)}) diverged: the global model "
                f"diverged (NaN/inf or |x| > 1e10) at server step {int(update.diverged_at[r])}", RuntimeWarning, stacklevel=2)


class StopWhenAllDiverged:
    """Ends the run once every replica has diverged (they are frozen: nothing would change)."""

    def on_chunk(self, loop: Any, update: Any) -> None:
        if (update.diverged_at >= 0).all():
            loop.stop()


class Checkpoints:
    """Saves the loop state by wall-clock interval (default) or every ``every`` chunks, after the last chunk, and
    when a signal stops the run.

    ``every`` (chunks) and ``interval`` (seconds) are exclusive (:func:`asyncfl_jax.checkpoint.cadence`); with
    neither, a checkpoint is saved once :data:`~asyncfl_jax.checkpoint.DEFAULT_INTERVAL` seconds of the host's wall
    clock (``now()``, by default ``time.monotonic``) have passed since the last one, checked after each chunk. A save
    during the run is asynchronous (``asynchronous=True``): the state's arrays are handed to orbax and the next chunk
    runs while a background thread writes the folder and then the record (:func:`asyncfl_jax.checkpoint.start_save`);
    the next save, the end of the run and a signal wait for it first, so the record only ever names a finished state.
    The saves after the last chunk and on a signal are waited for. The seconds the loop waits for saves are counted in
    the run time and reported as ``LoopState.checkpoint_seconds`` (``History.checkpoint_seconds``). ``at_end=False``
    leaves out the save after the last chunk (for a caller that saves the finished run's History itself, as
    ``asyncfl run`` does; a save under way is still finished).

    While the chunks run, the first Ctrl-C (SIGINT) or a SIGTERM lets the current chunk finish, saves, and raises
    :class:`~asyncfl_jax.checkpoint.SimulationInterrupted`; a second Ctrl-C stops at once (the last consistent state
    is saved if its arrays still exist). :meth:`restore` gives the state to resume from, when the folder holds a
    checkpoint of this same run (the identity is checked first; see :func:`asyncfl_jax.checkpoint.run_identity`).
    """

    def __init__(self, directory: str, run: Any, every: int | None = None, interval: float | None = None, *,
                 now: Any = time.monotonic, asynchronous: bool = True, at_end: bool = True) -> None:
        self.directory, self.run, self.at_end = directory, run, at_end
        self.cadence = checkpoint.cadence(every, interval)
        self.now, self.asynchronous = now, asynchronous
        placed, timeline = run.placed, run.timeline
        self.identity = checkpoint.run_identity(
            label=run.label, algorithm=run.algorithm, local=run.local, replicas=run.replicas,
            schedules=timeline.identity(placed.inputs), num_slots=timeline.num_slots, num_steps=run.num_steps,
            eval_every=run.eval_every, task=run.task, data=placed.data, carry_shape=run.carry_shape,
            engine=run.options.identity(run))
        self.saved_chunk: int | None = None  # next_chunk of the checkpoint on disk, if it is this run's state
        self.pending: checkpoint.PendingSave | None = None  # a save being written in the background
        self.pending_chunk: int | None = None
        self.last_save = 0.0  # now() when the last save started (or the loop started)
        self._signals = contextlib.ExitStack()
        self.stop: Any = None

    def restore(self) -> LoopState | None:
        """The saved state of this run, or None when the folder has no checkpoint (read straight into the carry's
        placement when it is spread over devices)."""
        state = checkpoint.load(self.directory, self.identity, self.run.carry_shape, shardings=self.run.placed.carry)
        if state is not None:
            self.saved_chunk = state.next_chunk
        return state

    def save(self, loop: Any, wait: bool = True) -> None:
        """Saves the loop's state (after the previous save has become current); ``wait``: until this one is the
        current checkpoint too. The seconds spent here count in the run time (``loop.count_in_run_time``)."""
        t0 = time.perf_counter()
        try:
            self.finish_pending()
            loop.update_times()
            self.pending = checkpoint.start_save(self.directory, self.identity, loop.state, self.run.num_chunks,
                                                 asynchronous=self.asynchronous)
            self.pending_chunk = loop.state.next_chunk
            self.last_save = self.now()
            if wait:
                self.finish_pending()
        finally:
            seconds = time.perf_counter() - t0
            loop.state.checkpoint_seconds += seconds
            loop.count_in_run_time(seconds)

    def finish_pending(self) -> None:
        """Waits for the save being written, if any (raising its error): its state becomes the saved one."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()
            self.saved_chunk = self.pending_chunk

    def on_start(self, loop: Any) -> None:
        del loop
        self.last_save = self.now()
        self.stop = self._signals.enter_context(checkpoint.stop_on_signals(enabled=True))

    def on_chunk(self, loop: Any, update: Any) -> None:
        del update
        if self.pending is not None and self.pending.done():
            self.finish_pending()  # a failed write is reported at the next chunk
        if self.stop.reason or (loop.finished and self.at_end):
            self.save(loop, wait=True)
        elif self.cadence.due(loop.state.next_chunk, self.now() - self.last_save):
            self.save(loop, wait=False)
        if self.stop.reason:  # read again after the save: a signal that came during it is acted on now
            if self.saved_chunk != loop.state.next_chunk:
                self.save(loop, wait=True)
            self._interrupted(loop, self.stop.reason, saved=True)

    def on_interrupt(self, loop: Any, error: KeyboardInterrupt) -> None:
        if isinstance(error, checkpoint.SimulationInterrupted):
            return
        with contextlib.suppress(checkpoint.CheckpointError):  # a failed background write: the older state stays
            self.finish_pending()
        saved = self.saved_chunk == loop.state.next_chunk
        if not saved and _alive(loop.state.carry):
            self.save(loop)
            saved = True
        self._interrupted(loop, self.stop.reason or "KeyboardInterrupt", saved, cause=error)

    def _interrupted(self, loop: Any, reason: str, saved: bool, cause: BaseException | None = None) -> None:
        raise checkpoint.SimulationInterrupted(self.run.label, reason, loop.state.eval_steps[-1], self.run.num_steps,
                                               self.directory, saved=saved) from cause

    def on_end(self, loop: Any, completed: bool) -> None:
        self._signals.close()
        if not completed:  # an error ends the run: a save under way still becomes current, its error is logged
            try:
                self.finish_pending()
            except checkpoint.CheckpointError as e:
                logger.warning("%s: %s", self.run.label, e)
            return
        self.finish_pending()
        if self.at_end and self.saved_chunk != loop.state.next_chunk:  # e.g. resumed from a finished checkpoint
            self.save(loop)


def _alive(carry: Any) -> bool:
    """False when a leaf of ``carry`` was donated to a chunk that did not finish (its arrays are gone)."""
    import jax

    return not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree_util.tree_leaves(carry))


# ---------------------------------------------------------------------------------------------------- metric writers
def progress_axes(update: Any) -> dict[str, np.ndarray]:
    """Where every replica stands at this evaluation on the axes that compare runs with different steps: ``time``
    (virtual time), ``uploads`` (client results received) and ``local_steps`` (local steps trained for them;
    :attr:`~asyncfl_jax.results.History.local_steps`), each float [R]: the values the History and ``metrics.csv``
    hold for this evaluation (:func:`asyncfl_jax.engine.history.progress_axes`)."""
    return run_progress_axes(update.loop.run_spec, update.loop.state)


def _rows(update: Any) -> list[dict[str, Any]]:
    """One record per replica of this evaluation: run, step, virtual time, uploads, local steps, replica, seed, swept
    hyper-parameters, metrics, diverged."""
    swept = swept_names([r.hparams for r in update.replicas])
    axes = progress_axes(update)
    rows = []
    for r, replica in enumerate(update.replicas):
        row: dict[str, Any] = {"run": update.label, "step": update.step, "time": float(axes["time"][r]),
                               "uploads": int(axes["uploads"][r]), "local_steps": float(axes["local_steps"][r]),
                               "replica": r, "seed": replica.seed}
        row.update({k: replica.hparams[k] for k in swept})
        row.update({k: float(v[r]) for k, v in update.metrics.items()})
        row["diverged"] = bool(update.diverged_at[r] >= 0)
        rows.append(row)
    return rows


class _FileLogger:
    """Appends records to ``path`` after each chunk, flushed (a run followed with ``tail -f``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: TextIO | None = None

    def on_start(self, loop: Any) -> None:
        del loop
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8", newline="")

    def on_chunk(self, loop: Any, update: Any) -> None:
        del loop
        self.write(_rows(update))
        self.file.flush()

    def on_end(self, loop: Any, completed: bool) -> None:
        del loop, completed
        if self.file is not None:
            self.file.close()

    def write(self, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError


class JSONLinesLogger(_FileLogger):
    """One JSON object per replica and evaluation (non-finite values as ``null``), with the wall time."""

    def write(self, rows: list[dict[str, Any]]) -> None:
        now = time.time()
        for row in rows:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            self.file.write(json.dumps({**clean, "wall_time": now}) + "\n")


class CSVLogger(_FileLogger):
    """CSV rows (header first) of every replica's evaluation: run, step, time (virtual), uploads, local_steps,
    replica, seed, swept values, metrics, diverged. Plot a metric against ``uploads``, ``time`` or ``local_steps`` to
    compare runs whose server steps differ (FedBuff's 300 steps and FedAsync's 3,000 for the same uploads)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.writer: Any = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(rows[0]))
            if self.file.tell() == 0:
                self.writer.writeheader()
        self.writer.writerows(rows)


def _tensorboardx() -> Any:
    try:
        import tensorboardX
    except ImportError:
        raise ImportError("TensorBoardLogger needs tensorboardX, which is not installed: pip install tensorboardX "
                          "(or pip install -e \".[tensorboard]\" from a clone)") from None
    return tensorboardX


class TensorBoardLogger:
    """Writes every replica's metrics as TensorBoard scalars (through ``tensorboardX``).

    Each replica gets its own event-file folder ``<logdir>/<run>/<point>/seed<s>`` (``<point>``: the swept values,
    e.g. ``alpha=0.3``; left out when the run sweeps nothing), and each metric is a scalar tagged by its name
    (``test_accuracy``, ``test_loss``, ...) at ``global_step`` = server steps done. Since runs with different
    numbers of uploads per step (FedBuff: 300 steps, FedAsync: 3,000 steps for 3,000 uploads) cannot be compared on
    server steps, each metric is also written against the axes that compare them, as TensorBoard's step of its own
    tag: ``vs_uploads/<metric>`` (step = client uploads received), ``vs_local_steps/<metric>`` (step = local steps
    trained, :attr:`~asyncfl_jax.results.History.local_steps`) and ``vs_virtual_time_x1000/<metric>`` (step =
    virtual time x 1000, rounded: TensorBoard's steps are integers); ``progress/uploads``, ``progress/virtual_time``
    and ``progress/local_steps`` hold those axes against the server step. TensorBoard then draws one chart per metric with a line per (run, point, seed); the
    folder names select them (regular expressions on ``point`` or ``seed``). Non-finite values (a diverged replica)
    are written as they are. The initial model (step 0) is not written: callbacks see the evaluations after chunks.

    Needs ``tensorboardX`` (``pip install -e ".[tensorboard]"`` from a clone); the error says so when it is missing.
    """

    def __init__(self, logdir: str, flush_secs: int = 10) -> None:
        _tensorboardx()  # a missing library is reported before anything runs
        self.logdir = logdir
        self.flush_secs = flush_secs
        self.writers: dict[int, Any] = {}

    def folder(self, label: str, replicas: list[Any], r: int) -> str:
        """The event-file folder of replica ``r`` of run ``label``."""
        swept = swept_names([rep.hparams for rep in replicas])
        point = point_name({k: replicas[r].hparams[k] for k in swept}).replace(", ", ",")
        parts = [self.logdir, label, *([point] if point else []), f"seed{replicas[r].seed}"]
        return os.path.join(*parts)

    def on_start(self, loop: Any) -> None:
        run = loop.run_spec
        writer = _tensorboardx().SummaryWriter
        self.writers = {r: writer(self.folder(run.label, run.replicas, r), flush_secs=self.flush_secs)
                        for r in range(len(run.replicas))}

    def on_chunk(self, loop: Any, update: Any) -> None:
        del loop
        axes = progress_axes(update)
        for r, writer in self.writers.items():
            x = {"uploads": int(axes["uploads"][r]), "virtual_time_x1000": int(round(1000 * float(axes["time"][r]))),
                 "local_steps": _int_or_none(axes["local_steps"][r])}
            for name, values in update.metrics.items():
                value = float(values[r])
                writer.add_scalar(name, value, global_step=int(update.step))
                for axis, at in x.items():
                    if at is not None:
                        writer.add_scalar(f"vs_{axis}/{name}", value, global_step=at)
            writer.add_scalar("progress/uploads", float(axes["uploads"][r]), global_step=int(update.step))
            writer.add_scalar("progress/virtual_time", float(axes["time"][r]), global_step=int(update.step))
            writer.add_scalar("progress/local_steps", float(axes["local_steps"][r]), global_step=int(update.step))
            writer.flush()

    def on_end(self, loop: Any, completed: bool) -> None:
        del loop, completed
        for writer in self.writers.values():
            writer.close()
        self.writers = {}


def _int_or_none(value: float) -> int | None:
    return int(round(float(value))) if math.isfinite(float(value)) else None
