"""Callbacks of the host loop (:class:`~asyncfl_jax.engine.loop.HostLoop`): everything a run does between chunks.

A callback has any of the hooks ``on_start(loop)``, ``on_chunk(loop, update)`` (``update``: a
:class:`~asyncfl_jax.engine.loop.ChunkUpdate`), ``on_interrupt(loop, error)`` and ``on_end(loop, completed)``; a plain
function ``fn(update)`` is called after each chunk. :func:`~asyncfl_jax.engine.simulate.simulate` runs, in order,
:class:`ProgressBar`, :class:`DivergenceWarnings`, :class:`StopWhenAllDiverged`, the user's callbacks, and
:class:`Checkpoints` (when a checkpoint folder is given), so a checkpoint holds what every other callback decided.

:class:`CSVLogger` and :class:`JSONLinesLogger` stream every evaluation of every replica to a file (one row per
replica and evaluation, with its seed and hyper-parameters), for users who follow runs with their own tools.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
import warnings
from typing import Any, TextIO

import numpy as np

from asyncfl_jax import checkpoint
from asyncfl_jax.results import swept_names


def progress_bar(total: int, enabled: bool, desc: str, initial: int = 0) -> Any:
    """A tqdm progress bar of server steps (disabled: a no-op bar)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, unit="step", leave=False,
                dynamic_ncols=True)


class ProgressBar:
    """A progress bar of server steps, with the mean test accuracy of the finite replicas."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def on_start(self, loop: Any) -> None:
        run = loop.run_spec
        self.bar = progress_bar(run.num_steps, self.enabled, run.label, initial=loop.state.eval_steps[-1])

    def on_chunk(self, loop: Any, update: Any) -> None:
        del loop
        self.bar.update(update.steps_done)
        name, short = ("test_accuracy", "acc") if "test_accuracy" in update.metrics else ("test_loss", "loss")
        values = update.metrics[name]  # a regression task reports no accuracy
        if np.isfinite(values).any():
            self.bar.set_postfix(**{short: f"{float(np.mean(values[np.isfinite(values)])):.3f}"})

    def on_end(self, loop: Any, completed: bool) -> None:
        del loop, completed
        if self.bar is not None:
            self.bar.close()


def describe_replica(replicas: list[Any], r: int) -> str:
    """``seed=..., <swept name>=<value>...`` of replica ``r``."""
    varying = swept_names([rep.hparams for rep in replicas])
    swept = ", ".join(f"{k}={replicas[r].hparams[k]:g}" for k in varying) or "no swept hyper-parameters"
    return f"seed={replicas[r].seed}, {swept}"


class DivergenceWarnings:
    """A ``RuntimeWarning`` for each replica whose model became NaN/inf, with the server step."""

    def on_chunk(self, loop: Any, update: Any) -> None:
        del loop
        for r in update.newly_diverged:
            warnings.warn(
                f"{update.label}: replica {r} ({describe_replica(update.replicas, r)}) diverged: the global model "
                f"became NaN/inf at server step {int(update.diverged_at[r])}", RuntimeWarning, stacklevel=2)


class StopWhenAllDiverged:
    """Ends the run once every replica has diverged (they are frozen: nothing would change)."""

    def on_chunk(self, loop: Any, update: Any) -> None:
        if (update.diverged_at >= 0).all():
            loop.stop()


class Checkpoints:
    """Saves the loop state every ``every`` chunks, after the last one, and when a signal stops the run.

    While the chunks run, the first Ctrl-C (SIGINT) or a SIGTERM lets the current chunk finish, saves, and raises
    :class:`~asyncfl_jax.checkpoint.SimulationInterrupted`; a second Ctrl-C stops at once (the last consistent state
    is saved if its arrays still exist). :meth:`restore` gives the state to resume from, when the folder holds a
    checkpoint of this same run (the identity is checked first; see :func:`asyncfl_jax.checkpoint.run_identity`).
    """

    def __init__(self, directory: str, run: Any, every: int = 1) -> None:
        self.directory, self.every, self.run = directory, every, run
        placed, timeline = run.placed, run.timeline
        self.identity = checkpoint.run_identity(
            label=run.label, algorithm=run.algorithm, local=run.local, replicas=run.replicas,
            schedules=timeline.identity(placed.inputs), num_slots=timeline.num_slots, num_steps=run.num_steps,
            eval_every=run.eval_every, task=run.task, data=placed.data, carry_shape=run.carry_shape,
            shard_jobs=run.placement.name == "shard_jobs", shard_replicas=run.placement.name == "shard_replicas",
            shard_clients=run.placement.name == "shard_clients")
        self.saved_chunk: int | None = None  # next_chunk of the checkpoint on disk, if it is this run's state
        self._signals = contextlib.ExitStack()
        self.stop: Any = None

    def restore(self) -> checkpoint.LoopState | None:
        """The saved state of this run, or None when the folder has no checkpoint (read straight into the carry's
        placement when it is spread over devices)."""
        state = checkpoint.load(self.directory, self.identity, self.run.carry_shape, shardings=self.run.placed.carry)
        if state is not None:
            self.saved_chunk = state.next_chunk
        return state

    def save(self, loop: Any) -> None:
        loop.update_times()
        checkpoint.save(self.directory, self.identity, loop.state, self.run.num_chunks)
        self.saved_chunk = loop.state.next_chunk

    def on_start(self, loop: Any) -> None:
        del loop
        self.stop = self._signals.enter_context(checkpoint.stop_on_signals(enabled=True))

    def on_chunk(self, loop: Any, update: Any) -> None:
        del update
        if self.stop.reason or loop.finished or loop.state.next_chunk % self.every == 0:
            self.save(loop)
        if self.stop.reason:
            self._interrupted(loop, self.stop.reason, saved=True)

    def on_interrupt(self, loop: Any, error: KeyboardInterrupt) -> None:
        if isinstance(error, checkpoint.SimulationInterrupted):
            return
        saved = self.saved_chunk == loop.state.next_chunk
        if not saved and _alive(loop.state.carry):
            self.save(loop)
            saved = True
        self._interrupted(loop, "KeyboardInterrupt", saved, cause=error)

    def _interrupted(self, loop: Any, reason: str, saved: bool, cause: BaseException | None = None) -> None:
        raise checkpoint.SimulationInterrupted(self.run.label, reason, loop.state.eval_steps[-1], self.run.num_steps,
                                               self.directory, saved=saved) from cause

    def on_end(self, loop: Any, completed: bool) -> None:
        self._signals.close()
        if completed and self.saved_chunk != loop.state.next_chunk:  # e.g. resumed from a finished checkpoint
            self.save(loop)


def _alive(carry: Any) -> bool:
    """False when a leaf of ``carry`` was donated to a chunk that did not finish (its arrays are gone)."""
    import jax

    return not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree_util.tree_leaves(carry))


# ---------------------------------------------------------------------------------------------------- metric writers
def _rows(update: Any) -> list[dict[str, Any]]:
    """One record per replica of this evaluation: step, replica, seed, swept hyper-parameters, metrics."""
    swept = swept_names([r.hparams for r in update.replicas])
    rows = []
    for r, replica in enumerate(update.replicas):
        row: dict[str, Any] = {"run": update.label, "step": update.step, "replica": r, "seed": replica.seed}
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
    """CSV rows (header first) of every replica's evaluation: run, step, replica, seed, swept values, metrics."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.writer: Any = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(rows[0]))
            if self.file.tell() == 0:
                self.writer.writeheader()
        self.writer.writerows(rows)
