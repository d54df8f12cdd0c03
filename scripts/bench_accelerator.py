#!/usr/bin/env python
"""The accelerator benchmark: the engine against a plain PyTorch per-event loop on the same device, at paper scale.

One command, from a checkout (no install, no download)::

    PYTHONPATH=. python scripts/bench_accelerator.py --out DIR            # full size: one GPU, within 8 minutes
    PYTHONPATH=. python scripts/bench_accelerator.py --quick --out DIR    # the same code paths on a CPU, 1-2 min

writes ``DIR/bench_accelerator.json`` (after every part, atomically) and ``DIR/bench_accelerator.md`` (one table),
and prints its progress. Every figure is a ratio of two measurements of the same run, on the same device:

* ``matmul``: the device's float32 (default and "highest" matmul precision) and bfloat16 matmul rates (square
  ``a @ b``, 2 n^3 FLOPs, best of several), the yardstick of the achieved FLOP/s below.
* ``torch`` and ``fedbuff``: FedBuff (n = 1,000 clients, IID, buffer M = 10, refill at step boundaries, K = 10 local
  SGD steps of B = 32, client lr 0.05, server lr 1) with the MLP 784-200-200-10 (Fashion-MNIST shapes), the CA2FL
  paper's CIFAR-10 CNN and ResNet-18 with GroupNorm (CIFAR-10 shapes), concurrency 20, 100 and 1,000: the engine's
  arrivals/s (its compiled chunks alone, and its whole run including compilation) against the plain PyTorch loop of
  ``bench_torch.py`` (one ``local_job`` per dispatched client, one server update per step) on the same device
  (``cuda`` when there is one), same partition, same schedule; each side's achieved FLOP/s (jobs trained x XLA's
  FLOPs of one job) over the measured matmul rates. Both sides start from a zero state of the run's shapes: the Mc
  initial jobs are not trained (their messages are zero), so a concurrency of 1,000 does not cost 1,000 ResNet jobs
  before the first step; every timed step does the same work as in a run from trained jobs.
* ``memory``: CA2FL and ACE with n = 10,000 and 100,000 clients (every client holds 32 examples): time per server
  step, the device's memory high-water mark (``device.memory_stats()["peak_bytes_in_use"]``; the process's peak RSS
  on a CPU) beside the project's memory budget (:meth:`asyncfl_jax.engine.Run.budget`, known before compiling) and
  XLA's analysis of the compiled chunk. The per-client cache is float32 where the budget's check passes against the
  device's real memory (``bytes_limit``), else bfloat16, else int8 (the refusals are recorded).
* ``replicas``: 1, 8 and 64 replicas (client learning rates x seeds) of the FedBuff MLP run vmapped in one program
  against one replica: total arrivals/s of R replicas / one replica's.
* ``mixed_precision``: the engine with bfloat16 local-training compute and float32 master weights
  (:func:`asyncfl_jax.precision.mixed_precision`) against float32, MLP and CNN.

Each part runs in its own process (a crash, an out-of-memory error or a timeout of one part is recorded and the next
part runs; the device's memory high-water mark is that of the part alone; PyTorch and JAX never hold the GPU
together) under a global wall-time budget (``--budget``, 450 s at full size): a part gets a share of what is left,
rows that cannot start in time are skipped with the reason written down. The PyTorch part runs first, before any JAX
process allocates the GPU's memory. Without PyTorch (``pip install torch``) the torch part is skipped, says so, and
the other parts run.

Data: random images of the papers' shapes (``bench_torch.PAPER_SHAPES``: 28x28x1 with 10 or 62 classes, 32x32x3
with 10 or 100), generated alike by both sides from a seed; ``--fmnist-dir DIR`` uses the Fashion-MNIST IDX files of
``DIR`` for the MLP instead. Throughput does not depend on the pixel values; the accuracies are not reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # bench_torch.py (PyTorch side, no JAX), bench_scale.py (engine timers)

JSON_NAME, MD_NAME = "bench_accelerator.json", "bench_accelerator.md"
SEED = 0
PARTS = ("matmul", "torch", "fedbuff", "memory", "replicas", "mixed_precision")
# Share of the remaining wall-time budget each part may use (of the parts not yet run).
WEIGHTS = {"matmul": 0.5, "torch": 2.5, "fedbuff": 6.0, "memory": 2.0, "replicas": 1.0, "mixed_precision": 1.5}
RESERVE_SECONDS = 5.0  # kept back from the budget: the last writes of the JSON and the table

# Sizes. Per model: data shape, engine (chunk length, chunks; the first chunk is the warm-up), PyTorch (warm-up
# steps, steps), the least seconds a row needs to be started, and (quick) a smaller ResNet of the same module.
FEDBUFF_FULL = {"num_clients": 1000, "concurrency": (20, 100, 1000), "buffer_size": 10, "local_steps": 10,
                "batch_size": 32, "client_lr": 0.05, "server_lr": 1.0, "refill": "boundary",
                "models": {"mlp": {"data": "fashion_mnist", "engine": (25, 3), "torch": (5, 30), "min_seconds": 10},
                           "ca2fl_cnn": {"data": "cifar10", "engine": (10, 3), "torch": (3, 15), "min_seconds": 20},
                           "resnet18_gn": {"data": "cifar10", "engine": (4, 3), "torch": (1, 6),
                                           "min_seconds": 45}}}
FEDBUFF_QUICK = {"num_clients": 40, "concurrency": (4, 8), "buffer_size": 2, "local_steps": 2, "batch_size": 8,
                 "client_lr": 0.05, "server_lr": 1.0, "refill": "boundary", "train_examples": 800,
                 "models": {"mlp": {"data": "fashion_mnist", "engine": (3, 2), "torch": (1, 4), "min_seconds": 1},
                            "ca2fl_cnn": {"data": "tiny_cifar", "engine": (3, 2), "torch": (1, 3), "min_seconds": 1},
                            "resnet18_gn": {"data": "tiny_cifar", "engine": (2, 2), "torch": (1, 2), "min_seconds": 1,
                                            "resnet": {"widths": (8, 8, 8, 8), "stage_sizes": (1, 1, 1, 1)}}}}
PLANS: dict[str, dict[str, Any]] = {
    "full": {
        "budget": 450.0,
        "matmul": {"sizes": (2048, 4096, 8192), "repeats": 5},
        "fedbuff": FEDBUFF_FULL,
        "memory": {"ns": (10_000, 100_000), "models": ("logreg", "mlp"), "algorithms": ("ca2fl", "ace"),
                   "steps": {"ace": (100, 3), "ca2fl": (10, 3)}, "per_client": 32, "min_seconds": 8},
        "replicas": {"counts": (1, 8, 64), "model": "mlp", "engine": (10, 3), "min_seconds": 8},
        "mixed_precision": {"models": ("mlp", "ca2fl_cnn"), "concurrency": 20},
    },
    "quick": {
        "budget": 150.0,
        "matmul": {"sizes": (256, 512), "repeats": 2},
        "fedbuff": FEDBUFF_QUICK,
        "memory": {"ns": (300,), "models": ("logreg",), "algorithms": ("ca2fl", "ace"),
                   "steps": {"ace": (4, 2), "ca2fl": (2, 2)}, "per_client": 8, "min_seconds": 1},
        "replicas": {"counts": (1, 8, 64), "model": "mlp", "engine": (2, 2), "min_seconds": 1, "hidden": (16, 16)},
        "mixed_precision": {"models": ("mlp",), "concurrency": 4},
    },
}


def log(msg: str) -> None:
    print(msg, flush=True)


def write_json(data: Any, path: str) -> None:
    """``data`` as JSON at ``path``, atomically (a temporary file in the same folder, then a rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=_json_default)
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> dict[str, Any]:
    """The checkout's commit and whether its tracked files differ from it (None outside a git checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def source_digest() -> str:
    """SHA-256 of the package's and the scripts' Python sources (paths and contents, sorted): identifies the code
    measured when the checkout has no git metadata (a copied working tree)."""
    import hashlib

    h = hashlib.sha256()
    for folder in ("asyncfl_jax", "scripts"):
        for dirpath, dirnames, filenames in sorted(os.walk(os.path.join(ROOT, folder))):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    h.update(os.path.relpath(path, ROOT).encode() + b"\0")
                    with open(path, "rb") as f:
                        h.update(f.read() + b"\0")
    return h.hexdigest()


# ==================================================================================================== child side
class PartWriter:
    """A part's results, written to its file after every row (a part killed at its deadline keeps its rows)."""

    def __init__(self, path: str, deadline: float) -> None:
        self.path, self.deadline = path, deadline
        self.data: dict[str, Any] = {"rows": [], "skipped": [], "info": {}}
        self.flush()

    def info(self, **kw: Any) -> None:
        self.data["info"].update(kw)
        self.flush()

    def row(self, row: dict[str, Any]) -> None:
        self.data["rows"].append(row)
        self.flush()

    def skip(self, what: str, why: str) -> None:
        log(f"    skipped {what}: {why}")
        self.data["skipped"].append({"what": what, "why": why})
        self.flush()

    def time_left(self) -> float:
        return self.deadline - time.time()

    def can_start(self, what: str, min_seconds: float) -> bool:
        """False (and the row recorded as skipped) when fewer than ``min_seconds`` of the part's time are left."""
        left = self.time_left()
        if left < min_seconds:
            self.skip(what, f"wall-time budget: {left:.0f} s left of this part's share, the row needs at least "
                            f"{min_seconds:.0f} s")
            return False
        return True

    def flush(self) -> None:
        write_json(self.data, self.path)


def device_info() -> dict[str, Any]:
    """The JAX device: platform, kind, memory limit and use (``memory_stats()`` where the backend has it)."""
    import jax

    dev = jax.devices()[0]
    stats = _memory_stats(dev)
    return {"platform": dev.platform, "device_kind": getattr(dev, "device_kind", str(dev)), "device": str(dev),
            "num_devices": jax.device_count(), "jax": jax.__version__, "jaxlib": _version("jaxlib"),
            "bytes_limit": stats.get("bytes_limit") if stats else None,
            "memory_stats_available": bool(stats)}


def _memory_stats(dev: Any = None) -> dict[str, Any] | None:
    import jax

    dev = dev or jax.devices()[0]
    try:
        return dev.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend reports statistics
        return None


def peak_memory() -> dict[str, Any]:
    """The device's memory high-water mark of this process (``peak_bytes_in_use``), else the process's peak RSS."""
    import bench_scale

    stats = _memory_stats()
    if stats and stats.get("peak_bytes_in_use") is not None:
        return {"peak_bytes": int(stats["peak_bytes_in_use"]), "source": "device.memory_stats()['peak_bytes_in_use']",
                "bytes_in_use": int(stats.get("bytes_in_use", 0))}
    return {"peak_bytes": bench_scale.peak_rss_bytes(), "source": "process peak RSS (the device reports no memory "
            "statistics)", "bytes_in_use": bench_scale.rss_bytes()}


# ---------------------------------------------------------------------------------------------------- matmul
def part_matmul(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """Square matmul rates: float32 at JAX's default precision (TF32 on NVIDIA GPUs since Ampere) and at "highest"
    (true float32), and bfloat16 with float32 accumulation."""
    import jax
    import jax.numpy as jnp

    out.info(device=device_info())
    plan = plan["matmul"]
    variants = {"float32": (jnp.float32, None), "float32_highest": (jnp.float32, jax.lax.Precision.HIGHEST),
                "bfloat16": (jnp.bfloat16, None)}
    for name, (dtype, precision) in variants.items():
        f = jax.jit(lambda a, b, p=precision: jnp.matmul(a, b, precision=p))
        best_rate = 0.0
        for n in plan["sizes"]:
            if not out.can_start(f"matmul {name} {n}", 1.0):
                break
            a = jax.random.normal(jax.random.PRNGKey(n), (n, n), jnp.float32).astype(dtype)
            f(a, a).block_until_ready()
            best = math.inf
            for _ in range(plan["repeats"]):
                t0 = time.perf_counter()
                f(a, a).block_until_ready()
                best = min(best, time.perf_counter() - t0)
            rate = 2.0 * n**3 / best
            best_rate = max(best_rate, rate)
            log(f"    matmul {name:<16} {n:5d}^2: {rate / 1e12:8.3f} TFLOP/s")
            out.row({"dtype": name, "n": n, "seconds": best, "flops_per_second": rate})
        out.info(**{f"peak_{name}": best_rate})


# ---------------------------------------------------------------------------------------------------- shared setup
def dataset_arrays(shape: str, fmnist_dir: str | None, plan: dict[str, Any]) -> dict[str, np.ndarray]:
    """The data of one model (NHWC float32 images, int labels): Fashion-MNIST's IDX files for the 28x28x1 shape when
    ``fmnist_dir`` is given, else random images of ``shape`` (the same in both processes)."""
    import bench_torch

    if fmnist_dir and shape == "fashion_mnist":
        d = bench_torch.load_fashion_mnist_idx(fmnist_dir)  # [N, 1, 28, 28]
        return {"train_x": np.moveaxis(d["train_x"], 1, -1), "train_y": d["train_y"].astype(np.int32),
                "test_x": np.moveaxis(d["test_x"], 1, -1)[:1000], "test_y": d["test_y"][:1000].astype(np.int32),
                "num_classes": np.int64(10)}
    return bench_torch.synthetic_images(shape, seed=SEED, train=plan.get("train_examples"), test=200)


def fedbuff_inputs_path(work: str, model: str, concurrency: int) -> str:
    return os.path.join(work, f"fedbuff_{model}_mc{concurrency}.npz")


def fedbuff_steps(spec: dict[str, Any]) -> int:
    """Server steps of one FedBuff configuration's schedule: enough for the engine's chunks and the PyTorch loop."""
    chunk, chunks = spec["engine"]
    steps = max(chunk * chunks, spec["torch"][1])
    return -(-steps // chunk) * chunk


def fedbuff_schedule(plan: dict[str, Any], concurrency: int, steps: int) -> Any:
    from asyncfl_jax.timing import DelayModel, make_schedule

    return make_schedule("concurrent", plan["num_clients"], steps, DelayModel(), seed=SEED, concurrency=concurrency,
                         buffer_size=plan["buffer_size"], refill=plan["refill"])


def prepare_fedbuff_inputs(plan: dict[str, Any], work: str, fmnist_dir: str | None) -> dict[str, Any]:
    """Writes, per (model, concurrency), the partition and schedule both sides run (``bench_yardstick`` format).
    Host arrays only: the parent process never touches an accelerator."""
    import bench_yardstick
    import jax

    jax.config.update("jax_platforms", "cpu")  # this process leaves the accelerator to the parts' processes
    from asyncfl_jax.data import partition

    fb = plan["fedbuff"]
    labels_of: dict[str, np.ndarray] = {}
    for model, spec in fb["models"].items():
        shape = spec["data"]
        if shape not in labels_of:
            labels_of[shape] = dataset_arrays(shape, fmnist_dir, fb)["train_y"]
        parts = partition("iid", labels_of[shape], fb["num_clients"], SEED)
        for mc in fb["concurrency"]:
            schedule = fedbuff_schedule(fb, mc, fedbuff_steps(spec))
            bench_yardstick.write_inputs(fedbuff_inputs_path(work, model, mc), parts, schedule)
    return {"prepared": True}


def resnet_options(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) for k, v in spec.get("resnet", {}).items()}


def jax_model(name: str, input_shape: tuple[int, ...], num_classes: int, spec: dict[str, Any] | None = None,
              hidden: tuple[int, ...] | None = None) -> Any:
    """The engine's model: ``make_model(name)``, or the quick size's smaller ResNet (the same module)."""
    from asyncfl_jax.models import ResNet18GN, make_model, model_from_flax

    if spec and spec.get("resnet"):
        import jax.numpy as jnp

        module = ResNet18GN(num_classes=num_classes, **resnet_options(spec))
        return model_from_flax(module, jnp.zeros((1, *input_shape), jnp.float32), seed=SEED, name=name)
    return make_model(name, input_shape, num_classes, seed=SEED, **({"hidden": hidden} if hidden else {}))


def load_inputs(path: str) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    offsets, indices = arrays["client_offsets"], arrays["client_indices"]
    parts = [indices[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    return parts, arrays


# ---------------------------------------------------------------------------------------------------- torch
def part_torch(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """The plain PyTorch per-event loop (``bench_torch.run_fedbuff``) of every FedBuff configuration, on ``cuda``
    when there is one. This process never imports JAX."""
    import bench_torch
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # the quick size on a CPU checks the code paths; one thread is robust to a busy machine
        torch.set_num_threads(1)
    else:
        torch.backends.cudnn.benchmark = True  # as a tuned PyTorch script would (XLA autotunes its convolutions)
    # JAX's default float32 matmul precision on NVIDIA GPUs (Ampere and later) is TF32; PyTorch's is "highest" for
    # matmuls and TF32 for convolutions. The loop mirrors JAX's default; the matmul part measures both precisions.
    torch.set_float32_matmul_precision("high")
    out.info(torch=torch.__version__, device=device,
             device_name=torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
             float32_matmul_precision=torch.get_float32_matmul_precision(),
             cudnn_benchmark=bool(torch.backends.cudnn.benchmark), threads=torch.get_num_threads())
    fb = plan["fedbuff"]
    for model_name, spec in fb["models"].items():
        data = None
        for mc in fb["concurrency"]:
            what = f"torch {model_name} Mc={mc}"
            if not out.can_start(what, spec["min_seconds"]):
                continue
            if data is None:
                arrays = dataset_arrays(spec["data"], ctx.get("fmnist_dir"), fb)
                train_x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(arrays["train_x"], -1, 1))).to(device)
                train_y = torch.from_numpy(arrays["train_y"].astype(np.int64)).to(device)
                data = (train_x, train_y, int(arrays["num_classes"]), tuple(arrays["train_x"].shape[1:]))
            train_x, train_y, classes, shape = data
            _, inputs = load_inputs(fedbuff_inputs_path(ctx["work"], model_name, mc))
            clients = bench_torch.client_tensors(train_x, train_y, inputs["client_offsets"], inputs["client_indices"])
            schedule = {k: inputs[k] for k in bench_torch.SCHEDULE_FIELDS}
            warmup, steps = spec["torch"]
            if mc == fb["concurrency"][0]:  # PyTorch's first calls (lazy initialization, cuDNN's autotuning) untimed
                bench_torch.run_fedbuff(model_name, clients, schedule, min(steps, warmup + 1), warmup,
                                        fb["local_steps"], fb["batch_size"], fb["client_lr"], fb["server_lr"],
                                        seed=SEED, device=device, initial_jobs=False, num_classes=classes,
                                        input_shape=shape, **resnet_options(spec))
            t_wall = time.perf_counter()  # the run: model built, every step (its warm-up ones included)
            model, res = bench_torch.run_fedbuff(
                model_name, clients, schedule, steps, warmup, fb["local_steps"], fb["batch_size"], fb["client_lr"],
                fb["server_lr"], seed=SEED, device=device, initial_jobs=False, num_classes=classes,
                input_shape=shape, **resnet_options(spec))
            res.pop("best_segment_updates_per_second", None)
            res.update(model=model_name, concurrency=mc, num_params=sum(p.numel() for p in model.parameters()),
                       wall_seconds=time.perf_counter() - t_wall)
            res["arrivals_per_second"] = res.pop("updates_per_second")
            res["arrivals_per_second_with_setup"] = res["total_arrivals"] / res["wall_seconds"]
            log(f"    {what}: {res['arrivals_per_second']:9.1f} arrivals/s ({res['timed_steps']} timed steps), "
                f"{res['arrivals_per_second_with_setup']:9.1f} arrivals/s with setup")
            out.row(res)
            del model, clients
        del data
        if device == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- fedbuff engine
def _dataset(arrays: dict[str, np.ndarray], name: str) -> Any:
    from asyncfl_jax.data.client_data import Dataset

    return Dataset(name=name, train_x=arrays["train_x"], train_y=arrays["train_y"], test_x=arrays["test_x"],
                   test_y=arrays["test_y"], num_classes=int(arrays["num_classes"]))


def _same_schedule(schedule: Any, inputs: dict[str, np.ndarray]) -> bool:
    import bench_torch

    return all(np.array_equal(np.asarray(getattr(schedule, k)), inputs[k]) for k in bench_torch.SCHEDULE_FIELDS)


def engine_fedbuff_row(task: Any, model_name: str, mc: int, spec: dict[str, Any], fb: dict[str, Any],
                       inputs: dict[str, np.ndarray], compute: str = "float32",
                       flops: float | None = None) -> dict[str, Any]:
    """The engine's FedBuff run of one configuration (``bench_scale.bench_engine`` from a zero state): steady-state
    arrivals/s of the timed chunks, and of the whole call (tracing, compilation, every chunk). ``flops``: XLA's
    FLOPs of one job (computed here when not given; one more compilation)."""
    from bench_scale import bench_engine

    from asyncfl_jax.algorithms import fedbuff
    from asyncfl_jax.client import LocalConfig, local_flops_per_job
    from asyncfl_jax.engine import make_replicas

    chunk, chunks = spec["engine"]
    schedule = fedbuff_schedule(fb, mc, fedbuff_steps(spec))
    if not _same_schedule(schedule, inputs):
        raise RuntimeError(f"the schedule of {model_name} Mc={mc} differs from the one PyTorch ran")
    steps = schedule.num_steps  # a whole number of chunks (fedbuff_steps)
    local = LocalConfig(steps=fb["local_steps"], batch_size=fb["batch_size"])
    algorithm = fedbuff()
    replicas = make_replicas(algorithm, [SEED], {"client_lr": fb["client_lr"], "server_lr": fb["server_lr"]})
    flops = local_flops_per_job(task.model, task.train, local) if flops is None else flops
    t0 = time.perf_counter()
    eng = bench_engine(task, algorithm, local, schedule, chunk, replicas, shard=None, zero_init=True,
                       full_eval=False)
    wall = time.perf_counter() - t0
    eng.pop("_params_after_first_chunk", None)
    all_arrivals = int((schedule.arrival_clients >= 0).sum())
    row = {"model": model_name, "concurrency": mc, "compute": compute, "num_params": task.model.num_params,
           "flops_per_job": flops, "num_clients": task.num_clients, "server_steps": steps, "chunk": chunk,
           "timed_steps": eng["timed_steps"], "timed_arrivals": eng["timed_arrivals"],
           "arrivals_per_second": eng["updates_per_second"],
           "best_chunk_arrivals_per_second": eng["best_chunk_updates_per_second"],
           "seconds_per_step": eng["seconds_per_step"], "compile_seconds": eng["compile_seconds"],
           "wall_seconds": wall, "arrivals_per_second_with_compile": all_arrivals / wall,
           "flops_per_second": eng["timed_computed_jobs"] * flops / eng["run_seconds"],
           "computed_jobs_per_step": schedule.dispatch_width, "num_slots": schedule.num_slots,
           "memory_budget": eng["memory_budget"], "same_schedule_as_torch": True}
    return row


def part_fedbuff(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """The engine side of every FedBuff configuration of the torch part (same partition and schedule)."""
    import jax

    from asyncfl_jax.task import make_task

    out.info(device=device_info())
    fb = plan["fedbuff"]
    for model_name, spec in fb["models"].items():
        task, flops = None, None
        for mc in fb["concurrency"]:
            what = f"engine {model_name} Mc={mc}"
            if not out.can_start(what, spec["min_seconds"]):
                continue
            parts, inputs = load_inputs(fedbuff_inputs_path(ctx["work"], model_name, mc))
            if task is None:
                ds = _dataset(dataset_arrays(spec["data"], ctx.get("fmnist_dir"), fb), spec["data"])
                model = jax_model(model_name, ds.input_shape, ds.num_classes, spec)
                task = make_task(ds, parts, model, seed=SEED, train_eval_size=16)
            row = engine_fedbuff_row(task, model_name, mc, spec, fb, inputs, flops=flops)
            flops = row["flops_per_job"]  # the same model and local steps at every concurrency
            row.update(peak_memory())
            log(f"    {what}: {row['arrivals_per_second']:9.1f} arrivals/s (best chunk "
                f"{row['best_chunk_arrivals_per_second']:.1f}), {row['arrivals_per_second_with_compile']:9.1f} "
                f"with compilation ({row['compile_seconds']:.1f} s), {row['flops_per_second'] / 1e12:.3f} TFLOP/s")
            out.row(row)
            jax.clear_caches()
        del task


# ---------------------------------------------------------------------------------------------------- memory
def fixed_size_task(ds: Any, num_clients: int, per_client: int, model_name: str) -> Any:
    """Every client holds ``per_client`` random examples of ``ds`` (drawn with overlap: any n works)."""
    from asyncfl_jax.task import make_task

    rng = np.random.default_rng([SEED, num_clients])
    idx = np.sort(rng.integers(0, len(ds.train_y), (num_clients, per_client)), axis=1)
    model = jax_model(model_name, ds.input_shape, ds.num_classes)
    return make_task(ds, list(idx), model, seed=SEED, train_eval_size=16)


def _fitting_cache(task: Any, name: str, n: int, steps: int, chunk: int) -> tuple[str | None, list[dict[str, Any]]]:
    """The first per-client cache (float32, bfloat16, int8) whose memory budget passes the project's check against
    this device's memory, and the refusals before it."""
    import bench_scale

    from asyncfl_jax.engine import make_replicas, prepare_run
    from asyncfl_jax.engine.budget import MemoryRefusal

    refusals = []
    for cache in ("float32", "bfloat16", "int8"):
        setup = bench_scale._ace_setup if name == "ace" else bench_scale._ca2fl_setup
        algorithm, local, schedule, hparams = setup(n, steps, cache=cache)
        run = prepare_run(task, algorithm, schedule, local, eval_every=chunk,
                          replicas=make_replicas(algorithm, [SEED], hparams))
        budget = run.budget()
        try:
            budget.check()
            return cache, refusals
        except MemoryRefusal as e:
            refusals.append({"cache": cache, "budget_bytes": budget.total, "refusal": str(e)})
    return None, refusals


def part_memory(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """CA2FL and ACE at large n: time per server step, the device's memory high-water mark, the budget beside it."""
    import bench_scale
    import jax

    from asyncfl_jax.engine import make_replicas
    from asyncfl_jax.engine.budget import compiled_bytes

    out.info(device=device_info())
    analysed = _record_compiled_bytes(compiled_bytes)
    mp = plan["memory"]
    ds = _dataset(bench_torch_images("fashion_mnist", plan), "fashion_mnist")
    rows = [(name, model, n) for model in mp["models"] for name in mp["algorithms"] for n in mp["ns"]]
    rows.sort(key=lambda r: (r[2], r[1] != "logreg"))  # smaller states first: the high-water mark grows row by row
    previous_peak = 0
    for name, model_name, n in rows:
        what = f"{name} {model_name} n={n}"
        if not out.can_start(what, mp["min_seconds"]):
            continue
        chunk, chunks = mp["steps"][name]
        task = fixed_size_task(ds, n, mp["per_client"], model_name)
        cache, refusals = _fitting_cache(task, name, n, chunk * chunks, chunk)
        if cache is None:
            out.skip(what, "the memory budget refuses every cache (float32, bfloat16, int8) on this device: "
                     + refusals[-1]["refusal"])
            continue
        setup = bench_scale._ace_setup if name == "ace" else bench_scale._ca2fl_setup
        algorithm, local, schedule, hparams = setup(n, chunk * chunks, cache=cache)
        replicas = make_replicas(algorithm, [SEED], hparams)
        bench_scale.reset_peak_rss()
        analysed.clear()
        eng = bench_scale.bench_engine(task, algorithm, local, schedule, chunk, replicas, shard=None,
                                       zero_init=True, full_eval=False)
        eng.pop("_params_after_first_chunk", None)
        mem = peak_memory()
        budget = eng["memory_budget"]
        state = budget["server_bytes"] + budget["clients_bytes"] + budget["pending_bytes"]
        row = {"algorithm": name, "model": model_name, "num_clients": n, "num_params": task.model.num_params,
               "cache": cache, "refusals": refusals, "seconds_per_step": min(eng["chunk_seconds"]) / chunk,
               "mean_seconds_per_step": eng["seconds_per_step"], "compile_seconds": eng["compile_seconds"],
               "budget_state_bytes": state, "budget_total_bytes": state + budget["data_bytes"],
               "device_bytes_limit": budget["available_bytes"], **mem,
               "peak_is_this_row": mem["peak_bytes"] > previous_peak,
               "peak_over_budget": mem["peak_bytes"] / (state + budget["data_bytes"])}
        row["compiled_chunk_bytes"] = analysed[-1] if analysed else None
        previous_peak = max(previous_peak, mem["peak_bytes"])
        log(f"    {what} ({cache} cache): {row['seconds_per_step'] * 1e3:8.3f} ms/step; peak "
            f"{mem['peak_bytes'] / 2**30:.2f} GiB vs budget {row['budget_total_bytes'] / 2**30:.2f} GiB")
        out.row(row)
        del task, eng
        jax.clear_caches()


def _record_compiled_bytes(compiled_bytes: Callable[[Any], int | None]) -> list[int | None]:
    """The bytes of XLA's memory analysis of every chunk the host loop compiles from now on (the loop's own check,
    :func:`asyncfl_jax.engine.budget.check_compiled`, wrapped to also record what it measured)."""
    from asyncfl_jax.engine import loop as loop_module

    seen: list[int | None] = []
    check = loop_module.check_compiled

    def recording(compiled: Any, label: str, *args: Any, **kwargs: Any) -> int | None:
        seen.append(compiled_bytes(compiled))
        return check(compiled, label, *args, **kwargs)

    loop_module.check_compiled = recording
    return seen


def bench_torch_images(shape: str, plan: dict[str, Any]) -> dict[str, np.ndarray]:
    import bench_torch

    return bench_torch.synthetic_images(shape, seed=SEED, train=plan["fedbuff"].get("train_examples"), test=200)


# ---------------------------------------------------------------------------------------------------- replicas
def part_replicas(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """R replicas (client learning rates x seeds) of the FedBuff MLP in one program against one replica."""
    import bench_scale
    import jax

    from asyncfl_jax.algorithms import fedbuff
    from asyncfl_jax.client import LocalConfig
    from asyncfl_jax.data import partition
    from asyncfl_jax.task import make_task

    out.info(device=device_info())
    rp, fb = plan["replicas"], plan["fedbuff"]
    spec = fb["models"][rp["model"]]
    ds = _dataset(dataset_arrays(spec["data"], ctx.get("fmnist_dir"), fb), spec["data"])
    task = make_task(ds, partition("iid", ds.train_y, fb["num_clients"], SEED),
                     jax_model(rp["model"], ds.input_shape, ds.num_classes, hidden=rp.get("hidden")), seed=SEED,
                     train_eval_size=16)
    chunk, chunks = rp["engine"]
    schedule = fedbuff_schedule(fb, fb["concurrency"][0], chunk * chunks)
    local = LocalConfig(steps=fb["local_steps"], batch_size=fb["batch_size"])
    algorithm = fedbuff()
    one = None
    for count in rp["counts"]:
        what = f"replicas R={count}"
        if not out.can_start(what, rp["min_seconds"]):
            continue
        replicas = bench_scale.replica_list(algorithm, count, {"server_lr": fb["server_lr"]})
        eng = bench_scale.bench_engine(task, algorithm, local, schedule, chunk, replicas, shard=None,
                                       zero_init=True, full_eval=False)
        best = min(eng["chunk_seconds"]) / chunk
        if count == 1:
            one = best
        row = {"replicas": count, "seconds_per_step": best, "compile_seconds": eng["compile_seconds"],
               "arrivals_per_second": eng["updates_per_second"], "num_params": task.model.num_params,
               "concurrency": fb["concurrency"][0], "throughput_vs_one": None if one is None else count * one / best}
        log(f"    {what}: {best * 1e3:8.3f} ms/step"
            + ("" if one is None else f" -> {row['throughput_vs_one']:.2f}x the arrivals/s of one replica"))
        out.row(row)
        jax.clear_caches()


# ---------------------------------------------------------------------------------------------------- mixed precision
def part_mixed_precision(plan: dict[str, Any], ctx: dict[str, Any], out: PartWriter) -> None:
    """The engine with bfloat16 local-training compute against float32, same configuration and process."""
    import jax

    from asyncfl_jax.precision import mixed_precision
    from asyncfl_jax.task import make_task

    out.info(device=device_info())
    mx, fb = plan["mixed_precision"], plan["fedbuff"]
    mc = mx["concurrency"]
    for model_name in mx["models"]:
        spec = fb["models"][model_name]
        if not out.can_start(f"mixed precision {model_name}", 2 * spec["min_seconds"]):
            continue
        parts, inputs = load_inputs(fedbuff_inputs_path(ctx["work"], model_name, mc))
        ds = _dataset(dataset_arrays(spec["data"], ctx.get("fmnist_dir"), fb), spec["data"])
        task = make_task(ds, parts, jax_model(model_name, ds.input_shape, ds.num_classes, spec), seed=SEED,
                         train_eval_size=16)
        rows, flops = {}, None
        for compute in ("float32", "bfloat16"):
            t = dataclasses.replace(task, model=mixed_precision(task.model, compute))
            rows[compute] = engine_fedbuff_row(t, model_name, mc, spec, fb, inputs, compute=compute, flops=flops)
            flops = rows[compute]["flops_per_job"]  # XLA's count of the float32 job (the same operations)
            jax.clear_caches()
        row = {"model": model_name, "concurrency": mc, "float32": rows["float32"], "bfloat16": rows["bfloat16"],
               "bfloat16_over_float32": rows["bfloat16"]["arrivals_per_second"]
               / rows["float32"]["arrivals_per_second"]}
        log(f"    mixed precision {model_name}: bfloat16 compute {row['bfloat16_over_float32']:.2f}x the float32 "
            "arrivals/s")
        out.row(row)


CHILD_PARTS: dict[str, Callable[[dict[str, Any], dict[str, Any], PartWriter], None]] = {
    "matmul": part_matmul, "torch": part_torch, "fedbuff": part_fedbuff, "memory": part_memory,
    "replicas": part_replicas, "mixed_precision": part_mixed_precision}


def child_main(args: argparse.Namespace) -> int:
    plan = PLANS[args.size]
    out = PartWriter(args.part_out, args.deadline)
    ctx = {"work": args.work, "fmnist_dir": args.fmnist_dir}
    try:
        CHILD_PARTS[args.child](plan, ctx, out)
    except Exception as e:  # noqa: BLE001 - recorded for the parent, which goes on with the next part
        out.data["error"] = f"{type(e).__name__}: {e}"
        out.data["traceback"] = traceback.format_exc()[-4000:]
        out.flush()
        traceback.print_exc()
        return 1
    return 0


# ==================================================================================================== parent side
def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def derive(res: dict[str, Any]) -> dict[str, Any]:
    """The ratios of the run, from whatever parts have finished (recomputed after each part)."""
    parts = res["parts"]
    ratios: dict[str, Any] = {}
    mm = parts.get("matmul", {}).get("info", {})
    peaks = {k: mm.get(f"peak_{k}") for k in ("float32", "float32_highest", "bfloat16")}
    if _finite(peaks["float32"]) and _finite(peaks["bfloat16"]) and peaks["float32"] > 0:
        ratios["matmul_bfloat16_over_float32"] = peaks["bfloat16"] / peaks["float32"]
    torch_rows = {(r["model"], r["concurrency"]): r for r in parts.get("torch", {}).get("rows", [])}
    fedbuff = []
    for r in parts.get("fedbuff", {}).get("rows", []):
        row = {"model": r["model"], "concurrency": r["concurrency"],
               "engine_arrivals_per_second": r["arrivals_per_second"],
               "engine_arrivals_per_second_with_compile": r["arrivals_per_second_with_compile"],
               "engine_flops_per_second": r["flops_per_second"]}
        for k, peak in peaks.items():
            if _finite(peak) and peak > 0:
                row[f"engine_flops_over_matmul_{k}"] = r["flops_per_second"] / peak
        t = torch_rows.get((r["model"], r["concurrency"]))
        if t is not None:
            row.update(torch_arrivals_per_second=t["arrivals_per_second"],
                       torch_arrivals_per_second_with_setup=t["arrivals_per_second_with_setup"],
                       engine_over_torch=r["arrivals_per_second"] / t["arrivals_per_second"],
                       engine_over_torch_with_compile=(r["arrivals_per_second_with_compile"]
                                                       / t["arrivals_per_second_with_setup"]))
            torch_flops = t["timed_jobs"] * r["flops_per_job"] / t["run_seconds"]
            row["torch_flops_per_second"] = torch_flops
            if _finite(peaks["float32"]) and peaks["float32"] > 0:
                row["torch_flops_over_matmul_float32"] = torch_flops / peaks["float32"]
        fedbuff.append(row)
    ratios["fedbuff"] = fedbuff
    ratios["memory"] = [{k: r[k] for k in ("algorithm", "model", "num_clients", "cache", "seconds_per_step",
                                           "peak_bytes", "budget_total_bytes", "peak_over_budget",
                                           "peak_is_this_row")}
                        for r in parts.get("memory", {}).get("rows", [])]
    ratios["replicas"] = [{"replicas": r["replicas"], "seconds_per_step": r["seconds_per_step"],
                           "throughput_vs_one": r["throughput_vs_one"]}
                          for r in parts.get("replicas", {}).get("rows", []) if r["throughput_vs_one"] is not None]
    ratios["mixed_precision"] = [{"model": r["model"], "bfloat16_over_float32": r["bfloat16_over_float32"]}
                                 for r in parts.get("mixed_precision", {}).get("rows", [])]
    return ratios


def _fmt(x: Any, unit: str = "", digits: int = 3) -> str:
    if not _finite(x):
        return "-" if x is None else str(x)
    if unit == "GiB":
        return f"{x / 2**30:.2f} GiB"
    if abs(x) >= 1000:
        return f"{x:,.0f}{unit}"
    return f"{x:.{digits}g}{unit}"


def markdown(res: dict[str, Any]) -> str:
    """One table of every measurement (a row each), with the run's device, versions, commit and date above it."""
    env, ratios = res["env"], res["ratios"]
    dev = env.get("device") or {}
    lines = [f"# bench_accelerator ({res['size']})", "",
             f"device: {dev.get('device_kind', '?')} ({dev.get('platform', '?')}); jax {dev.get('jax', '?')}, "
             f"torch {env.get('torch') or 'not installed'}; commit "
             f"{str(env.get('git', {}).get('commit') or env.get('git', {}).get('given'))[:12]}"
             f"{' (modified)' if env.get('git', {}).get('dirty') else ''}; {env['date']}", "",
             "| part | measurement | value | ratio |", "| --- | --- | --- | --- |"]

    def add(part: str, what: str, value: str, ratio: Any) -> None:
        lines.append(f"| {part} | {what} | {value} | {_fmt(ratio, 'x') if _finite(ratio) else ratio} |")

    mm = res["parts"].get("matmul", {}).get("info", {})
    for k in ("float32", "float32_highest", "bfloat16"):
        if _finite(mm.get(f"peak_{k}")):
            add("matmul", f"{k} peak", f"{mm[f'peak_{k}'] / 1e12:.3f} TFLOP/s",
                ratios.get("matmul_bfloat16_over_float32") if k == "bfloat16" else "-")
    for r in ratios.get("fedbuff", []):
        cfg = f"FedBuff {r['model']} Mc={r['concurrency']}"
        torch_v = r.get("torch_arrivals_per_second")
        add("fedbuff", f"{cfg}: engine / PyTorch arrivals/s (simulation)",
            f"{_fmt(r['engine_arrivals_per_second'])} / {_fmt(torch_v)}", r.get("engine_over_torch", "no PyTorch"))
        add("fedbuff", f"{cfg}: engine / PyTorch arrivals/s (with compilation / setup)",
            f"{_fmt(r['engine_arrivals_per_second_with_compile'])} / "
            f"{_fmt(r.get('torch_arrivals_per_second_with_setup'))}",
            r.get("engine_over_torch_with_compile", "no PyTorch"))
        add("fedbuff", f"{cfg}: engine FLOP/s / matmul f32, bf16",
            f"{r['engine_flops_per_second'] / 1e12:.3f} TFLOP/s",
            f"{_fmt(r.get('engine_flops_over_matmul_float32'))}x, "
            f"{_fmt(r.get('engine_flops_over_matmul_bfloat16'))}x")
    for r in ratios.get("memory", []):
        add("memory", f"{r['algorithm']} {r['model']} n={r['num_clients']:,} ({r['cache']} cache): time/step, peak "
            f"/ budget", f"{r['seconds_per_step'] * 1e3:.3f} ms; {_fmt(r['peak_bytes'], 'GiB')} / "
            f"{_fmt(r['budget_total_bytes'], 'GiB')}", r["peak_over_budget"])
    for r in ratios.get("replicas", []):
        add("replicas", f"R={r['replicas']}: total arrivals/s / one replica's",
            f"{r['seconds_per_step'] * 1e3:.3f} ms/step", r["throughput_vs_one"])
    for r in ratios.get("mixed_precision", []):
        add("mixed_precision", f"{r['model']}: bf16 compute / f32 arrivals/s", "", r["bfloat16_over_float32"])
    for name, part in res["parts"].items():
        if _finite(part.get("seconds")):
            add(name, "part wall time (its process: start, imports, compilations, runs)",
                f"{part['seconds']:.0f} s of at most {part['timeout_seconds']:.0f} s", "-")
        if part.get("status") != "ok":
            add(name, f"status {part.get('status')}", part.get("reason", "")[:200].replace("|", "/").replace(
                "\n", " "), "-")
        for s in part.get("skipped", []):
            add(name, f"skipped: {s['what']}", s["why"][:200].replace("|", "/"), "-")
    lines += ["", f"total wall time {res.get('total_seconds', 0):.0f} s of a {res['budget_seconds']:.0f} s budget"]
    return "\n".join(lines) + "\n"


def write_outputs(res: dict[str, Any], out_dir: str) -> None:
    res["ratios"] = derive(res)
    write_json(res, os.path.join(out_dir, JSON_NAME))
    md = os.path.join(out_dir, MD_NAME)
    fd, tmp = tempfile.mkstemp(prefix=f".{MD_NAME}.", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(markdown(res))
    os.replace(tmp, md)


def child_env() -> dict[str, str]:
    """The parts' environment: the checkout first on PYTHONPATH; JAX allocates the GPU's memory as it needs it (not
    75% at start), so the memory high-water marks are those of the runs, up to 90% of the device."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
    return env


def run_part(name: str, args: argparse.Namespace, work: str, timeout: float) -> dict[str, Any]:
    """One part in its own process; its rows (kept even when it fails or runs out of time) and its status."""
    path = os.path.join(work, f"part_{name}.json")
    deadline = time.time() + max(timeout - 2.0, 1.0)  # the child stops starting rows 2 s before it is killed
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--size", args.size, "--work", work,
           "--deadline", repr(deadline), "--part-out", path]
    if args.fmnist_dir:
        cmd += ["--fmnist-dir", args.fmnist_dir]
    t0 = time.perf_counter()
    status, reason = "ok", ""
    try:
        proc = subprocess.run(cmd, env=child_env(), timeout=timeout, stdout=None, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            status, reason = "failed", f"exit code {proc.returncode}: " + proc.stderr[-1500:].strip()
    except subprocess.TimeoutExpired:
        status, reason = "timeout", f"killed after its share of the budget ({timeout:.0f} s); rows before kept"
    part: dict[str, Any] = {"rows": [], "skipped": [], "info": {}}
    if os.path.exists(path):
        with open(path) as f:
            part = json.load(f)
    if part.get("error"):
        status, reason = "failed", part["error"]
    part.update(status=status, reason=reason, seconds=time.perf_counter() - t0, timeout_seconds=timeout)
    return part


def parent_main(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    plan = PLANS[args.size]
    budget = args.budget if args.budget is not None else plan["budget"]
    os.makedirs(args.out, exist_ok=True)
    parts = [p for p in PARTS if p in args.parts]
    has_torch = torch_available()
    res: dict[str, Any] = {
        "size": args.size, "budget_seconds": budget, "parts_requested": parts,
        "env": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "git": {**git_commit(), "given": args.commit}, "source_sha256": source_digest(),
                "python": platform.python_version(), "machine": platform.machine(),
                "cpu_count": os.cpu_count(), "jax": _version("jax"), "jaxlib": _version("jaxlib"),
                "torch": _version("torch") if has_torch else None, "flax": _version("flax"),
                "fmnist_dir": args.fmnist_dir, "device": None},
        "plan": plan, "parts": {}}
    log(f"bench_accelerator ({args.size}): parts {', '.join(parts)}, budget {budget:.0f} s; commit "
        f"{str(res['env']['git']['commit'] or args.commit)[:12]}, sources {res['env']['source_sha256'][:12]}; "
        f"jax {res['env']['jax']}, torch {res['env']['torch'] or 'absent'}")
    write_outputs(res, args.out)
    work = tempfile.mkdtemp(prefix="bench_accelerator_")
    try:
        return _run_parts(args, res, plan, parts, budget, has_torch, work, t_start)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_parts(args: argparse.Namespace, res: dict[str, Any], plan: dict[str, Any], parts: list[str], budget: float,
               has_torch: bool, work: str, t_start: float) -> int:
    needs_inputs = ("torch", "fedbuff", "mixed_precision")
    prepare_error = None
    if any(p in parts for p in needs_inputs):
        t0 = time.perf_counter()
        try:
            prepare_fedbuff_inputs(plan, work, args.fmnist_dir)
            log(f"  partitions and schedules of the FedBuff configurations written ({time.perf_counter() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001 - recorded; the parts that do not need them still run
            prepare_error = f"the FedBuff partitions and schedules could not be written: {type(e).__name__}: {e}"
            log(f"  !! {prepare_error}")
    for i, name in enumerate(parts):
        left = budget - (time.perf_counter() - t_start) - RESERVE_SECONDS
        if prepare_error and name in needs_inputs:
            res["parts"][name] = {"status": "failed", "reason": prepare_error, "rows": [], "skipped": [], "info": {}}
            write_outputs(res, args.out)
            continue
        if name == "torch" and not has_torch:
            msg = "PyTorch is not installed (pip install torch): the PyTorch yardstick is skipped"
            log(f"[{name}] {msg}")
            res["parts"][name] = {"status": "skipped", "reason": msg, "rows": [], "skipped": [], "info": {}}
            write_outputs(res, args.out)
            continue
        if left < 3.0:
            res["parts"][name] = {"status": "skipped", "reason": f"wall-time budget spent ({budget:.0f} s)",
                                  "rows": [], "skipped": [], "info": {}}
            log(f"[{name}] skipped: wall-time budget spent")
            write_outputs(res, args.out)
            continue
        todo = [p for p in parts[i:] if p != "torch" or has_torch]
        share = left * WEIGHTS[name] / sum(WEIGHTS[p] for p in todo)
        log(f"[{name}] (at most {share:.0f} s of {left:.0f} s left)")
        part = run_part(name, args, work, share)
        res["parts"][name] = part
        if isinstance(part["info"].get("device"), dict) and res["env"]["device"] is None:
            res["env"]["device"] = part["info"]["device"]
        log(f"[{name}] {part['status']} in {part['seconds']:.0f} s" + (f": {part['reason'][:300]}" if part["reason"]
                                                                          else ""))
        res["total_seconds"] = time.perf_counter() - t_start
        write_outputs(res, args.out)
    res["total_seconds"] = time.perf_counter() - t_start
    write_outputs(res, args.out)
    log(markdown(res))
    log(f"wrote {os.path.join(args.out, JSON_NAME)} and {os.path.join(args.out, MD_NAME)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for bench_accelerator.json and bench_accelerator.md (created)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: the same code paths on a CPU in 1-2 minutes (about 90 CPU-seconds)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--budget", type=float, default=None,
                   help="wall-time budget in seconds (default 450 at full size, 150 with --quick)")
    p.add_argument("--fmnist-dir", default=None, help="a folder of the Fashion-MNIST IDX files (the MLP's data)")
    p.add_argument("--commit", default=None,
                   help="the commit measured, recorded beside git's answer (for a copied checkout without .git; the "
                        "sources' SHA-256 is recorded either way)")
    # The parts' own processes (internal).
    p.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument("--size", choices=tuple(PLANS), default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--part-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)
    if not args.out:
        p.error("--out DIR is required")
    if args.size is not None:
        p.error("--size is internal; use --quick for the small size")
    args.size = "quick" if args.quick else "full"
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; choose from {','.join(PARTS)}")
    if args.budget is not None and not args.budget > 0:
        p.error(f"--budget must be > 0 seconds, got {args.budget}")
    if args.fmnist_dir:
        from asyncfl_jax.data.idx import find_idx_dir  # noqa: PLC0415 - a clear error before anything runs

        args.fmnist_dir = find_idx_dir("fashion_mnist", args.fmnist_dir)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
