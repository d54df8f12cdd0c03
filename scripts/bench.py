#!/usr/bin/env python
"""Throughput and scale benchmark of the asyncfl_jax engine, measured side by side in one process.

What it measures (everything in the same run, so ratios are meaningful on a noisy machine); ``--parts`` selects:

* ``matmul``: jitted float32 ``a @ b`` for square sizes, best of several repeats after warm-up, FLOPs = 2 n^3;
  measured at the start and again at the end, the peak is the best of all (conservative on a shared machine). A
  1024^3 matmul probe also runs right after each timed FedBuff engine chunk ("paired" fraction, informational).
* ``fedbuff``: FedBuff on Fashion-MNIST (n=100 clients, IID partition seed 0, concurrency Mc=20, buffer M=10, refill
  at step boundaries, K=10 local SGD steps of B=32, client lr 0.05, server lr 1) for logistic regression and an MLP
  784-200-200-10:

  a. *engine*: the same compiled program :func:`asyncfl_jax.engine.simulate` runs, driven chunk by chunk by the
     engine's own host loop (``prepare_run`` + ``HostLoop``, one replica). Compilation, the initial jobs and the
     first chunk (warm-up) are excluded from the timing. The evaluation the engine runs after each chunk is made
     negligible for the timed run by shrinking the evaluation sets to 2 examples (training code path unchanged); the
     cost of one full evaluation (10k test + 5k train examples) is measured separately and reported.
  b. *baseline*: a plain per-event Python loop over the same schedule doing the same math: one jitted single-client
     local update per dispatched job (trained at dispatch from the current model, result kept in a dict keyed by
     its pending slot), one jitted server update per server step (applied at the arrival step, donating its state).
     Jobs use the engine's PRNG keys, so after the same number of steps both give the same model up to float32
     rounding (checked after the engine's first chunk). The same loop with a no-op local update gives its
     Python/dispatch floor, i.e. how much of the loop's time is overhead rather than training.
  c. ratios: engine/baseline client updates per second; achieved local-training GFLOP/s (jobs trained x FLOPs per
     job from ``local_flops_per_job``, i.e. XLA's cost analysis of one fwd+bwd on B examples x K) and its fraction
     of the measured matmul peak.
* ``torch``: the plain-PyTorch yardstick (``bench_yardstick.py``, ``bench_torch.py``; needs ``torch``, the
  ``bench`` extra): the FedBuff setting above as the per-event loop a researcher would write in PyTorch (1 and 2
  threads, same partition and schedule) against the engine, for logreg, the MLP and the CNN, each side's GFLOP/s as a
  fraction of the matmul peak; and end to end, the process wall time of a 2,000-arrival ``asyncfl run`` (empty and
  warm compilation cache) against the PyTorch process.
* ``ace``: ACE (``get_algorithm("ace")``, all_active protocol, n=1000, one minibatch gradient of B=32 per job, the
  initialization round) on Fashion-MNIST logistic regression: engine vs the per-event loop (which also runs the
  initialization round client by client), with lookahead batching off (L=1) and on (L = 8, 32, 64), the lookahead
  windows achieved, and the engine step split into the server rule alone and the local training alone.
* ``ca2fl``: the same for CA2FL in the FedBuff setting (n=100, Mc=20, M=10, boundary refill, K=10); the lookahead
  windows of that schedule are reported (they are all one step: boundary refill dispatches jobs that may arrive in
  the next step).
* ``scaling``: engine time per event for ACE and CA2FL as n grows 10^2 -> 10^5 (every client holds 32 examples),
  with the MemoryBudget (known before compiling) and the process's peak RSS of each run; float32 caches where they
  fit, else int8, and int8 also at the largest n. Beyond ``real_init_max_n`` ACE starts from a zero state of the
  carry's shapes (see ``bench_scale.py``: the engine's init unrolls n / 256 groups of jobs and compiles for minutes).
* ``replicas``: wall time per server step as the replica axis (client learning rates x seeds) grows 1 -> 64,
  FedBuff (the setting above; logistic regression and the MLP) and ACE (n=1000, logistic regression, from a zero
  state): the replicas with the default settings on one device (the engine's grouping for the backend: on a CPU,
  groups called one after another by the host, ``engine/replica_groups.py``), all vmapped together
  (``replica_batch=R``), and spread over the host devices (``shard_replicas``), printed as
  "total arrivals/s of R replicas / one replica" (= R replicas together / the R run one by one); for the MLP also
  the local-training GFLOP/s over the matmul rate measured right after each row.
* ``checkpoints``: ``simulate`` with the default checkpoints (wall-clock interval, asynchronous) against none, on
  the benchmark task (FedBuff MLP), ACE with its n x d cache and a 10,000-step logistic-regression run evaluated every
  10 steps (``bench_checkpoints.py``); target: default <= 1.05x the wall time of no checkpoints.
* ``compile``: the compile time of the default experiment (``asyncfl run`` with no options, ``ExperimentConfig()``)
  as ``History.compile_seconds`` reports it, and its wall time.
* ``schedules``: wall time of ``make_schedule`` for 1M arrivals (all_active n=100k, T=1M; concurrent n=100k,
  Mc=1000, M=100, immediate refill, T=10k).

Usage::

    python scripts/bench.py --out bench.json   # every part; writes bench.json and bench.png
    python scripts/bench.py --quick            # smaller step counts and sweeps (about 2-3 minutes on 2 cores)
    python scripts/bench.py --parts ace,ca2fl,scaling --out results.json
    python scripts/bench.py --smoke --parts ace,ca2fl,scaling,replicas,compile   # smallest sizes (tests)
    python scripts/bench.py --one-device       # JAX's single CPU device (no sharding over cores)
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_scale.py, next to this file
import bench_checkpoints  # noqa: E402
import bench_scale  # noqa: E402
import bench_yardstick  # noqa: E402
from bench_scale import bench_baseline, bench_engine  # noqa: E402

from asyncfl_jax.algorithms import fedbuff  # noqa: E402
from asyncfl_jax.client import LocalConfig, local_flops_per_job, make_local_update  # noqa: E402
from asyncfl_jax.data import load_fashion_mnist, partition  # noqa: E402
from asyncfl_jax.data.client_data import Dataset  # noqa: E402
from asyncfl_jax.engine import make_replicas  # noqa: E402
from asyncfl_jax.models.core import make_model  # noqa: E402
from asyncfl_jax.task import make_task  # noqa: E402
from asyncfl_jax.timing import DelayModel, make_schedule  # noqa: E402

# The FedBuff setting (from the core issue).
NUM_CLIENTS = 100
CONCURRENCY = 20
BUFFER = 10
REFILL = "boundary"
K = 10
B = 32
CLIENT_LR = 0.05
SERVER_LR = 1.0
SEED = 0

SETTING = {"num_clients": NUM_CLIENTS, "concurrency": CONCURRENCY, "buffer_size": BUFFER, "refill": REFILL,
           "local_steps": K, "batch_size": B, "client_lr": CLIENT_LR, "server_lr": SERVER_LR, "seed": SEED}

TARGET_SPEEDUP_LOGREG = 10.0  # core issue: engine >= 10x the per-event loop (client updates/s), logistic regression
TARGET_PEAK_FRACTION_MLP = 0.5  # core issue: engine local training >= 50% of the measured matmul GFLOP/s, MLP
TARGET_SPEEDUP = bench_scale.TARGET_SPEEDUP  # performance and scale: FedBuff and ACE >= 30x the per-event loop

# Step counts per model: (engine chunk length, engine chunks (the first is warm-up), baseline steps).
FULL = {"logreg": (300, 8, 300), "mlp": (30, 11, 60)}
QUICK = {"logreg": (100, 4, 100), "mlp": (20, 3, 20)}
SMOKE = {"logreg": (5, 2, 5), "mlp": (2, 2, 2)}
CHECK_RTOL = bench_scale.CHECK_RTOL  # engine vs baseline: max |diff| <= CHECK_RTOL * max(max |x|, 1)
# The two differ only by float32 rounding (vmapped vs single-job reductions), ~1e-8 after one step; for the ReLU MLP a
# rounding difference that moves a pre-activation across 0 changes that step's gradient discontinuously, so the gap
# grows to ~1e-5 after 5 steps and ~1.5e-3 after 20-30 (measured); training different clients or keys would differ
# by O(max |x|).

PARTS = ("matmul", "fedbuff", "torch", "ace", "ca2fl", "scaling", "replicas", "checkpoints", "compile", "schedules")


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
        # best engine chunk vs best loop segment: both robust to other jobs on the machine
        "speedup_best": eng["best_chunk_updates_per_second"] / base["best_segment_updates_per_second"],
        "check": check,
        "isolated_local": iso,
    }



def _row(cells, widths):
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


BAR = "=" * 112
RULE = "-" * 112


def print_header(res: dict[str, Any]) -> None:
    print()
    print(BAR)
    e = res["env"]
    print(f"asyncfl_jax benchmark | jax {e['jax']} on {e['num_devices']} x {e['device']} ({e['cpu_count']} CPUs; "
          f"jobs of a step {'sharded over the devices' if e['jobs_sharded'] else 'on one device'}) | data: {res['data']} | "
          f"{res['mode']} run | parts: {','.join(res['parts'])}")
    print(BAR)


def print_fedbuff(res: dict[str, Any]) -> None:
    peak = res["matmul"]["peak_gflops"] if res.get("matmul") else math.nan
    print(f"FedBuff: n={NUM_CLIENTS}, Mc={CONCURRENCY}, M={BUFFER}, refill={REFILL}, K={K}, B={B}, SGD lr {CLIENT_LR}, "
          "IID, seed 0")
    print("engine timed without compile/initial jobs/first chunk, with evaluation disabled (2-example eval sets)")
    print(RULE)
    for label, key in (("start", "sizes"), ("end", "sizes_end")):
        if res.get("matmul") and key in res["matmul"]:
            mm = ", ".join(f"n={r['n']}: {r['gflops']:.1f}" for r in res["matmul"][key])
            print(f"matmul float32 GFLOP/s at {label:<5}: {mm}")
    print(f"matmul peak (best of all): {peak:.1f} GFLOP/s")
    print(RULE)
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
    line("best chunk/segment updates/s", lambda r, s: f"{r[s]['best_chunk_updates_per_second']:.1f}"
         if s == "engine" else f"{r[s]['best_segment_updates_per_second']:.1f}")
    line("compile s", lambda r, s: f"{r[s]['compile_seconds']:.1f}" if s == "engine" else None)
    line("full evaluation ms", lambda r, s: f"{r[s]['full_eval_seconds'] * 1e3:.0f}" if s == "engine" else None)
    line("no-op loop updates / s", lambda r, s: f"{r['baseline_noop']['updates_per_second']:.0f}"
         if s == "baseline" else None)
    line("engine / loop (updates/s)", lambda r, s: f"{r['speedup_updates_per_second']:.2f}x" if s == "engine" else None)
    line("  best chunk / best segment", lambda r, s: f"{r['speedup_best']:.2f}x" if s == "engine" else None)
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
    print(RULE)


def print_algorithms(res: dict[str, Any]) -> None:
    algos = res["algorithms"]
    cols = []  # (label, algorithm, engine variant or "loop")
    for name in ("ace", "ca2fl"):
        if name in algos:
            a = algos[name]
            cols += [(f"{name} L={L}" if L != "1" else f"{name} eng", name, L)
                     for L in sorted(a["engine"], key=int)]
            cols.append((f"{name} loop", name, "loop"))
    w = [28] + [12] * len(cols)
    s = {n: a["setting"] for n, a in algos.items()}
    if "ace" in s:
        print(f"ACE: all_active, n={s['ace']['num_clients']}, one minibatch gradient of B={s['ace']['batch_size']} per "
              f"job, server lr {s['ace']['hparams']['server_lr']}, initialization round; Fashion-MNIST logreg")
    if "ca2fl" in s:
        c = s["ca2fl"]
        print(f"CA2FL: concurrent, n={c['num_clients']}, Mc={c['concurrency']}, M={c['buffer_size']}, "
              f"refill={c['refill']}, K={c['local_steps']}, B={c['batch_size']}; Fashion-MNIST logreg")
    print(RULE)
    print(_row([""] + [c[0] for c in cols], w))

    def line(label, fn):
        cells = []
        for _, name, v in cols:
            try:
                x = fn(algos[name], algos[name]["baseline"] if v == "loop" else algos[name]["engine"][v], v)
            except (KeyError, TypeError, ZeroDivisionError):
                x = None
            cells.append("" if x is None else x)
        print(_row([label] + cells, w))

    line("client updates / s", lambda a, r, v: f"{r['updates_per_second']:.0f}")
    line("us per server step", lambda a, r, v: f"{r['seconds_per_step'] * 1e6:.0f}")
    line("best chunk/segment upd/s", lambda a, r, v: f"{r['best_segment_updates_per_second']:.0f}" if v == "loop"
         else f"{r['best_chunk_updates_per_second']:.0f}")
    line("engine / loop", lambda a, r, v: None if v == "loop" else f"{a['speedup'][v]:.2f}x")
    line("  best chunk / best segment", lambda a, r, v: None if v == "loop" else f"{a['speedup_best'][v]:.2f}x")
    line("lookahead window mean/max", lambda a, r, v: (f"{r['windows']['mean_window']:.1f}/{r['windows']['max_window']}"
                                                       if v not in ("loop", "1") else None))
    line("jobs trained / dispatched", lambda a, r, v: (f"{r['timed_computed_jobs'] / max(r['timed_jobs'], 1):.1f}"
                                                       if v != "loop" else None))
    line("compile s (init + chunk)", lambda a, r, v: (f"{r['compile_init_seconds']:.1f}+{r['compile_chunk_seconds']:.1f}"
                                                      if v != "loop" else None))
    line("no-op loop updates / s", lambda a, r, v: f"{a['baseline_noop']['updates_per_second']:.0f}"
         if v == "loop" else None)
    line("same model as loop", lambda a, r, v: (f"{'yes' if a['check'][v]['match'] else 'NO'} "
                                                f"({a['check'][v]['max_abs_diff']:.0e})") if v != "loop" else None)
    for name, a in algos.items():
        b = a["breakdown"]
        print(f"  {name} step breakdown: engine {b['engine_seconds_per_step'] * 1e6:.0f} us = server rule alone "
              f"{b['server_seconds_per_step'] * 1e6:.0f} us + local training alone "
              f"{b['training_seconds_per_step'] * 1e6:.0f} us ({b['jobs_per_step']:.0f} jobs) + engine bookkeeping "
              f"{b['other_seconds_per_step'] * 1e6:.0f} us")
        if "lookahead_windows_L8" in a:
            print(f"  {name}: lookahead windows of its schedule with L=8: mean "
                  f"{a['lookahead_windows_L8']['mean_window']:.2f}, max {a['lookahead_windows_L8']['max_window']}")
    print(RULE)


def print_scaling(sc: dict[str, Any]) -> None:
    print(f"scaling: engine time per client update (event; best chunk) as n grows, on one device unless marked; "
          f"every client holds {sc['examples_per_client']} examples; ACE from a zero state beyond "
          f"n={sc['real_init_max_n']} (*)")
    w = [33, 8, 11, 10, 14, 15, 15, 9, 9]
    print(_row(["", "cache", "us / event", "us / step", "server us/step", "compile chunk s", "init comp+run s", "state",
                "peak RSS"], w))
    for r in sc["rows"]:
        label = f"{r['algorithm']} n={r['num_clients']}" + (" (jobs sharded)" if r.get("shard") else "")
        if "error" in r:
            print(_row([label, r["cache"], "error"], w[:3]))
            continue
        init = "(*)" if r["zero_init"] else f"{r['compile_init_seconds']:.1f}+{r['init_run_seconds']:.1f}"
        print(_row([label, r["cache"], f"{r['seconds_per_event'] * 1e6:.0f}", f"{r['seconds_per_step'] * 1e6:.0f}",
                    f"{r['server_rule_seconds_per_step'] * 1e6:.0f}", f"{r['compile_chunk_seconds']:.1f}", init,
                    bench_scale._gib(r["state_bytes"]),
                    bench_scale._gib(r["peak_rss_bytes"])], w))
    print(RULE)


def print_replicas(rp: dict[str, Any]) -> None:
    print("replicas: total arrivals/s of R replicas / one replica on one device (= R replicas together / the R run "
          "one by one), best chunk, each row against one replica timed right before it; default grouping on one "
          "device | spread over the host devices (shard_replicas)")
    for name, block in rp.items():
        print(f"  {name} (n={block['num_clients']}, {block.get('devices', 1)} devices):")
        for r in block["rows"]:
            sharded = (f" | sharded {r['sharded_seconds_per_step'] * 1e3:8.2f} ms/step "
                       f"{r['sharded_throughput_vs_one']:5.2f}x" if "sharded_throughput_vs_one" in r else "")
            gflops = "".join(f"; local {r[f'{k}local_gflops']:.1f} GFLOP/s"
                             + (f" = {r[f'{k}fraction_of_matmul']:.0%} of matmul" if f"{k}fraction_of_matmul" in r
                                else "") + f" ({'sharded' if k else 'one device'})"
                             for k in ("", "sharded_") if f"{k}local_gflops" in r)
            paired = (f" [vs one replica timed right before: {r['paired_one_seconds_per_step'] * 1e3:.2f} ms/step]"
                      if "paired_one_seconds_per_step" in r else "")
            print(f"    R={r['replicas']:>2}: one device {r['seconds_per_step'] * 1e3:8.2f} ms/step "
                  f"{r['throughput_vs_one']:5.2f}x"
                  + (f" (CPU time {r['cpu_throughput_vs_one']:5.2f}x)" if "cpu_throughput_vs_one" in r else "")
                  + f"{sharded}{gflops}{paired}")
    print(RULE)


def print_torch(tr: dict[str, Any]) -> None:
    if "skipped" in tr:
        print(f"PyTorch yardstick: skipped ({tr['skipped']})")
        print(RULE)
        return
    print(f"PyTorch yardstick (torch {tr['torch']}): FedBuff, same partition and schedule; client updates / s "
          "(best chunk / best segment), GFLOP/s and fraction of the matmul peak")
    for name, r in tr["steady"].items():
        e = r["engine"]
        cells = [f"engine {e['best_chunk_updates_per_second']:.1f} ({e['gflops']:.1f} GFLOP/s"
                 + (f", {e['fraction_of_peak']:.0%} of peak)" if "fraction_of_peak" in e else ")")]
        for t, x in r["torch"].items():
            cells.append(f"PyTorch {t}T {x['best_segment_updates_per_second']:.1f} ({x['gflops']:.1f} GFLOP/s"
                         + (f", {x['fraction_of_peak']:.0%})" if "fraction_of_peak" in x else ")")
                         + f" -> {x['engine_over_torch_best']:.2f}x")
        print(f"  {name:<6} " + " | ".join(cells))
    e2e = tr.get("end_to_end", {})
    if "skipped" in e2e:
        print(f"  end to end: skipped ({e2e['skipped']})")
    for name in bench_yardstick.E2E_MODELS:
        if name in e2e:
            r = e2e[name]
            torch_text = ", ".join(f"{t}T {x['process_seconds']:.1f} s" for t, x in r["torch"].items())
            print(f"  {name:<6} {e2e['arrivals']} arrivals, process wall time: asyncfl run "
                  f"{r['engine_cold_cache']['process_seconds']:.1f} s (empty cache), "
                  f"{r['engine_warm_cache']['process_seconds']:.1f} s (warm); PyTorch {torch_text} -> "
                  f"{r['speedup_cold']:.2f}x / {r['speedup_warm']:.2f}x")
    print(RULE)


def print_targets(res: dict[str, Any]) -> None:
    print("targets")
    for t in res["targets"]:
        op = "<=" if t.get("op") == "<=" else ">="
        print(f"  {t['name']:<64} measured {t['measured']:8.3f}  target {op} {t['target']:<5}  {t['status']}")
        if "note" in t:
            print(f"    {t['note']}")


def print_table(res: dict[str, Any]) -> None:
    print_header(res)
    if res.get("models"):
        print_fedbuff(res)
    if res.get("torch"):
        print_torch(res["torch"])
    if res.get("algorithms"):
        print_algorithms(res)
    if res.get("scaling"):
        print_scaling(res["scaling"])
    if res.get("replicas"):
        print_replicas(res["replicas"])
    if res.get("checkpoints"):
        bench_checkpoints.print_checkpoints(res["checkpoints"])
        print(RULE)
    if res.get("compile"):
        c = res["compile"]
        runs = ", ".join(f"{r['label']} {r['compile_seconds']:.1f} s" for r in c["runs"])
        print(f"default experiment ({c['config']}; {c['data']} data, {c['model']}): compile {c['compile_seconds_total']:.1f}"
              f" s ({runs}), wall {c['wall_seconds']:.1f} s")
        print(RULE)
    if res.get("schedules"):
        sc = res["schedules"]
        print(f"schedule sampling (1M arrivals each): all_active n=100k T=1M: {sc['all_active_n100k_T1M_seconds']:.2f} s "
              f"| concurrent n=100k Mc=1000 M=100 immediate T=10k: "
              f"{sc['concurrent_n100k_Mc1000_M100_T10k_seconds']:.2f} s")
        print(RULE)
    print_targets(res)
    print(BAR)


def _target(name: str, measured: float, target: float, op: str = ">=", note: str | None = None) -> dict[str, Any]:
    ok = measured >= target if op == ">=" else measured <= target
    t = {"name": name, "measured": float(measured), "target": target, "op": op,
         "status": "PASS" if ok else "MISS"}
    if note:
        t["note"] = note
    return t


def targets_of(res: dict[str, Any]) -> list[dict[str, Any]]:
    targets = []
    by = {r["model"]: r for r in res.get("models", [])}
    if "logreg" in by:  # ratios of the best engine chunk and the best loop segment (robust to other jobs)
        v = by["logreg"]["speedup_best"]
        note = f"(whole runs: {by['logreg']['speedup_updates_per_second']:.2f}x)"
        targets.append(_target("FedBuff logreg: engine / per-event loop (core issue)", v, TARGET_SPEEDUP_LOGREG,
                               note=note))
        targets.append(_target("FedBuff logreg: engine / per-event loop", v, TARGET_SPEEDUP, note=note))
    if "mlp" in by and res.get("matmul"):
        v = by["mlp"]["engine_fraction_of_peak"]
        paired = by["mlp"]["engine"].get("paired_fraction_of_matmul")
        note = None
        if paired is not None:
            note = (f"(per chunk vs the matmul rate measured right after it, median: {paired:.3f} -> "
                    f"{'PASS' if paired >= TARGET_PEAK_FRACTION_MLP else 'MISS'}; informational)")
        targets.append(_target("FedBuff mlp: engine local-training GFLOP/s / matmul peak", v, TARGET_PEAK_FRACTION_MLP,
                               note=note))
    tr = res.get("torch", {})
    steady = tr.get("steady", {})
    if "logreg" in steady:
        targets.append(_target("FedBuff logreg: engine / plain PyTorch loop (best threads)",
                               steady["logreg"]["engine_over_best_torch"], bench_yardstick.TARGET_STEADY_LOGREG))
    cnn = steady.get("cnn", {})
    if "cnn_one_device_over_torch_1_thread" in cnn:
        targets.append(_target("CNN: engine (one device) / plain PyTorch loop, 1 thread",
                               cnn["cnn_one_device_over_torch_1_thread"], bench_yardstick.TARGET_CNN_ONE_DEVICE))
    if "cnn_shard_jobs_over_torch_1_thread" in cnn:
        targets.append(_target("CNN: engine (shard_jobs over the cores) / plain PyTorch loop, 1 thread",
                               cnn["cnn_shard_jobs_over_torch_1_thread"], bench_yardstick.TARGET_CNN_SHARD_JOBS))
    for name, target in bench_yardstick.TARGET_E2E.items():
        r = tr.get("end_to_end", {}).get(name)
        if r:
            targets.append(_target(f"{name}: PyTorch / asyncfl run process wall time, 2,000 arrivals (warm cache)",
                                   r["speedup_warm"], target, note=f"(empty cache: {r['speedup_cold']:.2f}x)"))
    algos = res.get("algorithms", {})
    if "ace" in algos:
        a = algos["ace"]
        targets.append(_target("ACE: engine (lookahead off) / per-event loop", a["speedup_best"]["1"], TARGET_SPEEDUP,
                               note=f"(whole runs: {a['speedup']['1']:.2f}x)"))
        on = max((L for L in a["engine"] if L != "1"), key=lambda L: a["speedup_best"][L], default=None)
        if on is not None:
            targets.append(_target(f"ACE: engine (lookahead L={on}, the best L) / per-event loop",
                                   a["speedup_best"][on], TARGET_SPEEDUP,
                                   note=f"(whole runs: {a['speedup'][on]:.2f}x)"))
    if "ca2fl" in algos:
        a = algos["ca2fl"]
        targets.append(_target("CA2FL: engine / per-event loop (informational)", a["speedup_best"]["1"],
                               TARGET_SPEEDUP, note=f"(whole runs: {a['speedup']['1']:.2f}x)"))
    count, ratio = bench_scale.TARGET_REPLICAS
    count_t, ratio_t = bench_scale.TARGET_REPLICA_THROUGHPUT
    for name, block in res.get("replicas", {}).items():
        rows = {r["replicas"]: r for r in block["rows"]}
        if count in rows:
            targets.append(_target(f"{name}: wall time of {count} replicas / one replica", rows[count]["relative_to_one"],
                                   ratio, op="<="))
        if count_t in rows:
            r = rows[count_t]
            targets.append(_target(f"{name}: total arrivals/s of {count_t} replicas / one replica",
                                   r["best_throughput_vs_one"], ratio_t, note=f"({r['best_placement']}; one device: "
                                   f"{r['throughput_vs_one']:.2f}x)"))
        several = [r for r in rows.values() if r["replicas"] > 1]
        if several:  # R = 1 is 1.0 by definition
            worst = min(several, key=lambda r: r["best_throughput_vs_one"])
            targets.append(_target(f"{name}: R replicas together / the R run one by one, worst R "
                                   f"(R = {worst['replicas']})", worst["best_throughput_vs_one"], 1.0,
                                   note=f"({worst['best_placement']})"))
        mlp = [r for r in rows.values() if "fraction_of_matmul" in r or "sharded_fraction_of_matmul" in r]
        if mlp:
            best = max(max(r.get("fraction_of_matmul", 0.0), r.get("sharded_fraction_of_matmul", 0.0)) for r in mlp)
            targets.append(_target(f"{name}: local-training GFLOP/s / matmul rate measured after it (best R)", best,
                                   bench_scale.TARGET_LOCAL_MATMUL_FRACTION))
    for name, measured, target in bench_checkpoints.targets(res.get("checkpoints", {})):
        targets.append(_target(name, measured, target, op="<="))
    if res.get("compile"):
        targets.append(_target("default experiment: compile seconds (all runs)", res["compile"]["compile_seconds_total"],
                               bench_scale.TARGET_COMPILE_SECONDS, op="<="))
    return targets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller step counts and sweeps (about 2-3 minutes)")
    p.add_argument("--smoke", action="store_true", help="the smallest sizes (for tests; numbers are meaningless)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    p.add_argument("--steps", type=int, default=None,
                   help="FedBuff engine server steps per model (rounded up to whole chunks of the default length; "
                        "the first chunk is warm-up)")
    p.add_argument("--out", default=None, help="write the results as JSON to this file (and the plot beside it)")
    p.add_argument("--plot", default=None,
                   help="the plot's file (default: the --out file with .png instead of .json; none without --out)")
    p.add_argument("--models", default="logreg,mlp", help="FedBuff part: comma-separated subset of logreg,mlp")
    p.add_argument("--torch-models", default="logreg,mlp,cnn",
                   help="torch part: comma-separated subset of logreg,mlp,cnn")
    p.add_argument("--skip-schedules", action="store_true", help="skip the schedule-sampling timings")
    p.add_argument("--real-init-max-n", type=int, default=None,
                   help="scaling part: run the engine's init (initial jobs, ACE's initialization round) up to this n "
                        "and start larger runs from a zero state (default 1000; running the init trains 2n jobs)")
    p.add_argument("--replica-counts", default=None,
                   help="replicas part: comma-separated replica counts (default: the mode's, e.g. 1,8,16 with --quick)")
    p.add_argument("--replica-models", default=None,
                   help="replicas part: comma-separated subset of fedbuff,fedbuff_mlp,ace (default: all three)")
    p.add_argument("--one-device", action="store_true",
                   help="keep JAX's single CPU device (default: one device per core, jobs of a step spread over them)")
    args = p.parse_args(argv)

    if args.quick and args.smoke:
        p.error("--quick and --smoke exclude each other")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    for x in parts:
        if x not in PARTS:
            p.error(f"unknown part {x!r}; choose from {','.join(PARTS)}")
    if args.skip_schedules and "schedules" in parts:
        parts.remove("schedules")
    if ("fedbuff" in parts or "torch" in parts) and "matmul" not in parts:
        parts.insert(0, "matmul")  # the FedBuff part reports GFLOP/s as a fraction of the matmul peak
    plan = {"full": FULL, "quick": QUICK, "smoke": SMOKE}[mode]
    scale_plan = bench_scale.PLANS[mode]
    if args.real_init_max_n is not None:
        scale_plan = {**scale_plan, "scaling": {**scale_plan["scaling"], "real_init_max_n": args.real_init_max_n}}
    if args.replica_counts or args.replica_models:
        replicas_plan = dict(scale_plan["replicas"])
        if args.replica_counts:
            replicas_plan["counts"] = tuple(int(c) for c in args.replica_counts.split(","))
        if args.replica_models:
            replicas_plan["algorithms"] = tuple(m.strip() for m in args.replica_models.split(","))
        scale_plan = {**scale_plan, "replicas": replicas_plan}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in plan:
            p.error(f"unknown model {m!r}; choose from {sorted(plan)}")
    torch_models = [m.strip() for m in args.torch_models.split(",") if m.strip()]
    for m in torch_models:
        if m not in bench_yardstick.PLANS[mode]:
            p.error(f"unknown --torch-models entry {m!r}; choose from logreg, mlp, cnn")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be >= 1")
    env = {"jax": jax.__version__, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
           "num_devices": jax.device_count(), "jobs_sharded": jax.device_count() > 1,
           "cpu_count": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
           "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    log(f"jax {env['jax']} ({env['backend']}: {env['device']}), {env['cpu_count']} CPUs, parts: {','.join(parts)}, "
        f"{mode} run")
    t_start = time.perf_counter()
    res: dict[str, Any] = {"env": env, "mode": mode, "quick": mode == "quick", "parts": parts}
    seconds: dict[str, float] = {}
    sizes, repeats = ([128, 256], 1) if mode == "smoke" else ([512, 1024, 2048], 3 if mode == "quick" else 6)

    if "matmul" in parts:
        log("1. matmul peak")
        t0 = time.perf_counter()
        res["matmul"] = matmul_peak(sizes, repeats)
        seconds["matmul"] = time.perf_counter() - t0

    ds = data_note = None
    if any(x in parts for x in ("fedbuff", "torch", "ace", "ca2fl", "scaling", "replicas", "checkpoints")):
        ds, data_note = load_data()
    res["data"] = data_note or "synthetic LEAF (compile part only)"

    if "fedbuff" in parts:
        log("2. FedBuff on Fashion-MNIST")
        t0 = time.perf_counter()
        probe = make_matmul_probe() if mode != "smoke" else None
        fb_parts = partition("iid", ds.train_y, NUM_CLIENTS, SEED)
        results = []
        for name in models:
            chunk_len, chunks, base_steps = plan[name]
            if args.steps is not None:
                if args.steps < 2 * chunk_len:  # too few steps for a warm-up chunk + a timed one: two chunks of half
                    chunk_len, chunks = max(1, args.steps // 2), 2
                else:
                    chunks = -(-args.steps // chunk_len)
            results.append(run_model(name, ds, fb_parts, chunk_len, chunks, baseline_steps=base_steps, probe=probe))
        res["models"] = results
        res["setting"] = {"num_clients": NUM_CLIENTS, "concurrency": CONCURRENCY, "buffer_size": BUFFER,
                          "refill": REFILL, "local_steps": K, "batch_size": B, "client_lr": CLIENT_LR,
                          "server_lr": SERVER_LR, "partition": "iid", "seed": SEED,
                          "engine_timing": "compile, initial jobs and first chunk excluded; evaluation sets shrunk "
                                           "to 2 examples (full evaluation cost reported separately)"}
        seconds["fedbuff"] = time.perf_counter() - t0

    if "torch" in parts:
        log("2'. the plain-PyTorch yardstick (FedBuff, same partition and schedule)")
        t0 = time.perf_counter()
        res["torch"] = bench_yardstick.run_part(ds, partition("iid", ds.train_y, NUM_CLIENTS, SEED), mode, SETTING,
                                                models=tuple(torch_models))
        seconds["torch"] = time.perf_counter() - t0

    for name in ("ace", "ca2fl"):
        if name in parts:
            log(f"3. {name.upper()} on Fashion-MNIST: engine vs per-event loop"
                + (", lookahead off vs on" if name == "ace" else ""))
            t0 = time.perf_counter()
            res.setdefault("algorithms", {})[name] = bench_scale.run_algorithm(name, ds, scale_plan[name])
            seconds[name] = time.perf_counter() - t0

    if "scaling" in parts:
        log("4. scaling with n: time per event and memory (ACE, CA2FL)")
        t0 = time.perf_counter()
        res["scaling"] = bench_scale.run_scaling(ds, scale_plan["scaling"])
        seconds["scaling"] = time.perf_counter() - t0

    if "replicas" in parts:
        log("5. replicas: wall time as the vmapped replica axis grows")
        t0 = time.perf_counter()
        res["replicas"] = bench_scale.run_replicas(ds, scale_plan["replicas"],
                                                   probe=make_matmul_probe() if mode != "smoke" else None)
        seconds["replicas"] = time.perf_counter() - t0

    if "checkpoints" in parts:
        log("5'. checkpoints: default (interval, asynchronous) vs none")
        t0 = time.perf_counter()
        res["checkpoints"] = bench_checkpoints.run_checkpoints(ds, mode)
        seconds["checkpoints"] = time.perf_counter() - t0

    if "compile" in parts:
        log("6. compile time of the default experiment")
        t0 = time.perf_counter()
        res["compile"] = bench_scale.run_compile(scale_plan["compile"])
        seconds["compile"] = time.perf_counter() - t0

    if "matmul" in parts:
        log("1'. matmul peak again (the machine may be noisy; the peak is the best of both)")
        mm_end = matmul_peak(sizes, repeats)
        res["matmul"] = {"sizes": res["matmul"]["sizes"], "sizes_end": mm_end["sizes"],
                         "peak_gflops": max(res["matmul"]["peak_gflops"], mm_end["peak_gflops"])}
        for r in res.get("models", []):
            r["engine_fraction_of_peak"] = r["engine"]["gflops"] / res["matmul"]["peak_gflops"]
        for r in res.get("torch", {}).get("steady", {}).values():
            r["engine"]["fraction_of_peak"] = r["engine"]["gflops"] / res["matmul"]["peak_gflops"]
            for tr in r["torch"].values():
                tr["fraction_of_peak"] = tr["gflops"] / res["matmul"]["peak_gflops"]

    if "schedules" in parts:
        log("7. schedule sampling")
        t0 = time.perf_counter()
        res["schedules"] = bench_schedules()
        seconds["schedules"] = time.perf_counter() - t0

    res["targets"] = targets_of(res)
    res["part_seconds"] = seconds
    res["total_seconds"] = time.perf_counter() - t_start
    print_table(res)
    log(f"total wall time {res['total_seconds']:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + ")")
    plot_path = args.plot or (os.path.splitext(args.out)[0] + ".png" if args.out else None)
    if args.out:  # the numbers first (atomically), so that a failing plot loses nothing
        write_json(res, args.out)
        log(f"wrote {args.out}")
    if plot_path:
        res["plot"] = bench_scale.plot(res, plot_path)
        if res["plot"]:
            log(f"wrote {res['plot']}")
            if args.out:
                write_json(res, args.out)
    return 0



def write_json(res: dict[str, Any], path: str) -> None:
    """Writes ``res`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2, default=float)
    os.replace(tmp, path)

if __name__ == "__main__":
    sys.exit(main())
