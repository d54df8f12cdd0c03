"""The simulation engine: one compiled ``lax.scan`` of server steps, vmapped over replicas, driven by a host loop.

The data flow, from a configuration to a :class:`~asyncfl_jax.results.History` (``docs/architecture.md``):

* :mod:`~asyncfl_jax.engine.timelines`: the replicas' schedules (pre-sampled, or in-scan event clocks) and what each
  chunk reads (:mod:`~asyncfl_jax.engine.inputs`);
* :mod:`~asyncfl_jax.engine.step`: the :class:`Program`: one server step shared by every clock and store, its scan
  over a chunk, the freeze of a diverged replica, the initialization (:mod:`~asyncfl_jax.engine.clocks`: when jobs
  start and results arrive; :mod:`~asyncfl_jax.engine.stores`: where a job's work waits;
  :mod:`~asyncfl_jax.engine.jobs`: the vmapped local training);
* :mod:`~asyncfl_jax.engine.placement`: single device, or jobs / replicas / clients spread over devices;
* :mod:`~asyncfl_jax.engine.options`: :class:`EngineOptions`, the engine's options, each rule written once;
* :mod:`~asyncfl_jax.engine.loop`: :func:`plan` (the one planning pass; :func:`prepare_run` with keywords) and the
  :class:`HostLoop` with its callbacks
  (:mod:`~asyncfl_jax.engine.callbacks`: progress, divergence warnings, early stop, checkpoints, metric writers);
* :func:`simulate`: the short driver over all of it; :func:`make_simulation`: the whole run as one pure function.

Randomness: the job at position ``j`` of dispatch row ``t + 1`` (started during step ``t``) uses
``fold_in(fold_in(key, t + 1), j)`` (initial jobs: row 0) and the server's randomness at step ``t`` uses
``fold_in(fold_in(key, t + 1), SERVER_STREAM)``, so results do not depend on chunking, batching of replicas, or when a
job is trained.
"""

from asyncfl_jax.engine.budget import MemoryBudget, device_memory_bytes, memory_budget
from asyncfl_jax.engine.callbacks import (Checkpoints, CSVLogger, DivergenceWarnings, JSONLinesLogger, ProgressBar,
                                          StopWhenAllDiverged, TensorBoardLogger, point_progress, progress_bar)
from asyncfl_jax.engine.clocks import TRACE_NAMES, ClockChunk, InScanClock, PresampledClock
from asyncfl_jax.engine.history import make_history
from asyncfl_jax.engine.hparams import (Replica, default_hparams, make_replicas, replica_keys, resolve_hparams,
                                        stack_hparams)
from asyncfl_jax.engine.inputs import (LookaheadPlan, ScheduleArrays, StepArrays, flush_buckets, job_arrivals,
                                       lookahead_plan, lookahead_windows, schedule_arrays, slice_steps,
                                       stack_schedules)
from asyncfl_jax.engine.jobs import INIT_BATCH, INIT_ROUND_STREAM, SERVER_STREAM, Arrivals, Jobs, Trainer, make_trainer
from asyncfl_jax.engine.loop import ChunkUpdate, HostLoop, Run, metric_shapes, plan, prepare_run
from asyncfl_jax.engine.options import EngineOptions, OptionError
from asyncfl_jax.engine.placement import (Placement, ShardClients, ShardJobs, ShardReplicas, SingleDevice, client_shardings,
                                          job_sharding, make_placement, per_client_leaves, replica_shardings)
from asyncfl_jax.engine.replicas import ReplicaSpec
from asyncfl_jax.engine.simulate import simulate
from asyncfl_jax.engine.step import (Carry, Program, SimulationOutput, build_program,
                                     freeze_diverged, keep_if_diverged, make_program, make_simulation)
from asyncfl_jax.engine.stores import Lookahead, TrainAtArrival, TrainAtDispatch, presampled_store

__all__ = [
    "Arrivals", "CSVLogger", "Carry", "Checkpoints", "ChunkUpdate", "ClockChunk", "DivergenceWarnings", "EngineOptions",
    "HostLoop", "OptionError", "Placement", "plan",
    "INIT_BATCH", "INIT_ROUND_STREAM", "InScanClock", "JSONLinesLogger", "Jobs", "Lookahead", "LookaheadPlan",
    "MemoryBudget", "PresampledClock", "ProgressBar", "Program", "Replica", "ReplicaSpec", "Run", "SERVER_STREAM",
    "ScheduleArrays", "ShardClients", "ShardJobs", "ShardReplicas", "SimulationOutput", "SingleDevice", "StepArrays",
    "StopWhenAllDiverged", "TRACE_NAMES", "TensorBoardLogger", "TrainAtArrival", "TrainAtDispatch", "Trainer",
    "build_program", "client_shardings", "default_hparams", "device_memory_bytes", "flush_buckets",
    "freeze_diverged", "job_arrivals", "job_sharding", "keep_if_diverged", "lookahead_plan", "lookahead_windows",
    "make_history", "make_placement", "make_program", "make_replicas", "make_simulation", "make_trainer",
    "memory_budget", "metric_shapes", "per_client_leaves", "point_progress", "prepare_run", "presampled_store",
    "progress_bar",
    "replica_keys", "replica_shardings",
    "resolve_hparams", "schedule_arrays", "simulate", "slice_steps", "stack_hparams", "stack_schedules",
]
