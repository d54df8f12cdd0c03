#!/usr/bin/env python
"""Throughput benchmark of the asyncfl_jax engine, measured side by side in one process.

What it measures (everything in the same run, so ratios are meaningful on a noisy machine):

1. **matmul peak**: jitted float32 ``a @ b`` for square sizes, best of several repeats after warm-up, FLOPs = 2 n^3;
   measured at the start and again at the end, the peak is the best of all (conservative on a shared machine). A
   1024^3 matmul probe also runs right after each timed engine chunk ("paired" fraction, informational).
2. **FedBuff on Fashion-MNIST** (n=100 clients, IID partition seed 0, concurrency Mc=20, buffer M=10, refill at step
   boundaries, K=10 local SGD steps of B=32, client lr 0.05, server lr 1) for logistic regression and an MLP
   784-200-200-10:

   a. *engine*: the same compiled program :func:`asyncfl_jax.engine.simulate` runs (``build_program`` ->
      ``jit(vmap(chunk), donate carry)``, one replica), driven chunk by chunk. Compilation, the initial jobs and the
      first chunk (warm-up) are excluded from the timing. The evaluation the engine runs after each chunk is made
      negligible for the timed run by shrinking the evaluation sets to 2 examples (training code path unchanged); the
      cost of one full evaluation (10k test + 5k train examples) is measured separately and reported.
   b. *baseline*: a plain per-event Python loop over the same schedule doing the same math: one jitted single-client
      local update per dispatched job (trained at dispatch from the current model, result kept in a dict keyed by
      its pending slot), one jitted FedBuff server update per server step (applied at the arrival step). Jobs use the
      engine's PRNG keys, so after the same number of steps both give the same model up to float32 rounding
      (checked after the engine's first chunk). The same loop with a no-op local update gives its Python/dispatch
      floor, i.e. how much of the loop's time is overhead rather than training.
   c. ratios: engine/baseline client updates per second; achieved local-training GFLOP/s (jobs trained x FLOPs per
      job from ``local_flops_per_job``, i.e. XLA's cost analysis of one fwd+bwd on B examples x K) and its fraction
      of the measured matmul peak.

3. **schedule sampling**: wall time of ``make_schedule`` for 1M arrivals (all_active n=100k, T=1M; concurrent n=100k,
   Mc=1000, M=100, immediate refill, T=10k).

Usage::

    python scripts/bench.py                 # full run (a few minutes on 2 CPU cores)
    python scripts/bench.py --quick         # about a minute
    python scripts/bench.py --steps 3000 --out results.json
    python scripts/bench.py --one-device   # JAX's single CPU device (no sharding of the jobs over cores)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from typing import Any

# One XLA device per CPU core, so the engine can spread the jobs of a step over the cores (``--one-device`` keeps
# JAX's default single CPU device). This must happen before JAX is imported.
if "--one-device" not in sys.argv and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={os.cpu_count() or 1}").strip()

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms import fedbuff
from asyncfl_jax.algorithms.base import ServerMeta
from asyncfl_jax.client import LocalConfig, local_flops_per_job, make_local_update
from asyncfl_jax.data import load_fashion_mnist, partition
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import build_program, job_sharding, make_replicas, schedule_arrays, stack_hparams
from asyncfl_jax.models.core import make_model
from asyncfl_jax.task import make_task, task_arrays
from asyncfl_jax.timing import DelayModel, make_schedule

# The benchmark's fixed setting (from the issue).
NUM_CLIENTS = 100
CONCURRENCY = 20
BUFFER = 10
REFILL = "boundary"
K = 10
B = 32
CLIENT_LR = 0.05
SERVER_LR = 1.0
SEED = 0

TARGET_SPEEDUP_LOGREG = 10.0  # engine >= 10x the per-event loop (client updates/s), logistic regression
TARGET_PEAK_FRACTION_MLP = 0.5  # engine local training >= 50% of the measured matmul GFLOP/s, MLP

# Step counts per model: (engine chunk length, engine chunks (the first is warm-up), baseline steps).
FULL = {"logreg": (300, 8, 300), "mlp": (30, 11, 60)}
QUICK = {"logreg": (100, 4, 100), "mlp": (20, 3, 20)}
# Engine vs baseline after the first chunk: max |diff| <= CHECK_RTOL * max(max |x|, 1). The two differ only by float32
# rounding (vmapped vs single-job reductions), ~1e-8 after one step; for the ReLU MLP a rounding difference that moves
# a pre-activation across 0 changes that step's gradient discontinuously, so the gap grows to ~1e-5 after 5 steps
# and ~1.5e-3 after 20-30 (measured); training different clients or keys would differ by O(max |x|).
CHECK_RTOL = 1e-2


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------- 1. matmul peak
def matmul_peak(sizes: list[int], repeats: int) -> dict[str, Any]:
    f = jax.jit(lambda a, b: a @ b)
    rows = []
    for n in sizes:
        ka, kb = jax.random.split(jax.random.PRNGKey(n))
        a = jax.random.normal(ka, (n, n), jnp.float32)
        b = jax.random.normal(kb, (n, n), jnp.float32)
        f(a, b).block_until_ready()  # compile + warm-up
        f(a, b).block_until_ready()
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(a, b).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        gflops = 2.0 * n**3 / best / 1e9
        rows.append({"n": n, "best_seconds": best, "gflops": gflops})
        log(f"  matmul {n:5d}x{n}: {gflops:8.1f} GFLOP/s (best of {repeats}: {best * 1e3:.2f} ms)")
    return {"sizes": rows, "peak_gflops": max(r["gflops"] for r in rows)}


def make_matmul_probe(n: int = 1024, repeats: int = 2):
    """A cheap matmul-rate probe (GFLOP/s, best of ``repeats``) to run right next to another measurement."""
    f = jax.jit(lambda a, b: a @ b)
    a = jax.random.normal(jax.random.PRNGKey(7), (n, n), jnp.float32)
    f(a, a).block_until_ready()

    def probe() -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(a, a).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n**3 / best / 1e9

    return probe


# ---------------------------------------------------------------------------------------------------- data
def load_data() -> tuple[Dataset, str]:
    try:
        return load_fashion_mnist(), "fashion_mnist"
    except FileNotFoundError as e:  # DatasetNotFoundError is a FileNotFoundError
        log(f"  !! Fashion-MNIST not found ({str(e).splitlines()[0]}); using a SYNTHETIC STAND-IN of the same shapes "
            "(random 28x28 images, 10 classes, 60000/10000). Throughput numbers are unaffected; accuracies are not "
            "meaningful.")
        rng = np.random.default_rng(0)
        ds = Dataset(
            name="synthetic_fashion_mnist_standin",
            train_x=rng.random((60000, 28, 28, 1), dtype=np.float32),
            train_y=rng.integers(0, 10, 60000).astype(np.int32),
            test_x=rng.random((10000, 28, 28, 1), dtype=np.float32),
            test_y=rng.integers(0, 10, 10000).astype(np.int32),
            num_classes=10,
        )
        return ds, "synthetic stand-in (Fashion-MNIST files missing)"


# ---------------------------------------------------------------------------------------------------- 2a. engine
def bench_engine(task, algorithm, local, schedule, chunk_len: int, hp_replicas, probe=None) -> dict[str, Any]:
    """Times the engine's compiled chunk over ``schedule`` (its length is a multiple of ``chunk_len``).

    ``probe()`` (optional) measures the matmul rate right after each timed chunk, so each chunk's GFLOP/s can be
    compared with the machine's rate at that moment (the machine may be shared).
    """
    T = schedule.num_steps
    num_chunks = T // chunk_len
    assert num_chunks * chunk_len == T
    # Evaluation made negligible for the timed run: 2-example evaluation sets (the training path is unchanged).
    timed_task = dataclasses.replace(task, test_x=task.test_x[:2], test_y=task.test_y[:2],
                                     train_eval_x=task.train_eval_x[:2], train_eval_y=task.train_eval_y[:2])
    jobs = job_sharding() if jax.device_count() > 1 else None  # the jobs of a step spread over the devices
    program = build_program(timed_task, algorithm, local, schedule.num_slots, job_sharding=jobs)
    sched = schedule_arrays(schedule)
    hp = stack_hparams(hp_replicas)
    keys = jnp.stack([jax.random.PRNGKey(r.seed) for r in hp_replicas])

    # Exactly simulate()'s jit/vmap setup for a schedule shared by all replicas.
    data = task_arrays(timed_task)
    init_fn = jax.jit(jax.vmap(program.init, in_axes=(None, 0, 0, None)))
    chunk_fn = jax.jit(jax.vmap(program.chunk, in_axes=(0, None, 0, 0, None)), donate_argnums=(0,))

    def part(c):
        return jax.tree_util.tree_map(lambda a: a[c * chunk_len:(c + 1) * chunk_len], sched.steps)

    parts = [part(c) for c in range(num_chunks)]
    jax.block_until_ready(parts)

    t0 = time.perf_counter()
    init_c = init_fn.lower(sched, hp, keys, data).compile()
    compile_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    carry = init_c(sched, hp, keys, data)
    jax.block_until_ready(carry)
    init_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    chunk_c = chunk_fn.lower(carry, parts[0], hp, keys, data).compile()
    compile_chunk = time.perf_counter() - t0

    # Chunk 0: warm-up (and the model after chunk_len steps, to check the baseline against).
    t0 = time.perf_counter()
    carry, out = chunk_c(carry, parts[0], hp, keys, data)
    jax.block_until_ready((carry, out))
    first_chunk = time.perf_counter() - t0
    params_after_first = np.asarray(carry.server.x[0])

    timed = list(range(1, num_chunks)) or [0]
    if timed == [0]:  # a single chunk: time it (after warm-up there is nothing left; re-run from a fresh init)
        carry = init_c(sched, hp, keys, data)
    chunk_seconds, probes = [], []
    for c in timed:  # blocking after each chunk costs nothing measurable and gives per-chunk rates
        t0 = time.perf_counter()
        carry, out = chunk_c(carry, parts[c], hp, keys, data)
        jax.block_until_ready((carry, out))
        chunk_seconds.append(time.perf_counter() - t0)
        if probe is not None:
            probes.append(probe())
    seconds = float(sum(chunk_seconds))

    steps = range(timed[0] * chunk_len, (timed[-1] + 1) * chunk_len)
    arrivals = int((schedule.arrival_clients[steps.start:steps.stop] >= 0).sum())
    jobs = int((schedule.dispatch_clients[steps.start:steps.stop] >= 0).sum())
    computed_jobs = len(steps) * schedule.dispatch_width  # the vmap also trains padded (-1) entries

    # One full evaluation (what eval_every costs), measured on its own.
    eval_fn = jax.jit(jax.vmap(build_program(task, algorithm, local, schedule.num_slots).evaluate,
                               in_axes=(0, None)))
    xs = carry.server.x
    full_data = task_arrays(task)
    jax.block_until_ready(eval_fn(xs, full_data))
    best_eval = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(eval_fn(xs, full_data))
        best_eval = min(best_eval, time.perf_counter() - t0)
    final_acc = float(eval_fn(xs, full_data)["test_accuracy"][0])

    return {
        "server_steps_total": T,
        "chunk_len": chunk_len,
        "timed_steps": len(steps),
        "timed_arrivals": arrivals,
        "timed_jobs": jobs,
        "timed_computed_jobs": computed_jobs,
        "run_seconds": seconds,
        "first_chunk_seconds": first_chunk,
        "compile_seconds": compile_init + compile_chunk,
        "compile_init_seconds": compile_init,
        "compile_chunk_seconds": compile_chunk,
        "init_run_seconds": init_run,
        "updates_per_second": arrivals / seconds,
        "server_steps_per_second": len(steps) / seconds,
        "jobs_per_second": jobs / seconds,
        "chunk_seconds": chunk_seconds,
        "chunk_jobs": [int((schedule.dispatch_clients[c * chunk_len:(c + 1) * chunk_len] >= 0).sum()) for c in timed],
        "matmul_gflops_after_chunk": probes,
        "best_chunk_updates_per_second": arrivals / len(timed) / min(chunk_seconds),
        "full_eval_seconds": best_eval,
        "final_test_accuracy": final_acc,
        "num_slots": schedule.num_slots,
        "dispatch_width": schedule.dispatch_width,
        "_params_after_first_chunk": params_after_first,
    }


# ---------------------------------------------------------------------------------------------------- 2b. baseline
def bench_baseline(task, algorithm, local, schedule, num_steps: int, hp_replica, noop: bool = False,
                   check_step: int | None = None) -> dict[str, Any]:
    """A per-event Python loop: one jitted client call per job, one jitted server call per step.

    ``noop=True`` replaces local training by a trivial function of the same signature: the loop's own cost (Python,
    dispatch of one jitted call per event), i.e. the fastest this baseline could be if training were free.
    """
    if noop:
        def local_fn(x, client, key, hp, data):  # raw uint32[2] keys (PRNGKey)
            return x * 1e-3 + key[0].astype(x.dtype)
    else:
        local_fn = make_local_update(task.model, local, output=algorithm.local_output)
    hp = {k: jnp.float32(v) for k, v in hp_replica.hparams.items()}
    key = jax.random.PRNGKey(hp_replica.seed)
    x0 = task.model.flat_params
    M = schedule.buffer_width

    @jax.jit
    def client_job(x, client, step_plus_one, j, hp, data):
        k = jax.random.fold_in(jax.random.fold_in(key, step_plus_one), j)  # the engine's key for this job
        message, _ = algorithm.client(x, local_fn(x, client, k, hp, data), (), hp)
        return message

    @jax.jit
    def server_step(state, messages, clients, staleness, step, time_, hp):
        deltas = jnp.stack(messages)
        mask = clients >= 0
        meta = ServerMeta(clients=clients, mask=mask, staleness=jnp.where(mask, staleness, 0), step=step, time=time_)
        return algorithm.server(state, deltas, meta, hp)

    staleness = np.maximum(schedule.staleness, 0)
    zero = jnp.zeros_like(x0)
    state = algorithm.init(x0, task.num_clients)
    pending: dict[int, jax.Array] = {}
    t0 = time.perf_counter()
    for j, (c, s) in enumerate(zip(schedule.init_clients.tolist(), schedule.init_slots.tolist())):
        if c >= 0:  # initial jobs (also compile client_job)
            pending[s] = client_job(x0, c, 0, j, hp, task.train)
    # Compile the server step outside the timing (result discarded).
    jax.block_until_ready(server_step(state, (zero,) * M, schedule.arrival_clients[0], staleness[0], 0,
                                      np.float32(0), hp))
    jax.block_until_ready(pending)
    warmup = time.perf_counter() - t0

    steps_ = 0
    arrivals = jobs = 0
    at_check = None
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
                            np.float32(schedule.step_times[t]), hp)
        steps_ += 1
        if steps_ == check_step:
            at_check = state  # a reference only (no device sync inside the timed loop)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t0
    return {
        "timed_steps": steps_,
        "timed_arrivals": arrivals,
        "timed_jobs": jobs,
        "run_seconds": seconds,
        "warmup_seconds": warmup,
        "updates_per_second": arrivals / seconds,
        "server_steps_per_second": steps_ / seconds,
        "jobs_per_second": jobs / seconds,
        "_params_at_check": None if at_check is None else np.asarray(algorithm.params(at_check)),
    }


# ---------------------------------------------------------------------------------------------------- breakdown
def bench_isolated_local(task, local, flops_per_job: float, width: int, repeats: int = 5) -> dict[str, Any]:
    """One jit(vmap(local update)) call of ``width`` clients from x_0, in isolation (no scan, no pending buffer)."""
    local_fn = make_local_update(task.model, local)
    hp = {k: jnp.float32(v) for k, v in {"client_lr": CLIENT_LR, "momentum": 0.0, "weight_decay": 0.0,
                                          "prox_mu": 0.0}.items()}
    x0 = task.model.flat_params
    clients = jnp.arange(width, dtype=jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), width)
    f = jax.jit(jax.vmap(local_fn, in_axes=(None, 0, 0, None, None)))
    jax.block_until_ready(f(x0, clients, keys, hp, task.train))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x0, clients, keys, hp, task.train))
        best = min(best, time.perf_counter() - t0)
    return {"width": width, "best_seconds": best, "jobs_per_second": width / best,
            "gflops": width * flops_per_job / best / 1e9}


# ---------------------------------------------------------------------------------------------------- 3. schedules
def bench_schedules() -> dict[str, Any]:
    delays = DelayModel()
    out = {}
    t0 = time.perf_counter()
    s = make_schedule("all_active", 100_000, 1_000_000, delays, seed=0)
    out["all_active_n100k_T1M_seconds"] = time.perf_counter() - t0
    out["all_active_arrivals"] = int(s.arrival_mask.sum())
    del s
    log(f"  all_active n=100k T=1M: {out['all_active_n100k_T1M_seconds']:.2f} s")
    t0 = time.perf_counter()
    s = make_schedule("concurrent", 100_000, 10_000, delays, seed=0, concurrency=1000, buffer_size=100,
                      refill="immediate")
    out["concurrent_n100k_Mc1000_M100_T10k_seconds"] = time.perf_counter() - t0
    out["concurrent_arrivals"] = int(s.arrival_mask.sum())
    del s
    log(f"  concurrent n=100k Mc=1000 M=100 immediate T=10k: {out['concurrent_n100k_Mc1000_M100_T10k_seconds']:.2f} s")
    return out


# ---------------------------------------------------------------------------------------------------- main
def run_model(name: str, ds: Dataset, parts, chunk_len: int, chunks: int, baseline_steps: int,
              probe=None) -> dict[str, Any]:
    """Engine vs per-event loop for one model (FedBuff setting of the module docstring)."""
    model = make_model(name, ds.input_shape, ds.num_classes, seed=SEED)
    task = make_task(ds, parts, model, seed=SEED)
    local = LocalConfig(steps=K, batch_size=B)
    algorithm = fedbuff()
    replicas = make_replicas(algorithm, [SEED], {"client_lr": CLIENT_LR, "server_lr": SERVER_LR})
    flops = local_flops_per_job(model, task.train, local)
    T = chunk_len * chunks
    t0 = time.perf_counter()
    schedule = make_schedule("concurrent", NUM_CLIENTS, T, DelayModel(), seed=SEED, concurrency=CONCURRENCY,
                             buffer_size=BUFFER, refill=REFILL)
    sched_seconds = time.perf_counter() - t0
    log(f"[{name}] d={model.num_params}, FLOPs/job={flops / 1e6:.2f} M (K={K} x fwd+bwd on B={B}), T={T} steps "
        f"({chunks} chunks of {chunk_len}), schedule {sched_seconds:.2f} s")

    eng = bench_engine(task, algorithm, local, schedule, chunk_len, replicas, probe)
    eng["gflops"] = eng["timed_jobs"] * flops / eng["run_seconds"] / 1e9
    if eng["matmul_gflops_after_chunk"]:  # each chunk's GFLOP/s over the matmul rate measured right after it
        eng["paired_fraction_of_matmul"] = float(np.median([
            j * flops / sec / 1e9 / mm for j, sec, mm in
            zip(eng["chunk_jobs"], eng["chunk_seconds"], eng["matmul_gflops_after_chunk"])]))
    eng["gflops_incl_padded_jobs"] = eng["timed_computed_jobs"] * flops / eng["run_seconds"] / 1e9
    log(f"  engine:   {eng['updates_per_second']:9.1f} updates/s, {eng['server_steps_per_second']:8.1f} steps/s, "
        f"{eng['gflops']:6.2f} GFLOP/s, compile {eng['compile_seconds']:.1f} s (timed {eng['timed_steps']} steps in "
        f"{eng['run_seconds']:.2f} s; best chunk {eng['best_chunk_updates_per_second']:.1f} updates/s; full eval "
        f"{eng['full_eval_seconds'] * 1e3:.0f} ms)")

    n_base = min(baseline_steps, T)
    base = bench_baseline(task, algorithm, local, schedule, n_base, replicas[0], check_step=chunk_len)
    base["gflops"] = base["timed_jobs"] * flops / base["run_seconds"] / 1e9
    log(f"  baseline: {base['updates_per_second']:9.1f} updates/s, {base['server_steps_per_second']:8.1f} steps/s, "
        f"{base['gflops']:6.2f} GFLOP/s (timed {base['timed_steps']} steps in {base['run_seconds']:.2f} s)")
    floor = bench_baseline(task, algorithm, local, schedule, n_base, replicas[0], noop=True)
    floor.pop("_params_at_check", None)
    log(f"  baseline loop with a no-op local update (Python + dispatch floor): {floor['updates_per_second']:.0f} "
        f"updates/s = {1e6 / floor['jobs_per_second']:.0f} us per event (vs {1e6 / base['jobs_per_second']:.0f} us "
        "with training)")

    # Same math check: baseline after `chunk_len` steps vs engine after its first chunk (same number of steps).
    # Only float32 rounding differs (vmap vs single-job reductions); it grows with steps, fast for the ReLU MLP.
    check = None
    a, b = eng.pop("_params_after_first_chunk"), base.pop("_params_at_check")
    if b is not None:
        diff = float(np.max(np.abs(a - b)))
        scale = float(np.max(np.abs(a)))
        check = {"steps": chunk_len, "max_abs_diff": diff, "max_abs_param": scale,
                 "match": bool(np.isfinite(diff) and diff <= CHECK_RTOL * max(scale, 1.0))}
        log(f"  check: engine vs baseline after {chunk_len} steps: max |diff| = {diff:.2e} (max |x| = {scale:.2f}) "
            f"-> {'match' if check['match'] else 'MISMATCH'}")

    iso = bench_isolated_local(task, local, flops, schedule.dispatch_width)
    log(f"  isolated jit(vmap(local)) of {iso['width']} jobs: {iso['best_seconds'] * 1e3:.2f} ms/call, "
        f"{iso['gflops']:.2f} GFLOP/s")
    return {
        "model": name,
        "num_params": model.num_params,
        "flops_per_job": flops,
        "schedule_seconds": sched_seconds,
        "engine": eng,
        "baseline": base,
        "baseline_noop": floor,
        "speedup_updates_per_second": eng["updates_per_second"] / base["updates_per_second"],
        "check": check,
        "isolated_local": iso,
    }


def _row(cells, widths):
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def print_table(res: dict[str, Any]) -> None:
    peak = res["matmul"]["peak_gflops"]
    bar = "=" * 104
    print()
    print(bar)
    e = res["env"]
    print(f"asyncfl_jax benchmark | jax {e['jax']} on {e['num_devices']} x {e['device']} ({e['cpu_count']} CPUs; "
          f"jobs of a step {'sharded over the devices' if e['jobs_sharded'] else 'on one device'}) | data: {res['data']} | "
          f"{'quick' if res['quick'] else 'full'} run")
    print(f"FedBuff: n={NUM_CLIENTS}, Mc={CONCURRENCY}, M={BUFFER}, refill={REFILL}, K={K}, B={B}, SGD lr {CLIENT_LR}, "
          "IID, seed 0")
    print("engine timed without compile/initial jobs/first chunk, with evaluation disabled (2-example eval sets)")
    print(bar)
    for label, key in (("start", "sizes"), ("end", "sizes_end")):
        if key in res["matmul"]:
            mm = ", ".join(f"n={r['n']}: {r['gflops']:.1f}" for r in res["matmul"][key])
            print(f"matmul float32 GFLOP/s at {label:<5}: {mm}")
    print(f"matmul peak (best of all): {peak:.1f} GFLOP/s")
    print("-" * 104)
    by = {r["model"]: r for r in res["models"]}
    cols = [(m, side) for m in ("logreg", "mlp") if m in by for side in ("engine", "baseline")]
    w = [30] + [15] * len(cols)
    print(_row([""] + [f"{m} {'eng' if side == 'engine' else 'loop'}" for m, side in cols], w))

    def line(label, fn):
        cells = []
        for m, side in cols:
            try:
                v = fn(by[m], side)
            except (KeyError, TypeError):
                v = None
            cells.append("" if v is None else v)
        print(_row([label] + cells, w))

    line("client updates / s", lambda r, s: f"{r[s]['updates_per_second']:.1f}")
    line("server steps / s", lambda r, s: f"{r[s]['server_steps_per_second']:.1f}")
    line("local-train GFLOP/s", lambda r, s: f"{r[s]['gflops']:.2f}")
    line("  fraction of matmul peak", lambda r, s: f"{r[s]['gflops'] / peak:.1%}")
    line("  paired with matmul (median)", lambda r, s: f"{r[s]['paired_fraction_of_matmul']:.1%}"
         if s == "engine" else None)
    line("timed steps / seconds", lambda r, s: f"{r[s]['timed_steps']} / {r[s]['run_seconds']:.2f}")
    line("best chunk updates / s", lambda r, s: f"{r[s]['best_chunk_updates_per_second']:.1f}"
         if s == "engine" else None)
    line("compile s", lambda r, s: f"{r[s]['compile_seconds']:.1f}" if s == "engine" else None)
    line("full evaluation ms", lambda r, s: f"{r[s]['full_eval_seconds'] * 1e3:.0f}" if s == "engine" else None)
    line("no-op loop updates / s", lambda r, s: f"{r['baseline_noop']['updates_per_second']:.0f}"
         if s == "baseline" else None)
    line("engine / loop (updates/s)", lambda r, s: f"{r['speedup_updates_per_second']:.2f}x" if s == "engine" else None)
    line("same model as loop (steps)", lambda r, s: (f"{'yes' if r['check']['match'] else 'NO'} "
                                                     f"({r['check']['steps']}: {r['check']['max_abs_diff']:.0e})")
         if s == "engine" else None)
    for m in ("logreg", "mlp"):
        if m in by:
            r = by[m]
            iso = r["isolated_local"]
            print(f"  {m}: d={r['num_params']}, {r['flops_per_job'] / 1e6:.2f} MFLOP/job; isolated jit(vmap(local)) of "
                  f"{iso['width']} jobs: {iso['best_seconds'] * 1e3:.2f} ms = {iso['gflops']:.2f} GFLOP/s "
                  f"({iso['gflops'] / peak:.0%} of peak)")
    print("-" * 104)
    print("targets")
    for t in res["targets"]:
        print(f"  {t['name']:<56} measured {t['measured']:7.3f}  target >= {t['target']:<5}  {t['status']}")
        if "note" in t:
            print(f"    {t['note']}")
    print("-" * 104)
    sc = res["schedules"]
    print(f"schedule sampling (1M arrivals each): all_active n=100k T=1M: {sc['all_active_n100k_T1M_seconds']:.2f} s | "
          f"concurrent n=100k Mc=1000 M=100 immediate T=10k: {sc['concurrent_n100k_Mc1000_M100_T10k_seconds']:.2f} s")
    print(bar)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller step counts (about a minute)")
    p.add_argument("--steps", type=int, default=None,
                   help="engine server steps per model (rounded up to whole chunks of the default length; the "
                        "first chunk is warm-up)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    p.add_argument("--models", default="logreg,mlp", help="comma-separated subset of logreg,mlp")
    p.add_argument("--skip-schedules", action="store_true", help="skip the schedule-sampling timings")
    p.add_argument("--one-device", action="store_true",
                   help="keep JAX's single CPU device (default: one device per core, jobs of a step spread over them)")
    args = p.parse_args(argv)

    plan = QUICK if args.quick else FULL
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in plan:
            p.error(f"unknown model {m!r}; choose from {sorted(plan)}")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    env = {"jax": jax.__version__, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
           "num_devices": jax.device_count(), "jobs_sharded": jax.device_count() > 1,
           "cpu_count": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}
    log(f"jax {env['jax']} ({env['backend']}: {env['device']}), {env['cpu_count']} CPUs")
    t_start = time.perf_counter()
    sizes, repeats = [512, 1024, 2048], (3 if args.quick else 6)

    log("1. matmul peak")
    mm = matmul_peak(sizes, repeats)

    probe = make_matmul_probe()
    log("2. FedBuff on Fashion-MNIST")
    ds, data_note = load_data()
    parts = partition("iid", ds.train_y, NUM_CLIENTS, SEED)
    results = []
    for name in models:
        chunk_len, chunks, base_steps = plan[name]
        if args.steps is not None:
            if args.steps < 2 * chunk_len:  # too few steps for a warm-up chunk + a timed one: two chunks of half
                chunk_len, chunks = max(1, args.steps // 2), 2
            else:
                chunks = -(-args.steps // chunk_len)
        results.append(run_model(name, ds, parts, chunk_len, chunks, baseline_steps=base_steps, probe=probe))

    log("1'. matmul peak again (the machine may be noisy; the peak is the best of both)")
    mm_end = matmul_peak(sizes, repeats)
    mm = {"sizes": mm["sizes"], "sizes_end": mm_end["sizes"],
          "peak_gflops": max(mm["peak_gflops"], mm_end["peak_gflops"])}
    peak = mm["peak_gflops"]

    targets = []
    by = {r["model"]: r for r in results}
    for r in results:
        r["engine_fraction_of_peak"] = r["engine"]["gflops"] / peak
    if "logreg" in by:
        v = by["logreg"]["speedup_updates_per_second"]
        targets.append({"name": "logreg: engine / per-event loop, client updates per s", "measured": v,
                        "target": TARGET_SPEEDUP_LOGREG, "status": "PASS" if v >= TARGET_SPEEDUP_LOGREG else "MISS"})
    if "mlp" in by:
        v = by["mlp"]["engine_fraction_of_peak"]
        t = {"name": "mlp: engine local-training GFLOP/s / matmul peak", "measured": v,
             "target": TARGET_PEAK_FRACTION_MLP, "status": "PASS" if v >= TARGET_PEAK_FRACTION_MLP else "MISS"}
        paired = by["mlp"]["engine"].get("paired_fraction_of_matmul")
        if paired is not None:
            t["note"] = (f"(per chunk vs the matmul rate measured right after it, median: {paired:.3f} -> "
                         f"{'PASS' if paired >= TARGET_PEAK_FRACTION_MLP else 'MISS'}; informational)")
        targets.append(t)

    sched = {"all_active_n100k_T1M_seconds": math.nan, "concurrent_n100k_Mc1000_M100_T10k_seconds": math.nan}
    if not args.skip_schedules:
        log("3. schedule sampling")
        sched = bench_schedules()

    res = {
        "env": env,
        "quick": bool(args.quick),
        "data": data_note,
        "setting": {"num_clients": NUM_CLIENTS, "concurrency": CONCURRENCY, "buffer_size": BUFFER, "refill": REFILL,
                    "local_steps": K, "batch_size": B, "client_lr": CLIENT_LR, "server_lr": SERVER_LR,
                    "partition": "iid", "seed": SEED,
                    "engine_timing": "compile, initial jobs and first chunk excluded; evaluation sets shrunk to 2 "
                                     "examples (full evaluation cost reported separately)"},
        "matmul": mm,
        "models": results,
        "targets": targets,
        "schedules": sched,
        "total_seconds": time.perf_counter() - t_start,
    }
    print_table(res)
    log(f"total wall time {res['total_seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=float)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
