"""The pre-sampled arrival schedule: who trains on which model version, and when each result arrives.

Conventions (used by every protocol and by the engine):

* ``x_0`` is the initial model (version 0). Server step ``t`` (``t = 0 .. T-1``) applies the results in
  ``arrival_clients[t]`` to ``x_t`` and produces ``x_{t+1}`` (version ``t+1``).
* A *job* is one local-training task of one client. It starts from the model ``x_v`` (its *version* ``v``) and its
  result is applied at one later server step ``t >= v``. Its staleness is ``t - v`` (always >= 0).
* Jobs that start from ``x_0`` before the first step are listed in ``init_clients``. Jobs that start from ``x_t``
  during step ``t`` (after the previous step was applied, or, for the "immediate" refill, while the buffer of step
  ``t`` is filling) are listed in ``dispatch_clients[t]``. The engine trains them at the start of step ``t``, before it
  reads step ``t``'s arrivals, so a job may arrive in the step it was dispatched in (staleness 0).
* Every job owns a *slot* of the engine's pending buffer from its dispatch until its arrival step is over; the
  ``*_slots`` arrays say which. A slot freed at step ``t`` is only reused by jobs of version ``>= t+1``.
* ``-1`` pads client ids (and their slots) where a step has fewer arrivals or dispatches than the static width. A
  step may have no arrival at all (a server clock that ticks when nothing arrived): all of its entries are -1.
* With dropouts (``info["dropped_clients"]``, ``info["dropout_time"]``) a job of a dropped client still in flight at
  the dropout time never arrives: its slot is never read and is simply written again by a later job (of a later
  step's dispatch row, started at or after the dropout time).

All arrays are numpy arrays on the host; the engine moves them to the device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from asyncfl_jax.errors import InputError

_ARRAY_FIELDS = (
    "init_clients",
    "init_slots",
    "dispatch_clients",
    "dispatch_slots",
    "dispatch_times",
    "arrival_clients",
    "arrival_slots",
    "arrival_versions",
    "arrival_times",
    "step_times",
)


class ScheduleFileError(InputError):
    """A file given as a schedule (``schedule_files``) is not one written by :meth:`Schedule.save`."""


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Arrays describing T server steps of an asynchronous (or synchronous) FL run.

    Shapes: ``D0`` initial jobs, ``D`` dispatch width, ``M`` arrival width (the buffer size, or with a server clock
    the largest number of arrivals in a step), ``S`` pending slots. Rows shorter than the width are padded.

    Attributes:
      init_clients:     int32 [D0]    clients that start a job from ``x_0`` before step 0 (-1 = none).
      init_slots:       int32 [D0]    pending slot of each initial job (-1 = none).
      dispatch_clients: int32 [T, D]  clients that start a job from ``x_t`` during step ``t`` (-1 = none).
      dispatch_slots:   int32 [T, D]  their pending slots.
      dispatch_times:   float64 [T, D] virtual time at which each of those jobs starts (nan where none).
      arrival_clients:  int32 [T, M]  clients whose results are applied at step ``t`` (-1 = none).
      arrival_slots:    int32 [T, M]  pending slot each arrival is read from.
      arrival_versions: int32 [T, M]  model version each arrival was computed on.
      arrival_times:    float64 [T, M] virtual time at which each result reaches the server (nan where none).
      step_times:       float64 [T]   virtual time at which step ``t`` is applied.
      num_clients:      n, the number of clients.
      num_slots:        S, the size of the pending buffer.
      init_time:        virtual time of the initial dispatch (usually 0).
      info:             JSON-serialisable description of how the schedule was made (protocol, delay model, seed).
    """

    init_clients: np.ndarray
    init_slots: np.ndarray
    dispatch_clients: np.ndarray
    dispatch_slots: np.ndarray
    dispatch_times: np.ndarray
    arrival_clients: np.ndarray
    arrival_slots: np.ndarray
    arrival_versions: np.ndarray
    arrival_times: np.ndarray
    step_times: np.ndarray
    num_clients: int
    num_slots: int
    init_time: float = 0.0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    # ------------------------------------------------------------------ shapes
    @property
    def num_steps(self) -> int:
        """T, the number of server steps."""
        return int(self.arrival_clients.shape[0])

    @property
    def buffer_width(self) -> int:
        """M, the static number of arrival entries per server step."""
        return int(self.arrival_clients.shape[1])

    @property
    def dispatch_width(self) -> int:
        """D, the static number of dispatch entries per server step."""
        return int(self.dispatch_clients.shape[1])

    @property
    def arrival_mask(self) -> np.ndarray:
        """bool [T, M]: which arrival entries are real (not padding)."""
        return self.arrival_clients >= 0

    @property
    def staleness(self) -> np.ndarray:
        """int32 [T, M]: ``t - version`` for every arrival (-1 where padding)."""
        steps = np.arange(self.num_steps, dtype=np.int64)[:, None]
        return np.where(self.arrival_mask, steps - self.arrival_versions, -1).astype(np.int32)

    @property
    def uploads_per_step(self) -> np.ndarray:
        """int64 [T]: number of client results applied at each step."""
        return self.arrival_mask.sum(axis=1).astype(np.int64)

    def pad(self, buffer_width: int | None = None, dispatch_width: int | None = None) -> "Schedule":
        """The same schedule with its arrival width ``M`` and dispatch width ``D`` padded (with -1 / nan) to at least
        the given values, e.g. to stack the schedules of several seeds whose widths differ (server clock,
        suspensions). Padding does not change any job: a padded entry is no arrival and no dispatch."""
        fields: dict[str, np.ndarray] = {}
        for names, width in (
            (("arrival_clients", "arrival_slots", "arrival_versions", "arrival_times"), buffer_width),
            (("dispatch_clients", "dispatch_slots", "dispatch_times"), dispatch_width),
        ):
            current = getattr(self, names[0]).shape[1]
            if width is None or width <= current:
                continue
            for name in names:
                a = getattr(self, name)
                fill = np.nan if a.dtype.kind == "f" else -1
                fields[name] = np.concatenate([a, np.full((a.shape[0], width - current), fill, dtype=a.dtype)], axis=1)
        return dataclasses.replace(self, **fields) if fields else self

    def truncate(self, num_steps: int) -> "Schedule":
        """The first ``num_steps`` steps (jobs still in flight afterwards are simply never applied)."""
        if not 0 < num_steps <= self.num_steps:
            raise ValueError(f"num_steps must be in [1, {self.num_steps}], got {num_steps}")
        per_step = {f: getattr(self, f)[:num_steps] for f in _ARRAY_FIELDS if not f.startswith("init_")}
        return dataclasses.replace(self, **per_step)

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | os.PathLike) -> None:
        """Writes the schedule to an ``.npz`` file atomically (temporary file, then rename)."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        meta = {
            "num_clients": self.num_clients,
            "num_slots": self.num_slots,
            "init_time": self.init_time,
            "info": self.info,
            "format": "asyncfl_jax.Schedule/1",
        }
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.array(json.dumps(meta)), **{k: getattr(self, k) for k in _ARRAY_FIELDS})
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Schedule":
        """Reads a schedule written by :meth:`save` and checks that it is consistent.

        Raises :class:`ScheduleFileError` (a ``ValueError``) naming the file for anything that is not such a schedule
        (not a ``.npz`` archive, truncated, missing entries, unreadable metadata, inconsistent arrays), and
        ``FileNotFoundError`` / ``OSError`` when the file cannot be opened."""
        path = os.fspath(path)
        if os.path.isdir(path):
            raise ScheduleFileError(f"{path}: is a folder, not a schedule file (.npz written by Schedule.save)")
        try:
            with np.load(path, allow_pickle=False) as z:
                missing = [k for k in ("meta", *_ARRAY_FIELDS) if k not in z.files]
                if missing:
                    raise ScheduleFileError(f"{path}: not a schedule file, missing entries {missing}")
                meta = json.loads(str(z["meta"]))
                arrays = {k: np.asarray(z[k]) for k in _ARRAY_FIELDS}
            schedule = cls(
                **arrays,
                num_clients=int(meta["num_clients"]),
                num_slots=int(meta["num_slots"]),
                init_time=float(meta.get("init_time", 0.0)),
                info=dict(meta.get("info", {})),
            )
            schedule.validate()
        except ScheduleFileError:
            raise
        except OSError as e:
            if isinstance(e, (FileNotFoundError, PermissionError)):
                raise
            raise ScheduleFileError(f"{path}: cannot be read as a schedule ({e})") from None
        except (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise ScheduleFileError(f"{path}: not a valid schedule file ({type(e).__name__}: {e})") from None
        return schedule

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raises ``ValueError`` naming the first entry that breaks the schedule's invariants.

        Checked: shapes and dtypes agree; client ids in ``[-1, n)``; slots in ``[0, S)`` where a client is given;
        versions in ``[0, t]`` (staleness >= 0); step times non-decreasing; no job starts before ``init_time``; every
        result arrives after its job started (no negative duration) and by its step's time; every arrival reads a
        slot whose last write was a job of the same client and version that has not been read yet. A slot may be
        written again before it is read only if it holds a job of a dropped client (``info["dropped_clients"]``) that
        never arrives, by a job of a later dispatch row started at or after ``info["dropout_time"]``, or, in a
        schedule from device traces with availability windows (``info["offline_discards"]``), a job discarded when
        its client went offline (``info["offline_discards"]`` lists the times of such discards), by a job of a later
        dispatch row.
        """
        T, M = self.arrival_clients.shape
        n, S = self.num_clients, self.num_slots
        if n < 1:
            raise ValueError(f"num_clients must be >= 1, got {n}")
        limit = int(np.iinfo(np.int32).max)  # client ids and slots are int32 arrays inside the compiled program
        for name, value in (("num_clients", n), ("num_slots", S)):
            if not 0 <= value <= limit:
                raise ValueError(f"{name} = {value} is out of range: must be in [0, {limit}] (int32)")
        for name in ("arrival_slots", "arrival_versions", "arrival_times"):
            if getattr(self, name).shape != (T, M):
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {(T, M)}")
        if self.dispatch_clients.shape[0] != T or self.dispatch_clients.ndim != 2:
            raise ValueError(f"dispatch_clients has shape {self.dispatch_clients.shape}, expected ({T}, D)")
        for name in ("dispatch_slots", "dispatch_times"):
            if getattr(self, name).shape != self.dispatch_clients.shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {self.dispatch_clients.shape}")
        if self.init_slots.shape != self.init_clients.shape:
            raise ValueError("init_slots and init_clients have different shapes")
        if self.step_times.shape != (T,):
            raise ValueError(f"step_times has shape {self.step_times.shape}, expected {(T,)}")
        for name in ("init_clients", "dispatch_clients", "arrival_clients"):
            ids = getattr(self, name)
            bad = np.argwhere((ids < -1) | (ids >= n))
            if bad.size:
                where = ", ".join(str(int(i)) for i in bad[0])
                raise ValueError(f"{name}[{where}] = {int(ids[tuple(bad[0])])} is not a client id in [0, {n})")
        if np.any(np.diff(self.step_times) < 0):
            t = int(np.argmax(np.diff(self.step_times) < 0)) + 1
            raise ValueError(f"step_times must be non-decreasing: step {t} at {self.step_times[t]} < {self.step_times[t - 1]}")
        # Replay the slot protocol: slot -> (client, version) of the job it holds.
        holder: dict[int, tuple[int, int]] = {}
        started: dict[int, float] = {}  # slot -> start time of the job it holds
        dropped = set(int(c) for c in self.info.get("dropped_clients", ()))
        dropout_time = float(self.info.get("dropout_time", np.inf))
        offline_discards = bool(self.info.get("offline_discards", False))

        def start(where: str, client: int, slot: int, version: int, when: float) -> None:
            if not 0 <= slot < S:
                raise ValueError(f"{where}: slot {slot} of client {client} is not in [0, {S})")
            if not when >= float(self.init_time):  # nan fails too
                raise ValueError(f"{where}: client {client} starts at time {when}, before the schedule's start "
                                 f"{float(self.init_time)} (or not a number)")
            if slot in holder:
                held_by, held_version = holder[slot]
                discarded = held_version < version and (offline_discards
                                                        or (held_by in dropped and when >= dropout_time))
                if not discarded:
                    raise ValueError(f"{where}: slot {slot} is still held by client {held_by}")
            holder[slot] = (client, version)
            started[slot] = when

        for j, (c, s) in enumerate(zip(self.init_clients.tolist(), self.init_slots.tolist())):
            if c >= 0:
                start(f"init[{j}]", c, s, 0, float(self.init_time))
        for t in range(T):
            for j, (c, s, w) in enumerate(zip(self.dispatch_clients[t].tolist(), self.dispatch_slots[t].tolist(),
                                              self.dispatch_times[t].tolist())):
                if c >= 0:
                    start(f"dispatch[{t}, {j}]", c, s, t, w)
            freed = []
            for j, (c, s, v, a) in enumerate(
                zip(self.arrival_clients[t].tolist(), self.arrival_slots[t].tolist(), self.arrival_versions[t].tolist(),
                    self.arrival_times[t].tolist())
            ):
                if c < 0:
                    continue
                if not 0 <= v <= t:
                    raise ValueError(f"arrival[{t}, {j}]: version {v} is not in [0, {t}] (staleness would be < 0)")
                if holder.get(s) != (c, v):
                    raise ValueError(
                        f"arrival[{t}, {j}]: client {c} (version {v}) reads slot {s}, which holds {holder.get(s)}; "
                        "every arrival must be preceded by its dispatch"
                    )
                if not a >= started[s]:  # nan fails too
                    raise ValueError(f"arrival[{t}, {j}]: client {c} arrives at time {a}, before its job started "
                                     f"(at {started[s]}): a negative duration")
                if not a <= self.step_times[t]:
                    raise ValueError(f"arrival[{t}, {j}]: client {c} arrives at time {a}, after step {t} was applied "
                                     f"(at {self.step_times[t]})")
                freed.append(s)
            for s in freed:
                del holder[s]
