#!/usr/bin/env python
"""Throughput benchmark of the asyncfl_jax engine, measured side by side in one process.

What it measures (everything in the same run, so ratios are meaningful on a noisy machine):

1. **matmul peak**: jitted float32 ``a @ b`` for square sizes, best of several repeats after warm-up, FLOPs = 2 n^3.
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
      engine's PRNG keys, so after the same number of steps both give the same model (checked).
   c. ratios: engine/baseline client updates per second; achieved local-training GFLOP/s (jobs trained x FLOPs per
      job from ``local_flops_per_job``, i.e. XLA's cost analysis of one fwd+bwd on B examples x K) and its fraction
      of the measured matmul peak.

3. **schedule sampling**: wall time of ``make_schedule`` for 1M arrivals (all_active n=100k, T=1M; concurrent n=100k,
   Mc=1000, M=100, immediate refill, T=10k).

Usage::

    python scripts/bench.py                 # full run (a few minutes on 2 CPU cores)
    python scripts/bench.py --quick         # about a minute
    python scripts/bench.py --steps 3000 --out results.json
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

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms import fedbuff
from asyncfl_jax.algorithms.base import ServerMeta
from asyncfl_jax.client import LocalConfig, local_flops_per_job, make_local_update
from asyncfl_jax.data import load_fashion_mnist, partition
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import build_program, make_replicas, schedule_arrays, stack_hparams
from asyncfl_jax.models.core import make_model
from asyncfl_jax.task import make_task
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

# Step counts: (engine chunk length = baseline steps, engine timed chunks) per model.
FULL = {"logreg": (300, 8), "mlp": (60, 6)}
QUICK = {"logreg": (100, 4), "mlp": (20, 3)}


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
def bench_engine(task, algorithm, local, schedule, chunk_len: int, hp_replicas) -> dict[str, Any]:
    """Times the engine's compiled chunk over ``schedule`` (its length is a multiple of ``chunk_len``)."""
    T = schedule.num_steps
    num_chunks = T // chunk_len
    assert num_chunks * chunk_len == T
    # Evaluation made negligible for the timed run: 2-example evaluation sets (the training path is unchanged).
    timed_task = dataclasses.replace(task, test_x=task.test_x[:2], test_y=task.test_y[:2],
                                     train_eval_x=task.train_eval_x[:2], train_eval_y=task.train_eval_y[:2])
    program = build_program(timed_task, algorithm, local, schedule.num_slots)
    sched = schedule_arrays(schedule)
    hp = stack_hparams(hp_replicas)
    keys = jnp.stack([jax.random.PRNGKey(r.seed) for r in hp_replicas])

    # Exactly simulate()'s jit/vmap setup for a schedule shared by all replicas.
    init_fn = jax.jit(jax.vmap(program.init, in_axes=(None, 0, 0)))
    chunk_fn = jax.jit(jax.vmap(program.chunk, in_axes=(0, None, 0, 0)), donate_argnums=(0,))

    def part(c):
        return jax.tree_util.tree_map(lambda a: a[c * chunk_len:(c + 1) * chunk_len], sched.steps)

    parts = [part(c) for c in range(num_chunks)]
    jax.block_until_ready(parts)

    t0 = time.perf_counter()
    init_c = init_fn.lower(sched, hp, keys).compile()
    compile_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    carry = init_c(sched, hp, keys)
    jax.block_until_ready(carry)
    init_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    chunk_c = chunk_fn.lower(carry, parts[0], hp, keys).compile()
    compile_chunk = time.perf_counter() - t0

    # Chunk 0: warm-up (and the model after chunk_len steps, to check the baseline against).
    t0 = time.perf_counter()
    carry, out = chunk_c(carry, parts[0], hp, keys)
    jax.block_until_ready((carry, out))
    first_chunk = time.perf_counter() - t0
    params_after_first = np.asarray(carry.server.x[0])

    timed = list(range(1, num_chunks)) or [0]
    if timed == [0]:  # a single chunk: time it (after warm-up there is nothing left; re-run from a fresh init)
        carry = init_c(sched, hp, keys)
    chunk_seconds = []
    for c in timed:  # blocking after each chunk costs nothing measurable and gives per-chunk rates
        t0 = time.perf_counter()
        carry, out = chunk_c(carry, parts[c], hp, keys)
        jax.block_until_ready((carry, out))
        chunk_seconds.append(time.perf_counter() - t0)
    seconds = float(sum(chunk_seconds))

    steps = range(timed[0] * chunk_len, (timed[-1] + 1) * chunk_len)
    arrivals = int((schedule.arrival_clients[steps.start:steps.stop] >= 0).sum())
    jobs = int((schedule.dispatch_clients[steps.start:steps.stop] >= 0).sum())
    computed_jobs = len(steps) * schedule.dispatch_width  # the vmap also trains padded (-1) entries

    # One full evaluation (what eval_every costs), measured on its own.
    eval_fn = jax.jit(jax.vmap(build_program(task, algorithm, local, schedule.num_slots).evaluate))
    xs = carry.server.x
    jax.block_until_ready(eval_fn(xs))
    best_eval = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(eval_fn(xs))
        best_eval = min(best_eval, time.perf_counter() - t0)
    final_acc = float(eval_fn(xs)["test_accuracy"][0])

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
        "best_chunk_updates_per_second": arrivals / len(timed) / min(chunk_seconds),
        "full_eval_seconds": best_eval,
        "final_test_accuracy": final_acc,
        "num_slots": schedule.num_slots,
        "dispatch_width": schedule.dispatch_width,
        "_params_after_first_chunk": params_after_first,
    }


# ---------------------------------------------------------------------------------------------------- 2b. baseline
def bench_baseline(task, algorithm, local, schedule, num_steps: int, hp_replica, noop: bool = False) -> dict[str, Any]:
    """A per-event Python loop: one jitted client call per job, one jitted server call per step.

    ``noop=True`` replaces local training by a trivial function of the same signature: the loop's own cost (Python,
    dispatch of one jitted call per event), i.e. the fastest this baseline could be if training were free.
    """
    if noop:
        def local_fn(x, client, key, hp):  # raw uint32[2] keys (PRNGKey)
            return x * 1e-3 + key[0].astype(x.dtype)
    else:
        local_fn = make_local_update(task.model, task.train, local, output=algorithm.local_output)
    hp = {k: jnp.float32(v) for k, v in hp_replica.hparams.items()}
    key = jax.random.PRNGKey(hp_replica.seed)
    x0 = task.model.flat_params
    M = schedule.buffer_width

    @jax.jit
    def client_job(x, client, step_plus_one, j, hp):
        k = jax.random.fold_in(jax.random.fold_in(key, step_plus_one), j)  # the engine's key for this job
        message, _ = algorithm.client(x, local_fn(x, client, k, hp), (), hp)
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
            pending[s] = client_job(x0, c, 0, j, hp)
    # Compile the server step outside the timing (result discarded).
    jax.block_until_ready(server_step(state, (zero,) * M, schedule.arrival_clients[0], staleness[0], 0,
                                      np.float32(0), hp))
    jax.block_until_ready(pending)
    warmup = time.perf_counter() - t0

    steps_ = 0
    arrivals = jobs = 0
    t0 = time.perf_counter()
    for t in range(num_steps):
        x = algorithm.params(state)
        for j, (c, s) in enumerate(zip(schedule.dispatch_clients[t].tolist(), schedule.dispatch_slots[t].tolist())):
            if c >= 0:  # 1. dispatch: train now from x_t, keep the message in the job's slot
                pending[s] = client_job(x, c, t + 1, j, hp)
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
        "_params": np.asarray(algorithm.params(state)),
    }


# ---------------------------------------------------------------------------------------------------- breakdown
def bench_isolated_local(task, local, flops_per_job: float, width: int, repeats: int = 5) -> dict[str, Any]:
    """One jit(vmap(local update)) call of ``width`` clients from x_0, in isolation (no scan, no pending buffer)."""
    local_fn = make_local_update(task.model, task.train, local)
    hp = {k: jnp.float32(v) for k, v in {"client_lr": CLIENT_LR, "momentum": 0.0, "weight_decay": 0.0,
                                          "prox_mu": 0.0}.items()}
    x0 = task.model.flat_params
    clients = jnp.arange(width, dtype=jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), width)
    f = jax.jit(jax.vmap(local_fn, in_axes=(None, 0, 0, None)))
    jax.block_until_ready(f(x0, clients, keys, hp))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x0, clients, keys, hp))
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
def run_model(name: str, ds: Dataset, parts, chunk_len: int, chunks: int, baseline_steps: int) -> dict[str, Any]:
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

    eng = bench_engine(task, algorithm, local, schedule, chunk_len, replicas)
    eng["gflops"] = eng["timed_jobs"] * flops / eng["run_seconds"] / 1e9
    eng["gflops_incl_padded_jobs"] = eng["timed_computed_jobs"] * flops / eng["run_seconds"] / 1e9
    log(f"  engine:   {eng['updates_per_second']:9.1f} updates/s, {eng['server_steps_per_second']:8.1f} steps/s, "
        f"{eng['gflops']:6.2f} GFLOP/s, compile {eng['compile_seconds']:.1f} s "
        f"(timed {eng['timed_steps']} steps in {eng['run_seconds']:.2f} s; full eval {eng['full_eval_seconds'] * 1e3:.0f} ms)")

    base = bench_baseline(task, algorithm, local, schedule, min(baseline_steps, T), replicas[0])
    base["gflops"] = base["timed_jobs"] * flops / base["run_seconds"] / 1e9
    log(f"  baseline: {base['updates_per_second']:9.1f} updates/s, {base['server_steps_per_second']:8.1f} steps/s, "
        f"{base['gflops']:6.2f} GFLOP/s (timed {base['timed_steps']} steps in {base['run_seconds']:.2f} s)")

    # Same math check: baseline after `baseline_steps` steps vs engine after its first chunk (same number of steps).
    check = None
    if base["timed_steps"] == chunk_len:
        a, b = eng.pop("_params_after_first_chunk"), base.pop("_params")
        diff = float(np.max(np.abs(a - b)))
        scale = float(np.max(np.abs(a)))
        check = {"steps": chunk_len, "max_abs_diff": diff, "max_abs_param": scale,
                 "match": bool(np.isfinite(diff) and diff <= 1e-3 * max(scale, 1.0))}
        log(f"  check: engine vs baseline after {chunk_len} steps: max |diff| = {diff:.2e} (max |x| = {scale:.2f}) "
            f"-> {'match' if check['match'] else 'MISMATCH'}")
    eng.pop("_params_after_first_chunk", None)
    base.pop("_params", None)

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
        "speedup_updates_per_second": eng["updates_per_second"] / base["updates_per_second"],
        "check": check,
        "isolated_local": iso,
    }


def fmt_row(cells, widths):
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def print_table(res: dict[str, Any]) -> None:
    peak = res["matmul"]["peak_gflops"]
    print()
    print("=" * 100)
    print(f"asyncfl_jax benchmark  |  jax {res['env']['jax']} on {res['env']['device']} "
          f"({res['env']['cpu_count']} CPUs)  |  data: {res['data']}  |  {'quick' if res['quick'] else 'full'} run")
    print(f"FedBuff: n={NUM_CLIENTS}, Mc={CONCURRENCY}, M={BUFFER}, refill={REFILL}, K={K}, B={B}, SGD lr {CLIENT_LR}; "
          "engine timed with evaluation disabled (2-example eval sets)")
    print("=" * 100)
    mm = ", ".join(f"{r['n']}: {r['gflops']:.1f}" for r in res["matmul"]["sizes"])
    print(f"matmul float32 GFLOP/s  ({mm})  ->  peak {peak:.1f}")
    print("-" * 100)
    w = [26, 14, 14, 14, 14]
    print(fmt_row(["", "logreg eng", "logreg base", "mlp eng", "mlp base"], w))
    m = {r["model"]: r for r in res["models"]}
    L, P = m.get("logreg"), m.get("mlp")

    def cell(r, side, key, f="{:.1f}"):
        if r is None:
            return "-"
        v = r[side].get(key)
        return "-" if v is None else f.format(v)

    rows = [
        ("client updates / s", "updates_per_second", "{:.1f}"),
        ("server steps / s", "server_steps_per_second", "{:.1f}"),
        ("local-train GFLOP/s", "gflops", "{:.2f}"),
        ("timed steps", "timed_steps", "{:d}"),
        ("timed seconds", "run_seconds", "{:.2f}"),
    ]
    for label, key, f in rows:
        print(fmt_row([label, cell(L, "engine", key, f), cell(L, "baseline", key, f), cell(P, "engine", key, f),
                       cell(P, "baseline", key, f)], w))
    print(fmt_row(["compile s (engine)", cell(L, "engine", "compile_seconds", "{:.1f}"), "",
                   cell(P, "engine", "compile_seconds", "{:.1f}"), ""], w))
    print(fmt_row(["full eval ms (engine)", cell(L, "engine", "full_eval_seconds", "{:.0f}") if L is None else
                   f"{L['engine']['full_eval_seconds'] * 1e3:.0f}", "",
                   "-" if P is None else f"{P['engine']['full_eval_seconds'] * 1e3:.0f}", ""], w))
    for r in (L, P):
        if r is not None:
            iso = r["isolated_local"]
            print(f"  {r['model']}: d={r['num_params']}, {r['flops_per_job'] / 1e6:.2f} MFLOP/job; isolated "
                  f"jit(vmap(local)) x{iso['width']}: {iso['best_seconds'] * 1e3:.2f} ms = {iso['gflops']:.2f} GFLOP/s "
                  f"({iso['gflops'] / peak:.0%} of peak); engine/baseline same model after {r['check']['steps']} "
                  f"steps: {'yes' if r['check']['match'] else 'NO'} (max diff {r['check']['max_abs_diff']:.1e})"
                  if r["check"] else "")
    print("-" * 100)
    print("targets")
    for t in res["targets"]:
        print(f"  {t['name']:<58} measured {t['measured']:8.3f}   target >= {t['target']:<6}  {t['status']}")
    print("-" * 100)
    s = res["schedules"]
    print(f"schedule sampling: all_active n=100k T=1M: {s['all_active_n100k_T1M_seconds']:.2f} s   |   concurrent "
          f"n=100k Mc=1000 M=100 immediate T=10k (1M arrivals): {s['concurrent_n100k_Mc1000_M100_T10k_seconds']:.2f} s")
    print("=" * 100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller step counts (about a minute)")
    p.add_argument("--steps", type=int, default=None,
                   help="engine server steps per model (rounded up to whole chunks; chunk = baseline steps)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    p.add_argument("--models", default="logreg,mlp", help="comma-separated subset of logreg,mlp")
    p.add_argument("--skip-schedules", action="store_true", help="skip the schedule-sampling timings")
    args = p.parse_args(argv)

    plan = QUICK if args.quick else FULL
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    env = {"jax": jax.__version__, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
           "cpu_count": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()}
    log(f"jax {env['jax']} ({env['backend']}: {env['device']}), {env['cpu_count']} CPUs")
    t_start = time.perf_counter()

    log("1. matmul peak")
    mm = matmul_peak([512, 1024, 2048], repeats=3 if args.quick else 6)
    peak = mm["peak_gflops"]

    log("2. FedBuff on Fashion-MNIST")
    ds, data_note = load_data()
    parts = partition("iid", ds.train_y, NUM_CLIENTS, SEED)
    results = []
    for name in models:
        chunk_len, chunks = plan[name]
        if args.steps is not None:
            chunks = max(1, -(-args.steps // chunk_len))
            if args.steps < chunk_len:
                chunk_len, chunks = args.steps, 1
        results.append(run_model(name, ds, parts, chunk_len, chunks, baseline_steps=chunk_len))

    targets = []
    by = {r["model"]: r for r in results}
    if "logreg" in by:
        v = by["logreg"]["speedup_updates_per_second"]
        targets.append({"name": "logreg: engine / per-event loop (client updates per second)", "measured": v,
                        "target": TARGET_SPEEDUP_LOGREG, "status": "PASS" if v >= TARGET_SPEEDUP_LOGREG else "MISS"})
    if "mlp" in by:
        v = by["mlp"]["engine"]["gflops"] / peak
        targets.append({"name": "mlp: engine local-training GFLOP/s / matmul peak", "measured": v,
                        "target": TARGET_PEAK_FRACTION_MLP,
                        "status": "PASS" if v >= TARGET_PEAK_FRACTION_MLP else "MISS"})
        by["mlp"]["engine_fraction_of_peak"] = v
    for r in results:
        r["engine_fraction_of_peak"] = r["engine"]["gflops"] / peak

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
