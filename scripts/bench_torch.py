#!/usr/bin/env python
"""The plain-PyTorch yardstick: FedBuff as the per-event loop a researcher would write in PyTorch.

This file never imports JAX: it is run in its own process by ``scripts/bench.py`` (part ``torch``), so the two
frameworks' thread pools never share a process and the end-to-end wall time of a PyTorch run (interpreter start,
``import torch``, data, training) is measured as a user would see it.

The task is the benchmark's FedBuff setting (``scripts/bench.py``): Fashion-MNIST, n = 100 clients, concurrency
Mc = 20, buffer M = 10, refill at step boundaries, K = 10 local SGD steps of B = 32, client lr 0.05, server lr 1. The
client partition and the arrival schedule are given by the caller in an ``.npz`` (the same arrays the engine runs on),
so both loops train the same clients in the same order:

* initial jobs ``init_clients`` start from ``x_0``;
* at server step ``t``, the jobs in ``dispatch_clients[t]`` start from the current model ``x_t`` (each message is kept
  under its pending slot), then the messages of ``arrival_clients[t]`` are applied:
  ``x_{t+1} = x_t + eta_g * (1/|A_t|) sum_{i in A_t} Delta_i`` (FedBuff, constant staleness weights);
* a job copies the global model into a client model and runs K steps of ``torch.optim.SGD`` on minibatches taken in
  the order of one shuffle of the client's examples per job (``k*B .. k*B+B-1``, wrapping around), as the engine does;
  its message is ``Delta = y_K - x``.

The models are the engine's built-in ones written with ``torch.nn``: logistic regression (784 -> 10), the MLP
784-200-200-10 (ReLU) and the CNN (conv5x5(32)-ReLU-maxpool2, conv5x5(64)-ReLU-maxpool2, FC 512-ReLU, FC 10; SAME
padding). Initial weights are PyTorch's own (the engine's are Flax's): the work per event is the same, not the bits.

Usage (what ``bench.py`` runs)::

    python scripts/bench_torch.py --inputs inputs.npz --model mlp --threads 1 --steps 60 --warmup 5 --json out.json
    python scripts/bench_torch.py --inputs inputs.npz --model logreg --threads 2 --idx-dir DIR --json out.json
        # end to end: reads the IDX files itself, trains every step of the schedule, evaluates once at the end

``--inputs`` holds ``client_offsets``/``client_indices`` (the partition, concatenated), the schedule arrays, and with
``--idx-dir`` unset, ``train_x``/``train_y``/``test_x``/``test_y``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

SCHEDULE_FIELDS = ("init_clients", "init_slots", "dispatch_clients", "dispatch_slots", "arrival_clients",
                   "arrival_slots")


# ------------------------------------------------------------------------------------------------------------ models
TORCH_MODELS = ("logreg", "mlp", "cnn", "ca2fl_cnn", "resnet18_gn")

# Synthetic data of the papers' shapes: name -> (image shape HWC, classes, train examples, test examples).
PAPER_SHAPES = {
    "fashion_mnist": ((28, 28, 1), 10, 60000, 10000),
    "femnist": ((28, 28, 1), 62, 60000, 10000),
    "cifar10": ((32, 32, 3), 10, 50000, 10000),
    "cifar100": ((32, 32, 3), 100, 50000, 10000),
    "tiny_cifar": ((8, 8, 3), 10, 50000, 10000),  # the CPU smoke size of scripts/bench_accelerator.py --quick
}


def synthetic_images(shape_name: str, seed: int = 0, train: int | None = None,
                     test: int | None = None) -> dict[str, np.ndarray]:
    """Random images of one of :data:`PAPER_SHAPES` (NHWC float32 in [0, 1], int labels), the same arrays for the
    same arguments in any process (NumPy's PCG64 from ``seed``): both sides of a benchmark build them alike."""
    shape, classes, n_train, n_test = PAPER_SHAPES[shape_name]
    n_train, n_test = n_train if train is None else train, n_test if test is None else test
    rng = np.random.default_rng(seed)
    return {"train_x": rng.random((n_train, *shape), dtype=np.float32),
            "train_y": rng.integers(0, classes, n_train).astype(np.int32),
            "test_x": rng.random((n_test, *shape), dtype=np.float32),
            "test_y": rng.integers(0, classes, n_test).astype(np.int32), "num_classes": np.int64(classes)}


class _BasicBlockGN(nn.Module):
    """ResNet basic block with GroupNorm (``asyncfl_jax.models.paper_models._BasicBlockGN`` in ``torch.nn``)."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(groups, cout, eps=1e-5)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-5)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                          nn.GroupNorm(groups, cout, eps=1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return torch.relu(self.shortcut(x) + y)


def resnet_gn(in_channels: int, num_classes: int, widths=(64, 128, 256, 512), stage_sizes=(2, 2, 2, 2),
              groups: int = 2) -> nn.Module:
    """``asyncfl_jax.models.paper_models.ResNet18GN`` in ``torch.nn``: CIFAR stem (3x3 conv, GroupNorm, ReLU, no
    max-pool), four stages of basic blocks, global average pooling, FC (11,173,962 parameters for 10 classes)."""
    layers = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.GroupNorm(groups, widths[0], eps=1e-5),
              nn.ReLU()]
    cin = widths[0]
    for stage, (blocks, width) in enumerate(zip(stage_sizes, widths)):
        for block in range(blocks):
            layers.append(_BasicBlockGN(cin, width, 2 if stage > 0 and block == 0 else 1, groups))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def make_torch_model(name: str, num_classes: int = 10, input_shape: tuple[int, int, int] = (28, 28, 1),
                     **resnet: Any) -> nn.Module:
    """The engine's models in ``torch.nn`` for ``input_shape`` (H, W, C) images: the built-in ``logreg``, ``mlp`` and
    ``cnn`` (``asyncfl_jax.models.flax_models``), the CA2FL CIFAR CNN and ResNet-18 with GroupNorm
    (``asyncfl_jax.models.paper_models``; ``resnet``: its ``widths`` / ``stage_sizes`` / ``groups``)."""
    h, w, c = input_shape
    if name == "ca2fl_cnn":
        return nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * (h // 4) * (w // 4), 512), nn.ReLU(), nn.Linear(512, 128), nn.ReLU(),
            nn.Linear(128, num_classes))
    if name == "resnet18_gn":
        return resnet_gn(c, num_classes, **resnet)
    if (h, w, c) != (28, 28, 1):
        raise ValueError(f"model {name!r} of this yardstick takes 28x28x1 images, got {input_shape}")
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                             nn.Linear(200, num_classes))
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, num_classes))
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(TORCH_MODELS)}")


# ------------------------------------------------------------------------------------------------------------ data
def read_idx(path: str) -> np.ndarray:
    """One gzipped IDX file (uint8 images or labels), read with NumPy as a PyTorch user would."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist_idx(folder: str) -> dict[str, np.ndarray]:
    """Images as float32 in [0, 1] with a channel axis first ([N, 1, 28, 28]), labels int64."""
    def images(stem: str) -> np.ndarray:
        return (read_idx(os.path.join(folder, stem + ".gz")).astype(np.float32) / 255.0)[:, None]

    def labels(stem: str) -> np.ndarray:
        return read_idx(os.path.join(folder, stem + ".gz")).astype(np.int64)

    return {"train_x": images("train-images-idx3-ubyte"), "train_y": labels("train-labels-idx1-ubyte"),
            "test_x": images("t10k-images-idx3-ubyte"), "test_y": labels("t10k-labels-idx1-ubyte")}


def client_tensors(train_x: torch.Tensor, train_y: torch.Tensor, offsets: np.ndarray,
                   indices: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's examples, gathered once (the partition is fixed for the run)."""
    out = []
    for i in range(len(offsets) - 1):
        idx = torch.from_numpy(indices[offsets[i]:offsets[i + 1]].astype(np.int64))
        out.append((train_x[idx], train_y[idx]))
    return out


# ------------------------------------------------------------------------------------------------------------ FL
def local_job(global_model: nn.Module, client_model: nn.Module, data: tuple[torch.Tensor, torch.Tensor],
              steps: int, batch_size: int, lr: float, generator: torch.Generator) -> list[torch.Tensor]:
    """K SGD steps from the global model on one client's data; returns ``Delta = y_K - x`` per parameter."""
    client_model.load_state_dict(global_model.state_dict())
    opt = torch.optim.SGD(client_model.parameters(), lr=lr)
    x, y = data
    n = len(y)
    order = torch.randperm(n, generator=generator)
    for k in range(steps):
        if n <= batch_size:
            pos = order
        else:
            pos = order[(torch.arange(k * batch_size, (k + 1) * batch_size)) % n]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(client_model(x[pos]), y[pos])
        loss.backward()
        opt.step()
    with torch.no_grad():
        return [c.detach() - g.detach() for c, g in zip(client_model.parameters(), global_model.parameters())]


@torch.no_grad()
def apply_fedbuff(global_model: nn.Module, deltas: list[list[torch.Tensor]], server_lr: float,
                  count: int | None = None) -> None:
    """``x <- x + eta_g * mean_i Delta_i`` over the step's arrivals (FedBuff with constant staleness weights).

    ``count``: the number of arrivals when it exceeds ``len(deltas)``, the others' messages being zero (the initial
    jobs of a run started from a zero state, ``run_fedbuff(initial_jobs=False)``)."""
    count = len(deltas) if count is None else count
    if not deltas:
        return
    for p, *ds in zip(global_model.parameters(), *deltas):
        p.add_(torch.stack(ds).sum(0), alpha=server_lr / count)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 2000) -> float:
    correct = 0
    for s in range(0, len(y), batch):
        correct += int((model(x[s:s + batch]).argmax(1) == y[s:s + batch]).sum())
    return correct / len(y)


def run_fedbuff(model_name: str, clients: list[tuple[torch.Tensor, torch.Tensor]], schedule: dict[str, np.ndarray],
                steps: int, warmup: int, local_steps: int, batch_size: int, lr: float, server_lr: float,
                seed: int = 0, segments: int = 5,
                initial_state: dict[str, torch.Tensor] | None = None, device: str = "cpu",
                initial_jobs: bool = True, **model_args: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The per-event loop over the first ``steps`` server steps; the first ``warmup`` steps are not timed.

    ``initial_state``: a ``state_dict`` for ``x_0`` (default: PyTorch's initialization with ``seed``). ``device``:
    where the models and the clients' data live (``"cuda"``: the clock waits for the GPU at every segment's end).
    ``initial_jobs=False``: the initial jobs are not trained and their messages are zero (a run from a zero state, as
    the engine's ``zero_init`` benchmark runs; the steps then do the same work as from trained ones).
    ``model_args``: :func:`make_torch_model`'s ``num_classes``, ``input_shape``, ResNet options.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    global_model = make_torch_model(model_name, **model_args).to(device)
    client_model = make_torch_model(model_name, **model_args).to(device)
    if initial_state is not None:
        global_model.load_state_dict(initial_state)

    def sync() -> None:
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    pending: dict[int, list[torch.Tensor] | None] = {}
    t_start = time.perf_counter()
    for c, s in zip(schedule["init_clients"].tolist(), schedule["init_slots"].tolist()):
        if c >= 0:  # initial jobs from x_0
            pending[s] = local_job(global_model, client_model, clients[c], local_steps, batch_size, lr,
                                   generator) if initial_jobs else None
    arrivals = jobs = 0
    total_arrivals = 0
    segment_rates: list[float] = []
    bounds = set(np.linspace(warmup, steps, min(segments, max(steps - warmup, 1)) + 1).astype(int).tolist()[1:])
    t0 = seg_t0 = time.perf_counter()
    seg_arrivals = 0
    for t in range(steps):
        if t == warmup:
            sync()
            t0 = seg_t0 = time.perf_counter()
            cpu0 = time.process_time()
            arrivals = jobs = seg_arrivals = 0
        for c, s in zip(schedule["dispatch_clients"][t].tolist(), schedule["dispatch_slots"][t].tolist()):
            if c >= 0:  # 1. dispatch: train now from x_t, keep the message under its slot
                pending[s] = local_job(global_model, client_model, clients[c], local_steps, batch_size, lr, generator)
                jobs += 1
        deltas, count = [], 0
        for c, s in zip(schedule["arrival_clients"][t].tolist(), schedule["arrival_slots"][t].tolist()):
            if c >= 0:  # 2. arrival: the message of that slot (None: a zero message)
                message = pending.pop(s)
                if message is not None:
                    deltas.append(message)
                count += 1
                arrivals += 1
                total_arrivals += 1
        apply_fedbuff(global_model, deltas, server_lr, count)
        if t + 1 in bounds:
            sync()
            now = time.perf_counter()
            segment_rates.append((arrivals - seg_arrivals) / (now - seg_t0))
            seg_t0, seg_arrivals = now, arrivals
    sync()
    end = time.perf_counter()
    cpu_seconds = time.process_time() - cpu0 if steps > warmup else float("nan")
    seconds = end - t0
    timed = steps - warmup
    return global_model, {
        "timed_steps": timed, "timed_arrivals": arrivals, "timed_jobs": jobs, "run_seconds": seconds,
        "total_steps": steps, "total_arrivals": total_arrivals, "total_seconds": end - t_start,
        "updates_per_second": arrivals / seconds if seconds > 0 else float("nan"),
        "jobs_per_second": jobs / seconds if seconds > 0 else float("nan"),
        "best_segment_updates_per_second": max(segment_rates) if segment_rates else float("nan"),
        "cpu_seconds_per_upload": cpu_seconds / arrivals if arrivals else float("nan"),  # process CPU, all threads
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", required=True, help=".npz with the partition and schedule (and data without --idx-dir)")
    p.add_argument("--model", required=True, choices=("logreg", "mlp", "cnn"))
    p.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, default=None, help="server steps (default: the whole schedule)")
    p.add_argument("--warmup", type=int, default=0, help="untimed first steps")
    p.add_argument("--idx-dir", default=None, help="read Fashion-MNIST from this folder's IDX files (end to end)")
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--server-lr", type=float, default=1.0)
    p.add_argument("--json", required=True, help="write the measurements here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    t_data = time.perf_counter()
    with np.load(args.inputs) as f:
        inputs = {k: f[k] for k in f.files}
    data = load_fashion_mnist_idx(args.idx_dir) if args.idx_dir else {
        "train_x": inputs["train_x"], "train_y": inputs["train_y"].astype(np.int64),
        "test_x": inputs["test_x"], "test_y": inputs["test_y"].astype(np.int64)}
    train_x, train_y = torch.from_numpy(np.ascontiguousarray(data["train_x"])), torch.from_numpy(data["train_y"])
    clients = client_tensors(train_x, train_y, inputs["client_offsets"], inputs["client_indices"])
    schedule = {k: inputs[k] for k in SCHEDULE_FIELDS}
    data_seconds = time.perf_counter() - t_data
    steps = args.steps or len(schedule["arrival_clients"])
    if not 0 <= args.warmup < steps <= len(schedule["arrival_clients"]):
        p.error(f"need 0 <= --warmup < --steps <= {len(schedule['arrival_clients'])} (the schedule's steps)")
    model, res = run_fedbuff(args.model, clients, schedule, steps, args.warmup, args.local_steps, args.batch_size,
                             args.lr, args.server_lr)
    t_eval = time.perf_counter()
    res["test_accuracy"] = accuracy(model, torch.from_numpy(np.ascontiguousarray(data["test_x"])),
                                    torch.from_numpy(data["test_y"]))
    res.update(model=args.model, threads=args.threads, torch=torch.__version__, data_seconds=data_seconds,
               eval_seconds=time.perf_counter() - t_eval,
               num_params=sum(p.numel() for p in model.parameters()))
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
