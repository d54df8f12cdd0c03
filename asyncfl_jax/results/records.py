"""The feature data of a :class:`~asyncfl_jax.results.History`, grouped: small frozen records, each None in a History
whose run did not have the feature.

* :class:`RunCost`: what the run cost (compile, run and checkpoint seconds, the memory budget, the bits of one
  upload); present in every History.
* :class:`ClientEvaluation`: the per-client test split's metrics (``data.client_test_fraction > 0``).
* :class:`EventClockRecord`: what the in-scan event clock decided during the run (its schedules, each job's local
  step count).
* :class:`LookaheadWindows`: how lookahead batching grouped the server steps (``lookahead > 1``).

A History also accepts (and reports, as read-only properties) the flat names of its first layout
(``compile_seconds``, ``client_metrics``, ``lookahead``, ``job_steps``, ...): :func:`grouped_fields` turns them into
these records.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class RunCost:
    """What a run cost. ``compile_seconds``: time to compile (including running the initial jobs);
    ``run_seconds``: time of the scan, the evaluations and the waits for checkpoint saves; ``checkpoint_seconds``:
    the part of ``run_seconds`` the run waited for checkpoint saves (0 without checkpoints); ``memory``: the memory
    budget printed before the run (bytes of server, client and in-flight state, data); ``message_bits``: bits of one
    upload, ``{"payload": ..., "index": ...}`` (index: the positions a sparsifying compressor sends; 0 otherwise)."""

    compile_seconds: float = 0.0
    run_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    memory: dict[str, Any] | None = None
    message_bits: dict[str, int] | None = None


@dataclasses.dataclass(frozen=True)
class ClientEvaluation:
    """The per-client test split's metrics. ``metrics``: name -> float [R, E, C] (``client_accuracy``,
    ``client_loss``): each evaluated client's metric on its own test examples at every evaluation; ``client_ids``:
    int [C], the ids of the evaluated clients (the last axis of ``metrics``)."""

    metrics: dict[str, np.ndarray] | None
    client_ids: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class EventClockRecord:
    """What the in-scan event clock decided during the run. ``schedules``: the schedule each replica went through
    (not in the History file: ``asyncfl run`` writes them to ``schedules/``; None in a History read from files);
    ``job_steps``: int [R, T], the local step count of the job applied at each server step (AsyncFedED's K; -1 once
    a replica was frozen)."""

    schedules: list[Any] | None
    job_steps: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class LookaheadWindows:
    """How lookahead batching grouped the server steps: ``L`` (the lookahead), the number of windows (steps trained
    together per flush), their mean and largest length, and ``window_histogram``: the number of windows of each
    length 1..L."""

    L: int
    num_windows: int
    mean_window: float
    max_window: int
    window_histogram: tuple[int, ...]

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> "LookaheadWindows":
        """The record of the dict that ``History.lookahead`` reports (and ``summary.json`` holds)."""
        return cls(**{**info, "window_histogram": tuple(info["window_histogram"])})

    def as_dict(self) -> dict[str, Any]:
        """``{"L", "num_windows", "mean_window", "max_window", "window_histogram"}`` (the histogram as a list)."""
        return {**dataclasses.asdict(self), "window_histogram": list(self.window_histogram)}


COST_NAMES = tuple(f.name for f in dataclasses.fields(RunCost))
LEGACY_NAMES = (*COST_NAMES, "client_metrics", "client_ids", "realized_schedules", "job_steps", "lookahead")
"""The History fields of the first layout that now live in a record (accepted by ``History(...)``, read-only
properties of a History, and the names of the History file's entries)."""


def grouped_fields(cost: RunCost | None, clients: ClientEvaluation | None, clock: EventClockRecord | None,
                   windows: LookaheadWindows | None, legacy: Mapping[str, Any]) -> dict[str, Any]:
    """The records of a History given its records and flat fields of the first layout (``legacy``, e.g.
    ``client_metrics=...``; each one given replaces that part of its record). A record none of whose parts is set
    is None. ``TypeError`` for a name that is not a History field."""
    unknown = sorted(set(legacy) - set(LEGACY_NAMES))
    if unknown:
        raise TypeError(f"History got unexpected keyword arguments {unknown}")
    cost = cost if cost is not None else RunCost()
    if any(k in legacy for k in COST_NAMES):
        cost = dataclasses.replace(cost, **{k: legacy[k] for k in COST_NAMES if k in legacy})
    if "client_metrics" in legacy or "client_ids" in legacy:
        metrics = legacy.get("client_metrics", clients.metrics if clients else None)
        ids = legacy.get("client_ids", clients.client_ids if clients else None)
        clients = None if metrics is None and ids is None else ClientEvaluation(metrics, ids)
    if "realized_schedules" in legacy or "job_steps" in legacy:
        schedules = legacy.get("realized_schedules", clock.schedules if clock else None)
        job_steps = legacy.get("job_steps", clock.job_steps if clock else None)
        clock = None if schedules is None and job_steps is None else EventClockRecord(schedules, job_steps)
    if "lookahead" in legacy:
        windows = None if legacy["lookahead"] is None else LookaheadWindows.from_dict(legacy["lookahead"])
    return {"cost": cost, "clients": clients, "clock": clock, "windows": windows}
