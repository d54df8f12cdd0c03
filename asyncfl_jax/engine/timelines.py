"""Timelines: the host side of each clock. A timeline holds the replicas' schedules (or event clocks), builds the
program that reads them, feeds each chunk its inputs, and tells afterwards which schedule every replica went through.

* :class:`PresampledTimeline`: one pre-sampled :class:`~asyncfl_jax.timing.schedule.Schedule` shared by the replicas,
  or one per seed; train at dispatch, or lookahead batching (``lookahead > 1``, the plan computed here and shared by
  the replicas).
* :class:`EventClockTimeline`: one :class:`~asyncfl_jax.timing.clock.EventClock` per seed (or shared); the chunk's
  duration tables are computed on the host from the clock's job and upload counters; the realized schedules are
  rebuilt from the per-step traces.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.distributed import to_host
from asyncfl_jax.engine.clocks import TRACE_NAMES, ClockChunk, InScanClock, PresampledClock
from asyncfl_jax.engine.hparams import Replica
from asyncfl_jax.engine.replicas import PerReplica
from asyncfl_jax.engine.inputs import (LookaheadPlan, ScheduleArrays, StepArrays, lookahead_plan, lookahead_summary,
                                       schedule_arrays, slice_steps, stack_schedules)
from asyncfl_jax.engine.step import Program, make_program
from asyncfl_jax.engine.stores import TrainAtArrival, presampled_store
from asyncfl_jax.task import Task
from asyncfl_jax.timing.clock import EventClock, OpenJobs, Trace, realized_schedule, stack_tables
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.stats import schedule_summary


def _distinct_seeds(seeds: Sequence[int], what: str) -> None:
    """One schedule (or clock) per seed needs distinct seeds (else two of them would be matched to one seed)."""
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a seed, so the {what} given one per seed cannot be matched to "
                         "them; use distinct seeds")


def _per_replica(items: list[Any], seeds: Sequence[int], replicas: Sequence[Replica], what: str) -> list[Any]:
    """One item shared by every replica, or one per seed matched to the replicas by their seeds."""
    if len(items) == 1:
        return items * len(replicas)
    if len(items) != len(seeds):
        raise ValueError(f"got {len(items)} {what} for {len(seeds)} seeds; give one per seed or one in all")
    _distinct_seeds(seeds, what)
    by_seed = dict(zip([int(s) for s in seeds], items))
    return [by_seed[r.seed] for r in replicas]


def make_timeline(schedules: Any, seeds: Sequence[int], replicas: Sequence[Replica], num_clients: int,
                  eval_every: int, lookahead: int) -> "PresampledTimeline | EventClockTimeline":
    """The timeline of ``schedules``: schedules or event clocks (one shared, one per seed, or one per replica in a
    :class:`~asyncfl_jax.engine.replicas.PerReplica` list, checked and padded by :mod:`~asyncfl_jax.engine.replicas`;
    not a mix)."""
    explicit = isinstance(schedules, PerReplica)
    items = [schedules] if isinstance(schedules, (Schedule, EventClock)) else list(schedules)
    if explicit and len(items) != len(replicas):
        raise ValueError(f"got {len(items)} schedules for {len(replicas)} replicas")
    clocked = [isinstance(c, EventClock) for c in items]
    if any(clocked) and not all(clocked):
        raise ValueError("schedules must be all Schedule or all EventClock, not a mix")
    if not all(clocked) and not all(isinstance(c, Schedule) for c in items):
        raise ValueError("schedules must be Schedule or EventClock objects")
    if any(clocked):
        if lookahead > 1:
            raise ValueError("lookahead batching needs a pre-sampled schedule; the event clock trains each job when "
                             "it arrives (use lookahead=1)")
        clocks = items if explicit else _per_replica(items, seeds, replicas, "event clocks")
        return EventClockTimeline(clocks, num_clients, eval_every)
    # One schedule object for every replica is shared (not stacked), whether given once or once per replica.
    shared = len(items) == 1 or (explicit and all(s is items[0] for s in items))
    per = items if explicit else _per_replica(items, seeds, replicas, "schedules")
    return PresampledTimeline(per, shared, num_clients, lookahead)


@dataclasses.dataclass
class PresampledTimeline:
    """Replicas over pre-sampled schedules (``shared``: one schedule for all of them)."""

    schedules: list[Schedule]
    shared: bool
    num_clients: int
    lookahead: int = 1
    records_schedules = False  # the History's realized_schedules: None (the schedules are the given ones)

    def __post_init__(self) -> None:
        for s in self.schedules:
            if s.num_clients != self.num_clients:
                raise ValueError(f"the schedule has {s.num_clients} clients but the task has {self.num_clients}")
        if self.shared:
            self.inputs, self.num_slots = schedule_arrays(self.schedules[0]), self.schedules[0].num_slots
        else:
            self.inputs, self.num_slots = stack_schedules(self.schedules)
        self.store = presampled_store(self.lookahead)  # train at dispatch, or lookahead batching
        axis = None if self.shared else 0
        self.input_axes: Any = axis
        self.chunk_axes: Any = axis
        if self.lookahead > 1:  # the plan is shared by the replicas (one plan valid for every replica's schedule)
            position, flush = lookahead_plan(self.schedules[:1] if self.shared else self.schedules, self.lookahead)
            self.plan = LookaheadPlan(jnp.asarray(position), jnp.asarray(flush))
            self.inputs = self.inputs._replace(steps=self.inputs.steps._replace(plan=self.plan))
            if not self.shared:
                self.chunk_axes = StepArrays(*([0] * (len(StepArrays._fields) - 1)), plan=None)
                self.input_axes = ScheduleArrays(0, 0, self.chunk_axes)

    @property
    def num_steps(self) -> int:
        return self.schedules[0].num_steps

    def program(self, task: Task, algorithm: Algorithm, local: LocalConfig, constrain_jobs: Any,
                executor: Any = None) -> Program:
        """Train at dispatch, or lookahead batching (:attr:`store`, chosen from the options with the timeline)."""
        return make_program(task, algorithm, local, PresampledClock(), self.store, num_slots=self.num_slots,
                            constrain_jobs=constrain_jobs, executor=executor)

    def chunk_inputs(self, inputs: ScheduleArrays, start: int, stop: int, carry: Any) -> StepArrays:
        del carry
        part = slice_steps(inputs.steps._replace(plan=()), start, stop, replica_axis=not self.shared)
        if self.lookahead > 1:
            part = part._replace(plan=jax.tree_util.tree_map(lambda a: a[start:stop], inputs.steps.plan))
        return part

    def identity(self, inputs: ScheduleArrays) -> Any:
        """What a checkpoint records of the timing (the schedule arrays)."""
        return inputs

    def realized(self, traces: Mapping[str, list[np.ndarray]], carry: Any, num_steps: int) -> list[Schedule]:
        del traces, carry, num_steps
        return self.schedules

    def summaries(self, realized: list[Schedule]) -> list[dict]:
        """The schedule statistics of the History (one for a shared schedule)."""
        return [schedule_summary(s) for s in (realized[:1] if self.shared else realized)]

    def lookahead_info(self) -> dict | None:
        return lookahead_summary(self.lookahead, self.plan.flush) if self.lookahead > 1 else None

    def job_steps(self, traces: Mapping[str, list[np.ndarray]], num_steps: int) -> None:
        del traces, num_steps
        return None


@dataclasses.dataclass
class EventClockTimeline:
    """Replicas under the in-scan event clock (one :class:`EventClock` per replica)."""

    clocks: list[EventClock]
    num_clients: int
    eval_every: int
    shared: bool = False
    lookahead: int = 1
    records_schedules = True  # the History keeps the schedules the clock realized

    def __post_init__(self) -> None:
        for c in self.clocks:
            if c.num_clients != self.num_clients:
                raise ValueError(f"the event clock has {c.num_clients} clients but the task has {self.num_clients}")
            if c.num_steps != self.clocks[0].num_steps:
                raise ValueError("the event clocks of the replicas must have the same num_steps")
        zeros = np.zeros(self.num_clients, dtype=np.int64)
        self.inputs = stack_tables([c.tables(zeros, zeros, 1) for c in self.clocks])  # the initial jobs' tables
        self.input_axes: Any = 0
        self.chunk_axes: Any = ClockChunk(None, 0)
        self.num_slots = self.num_clients

    @property
    def num_steps(self) -> int:
        return self.clocks[0].num_steps

    def program(self, task: Task, algorithm: Algorithm, local: LocalConfig, constrain_jobs: Any,
                executor: Any = None) -> Program:
        """One slot per client; each job trained when it arrives."""
        return make_program(task, algorithm, local, InScanClock(self.num_clients, local.steps), TrainAtArrival,
                            num_slots=self.num_clients, constrain_jobs=constrain_jobs, executor=executor)

    def chunk_inputs(self, inputs: Any, start: int, stop: int, carry: Any) -> ClockChunk:
        """The chunk's steps and the duration tables its clients may need, from the clock's counters."""
        del inputs
        jobs, uploads = to_host((carry.clock.jobs, carry.clock.uploads))  # from every process (a collective)
        tables = stack_tables([c.tables(jobs[r], uploads[r], self.eval_every + 1) for r, c in enumerate(self.clocks)])
        return ClockChunk(jnp.arange(start, stop, dtype=jnp.int32), tables)

    def identity(self, inputs: Any) -> Any:
        """What a checkpoint records of the timing (the initial tables and the clocks' descriptions)."""
        described = json.dumps([c.info for c in self.clocks], sort_keys=True).encode()
        return inputs, np.frombuffer(described, dtype=np.uint8)

    def realized(self, traces: Mapping[str, list[np.ndarray]], carry: Any, num_steps: int) -> list[Schedule]:
        """Each replica's schedule, rebuilt from the per-step traces and the jobs that never arrived."""
        trace = {k: np.concatenate(v, axis=1)[:, :num_steps] for k, v in traces.items()}
        clock = to_host(carry.clock)
        return [realized_schedule(c, _replica_trace(trace, r), _open_jobs(clock, r)) for r, c in enumerate(self.clocks)]

    def summaries(self, realized: list[Schedule]) -> list[dict]:
        return [schedule_summary(s) for s in realized]

    def lookahead_info(self) -> None:
        return None

    def job_steps(self, traces: Mapping[str, list[np.ndarray]], num_steps: int) -> np.ndarray:
        """int [R, T]: the local step count of the job applied at each step (-1 once a replica was frozen)."""
        steps = np.concatenate(traces["steps"], axis=1)[:, :num_steps]
        clients = np.concatenate(traces["client"], axis=1)[:, :num_steps]
        return np.where(np.minimum.accumulate(clients, axis=1) < 0, -1, steps)


def _replica_trace(trace: Mapping[str, np.ndarray], r: int) -> Trace:
    frozen = np.flatnonzero(trace["client"][r] < 0)  # a diverged replica is frozen: its schedule stops there
    end = int(frozen[0]) if frozen.size else trace["client"].shape[1]
    start = trace["start_hi"][r][:end].astype(np.float64) + trace["start_lo"][r][:end]
    arrival = trace["arrival_hi"][r][:end].astype(np.float64) + trace["arrival_lo"][r][:end]
    return Trace(*(trace[k][r][:end] for k in ("client", "row", "col", "steps")), start, arrival)


def _open_jobs(clock: Any, r: int) -> OpenJobs:
    in_flight = np.isfinite(clock.finish.hi[r])
    lost = clock.discarded_row[r] >= 0
    return OpenJobs(
        client=np.concatenate([np.flatnonzero(in_flight), np.flatnonzero(lost)]),
        row=np.concatenate([clock.row[r][in_flight], clock.discarded_row[r][lost]]),
        col=np.concatenate([clock.col[r][in_flight], clock.discarded_col[r][lost]]),
        start=np.concatenate([clock.start.hi[r][in_flight].astype(np.float64) + clock.start.lo[r][in_flight],
                              clock.discarded_start.hi[r][lost].astype(np.float64)
                              + clock.discarded_start.lo[r][lost]]),
    )


__all__ = ["EventClockTimeline", "PresampledTimeline", "TRACE_NAMES", "make_timeline"]
