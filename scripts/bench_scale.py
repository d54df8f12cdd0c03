"""The engine/baseline timers of ``scripts/bench.py`` and its "performance and scale" parts.

``bench.py`` is the entry point (it sets up the XLA devices before JAX is imported, then imports this module). What
is here:

* :func:`bench_engine`: times the engine's compiled chunks over a pre-sampled schedule with the engine's own host
  loop (``prepare_run`` + ``HostLoop``, what :func:`asyncfl_jax.simulate` runs; a callback records each chunk's
  time), optionally with lookahead batching, with the jobs or the replica axis spread over the devices, or from a zero
  state of the right shapes (large n, see below).
* :func:`bench_baseline`: the plain per-event Python loop over the same schedule doing the same math (one jitted
  client call per job, one jitted server call per step, the initialization round of ACE client by client).
* :func:`bench_breakdown`: the engine's two halves run alone (the server rule over the schedule's arrivals, the local
  training of the schedule's jobs), to see what limits a step.
* the parts: :func:`run_algorithm` (ACE / CA2FL engine vs loop, lookahead on vs off), :func:`run_scaling` (time per
  event and memory as n grows), :func:`run_replicas` (wall time as the replica axis grows), :func:`run_compile` (the
  default experiment's compile time), and :func:`plot` (``bench.png``).

Zero-state runs. The engine's ``init`` trains the initial jobs (n of them under "all_active") and ACE's
initialization round (n more); it scans over groups of ``INIT_BATCH`` jobs, so it compiles once whatever n, but
running it trains 2n jobs. Where a part only needs the steady-state step (scaling beyond ``real_init_max_n``, the
replica sweep of ACE) it starts the chunk from a zero state of the same shapes instead, to keep the benchmark short:
a step does the same work whatever the values (the cache row write, the gradient job and the server update have no
value-dependent control flow), so the time per event is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.algorithms.base import ServerMeta
from asyncfl_jax.client import LocalConfig, local_flops_per_job, make_local_update
from asyncfl_jax.data import partition
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import (INIT_ROUND_STREAM, SERVER_STREAM, HostLoop, flush_buckets, job_sharding, lookahead_plan,
                                lookahead_windows, make_placement, make_replicas, prepare_run)
from asyncfl_jax.engine.stores import LookaheadState
from asyncfl_jax.models.core import make_model
from asyncfl_jax.results import save_figure
from asyncfl_jax.task import make_evaluator, make_task, task_arrays
from asyncfl_jax.timing import DelayModel, make_schedule

SEED = 0
# Engine vs baseline after the first chunk: max |diff| <= CHECK_RTOL * max(max |x|, 1) (see bench.py).
CHECK_RTOL = 1e-2

# ACE (all_active, one minibatch gradient per job) and CA2FL (the FedBuff setting of bench.py) on Fashion-MNIST.
ACE = {"batch_size": 32, "server_lr": 0.1}
CA2FL = {"num_clients": 100, "concurrency": 20, "buffer_size": 10, "refill": "boundary", "local_steps": 10,
         "batch_size": 32, "client_lr": 0.05, "server_lr": 1.0}
SCALING_EXAMPLES_PER_CLIENT = 32  # scaling part: every client holds 32 training examples (drawn with overlap)
REPLICA_LRS = (0.01, 0.02, 0.05, 0.1)  # replica sweep: client learning rates x seeds

TARGET_SPEEDUP = 30.0  # FedBuff and ACE: engine >= 30x the per-event loop (client updates per second)
TARGET_REPLICAS = (16, 3.0)  # 16 replicas in <= 3x the wall time of one
TARGET_LOCAL_MATMUL_FRACTION = 0.7  # MLP local training >= 70% of the f32 matmul rate measured in the same run
TARGET_REPLICA_THROUGHPUT = (8, 1.5)  # 8 replicas deliver >= 1.5x the total arrivals/s of one (and >= 1x at every R)
TARGET_COMPILE_SECONDS = 20.0  # the default experiment compiles in <= 20 s

# Per mode: step counts and sizes of each part.
PLANS = {
    "full": {
        "ace": {"chunk": 500, "chunks": 5, "baseline": 1000, "lookaheads": (8, 32, 64), "num_clients": 1000},
        "ca2fl": {"chunk": 100, "chunks": 4, "baseline": 100, "num_clients": 100},
        "scaling": {"ns": (100, 1000, 10_000, 100_000), "ace": (200, 4), "ca2fl": (15, 4), "real_init_max_n": 1000},
        "replicas": {"counts": (1, 2, 4, 8, 16, 32, 64), "fedbuff": (10, 5), "fedbuff_mlp": (6, 4), "ace": (200, 4),
                     "ace_clients": 1000},
        "compile": {"arrivals": None},
    },
    "quick": {
        "ace": {"chunk": 250, "chunks": 3, "baseline": 300, "lookaheads": (8, 32), "num_clients": 1000},
        "ca2fl": {"chunk": 50, "chunks": 3, "baseline": 50, "num_clients": 100},
        "scaling": {"ns": (100, 10_000), "ace": (200, 3), "ca2fl": (10, 3), "real_init_max_n": 1000,
                    "sharded_jobs": False, "int8_at_largest": False},
        "replicas": {"counts": (1, 8, 16), "fedbuff": (10, 5), "fedbuff_mlp": (6, 3), "ace": (100, 3),
                     "ace_clients": 1000},
        "compile": {"arrivals": 600},  # the same programs as the default's 3,000 (chunks of T / 30 steps), run shorter
    },
    "smoke": {  # the smallest sizes (tests): the code paths, not the sweeps; numbers meaningless
        "ace": {"chunk": 5, "chunks": 2, "baseline": 5, "lookaheads": (4,), "num_clients": 50, "noop": False},
        "ca2fl": {"chunk": 2, "chunks": 2, "baseline": 2, "num_clients": 40, "noop": False},
        "scaling": {"ns": (60,), "ace": (5, 2), "ca2fl": (2, 2), "real_init_max_n": 50, "int8_at_largest": False,
                    "sharded_jobs": False},
        "replicas": {"counts": (1, 2), "ace": (5, 2), "ace_clients": 50, "algorithms": ("ace",)},
        "compile": {"arrivals": 20, "runs": 1},
    },
}


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------- memory
def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    """The process's resident set size now."""
    kib = _proc_status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size (since the last :func:`reset_peak_rss`, else since the process started)."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what the machine can still give, other jobs included)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gib(nbytes: float | None) -> str:
    return "?" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


# ---------------------------------------------------------------------------------------------------- engine timer
def _shrunk_eval(task):
    """The task with 2-example evaluation sets: the engine's per-chunk evaluation becomes negligible."""
    return dataclasses.replace(task, test_x=task.test_x[:2], test_y=task.test_y[:2],
                               train_eval_x=task.train_eval_x[:2], train_eval_y=task.train_eval_y[:2])


def _zero_carry(run):
    """A zero state of the run's carry shapes (an empty lookahead buffer, no replica diverged)."""
    shape = run.carry_shape
    carry = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
    carry = carry._replace(diverged_at=jnp.full(shape.diverged_at.shape, -1, jnp.int32))
    if isinstance(carry.store, LookaheadState):  # an empty lookahead buffer
        buf = carry.store.deferred
        buf = buf._replace(clients=jnp.full(buf.clients.shape, -1, jnp.int32),
                           slots=jnp.full(buf.slots.shape, -1, jnp.int32))
        carry = carry._replace(store=carry.store._replace(deferred=buf))
    return carry


class ChunkTimer:
    """Host-loop callback: the wall time of every chunk's compiled program, a matmul probe after each, and the
    model of replica 0 after the first chunk (to check the per-event loop against)."""

    def __init__(self, algorithm, probe=None):
        self.algorithm, self.probe = algorithm, probe
        self.seconds, self.probes, self.first_params = [], [], None
        self.cpu_seconds: list[float] = []  # process CPU time (all threads) from one chunk's end to the next's
        self._cpu_mark = None

    def on_chunk(self, loop, update):
        now = time.process_time()
        self.cpu_seconds.append(now - self._cpu_mark if self._cpu_mark is not None else math.nan)
        self.seconds.append(update.seconds)
        if self.first_params is None:
            server = jax.tree_util.tree_map(lambda a: a[0], loop.state.carry.server)
            self.first_params = np.asarray(self.algorithm.params(server))
        if self.probe is not None:
            self.probes.append(self.probe())
        self._cpu_mark = time.process_time()  # the probe's own CPU time left out


def window_summary(flush: np.ndarray, lookahead: int, width: int) -> dict[str, Any]:
    """Lookahead windows of a plan (steps between flushes) and the jobs a flush trains (all L x D buffer rows)."""
    windows = lookahead_windows(np.asarray(flush))
    return {"L": int(lookahead), "num_windows": int(windows.size),
            "mean_window": float(windows.mean()) if windows.size else 0.0,
            "median_window": float(np.median(windows)) if windows.size else 0.0,
            "max_window": int(windows.max(initial=0)),
            "window_histogram": [int(c) for c in np.bincount(windows, minlength=lookahead + 1)[1:]],
            "trained_rows_per_used_row": float(lookahead / windows.mean()) if windows.size else math.nan,
            "jobs_per_flush": int(lookahead * width)}


def bench_engine(task, algorithm, local, schedule, chunk_len: int, hp_replicas, probe=None, *, lookahead: int = 1,
                 shard: str | None = "jobs", zero_init: bool = False, full_eval: bool = True,
                 replica_batch: int | None = None) -> dict[str, Any]:
    """Times the engine's compiled chunk over ``schedule`` (its length is a multiple of ``chunk_len``).

    Compilation, the initial jobs and the first chunk (warm-up) are excluded; the evaluation sets are shrunk to 2
    examples (the training path is unchanged). ``probe()`` (optional) measures the matmul rate right after each timed
    chunk. ``lookahead = L > 1``: lookahead batching with the plan of this schedule. ``shard``: "jobs" (the jobs of a
    step over the devices), "replicas" (the replica axis over the devices, as ``simulate(shard_replicas=True)``) or
    None. ``zero_init``: start from a zero state of the carry's shapes (see the module docstring) instead of running
    ``init``. ``full_eval``: also time one full evaluation (10k test + 5k train examples). ``replica_batch``: as
    ``simulate``'s (None: the engine's default grouping for the backend).
    """
    T = schedule.num_steps
    num_chunks = T // chunk_len
    assert num_chunks * chunk_len == T, (T, chunk_len)
    ndev = jax.device_count()
    R = len(hp_replicas)
    if shard == "replicas" and (ndev == 1 or R % ndev):
        shard = None
    if shard == "jobs" and ndev == 1:
        shard = None
    timed_task = _shrunk_eval(task)
    plan_seconds, windows = 0.0, None
    if lookahead > 1:  # the host's plan, timed on its own (prepare_run computes it again)
        t0 = time.perf_counter()
        position, flush = lookahead_plan([schedule], lookahead)
        plan_seconds = time.perf_counter() - t0
    placement = make_placement(shard_jobs=shard == "jobs", shard_replicas=shard == "replicas")
    run = prepare_run(timed_task, algorithm, schedule, local, eval_every=chunk_len, placement=placement,
                      lookahead=lookahead, replicas=hp_replicas, replica_batch=replica_batch)
    budget = run.budget()
    timer = ChunkTimer(algorithm, probe)
    loop = HostLoop(run, [timer])  # the engine's own host loop, as simulate drives it
    placed = run.placed
    compile_init = init_run = math.nan
    if zero_init:
        start = loop.initial_state(_zero_carry(run))
    else:
        t0 = time.perf_counter()
        init_c = loop.init_fn.lower(placed.inputs, placed.hp, placed.keys, placed.data).compile()
        compile_init = time.perf_counter() - t0
        t0 = time.perf_counter()
        carry = init_c(placed.inputs, placed.hp, placed.keys, placed.data)
        jax.block_until_ready(carry)
        init_run = time.perf_counter() - t0
        start = loop.initial_state(carry)
    state = loop.run(start)  # chunk 0 is the warm-up (and compiles the chunk)
    compile_chunk = loop.loop_compile_seconds
    first_chunk = timer.seconds[0]
    params_after_first = timer.first_params
    timed = list(range(1, num_chunks)) or [0]
    chunk_seconds = timer.seconds[1:]
    if timed == [0]:  # a single chunk: time it again from a fresh state (the compiled chunk is reused)
        timer.seconds = []
        state = loop.run(loop.initial_state(_zero_carry(run) if zero_init else None))
        chunk_seconds = timer.seconds
    probes = timer.probes[1:] if len(timer.probes) > 1 else timer.probes
    carry = state.carry
    seconds = float(sum(chunk_seconds))

    steps = range(timed[0] * chunk_len, (timed[-1] + 1) * chunk_len)
    arrivals = int((schedule.arrival_clients[steps.start:steps.stop] >= 0).sum())
    jobs = int((schedule.dispatch_clients[steps.start:steps.stop] >= 0).sum())
    if lookahead > 1:
        flush_timed = np.asarray(flush)[steps.start:steps.stop]
        filled = np.asarray(position)[steps.start:steps.stop][flush_timed] + 1
        buckets = np.asarray(flush_buckets(lookahead))
        trained_rows = buckets[np.searchsorted(buckets, filled)]  # a flush trains its filled rows, rounded up
        computed_jobs = int(trained_rows.sum()) * schedule.dispatch_width
        windows = window_summary(flush, lookahead, schedule.dispatch_width)
        windows["plan_seconds"] = plan_seconds
    else:
        computed_jobs = len(steps) * schedule.dispatch_width  # the vmap also trains padded (-1) entries

    res = {
        "replica_batch": run.replica_batch,
        "server_steps_total": T,
        "chunk_len": chunk_len,
        "replicas": R,
        "shard": shard,
        "lookahead": lookahead,
        "windows": windows,
        "zero_init": zero_init,
        "timed_steps": len(steps),
        "timed_arrivals": arrivals,
        "timed_jobs": jobs,
        "timed_computed_jobs": computed_jobs,
        "run_seconds": seconds,
        "first_chunk_seconds": first_chunk,
        "compile_seconds": (0.0 if zero_init else compile_init) + compile_chunk,
        "compile_init_seconds": compile_init,
        "compile_chunk_seconds": compile_chunk,
        "init_run_seconds": init_run,
        "updates_per_second": arrivals * R / seconds,
        "server_steps_per_second": len(steps) / seconds,
        "jobs_per_second": jobs * R / seconds,
        "seconds_per_step": seconds / len(steps),
        "seconds_per_event": seconds / max(arrivals, 1),
        "chunk_seconds": chunk_seconds,
        "chunk_jobs": [int((schedule.dispatch_clients[c * chunk_len:(c + 1) * chunk_len] >= 0).sum()) for c in timed],
        "matmul_gflops_after_chunk": probes,
        "best_chunk_updates_per_second": arrivals * R / len(timed) / min(chunk_seconds),
        # process CPU seconds (all threads) per client update over the timed chunks (their evaluations included)
        "cpu_seconds_per_upload": float(np.sum(timer.cpu_seconds[1:])) / max(arrivals * R, 1)
        if len(timer.cpu_seconds) > 1 else math.nan,
        "num_slots": schedule.num_slots,
        "dispatch_width": schedule.dispatch_width,
        "memory_budget": budget.as_dict(),
        "memory_budget_text": budget.describe(),
        "_params_after_first_chunk": params_after_first,
    }
    if full_eval:  # one full evaluation (what eval_every costs), measured on its own
        eval_fn = jax.jit(jax.vmap(make_evaluator(task.model), in_axes=(0, None)))
        xs = jax.vmap(algorithm.params)(carry.server)
        full_data = task_arrays(task)
        jax.block_until_ready(eval_fn(xs, full_data))
        best_eval = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(eval_fn(xs, full_data))
            best_eval = min(best_eval, time.perf_counter() - t0)
        res["full_eval_seconds"] = best_eval
        res["final_test_accuracy"] = float(eval_fn(xs, full_data)["test_accuracy"][0])
    del carry, state, loop
    return res


# ---------------------------------------------------------------------------------------------------- baseline
def bench_baseline(task, algorithm, local, schedule, num_steps: int, hp_replica, noop: bool = False,
                   check_step: int | None = None, segments: int = 5) -> dict[str, Any]:
    """A per-event Python loop: one jitted client call per job, one jitted server call per step.

    The same math as the engine: jobs use the engine's PRNG keys (``fold_in(fold_in(key, t + 1), j)``), the server its
    per-step key, an initialization round (ACE) is run client by client at ``x0`` and applied with all n messages.
    The server call donates its state, so an n x d cache is updated in place as in the engine. Algorithms with client
    memory or per-job step counts are not supported. ``noop=True`` replaces local training by a trivial function of
    the same signature: the loop's own cost (Python, dispatch of one jitted call per event). The loop is also timed
    in ``segments`` equal parts (waiting for the device at the end of each): the best part's rate is robust to other
    jobs on the machine, as the engine's best chunk is.
    """
    x0 = task.model.flat_params
    n = task.num_clients
    if jax.tree_util.tree_leaves(algorithm.init_clients(x0, 1)) or algorithm.jobs.steps is not None:
        raise ValueError(f"the per-event loop does not support {algorithm.name} (client memory / per-job steps)")
    if noop:
        def local_fn(x, client, key, hp, data):  # raw uint32[2] keys (PRNGKey)
            return x * 1e-3 + key[0].astype(x.dtype)
    else:
        local_fn = make_local_update(task.model, local, output=algorithm.local_output)
    hp = {k: jnp.float32(v) for k, v in hp_replica.hparams.items()}
    key = jax.random.PRNGKey(hp_replica.seed)

    @jax.jit
    def client_job(x, client, stream, j, hp, data):
        k = jax.random.fold_in(jax.random.fold_in(key, stream), j)  # the engine's key for this job
        message, _ = algorithm.client(x, local_fn(x, client, k, hp, data), (), hp)
        return message

    @functools.partial(jax.jit, donate_argnums=(0,))
    def server_step(state, messages, clients, staleness, step, time_, stream, hp):
        deltas = jnp.stack(messages)
        mask = clients >= 0
        meta = ServerMeta(clients=clients, mask=mask, staleness=jnp.where(mask, staleness, 0), step=step, time=time_,
                          key=jax.random.fold_in(jax.random.fold_in(key, stream), SERVER_STREAM))
        return algorithm.server(state, deltas, meta, hp)

    staleness = np.maximum(schedule.staleness, 0)
    state = jax.tree_util.tree_map(jnp.copy, algorithm.init(x0, n))  # the calls donate it: never the task's x0
    pending: dict[int, jax.Array] = {}
    t0 = time.perf_counter()
    if algorithm.init_round is not None:  # every client at x0, then one server step with the n messages (as the engine)
        msgs = tuple(client_job(x0, i, INIT_ROUND_STREAM, i, hp, task.train) for i in range(n))
        state = server_step(state, msgs, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), -1, np.float32(0),
                            INIT_ROUND_STREAM, hp)
        del msgs
    start = algorithm.params(state)
    for j, (c, s) in enumerate(zip(schedule.init_clients.tolist(), schedule.init_slots.tolist())):
        if c >= 0:  # initial jobs (also compile client_job)
            pending[s] = client_job(start, c, 0, j, hp, task.train)
    # Compile the server step outside the timing (on a copy: the call donates its state).
    zero = jnp.zeros_like(x0)
    jax.block_until_ready(server_step(jax.tree_util.tree_map(jnp.copy, state), (zero,) * schedule.buffer_width,
                                      schedule.arrival_clients[0], staleness[0], 0, np.float32(0), 1, hp))
    jax.block_until_ready((pending, state))
    warmup = time.perf_counter() - t0

    steps_ = arrivals = jobs = 0
    at_check = None
    bounds = set(np.linspace(0, num_steps, min(segments, num_steps) + 1).astype(int).tolist()[1:])
    segment_rates, seg_t0, seg_arrivals = [], time.perf_counter(), 0
    t0 = time.perf_counter()
    for t in range(num_steps):
        x = algorithm.params(state)
        for j, (c, s) in enumerate(zip(schedule.dispatch_clients[t].tolist(), schedule.dispatch_slots[t].tolist())):
            if c >= 0:  # 1. dispatch: train now from x_t, keep the message in the job's slot
                pending[s] = client_job(x, c, t + 1, j, hp, task.train)
                jobs += 1
        msgs = []
        for c, s in zip(schedule.arrival_clients[t].tolist(), schedule.arrival_slots[t].tolist()):
            if c >= 0:  # 2. arrival: read the message from its slot
                msgs.append(pending.pop(s))
                arrivals += 1
            else:
                msgs.append(zero)
        state = server_step(state, tuple(msgs), schedule.arrival_clients[t], staleness[t], t,
                            np.float32(schedule.step_times[t]), t + 1, hp)
        steps_ += 1
        if steps_ == check_step:
            at_check = jnp.copy(algorithm.params(state))  # no device sync inside the timed loop
        if steps_ in bounds:  # the end of a segment
            jax.block_until_ready(state)
            now = time.perf_counter()
            segment_rates.append((arrivals - seg_arrivals) / (now - seg_t0))
            seg_t0, seg_arrivals = now, arrivals
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t0
    res = {
        "timed_steps": steps_,
        "timed_arrivals": arrivals,
        "timed_jobs": jobs,
        "run_seconds": seconds,
        "warmup_seconds": warmup,
        "updates_per_second": arrivals / seconds,
        "server_steps_per_second": steps_ / seconds,
        "jobs_per_second": jobs / seconds,
        "seconds_per_step": seconds / max(steps_, 1),
        "seconds_per_event": seconds / max(arrivals, 1),
        "segment_updates_per_second": segment_rates,
        "best_segment_updates_per_second": max(segment_rates) if segment_rates else math.nan,
        "_params_at_check": None if at_check is None else np.asarray(at_check),
    }
    del state, pending
    return res


# ---------------------------------------------------------------------------------------------------- breakdown
def bench_breakdown(task, algorithm, local, schedule, num_steps: int, hp_replica, repeats: int = 3,
                    halves: tuple[str, ...] = ("server", "training"), shard: str | None = None) -> dict[str, Any]:
    """Seconds per server step of the engine's two halves run alone, each as one jitted ``lax.scan`` over the
    schedule's first ``num_steps`` steps: the server rule on the step's arrivals (with fixed messages), and the local
    training of the step's dispatched jobs (vmapped, from a carried model). Their sum against the engine's step time
    leaves the engine's own bookkeeping (pending-buffer writes and reads, keys, the divergence check). ``halves``
    selects which of the two run; ``shard="jobs"`` spreads the jobs of a step over the devices as the engine does."""
    spread = job_sharding() if shard == "jobs" and jax.device_count() > 1 else None
    x0 = task.model.flat_params
    n, d = task.num_clients, x0.shape[0]
    hp = {k: jnp.float32(v) for k, v in hp_replica.hparams.items()}
    key = jax.random.PRNGKey(hp_replica.seed)
    local_fn = make_local_update(task.model, local, output=algorithm.local_output)
    sl = slice(0, num_steps)
    arrivals = (jnp.asarray(schedule.arrival_clients[sl]), jnp.asarray(np.maximum(schedule.staleness[sl], 0)))
    dispatches = jnp.asarray(schedule.dispatch_clients[sl])
    ts = jnp.arange(num_steps, dtype=jnp.int32)
    messages = 1e-3 * jax.random.normal(jax.random.PRNGKey(3), (schedule.buffer_width, d), jnp.float32)

    @functools.partial(jax.jit, donate_argnums=(0,))
    def servers(state, messages, hp):
        def body(st, item):
            clients, stale, t = item
            mask = clients >= 0
            meta = ServerMeta(clients=clients, mask=mask, staleness=jnp.where(mask, stale, 0), step=t,
                              time=t.astype(jnp.float32),
                              key=jax.random.fold_in(jax.random.fold_in(key, t + 1), SERVER_STREAM))
            return algorithm.server(st, messages, meta, hp), None

        return jax.lax.scan(body, state, (*arrivals, ts))[0]

    @jax.jit
    def training(x, hp, data):
        def body(x, item):
            clients, t = item
            base = jax.random.fold_in(key, t + 1)
            keys = jax.vmap(lambda j: jax.random.fold_in(base, j))(jnp.arange(clients.shape[0]))
            clients = jnp.maximum(clients, 0)
            if spread is not None:
                clients = jax.lax.with_sharding_constraint(clients, spread)
                keys = jax.lax.with_sharding_constraint(keys, spread)
            results = jax.vmap(local_fn, in_axes=(None, 0, 0, None, None))(x, clients, keys, hp, data)
            return x - 1e-6 * jnp.sum(results, axis=0), None  # the next step depends on this one

        return jax.lax.scan(body, x, (dispatches, ts))[0]

    def best_of(fn, make_args):
        jax.block_until_ready(fn(*make_args()))  # compile + warm-up
        best = math.inf
        for _ in range(repeats):
            args = make_args()
            jax.block_until_ready(args)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best = min(best, time.perf_counter() - t0)
        return best / num_steps

    res = {"steps": num_steps, "jobs_per_step": float((schedule.dispatch_clients[sl] >= 0).sum() / num_steps)}
    if "server" in halves:
        # The state is donated, so it is built on a copy of x0 (never the task's own), and each timed call runs on the
        # previous call's output, as the engine's chunks do (a freshly built n x d state was copied whole at its first
        # call with 2 CPU devices: +0.25 s at n = 100,000).
        state = servers(algorithm.init(jnp.copy(x0), n), messages, hp)  # compile + warm-up
        jax.block_until_ready(state)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            state = servers(state, messages, hp)
            jax.block_until_ready(state)
            best = min(best, time.perf_counter() - t0)
        res["server_seconds_per_step"] = best / num_steps
        del state
    if "training" in halves:
        res["training_seconds_per_step"] = best_of(training, lambda: (x0, hp, task.train))
    return res


# ---------------------------------------------------------------------------------------------------- helpers
def _check(eng: dict[str, Any], base: dict[str, Any], steps: int) -> dict[str, Any] | None:
    a, b = eng.pop("_params_after_first_chunk", None), base.get("_params_at_check")
    if a is None or b is None:
        return None
    diff = float(np.max(np.abs(a - b)))
    scale = float(np.max(np.abs(a)))
    return {"steps": steps, "max_abs_diff": diff, "max_abs_param": scale,
            "match": bool(np.isfinite(diff) and diff <= CHECK_RTOL * max(scale, 1.0))}


def fixed_size_task(ds: Dataset, num_clients: int, per_client: int = SCALING_EXAMPLES_PER_CLIENT, seed: int = SEED):
    """Logistic regression on ``ds`` with every client holding ``per_client`` random training examples (clients may
    share examples, so any n works; the work of a job does not depend on n)."""
    rng = np.random.default_rng([seed, num_clients])
    idx = np.sort(rng.integers(0, len(ds.train_y), (num_clients, per_client)), axis=1)
    model = make_model("logreg", ds.input_shape, ds.num_classes, seed=seed)
    return make_task(ds, list(idx), model, seed=seed)


def _ace_setup(num_clients: int, T: int, cache: str = "float32"):
    algorithm = get_algorithm("ace", cache=cache)
    local = LocalConfig(steps=1, batch_size=ACE["batch_size"])  # ACE uploads one minibatch gradient
    schedule = make_schedule("all_active", num_clients, T, DelayModel(), seed=SEED)
    return algorithm, local, schedule, {"server_lr": ACE["server_lr"]}


def _ca2fl_setup(num_clients: int, T: int, cache: str = "float32", name: str = "ca2fl"):
    algorithm = get_algorithm(name, cache=cache) if name == "ca2fl" else get_algorithm(name)
    local = LocalConfig(steps=CA2FL["local_steps"], batch_size=CA2FL["batch_size"])
    schedule = make_schedule("concurrent", num_clients, T, DelayModel(), seed=SEED,
                             concurrency=min(CA2FL["concurrency"], num_clients), buffer_size=CA2FL["buffer_size"],
                             refill=CA2FL["refill"])
    return algorithm, local, schedule, {"client_lr": CA2FL["client_lr"], "server_lr": CA2FL["server_lr"]}


def _job_shard(name: str) -> str | None:
    """ACE trains one job per step: spreading a step's jobs over the devices only adds a transfer (measured: 1.2 ms
    per step instead of 0.15 ms at n = 1000 on 2 CPU devices), so its jobs stay on one device; the others (10 jobs
    per step) spread them as the FedBuff part does."""
    return None if name == "ace" else "jobs"


# ---------------------------------------------------------------------------------------------------- part: ACE/CA2FL
def run_algorithm(name: str, ds: Dataset, plan: dict[str, Any]) -> dict[str, Any]:
    """Engine vs per-event loop for ACE (lookahead off and on) or CA2FL, Fashion-MNIST logistic regression."""
    n = plan["num_clients"]
    chunk_len, chunks = plan["chunk"], plan["chunks"]
    T = chunk_len * chunks
    if name == "ace":
        algorithm, local, schedule, hparams = _ace_setup(n, T)
        lookaheads = tuple(plan["lookaheads"])
    else:
        algorithm, local, schedule, hparams = _ca2fl_setup(n, T)
        lookaheads = ()
    parts = partition("iid", ds.train_y, n, SEED)
    model = make_model("logreg", ds.input_shape, ds.num_classes, seed=SEED)
    task = make_task(ds, parts, model, seed=SEED)
    replicas = make_replicas(algorithm, [SEED], hparams)
    flops = local_flops_per_job(model, task.train, local)  # ACE: one fwd+bwd (local.steps = 1)
    log(f"[{name}] n={n}, d={model.num_params}, T={T} steps ({chunks} chunks of {chunk_len}), D={schedule.dispatch_width}"
        f" jobs/step, M={schedule.buffer_width} arrivals/step, {flops / 1e6:.2f} MFLOP/job")

    variants = {}
    shard = _job_shard(name)
    eng = bench_engine(task, algorithm, local, schedule, chunk_len, replicas, shard=shard)
    variants["1"] = eng
    log(f"  engine L=1:  {eng['updates_per_second']:9.1f} updates/s, {eng['seconds_per_step'] * 1e6:7.1f} us/step, "
        f"compile {eng['compile_seconds']:.1f} s (init {eng['compile_init_seconds']:.1f} + chunk "
        f"{eng['compile_chunk_seconds']:.1f}), init run {eng['init_run_seconds']:.2f} s")
    for L in lookaheads:
        la = bench_engine(task, algorithm, local, schedule, chunk_len, replicas, lookahead=L, shard=shard,
                          full_eval=False)
        variants[str(L)] = la
        w = la["windows"]
        log(f"  engine L={L:<3} {la['updates_per_second']:9.1f} updates/s, {la['seconds_per_step'] * 1e6:7.1f} us/step "
            f"(windows: mean {w['mean_window']:.2f}, median {w['median_window']:.0f}, max {w['max_window']}; "
            f"{la['timed_computed_jobs']} jobs trained for {la['timed_jobs']} dispatched)")

    base = bench_baseline(task, algorithm, local, schedule, min(plan["baseline"], T), replicas[0],
                          check_step=chunk_len)
    log(f"  loop:        {base['updates_per_second']:9.1f} updates/s, {base['seconds_per_step'] * 1e6:7.1f} us/step "
        f"(timed {base['timed_steps']} steps in {base['run_seconds']:.2f} s; best segment "
        f"{base['best_segment_updates_per_second']:.1f} updates/s)")
    floor = None
    if plan.get("noop", True):
        floor = bench_baseline(task, algorithm, local, schedule, min(plan["baseline"], T), replicas[0], noop=True)
        floor.pop("_params_at_check", None)
        log(f"  loop with a no-op local update: {floor['updates_per_second']:.0f} updates/s = "
            f"{floor['seconds_per_event'] * 1e6:.0f} us per event")
    checks = {L: _check(v, base, chunk_len) for L, v in variants.items()}
    base.pop("_params_at_check", None)
    for L, c in checks.items():
        if c is not None:
            log(f"  check L={L}: engine vs loop after {c['steps']} steps: max |diff| = {c['max_abs_diff']:.2e} "
                f"-> {'match' if c['match'] else 'MISMATCH'}")
    breakdown = bench_breakdown(task, algorithm, local, schedule, min(T, max(chunk_len, 50)), replicas[0],
                                shard=eng["shard"])
    breakdown["shard"] = eng["shard"]
    breakdown["engine_seconds_per_step"] = eng["seconds_per_step"]
    breakdown["other_seconds_per_step"] = (eng["seconds_per_step"] - breakdown["server_seconds_per_step"]
                                           - breakdown["training_seconds_per_step"])
    log(f"  breakdown per step: engine {eng['seconds_per_step'] * 1e6:.0f} us = server alone "
        f"{breakdown['server_seconds_per_step'] * 1e6:.0f} us + training alone "
        f"{breakdown['training_seconds_per_step'] * 1e6:.0f} us + other {breakdown['other_seconds_per_step'] * 1e6:.0f} us")
    res = {
        "algorithm": name,
        "setting": {"num_clients": n, "protocol": "all_active" if name == "ace" else "concurrent",
                    "local_steps": local.steps if name != "ace" else 1, "batch_size": local.batch_size,
                    **({} if name == "ace" else {"concurrency": CA2FL["concurrency"],
                                                  "buffer_size": CA2FL["buffer_size"], "refill": CA2FL["refill"]}),
                    "hparams": hparams, "delays": "DelayModel() (speed U(0, 5) x |N(0, 1)|)", "partition": "iid"},
        "num_params": model.num_params,
        "flops_per_job": flops,
        "engine": variants,
        "baseline": base,
        "baseline_noop": floor,
        "speedup": {L: v["updates_per_second"] / base["updates_per_second"] for L, v in variants.items()},
        # best engine chunk vs best loop segment: both robust to other jobs on the machine
        "speedup_best": {L: v["best_chunk_updates_per_second"] / base["best_segment_updates_per_second"]
                         for L, v in variants.items()},
        "check": checks,
        "breakdown": breakdown,
    }
    if name != "ace":  # why lookahead does not apply here: the windows of this schedule
        res["lookahead_windows_L8"] = window_summary(lookahead_plan([schedule], 8)[1], 8, schedule.dispatch_width)
        log(f"  lookahead windows of this schedule with L=8: mean {res['lookahead_windows_L8']['mean_window']:.2f}")
    best = max(variants, key=lambda L: variants[L]["best_chunk_updates_per_second"])
    res["best_lookahead"] = int(best)
    return res


# ---------------------------------------------------------------------------------------------------- part: scaling
def _scaling_row(ds: Dataset, name: str, n: int, plan: dict[str, Any], cache: str,
                 shard: str | None) -> dict[str, Any]:
    chunk_len, chunks = plan[name]
    T = chunk_len * chunks
    task = fixed_size_task(ds, n)
    setup = _ace_setup if name == "ace" else _ca2fl_setup
    algorithm, local, schedule, hparams = setup(n, T, cache=cache)
    replicas = make_replicas(algorithm, [SEED], hparams)
    zero_init = name == "ace" and n > plan["real_init_max_n"]
    gc.collect()
    rss_before = rss_bytes()
    reset_ok = reset_peak_rss()
    eng = bench_engine(task, algorithm, local, schedule, chunk_len, replicas, full_eval=False, zero_init=zero_init,
                       shard=shard)
    peak = peak_rss_bytes()
    eng.pop("_params_after_first_chunk", None)
    # The server rule alone at this n (is the n x d cache update O(d) per arrival, as it should be?).
    server_s = bench_breakdown(task, algorithm, local, schedule, T, replicas[0], repeats=3,
                               halves=("server",))["server_seconds_per_step"]
    best = min(eng["chunk_seconds"]) / chunk_len  # the best timed chunk (robust to other jobs on the machine)
    row = {"algorithm": name, "num_clients": n, "cache": cache, "shard": eng["shard"], "zero_init": zero_init,
           "seconds_per_step": best, "seconds_per_event": best * eng["timed_steps"] / max(eng["timed_arrivals"], 1),
           "mean_seconds_per_step": eng["seconds_per_step"],
           "updates_per_second": eng["updates_per_second"], "timed_steps": eng["timed_steps"],
           "compile_init_seconds": eng["compile_init_seconds"], "compile_chunk_seconds": eng["compile_chunk_seconds"],
           "init_run_seconds": eng["init_run_seconds"], "memory_budget": eng["memory_budget"],
           "state_bytes": sum(eng["memory_budget"][k] for k in ("server_bytes", "clients_bytes", "pending_bytes")),
           "rss_before_bytes": rss_before, "peak_rss_bytes": peak, "peak_rss_reset": reset_ok,
           "server_rule_seconds_per_step": server_s}
    del task, eng
    gc.collect()
    return row


def run_scaling(ds: Dataset, plan: dict[str, Any]) -> dict[str, Any]:
    """Time per event and memory as n grows, for ACE (all_active) and CA2FL (concurrent, Mc = 20, M = 10), on one
    device; float32 caches where they fit (twice the state within 70% of the machine's available memory), else int8;
    int8 also at the largest n. CA2FL also with its jobs spread over the devices (as in the CA2FL part), where there
    are several. Time per step is that of the best timed chunk."""
    rows = []
    largest = max(plan["ns"])
    for name in ("ace", "ca2fl"):
        for n in plan["ns"]:
            caches = ["float32"] + (["int8"] if n == largest and plan.get("int8_at_largest", True) else [])
            # float32 fits? The budget is known before anything is compiled.
            _, _, schedule, _ = (_ace_setup if name == "ace" else _ca2fl_setup)(n, 2)
            d = int(np.prod(ds.input_shape)) * ds.num_classes + ds.num_classes  # logistic regression
            state_est = _state_bytes_estimate(n, schedule.num_slots, d)
            avail = available_memory_bytes()
            if avail is not None and 2 * state_est > 0.7 * avail:
                log(f"  [{name} n={n}] float32 needs ~{_gib(2 * state_est)} (twice the state) but "
                    f"{_gib(avail)} is available: int8 cache only")
                caches = ["int8"]
            variants = [(cache, None) for cache in caches]
            if name != "ace" and plan.get("sharded_jobs", True) and jax.device_count() > 1 and "float32" in caches:
                variants.append(("float32", "jobs"))  # the jobs of a step spread over the devices (shard_jobs)
            for cache, shard in variants:
                try:
                    row = _scaling_row(ds, name, n, plan, cache, shard)
                except MemoryError as e:
                    log(f"  [{name} n={n} {cache}] {e}")
                    rows.append({"algorithm": name, "num_clients": n, "cache": cache, "shard": shard,
                                 "error": str(e)})
                    continue
                rows.append(row)
                log(f"  [{name} n={n:>6} {cache:<7}{' jobs sharded' if shard else ''}] "
                    f"{row['seconds_per_event'] * 1e6:8.1f} us/event "
                    f"({row['seconds_per_step'] * 1e6:.0f} us/step; server rule alone "
                    f"{row['server_rule_seconds_per_step'] * 1e6:.0f} us/step), compile chunk "
                    f"{row['compile_chunk_seconds']:.1f} s"
                    + ("" if row["zero_init"] else f", init compile {row['compile_init_seconds']:.1f} s + run "
                       f"{row['init_run_seconds']:.1f} s")
                    + f"; state {_gib(row['state_bytes'])}, peak RSS {_gib(row['peak_rss_bytes'])}")
                jax.clear_caches()
    return {"rows": rows, "examples_per_client": SCALING_EXAMPLES_PER_CLIENT, "real_init_max_n": plan["real_init_max_n"],
            "steps": {k: plan[k] for k in ("ace", "ca2fl")}}


def _state_bytes_estimate(n: int, num_slots: int, d: int) -> int:
    """float32 cache (n x d) + pending messages (num_slots x d) + the model, before building anything."""
    return 4 * d * (n + num_slots + 2)


# ---------------------------------------------------------------------------------------------------- part: replicas
def replica_list(algorithm, count: int, fixed: dict[str, float]):
    """``count`` replicas: a client learning-rate sweep (up to 4 values) x seeds; for an algorithm whose clients
    upload one gradient (ACE: no local optimizer, ``client_lr`` is not read), a server learning-rate sweep around
    its ``server_lr`` (the same factors relative to 0.05) instead."""
    k = min(count, len(REPLICA_LRS))
    assert count % k == 0, count
    if algorithm.upload == "gradient":
        swept = {"server_lr": [fixed["server_lr"] * lr / 0.05 for lr in REPLICA_LRS[:k]]}
    else:
        swept = {"client_lr": list(REPLICA_LRS[:k])}
    return make_replicas(algorithm, list(range(count // k)), {**fixed, **swept})


def _replica_setup(name: str, ds: Dataset, T: int, plan: dict[str, Any]):
    """(algorithm, local, schedule, fixed hyper-parameters, task, n, zero_init) of one replica-sweep workload:
    ``fedbuff`` / ``fedbuff_mlp`` (bench.py's FedBuff setting, logistic regression / MLP 784-200-200-10) or ``ace``
    (n = ``plan["ace_clients"]``, logistic regression, from a zero state)."""
    if name in ("fedbuff", "fedbuff_mlp"):
        algorithm, local, schedule, hparams = _ca2fl_setup(CA2FL["num_clients"], T, name="fedbuff")
        n, model, zero_init = CA2FL["num_clients"], ("mlp" if name == "fedbuff_mlp" else "logreg"), False
    elif name == "ace":
        n, model, zero_init = plan["ace_clients"], "logreg", True
        algorithm, local, schedule, hparams = _ace_setup(n, T)
    else:
        raise ValueError(f"replicas part: unknown workload {name!r} (fedbuff, fedbuff_mlp, ace)")
    task = make_task(ds, partition("iid", ds.train_y, n, SEED),
                     make_model(model, ds.input_shape, ds.num_classes, seed=SEED), seed=SEED)
    return algorithm, local, schedule, {k: v for k, v in hparams.items() if k != "client_lr"}, task, n, zero_init


def _replica_row(task, algorithm, local, schedule, chunk_len: int, replicas, shard: str | None,
                 replica_batch: int | None, zero_init: bool, flops_job: float, probe=None) -> dict[str, Any]:
    """One placement of ``replicas`` timed by :func:`bench_engine`: the best timed chunk's wall time per server step
    and the other figures a row of :func:`run_replicas` reports (keys without a placement prefix)."""
    gc.collect()
    reset_peak_rss()
    eng = bench_engine(task, algorithm, local, schedule, chunk_len, replicas, shard=shard, full_eval=False,
                       zero_init=zero_init, replica_batch=replica_batch)
    eng.pop("_params_after_first_chunk", None)
    best = min(eng["chunk_seconds"])
    out = {"seconds_per_step": best / chunk_len,  # the best timed chunk
           "mean_seconds_per_step": eng["seconds_per_step"], "updates_per_second": eng["updates_per_second"],
           "compile_seconds": eng["compile_seconds"], "cpu_seconds_per_upload": eng["cpu_seconds_per_upload"],
           "peak_rss_bytes": peak_rss_bytes(), "replica_batch": eng["replica_batch"],
           "timed_steps": eng["timed_steps"], "state_bytes": sum(
               eng["memory_budget"][k] for k in ("server_bytes", "clients_bytes", "pending_bytes"))}
    if not math.isnan(flops_job):
        jobs_per_chunk = len(replicas) * eng["timed_computed_jobs"] / max(len(eng["chunk_seconds"]), 1)
        out["local_gflops"] = flops_job * jobs_per_chunk / best / 1e9
        if probe is not None:
            out["matmul_gflops"] = probe()
            out["fraction_of_matmul"] = out["local_gflops"] / out["matmul_gflops"]
    jax.clear_caches()
    return out


def run_replicas(ds: Dataset, plan: dict[str, Any], probe=None) -> dict[str, Any]:
    """Throughput as the replica axis grows (a seed x learning-rate sweep), measured in one process.

    For every count R: the best timed chunk's wall time per server step with the default grouping on one device
    (the engine's choice for the backend), with every replica vmapped together, and, when there are several (host)
    devices and they divide R, with the replica axis spread over them (``shard_replicas``, one XLA device per core, as
    ``simulate(shard_replicas=True)``). Every row R > 1 is paired with one replica timed again right before it, so
    that a change of the machine's speed between rows (minutes apart; wall times of one replica moved by 7-50% between
    rows on the 2-core machine) does not pass for a difference between R replicas and one. Reported as ratios:

    * ``throughput_vs_one`` = (total arrivals/s of R replicas) / (arrivals/s of one replica on one device)
      = R t_1 / t_R, with t_1 the one replica timed right before the row (``paired_one_seconds_per_step``); the same
      number is "R replicas together vs the R run one by one" (R runs of one replica take R t_1: same shapes,
      compiled once); ``throughput_vs_first_one`` uses the first row's t_1 instead (what the ratio was before the
      pairing);
    * ``cpu_throughput_vs_one``: the same in process CPU time per upload (all threads), against the paired one;
    * ``best_throughput_vs_one``: the better of the default and ``shard_replicas`` (what a user gets with the right
      option).

    With ``probe`` (a matmul-rate probe), every row of the MLP workload also gives its local-training GFLOP/s and the
    fraction of the matmul rate measured right after it."""
    out = {}
    ndev = jax.device_count()
    for name in plan.get("algorithms", ("fedbuff", "fedbuff_mlp", "ace")):
        chunk_len, chunks = plan[name]
        T = chunk_len * chunks
        algorithm, local, schedule, fixed, task, n, zero_init = _replica_setup(name, ds, T, plan)
        flops_job = local_flops_per_job(task.model, task_arrays(task).train, local, task.loss) \
            if name == "fedbuff_mlp" else math.nan

        def measure(replicas, shard, replica_batch, probe=probe):
            return _replica_row(task, algorithm, local, schedule, chunk_len, replicas, shard, replica_batch,
                                zero_init, flops_job, probe)

        rows = []
        for count in plan["counts"]:
            replicas = replica_list(algorithm, count, fixed)
            row = {"replicas": count}
            if count > 1:  # one replica again, right before the row: the pair the ratios compare
                one_again = measure(replica_list(algorithm, 1, fixed), None, None, probe=None)
                row["paired_one_seconds_per_step"] = one_again["seconds_per_step"]
                row["paired_one_cpu_seconds_per_upload"] = one_again["cpu_seconds_per_upload"]
            # the default (the engine's grouping for the backend), the plain vmap of every replica, the replicas
            # spread over the devices
            variants = [(None, None, "")] + ([(None, count, "vmap_")] if count > 1 else []) + (
                [("replicas", None, "sharded_")] if ndev > 1 and count > 1 and count % ndev == 0 else [])
            for shard, replica_batch, key in variants:
                got = measure(replicas, shard, replica_batch)
                grouping, steps, state = (got.pop(k) for k in ("replica_batch", "timed_steps", "state_bytes"))
                row.update({f"{key}{k}": v for k, v in got.items()})
                if key == "":  # the default placement's own facts
                    row.update(shard=None, default_replica_batch=grouping, timed_steps=steps, state_bytes=state)
            rows.append(row)
            one = row.get("paired_one_seconds_per_step", row["seconds_per_step"])
            one_cpu = row.get("paired_one_cpu_seconds_per_upload", row["cpu_seconds_per_upload"])
            first = rows[0]["seconds_per_step"]
            row["relative_to_one"] = row["seconds_per_step"] / one
            row["throughput_vs_one"] = count * one / row["seconds_per_step"]
            row["throughput_vs_first_one"] = count * first / row["seconds_per_step"]
            # the same ratio in process CPU time per upload (all threads): steadier than wall time on a shared machine
            row["cpu_throughput_vs_one"] = one_cpu / row["cpu_seconds_per_upload"]
            if "sharded_seconds_per_step" in row:
                row["sharded_throughput_vs_one"] = count * one / row["sharded_seconds_per_step"]
            if "vmap_seconds_per_step" in row:
                row["vmap_throughput_vs_one"] = count * one / row["vmap_seconds_per_step"]
            row["best_throughput_vs_one"] = max(row["throughput_vs_one"], row.get("sharded_throughput_vs_one", 0.0))
            row["best_placement"] = "one device" if row["best_throughput_vs_one"] == row["throughput_vs_one"] \
                else f"shard_replicas over {ndev} devices"
            vmap = (f" (replica_batch {row['default_replica_batch']}); all vmapped together "
                    f"{row['vmap_throughput_vs_one']:5.2f}x" if "vmap_throughput_vs_one" in row else "")
            sharded = (f"; over {ndev} devices {row['sharded_seconds_per_step'] * 1e3:8.2f} ms/step = "
                       f"{row['sharded_throughput_vs_one']:5.2f}x" if "sharded_throughput_vs_one" in row else "")
            paired = (f" [one replica right before: {one * 1e3:.2f} ms/step; vs the first row's "
                      f"{row['throughput_vs_first_one']:5.2f}x]" if count > 1 else "")
            log(f"  [{name} R={count:>2}] one device {row['seconds_per_step'] * 1e3:8.2f} ms/step: total arrivals/s "
                f"= {row['throughput_vs_one']:5.2f}x one replica (per CPU-second {row['cpu_throughput_vs_one']:5.2f}x)"
                f"{vmap}{sharded}{paired}")
        out[name] = {"num_clients": n, "rows": rows, "steps": {"chunk": chunk_len, "chunks": chunks},
                     "devices": ndev, "local_flops_per_job": flops_job}
    return out


# ---------------------------------------------------------------------------------------------------- part: compile
def run_compile(plan: dict[str, Any]) -> dict[str, Any]:
    """Compile time of the default experiment (``asyncfl run`` with no options: ``ExperimentConfig()``), as each
    run's ``History.compile_seconds`` reports it (compiling the init, chunk and evaluation programs, plus running
    the initial jobs), and the wall time of the whole experiment (without writing files)."""
    from asyncfl_jax.config import ExperimentConfig
    from asyncfl_jax.experiment import run_config

    cfg = ExperimentConfig()
    note = "ExperimentConfig() defaults"
    if plan.get("runs"):
        cfg = dataclasses.replace(cfg, runs=cfg.runs[:plan["runs"]])
        note += f", first {plan['runs']} run(s)"
    if plan.get("arrivals"):
        cfg = dataclasses.replace(cfg, runs=[dataclasses.replace(r, arrivals=plan["arrivals"]) for r in cfg.runs])
        note += f", arrivals cut to {plan['arrivals']} per run"
    jax.clear_caches()
    t0 = time.perf_counter()
    histories = run_config(cfg, progress=False, write=False, plot=False)
    wall = time.perf_counter() - t0
    runs = [{"label": h.label, "algorithm": h.algorithm, "num_steps": int(h.num_steps),
             "compile_seconds": float(h.compile_seconds), "run_seconds": float(h.run_seconds)} for h in histories]
    total = sum(r["compile_seconds"] for r in runs)
    for r in runs:
        log(f"  {r['label']}: compile {r['compile_seconds']:.1f} s, run {r['run_seconds']:.1f} s "
            f"({r['num_steps']} steps)")
    log(f"  default experiment: compile {total:.1f} s in all, wall {wall:.1f} s ({note})")
    return {"config": note, "data": cfg.data.name, "model": cfg.model.name, "runs": runs,
            "compile_seconds_total": total, "wall_seconds": wall}


# ---------------------------------------------------------------------------------------------------- plot
def plot(res: dict[str, Any], path: str) -> str | None:
    """bench.png: time per event vs n, memory vs n, wall time vs replicas, ACE updates/s vs lookahead L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if res.get("scaling"):
        panels += ["scaling", "memory"]
    if res.get("replicas"):
        panels.append("replicas")
    if res.get("algorithms", {}).get("ace"):
        panels.append("lookahead")
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False)
    colors = {"ace": "tab:blue", "ca2fl": "tab:orange", "fedbuff": "tab:green"}
    for ax, panel in zip(axes[0], panels):
        if panel in ("scaling", "memory"):
            rows = [r for r in res["scaling"]["rows"] if "error" not in r]
            for name in ("ace", "ca2fl"):
                for cache, shard, style in (("float32", None, "-o"), ("int8", None, "s"), ("float32", "jobs", "--x")):
                    sel = sorted((r for r in rows if r["algorithm"] == name and r["cache"] == cache
                                  and r.get("shard") == shard), key=lambda r: r["num_clients"])
                    if not sel:
                        continue
                    ns = [r["num_clients"] for r in sel]
                    what = cache + (", jobs sharded" if shard else "")
                    if panel == "scaling":
                        ax.plot(ns, [r["seconds_per_event"] * 1e6 for r in sel], style, color=colors[name],
                                label=f"{name} ({what})")
                    elif shard is None:
                        ax.plot(ns, [r["state_bytes"] / 2**20 for r in sel], style, color=colors[name],
                                label=f"{name} state ({cache})")
                        if cache == "float32":
                            ax.plot(ns, [r["peak_rss_bytes"] / 2**20 for r in sel], ":", marker="^",
                                    color=colors[name], label=f"{name} peak RSS")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("clients n")
            ax.set_ylabel("engine time per client update (us)" if panel == "scaling" else "MiB")
            ax.set_title("time per event vs n" if panel == "scaling" else "memory vs n")
        elif panel == "replicas":
            for name, block in res["replicas"].items():
                rs = [r["replicas"] for r in block["rows"]]
                ax.plot(rs, [r["relative_to_one"] for r in block["rows"]], "-o", color=colors.get(name),
                        label=f"{name} (n={block['num_clients']})")
            top = max(max(r["replicas"] for r in b["rows"]) for b in res["replicas"].values())
            ax.plot([1, top], [1, top], "--", color="gray", label="linear")
            ax.axhline(TARGET_REPLICAS[1], color="red", lw=0.8, ls=":", label="target at 16: 3x")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("replicas (vmapped)")
            ax.set_ylabel("wall time per step / one replica's")
            ax.set_title("wall time vs replicas")
        else:
            ace = res["algorithms"]["ace"]
            Ls = sorted(int(k) for k in ace["engine"])
            ax.plot(Ls, [ace["engine"][str(L)]["updates_per_second"] for L in Ls], "-o", color=colors["ace"],
                    label="engine")
            ax.axhline(ace["baseline"]["updates_per_second"], color="gray", ls="--", label="per-event loop")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("lookahead L (1 = off)")
            ax.set_ylabel("client updates / s")
            ax.set_title(f"ACE n={ace['setting']['num_clients']}: lookahead")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path
