"""The AsynFLC-EF paper's experiment (Yang, Hou and Wu, "Convergence Analysis of Asynchronous Federated Learning with
Gradient Compression for Non-Convex Optimization"; digest 004): how many uploaded bits does each method need to
reach a target test accuracy (Table III), accuracy against uploaded bits and virtual time (Figs. 1-3), the
compression ratio x quantization bits grid of AsynFLC-EF as a heat map, and the server's waiting time W (Fig. 4).

Methods (Table III's twelve columns; the heat map adds the missing cells of its grid):

=========================  ==================================================================  =====================
method                     rule                                                                bits per upload
=========================  ==================================================================  =====================
FedBuff                    x += eta_g mean of M = 10 buffered deltas, weights 1/sqrt(1 + tau)  32 d
AsynFL                     x += (eta_g / n) sum_{i in S_t} Delta_i (Eq. 5)                     32 d
AsynFLC(Q4b)               AsynFL with uploads Q_4bit(Delta_i), unbiased, no error feedback    4 d
AsynFLC(top3)              AsynFL with uploads Top_k(Delta_i), k = 3% of d, no error feedback  32 k
AsynFLC-EF(top3/6/10)      uploads C(Delta_i + e_i), e_i <- Delta_i + e_i - C(.) (Eqs. 8-10)   32 k
AsynFLC-EF(top3+Q4b) ...   the same with C = Q_b(Top_k(.)) (b = 2, 4, 8)                       b k
AsynFLC(sign)              scaled sign, no error feedback (Fig. 5; not in the default list)    d
=========================  ==================================================================  =====================

(bits: the paper's cost model, which counts neither the quantizer's float scale nor the positions of the kept
entries; the tables also give the bits with both, ``payload + index``.)

Protocol (digest sections 1-2 and 6). n clients hold a Dirichlet(0.4) label split (``--iid``: a uniform split, for
Fig. 5). A job is K = 10 local SGD steps from the model the client last received. Client i's mean job time is
``mu_i ~ N(500 s, 150 s)`` (at least 50 s), each job ``mu_i * LogNormal(0, 0.1^2)`` (about 10% jitter), capped at
1000 s in the window schedules (the paper: "1000 means synchronous updates"). The AsynFL servers aggregate every
W = 500 s whatever arrived in the window (``S_t``, of varying size); with ``--window-semantics wait`` (default, the
digest's event model) a client that reports waits for the window to close and starts its next job from the new
model x_{t+1}, so W >= the longest job gives synchronous rounds; ``immediate`` uses the package's ``all_active``
protocol with ``aggregation="periodic"`` instead (the client restarts at once from the current x_t; the protocol of
``scripts/demo_compression.py``). FedBuff keeps all n clients training (``concurrent``, concurrency n, immediate
refill) with the same client durations and steps after every M = 10 arrivals; it gets as many uploads as the
AsynFL runs make in T rounds. Error-feedback residuals live on the clients (n x d) and change only at an upload.
The quantizer of Q4b and top-k+Qb is the max-abs stochastic quantizer (``qsgd_max``, digest A6: the L2-norm QSGD
inside error feedback diverges for s <= 7; ``--qsgd-norm l2`` gives the literal QSGD for AsynFLC(Qb)).

Scales:

* ``--scale cpu`` (default): Fashion-MNIST, logistic regression (d = 7,850), n = 50, batch 32, local lr 0.05,
  T = 60 rounds (about 2,200 uploads), seeds 0 and 1, and a server-learning-rate grid {0.5, 1, 2, 4} per method
  (FedBuff: {0.25, 0.5, 1, 2}; one vmapped program per method; the reported value has the best final accuracy, the
  mean of the last three evaluations). Measured results: ``docs/reproduce_asynflc_ef.md``.
* ``--scale cpu_mlp``: the paper's claims on a non-convex model: Fashion-MNIST, the MLP 784-64-10 (d = 50,890),
  n = 50, Dirichlet(0.4), W = 500 s, K = 10, batch 32, local lr 0.2 (the best of a sweep, docs), T = 80 rounds
  (about 2,990 uploads), seeds 0-4; five methods (:data:`CLAIM_METHODS`: AsynFL, AsynFLC(Q4b), AsynFLC(top3),
  AsynFLC-EF(top3), AsynFLC-EF(top3+Q2b)), each at its best server lr of {1, 2, 4}; no heat map and no Fig. 4 part.
  ``table.md`` ends with the verdicts on the claims (:data:`UPLOAD_CLAIMS` at equal uploads and virtual time,
  :data:`BITS_CLAIMS` at equal bits; :mod:`asyncfl_jax.reproduce.verdicts`) and ``claims_<task>.png`` draws the
  methods against uploads, virtual time and bits, one line per method with a band over the seeds. Every task's
  table has these verdicts for the claims whose two methods ran.
* ``--scale paper``: the paper's four tasks, n = 100, batch 128, W = 500 s, eta_g = 1 (digest A3), seeds 0-2:
  MNIST and Fashion-MNIST with the MLP 784-200-200-10 (lr 0.01, T = 200), CIFAR-10 with the CNN (``cnn``, lr 0.01,
  T = 1000) and AlexNet (``alexnet_cifar``, 23.3M parameters, lr 1e-4, T = 2000, one seed per program for memory).
  Targets as in Table III: 85% (MNIST), 75% (Fashion-MNIST), 55% (CIFAR-10). It needs an accelerator (many hours on
  a CPU) and the data: MNIST/Fashion-MNIST IDX files (``--data-dir`` or the usual places) or TFDS-prepared copies,
  CIFAR-10 prepared with TFDS (``--tfds-data-dir``, ``$TFDS_DATA_DIR``); a missing dataset stops the script before
  anything runs (exit code 2), naming what to install; ``--tasks`` picks a subset.

Each method is scored as in Table III: the cumulative uploaded bits at the first evaluation whose test accuracy
reaches the target, the mean over seeds (reported only when every seed reached it), beside the paper's GB and the
ratios that do not depend on the model size: "x fewer bits than AsynFL" and "uploads relative to AsynFL" (for the
paper: its GB divided by AsynFL's GB times the method's bit fraction). The heat map shows, over the fraction k/d x
quantization bits grid (32: top-k alone), the measured bits ratio with the paper's in parentheses where Table III has
the cell, the uploads ratio and the final accuracy. The waiting-time part (Fig. 4) runs AsynFLC-EF(top3) for
W in {300, 500, 700, 900, 1000} s as one vmapped program (replica (W_j, seed s) has training seed 1000 j + s and the
window schedule of timing seed s) for the same T rounds, and logs the digest's delay statistics (tau_max, tau_avg0,
tau_avg1, tau_avgm0, tau_avgm1; |S_t|).

The command is ``scripts/reproduce_asynflc_ef.py`` (examples in its docstring, options in ``--help``).

``--scale cpu`` ran in 14 CPU-minutes (38 minutes of wall time on 2 cores shared with other jobs): 16 programs of 8
replicas and the Fig. 4 program of 10.
``--scale cpu_mlp`` ran in 13.8 CPU-minutes (29 minutes of wall time on the same shared 2 cores): five programs of
15 replicas.

It writes ``table.md``, ``results.json`` (settings, per-method rows, heat-map cells, delay statistics and every
run's evaluations), ``accuracy_vs_bits.png``, ``accuracy_vs_time.png``, ``heatmap.png`` and ``waiting_time.png`` to
``--out``; ``--from-results`` remakes the table and the figures from a ``results.json`` without running anything.
``--tasks synthetic_logreg`` runs on the embedded LEAF Synthetic(1, 1) data (no download).

Not reproduced: the paper's loss curves (the runs log test and train loss, the figures show accuracy); the delay
model's normal per-job noise (log-normal here, the same 10%); FedBuff's durations are not capped at 1000 s (about
0.1% of the jobs are longer); the paper's unknowns (K, eta_g, T, seeds, architectures, FedBuff's M) follow the
digest's recommendations (A2-A4).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from typing import Any, NamedTuple

import numpy as np

from asyncfl_jax import (LocalConfig, ReplicaSpec, Schedule, Task, get_algorithm, make_model, make_schedule,
                         make_task)
from asyncfl_jax.algorithms import Algorithm
from asyncfl_jax.algorithms.compression import num_kept
from asyncfl_jax.data import Dataset, partition
from asyncfl_jax.reproduce.curves import best_on_grid, fewest_on_grid, first_reach, mean_if_all
from asyncfl_jax.reproduce.data import DataUnavailable, check_dataset, load_dataset
from asyncfl_jax.reproduce.grid import command_main, metric_dtype, replica_arrays, run_grid, setting_seed
from asyncfl_jax.reproduce.report import (distinct_seeds_problem, fmt_bits, fmt_ratio, parse_checked, pyplot,
                                          round_up, to_json, yes_no)
from asyncfl_jax.reproduce.verdicts import verdict_json
from asyncfl_jax.results import save_figure, write_atomic
from asyncfl_jax.timing import DelayModel, delay_statistics, window_schedule
from asyncfl_jax.reproduce.settings import ReproductionSettings

# ------------------------------------------------------------------------------------------------ the paper's numbers
# Table III: uplink GB to reach the target accuracy (non-IID), per task (target, {method: GB}).
TABLE3_METHODS = ("FedBuff", "AsynFL", "AsynFLC(Q4b)", "AsynFLC-EF(top10)", "AsynFLC-EF(top6)", "AsynFLC-EF(top3)",
                  "AsynFLC(top3)", "AsynFLC-EF(top10+Q4b)", "AsynFLC-EF(top6+Q4b)", "AsynFLC-EF(top3+Q8b)",
                  "AsynFLC-EF(top3+Q4b)", "AsynFLC-EF(top3+Q2b)")
_GB = {
    "mnist_mlp": (0.85, (0.41, 0.39, 0.05, 0.05, 0.04, 0.02, 0.03, 0.006, 0.004, 0.004, 0.002, 0.001)),
    "fmnist_mlp": (0.75, (0.48, 0.48, 0.06, 0.05, 0.06, 0.02, 0.05, 0.007, 0.004, 0.005, 0.002, 0.001)),
    "cifar10_cnn": (0.55, (497.67, 364.43, 45.38, 36.67, 22.38, 11.43, 26.75, 4.57, 2.77, 2.84, 1.41, 0.72)),
    "cifar10_alexnet": (0.55, (1078.75, 765.66, 92.08, 47.94, 29.69, 15.71, 15.40, 5.88, 3.68, 3.95, 1.96, 0.89)),
}
PAPER_TABLE3 = {row: {"target": target, "gb": dict(zip(TABLE3_METHODS, gb))} for row, (target, gb) in _GB.items()}
PAPER_ROW_NAMES = {"mnist_mlp": "MNIST (MLP, 85%)", "fmnist_mlp": "FMNIST (MLP, 75%)",
                   "cifar10_cnn": "CIFAR-10 CNN (55%)", "cifar10_alexnet": "CIFAR-10 AlexNet (55%)"}
FIG1 = ("FedBuff", "AsynFL", "AsynFLC(top3)", "AsynFLC-EF(top3)", "AsynFLC(Q4b)", "AsynFLC-EF(top3+Q4b)")
FIG2 = ("FedBuff", "AsynFL", "AsynFLC-EF(top3)", "AsynFLC-EF(top6)", "AsynFLC-EF(top10)")
FIG3 = ("FedBuff", "AsynFL", "AsynFLC-EF(top6+Q4b)", "AsynFLC-EF(top10+Q4b)", "AsynFLC-EF(top3+Q2b)",
        "AsynFLC-EF(top3+Q4b)", "AsynFLC-EF(top3+Q8b)")

# ------------------------------------------------------------------------------------------------ tasks and scales
# name: dataset, model, local lr (digest section 3), target (Table III), rounds T (digest A3), paper row.
TASKS = {
    "mnist_mlp": {"dataset": "mnist", "model": "mlp", "client_lr": 0.01, "target": 0.85, "rounds": 200},
    "fmnist_mlp": {"dataset": "fashion_mnist", "model": "mlp", "client_lr": 0.01, "target": 0.75, "rounds": 200},
    "cifar10_cnn": {"dataset": "cifar10", "model": "cnn", "client_lr": 0.01, "target": 0.55, "rounds": 1000},
    "cifar10_alexnet": {"dataset": "cifar10", "model": "alexnet_cifar", "client_lr": 1e-4, "target": 0.55,
                        "rounds": 2000, "seeds_per_program": 1},
    # CPU scale: the setting of scripts/demo_compression.py (compared with the paper's Fashion-MNIST row).
    "fmnist_logreg": {"dataset": "fashion_mnist", "model": "logreg", "client_lr": 0.05, "target": 0.75, "rounds": 60,
                      "paper_row": "fmnist_mlp"},
    "synthetic_logreg": {"dataset": "synthetic", "model": "logreg", "client_lr": 0.05, "target": 0.6, "rounds": 60,
                         "paper_row": None},
    # CPU scale of the claims (--scale cpu_mlp): a non-convex model, the MLP 784-64-10 (d = 50,890; the paper's
    # 784-200-200-10 costs four times as much per job), compared with the paper's Fashion-MNIST row. Local lr 0.2: the
    # best of {0.05, 0.1, 0.2, 0.4} for AsynFL, AsynFLC(top3) and AsynFLC-EF(top3) in a sweep on seeds 100 and 101
    # (docs/reproduce_asynflc_ef.md); the paper's 0.01 is for batch 128 and an unknown K.
    "fmnist_mlp_cpu": {"dataset": "fashion_mnist", "model": "mlp", "hidden": [64], "client_lr": 0.2,
                       "target": 0.75, "rounds": 80, "paper_row": "fmnist_mlp"},
}
SCALES = {
    "cpu": {"tasks": ["fmnist_logreg"], "clients": 50, "batch_size": 32, "seeds": [0, 1],
            "server_lr": [0.5, 1.0, 2.0, 4.0], "fedbuff_server_lr": [0.25, 0.5, 1.0, 2.0], "evals": 30},
    "paper": {"tasks": ["mnist_mlp", "fmnist_mlp", "cifar10_cnn", "cifar10_alexnet"], "clients": 100,
              "batch_size": 128, "seeds": [0, 1, 2], "server_lr": [1.0], "fedbuff_server_lr": [1.0], "evals": 100},
}
# The claims at CPU scale on a non-convex model (docs/reproduce_asynflc_ef.md): error feedback against compression
# without it and against full precision, and a heavier bit width, with 5 seeds and each method at its best server lr
# of the grid; no heat map and no Fig. 4 part (--fractions / --windows add them).
CLAIM_METHODS = ("AsynFL", "AsynFLC(Q4b)", "AsynFLC(top3)", "AsynFLC-EF(top3)", "AsynFLC-EF(top3+Q2b)")
SCALES["cpu_mlp"] = {"tasks": ["fmnist_mlp_cpu"], "clients": 50, "batch_size": 32, "seeds": [0, 1, 2, 3, 4],
                     "server_lr": [1.0, 2.0, 4.0], "fedbuff_server_lr": [0.5, 1.0, 2.0], "evals": 40,
                     "methods": list(CLAIM_METHODS), "fractions": [], "windows": []}
FRACTIONS = [0.03, 0.06, 0.1]  # the heat map's k/d (the paper's)
QUICK = {"seeds": [0], "server_lr": [1.0, 2.0], "fedbuff_server_lr": [0.5, 1.0], "rounds": 30, "evals": 15}
WINDOWS = [300.0, 500.0, 700.0, 900.0, 1000.0]  # Fig. 4's waiting times, and 1000 s = synchronous
MEAN_DURATION, DURATION_STD, MIN_MEAN, MAX_DURATION = 500.0, 150.0, 50.0, 1000.0  # digest A2 (seconds)
_METHOD = re.compile(r"^AsynFLC(-EF)?\((?:top([0-9.]+)(?:\+Q(\d+)b)?|Q(\d+)b|sign)\)$")


# ------------------------------------------------------------------------------------------------ methods
class Method(NamedTuple):
    """A method of the paper: its algorithm, compressor and options, and its bits per upload in the paper's model."""

    name: str
    algorithm: str  # fedbuff, asynfl, asynflc, asynflc_ef
    compressor: str | None = None
    options: tuple = ()
    fraction: float | None = None  # k/d of a sparsifier
    quant_bits: int | None = None  # b of a quantizer

    @property
    def protocol(self) -> str:
        """``buffer`` (FedBuff: a step every M arrivals) or ``window`` (the AsynFL servers)."""
        return "buffer" if self.algorithm == "fedbuff" else "window"

    @property
    def error_feedback(self) -> bool:
        """Whether the clients keep error-feedback residuals."""
        return self.algorithm == "asynflc_ef"

    def build(self) -> Algorithm:
        """The project algorithm of the method."""
        if self.algorithm == "fedbuff":
            return get_algorithm("fedbuff", staleness="inverse_sqrt")
        if self.compressor is None:
            return get_algorithm("asynfl")
        return get_algorithm(self.algorithm, compressor=self.compressor, **dict(self.options))

    def paper_bits(self, d: int) -> int:
        """Bits of one upload in Table III's cost model: 32 d, b d, 32 k, b k or d (no scale, no indices)."""
        if self.compressor == "sign":
            return d
        values = d if self.fraction is None else num_kept(d, self.fraction)
        return (self.quant_bits or 32) * values

    @property
    def bit_fraction(self) -> float:
        """The paper's bits per upload over 32 d (for the paper's upload ratios; k/d taken exactly)."""
        if self.compressor == "sign":
            return 1 / 32
        return (self.fraction or 1.0) * (self.quant_bits or 32) / 32


def percent(fraction: float) -> str:
    """A fraction of d as the percentage in a method's name (``0.03`` -> ``3``)."""
    return f"{fraction * 100:.4g}"


def ef_name(fraction: float, quant_bits: int | None) -> str:
    """The paper's name of an AsynFLC-EF heat-map cell: ``AsynFLC-EF(top3)``, ``AsynFLC-EF(top3+Q4b)``."""
    return f"AsynFLC-EF(top{percent(fraction)}" + ("" if quant_bits is None else f"+Q{quant_bits}b") + ")"


def parse_method(name: str, qsgd_norm: str = "max") -> Method:
    """``FedBuff``, ``AsynFL``, ``AsynFLC(Q4b)``, ``AsynFLC(top3)``, ``AsynFLC(sign)``, ``AsynFLC-EF(top6)``,
    ``AsynFLC-EF(top3+Q2b)`` ... (percentages of d kept, bits per quantized value)."""
    if name == "FedBuff":
        return Method(name, "fedbuff")
    if name == "AsynFL":
        return Method(name, "asynfl")
    m = _METHOD.match(name)
    if not m:
        raise ValueError(f"unknown method {name!r}: use FedBuff, AsynFL, AsynFLC(Q<b>b), AsynFLC(top<p>), "
                         "AsynFLC(sign), AsynFLC-EF(top<p>) or AsynFLC-EF(top<p>+Q<b>b) (p: percent of d kept)")
    ef, top, top_bits, q_bits = m.groups()
    algorithm = "asynflc_ef" if ef else "asynflc"
    if top is not None:
        fraction = float(top) / 100
        if not 0 < fraction <= 1:
            raise ValueError(f"method {name!r}: top<p> needs 0 < p <= 100")
        if top_bits is None:
            return Method(name, algorithm, "top_k", (("fraction", fraction),), fraction=fraction)
        bits = int(top_bits)
        return Method(name, algorithm, "top_k_qsgd", (("fraction", fraction), ("quant_bits", bits)), fraction=fraction,
                      quant_bits=bits)
    if q_bits is not None:
        bits = int(q_bits)
        compressor = "qsgd_max" if qsgd_norm == "max" else "qsgd"
        return Method(name, algorithm, compressor, (("quant_bits", bits),), quant_bits=bits)
    return Method(name, algorithm, "sign")


# ------------------------------------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/reproduce_asynflc_ef.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=list(SCALES), default="cpu",
                   help="cpu: Fashion-MNIST logreg, n = 50, 2 seeds, a server-lr grid (default); cpu_mlp: the claims "
                        "on the Fashion-MNIST MLP 784-64-10, 5 methods, 5 seeds, with verdict tables; paper: the "
                        "paper's tasks, n = 100, batch 128, eta_g = 1, 3 seeds (needs an accelerator and the data)")
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=None, help="default: from --scale")
    p.add_argument("--quick", action="store_true", help="one seed, 30 rounds, server lr grid {1, 2}")
    p.add_argument("--dry-run", action="store_true", help="print the plan (settings, programs, memory) and stop")
    p.add_argument("--from-results", default=None, metavar="RESULTS_JSON",
                   help="no runs: remake table.md and the figures in --out from a results.json of this script")
    p.add_argument("--methods", nargs="+", default=None,
                   help="methods of the main comparison (default: Table III's twelve columns; cpu_mlp: AsynFL, "
                        "AsynFLC(Q4b), AsynFLC(top3), AsynFLC-EF(top3), AsynFLC-EF(top3+Q2b))")
    p.add_argument("--fractions", type=float, nargs="*", default=None,
                   help="k/d of the heat map (paper and default: 0.03, 0.06, 0.1; cpu_mlp: none); none: no heat map")
    p.add_argument("--quant-bits", type=int, nargs="*", default=[2, 4, 8],
                   help="quantization bits of the heat map (paper: 2, 4, 8; top-k alone is added as 32)")
    p.add_argument("--windows", type=float, nargs="*", default=None,
                   help="waiting times W (s) of the Fig. 4 part (default 300 500 700 900 1000; cpu_mlp: none; none: "
                        "skip it)")
    p.add_argument("--window-method", default="AsynFLC-EF(top3)", help="the method of the Fig. 4 part")
    p.add_argument("--clients", type=int, default=None, help="n (cpu: 50, paper: 100)")
    p.add_argument("--rounds", type=int, default=None, help="T, AsynFL rounds per run (default: per task)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="training and timing seeds")
    p.add_argument("--server-lr", type=float, nargs="+", default=None,
                   help="eta_g grid of the AsynFL family (cpu: 0.5 1 2 4; paper: 1)")
    p.add_argument("--fedbuff-server-lr", type=float, nargs="+", default=None,
                   help="eta_g grid of FedBuff (cpu: 0.25 0.5 1 2; paper: 1)")
    p.add_argument("--client-lr", type=float, default=None, help="local SGD step size eta (default: per task)")
    p.add_argument("--target", type=float, default=None, help="test accuracy to reach (default: per task)")
    p.add_argument("--model", default=None, help="override the task's model (e.g. mlp at --scale cpu)")
    p.add_argument("--local-steps", type=int, default=10, help="K, local SGD steps per job (digest A3: 10)")
    p.add_argument("--batch-size", type=int, default=None, help="cpu: 32, paper: 128")
    p.add_argument("--window", type=float, default=500.0, help="the AsynFL servers' waiting time W in seconds")
    p.add_argument("--window-semantics", choices=["wait", "immediate"], default="wait",
                   help="wait: a reporting client starts again from x_{t+1} when the window closes (digest); "
                        "immediate: it restarts at once from x_t (the package's all_active + periodic clock)")
    p.add_argument("--buffer-size", type=int, default=10, help="FedBuff's M")
    p.add_argument("--dirichlet-alpha", type=float, default=0.4, help="label-split concentration (paper: 0.4)")
    p.add_argument("--iid", action="store_true", help="a uniform split instead (Fig. 5's IID setting)")
    p.add_argument("--qsgd-norm", choices=["max", "l2"], default="max",
                   help="scale of AsynFLC(Qb): max-abs (default, digest A6) or the L2 norm (literal QSGD)")
    p.add_argument("--evals", type=int, default=None, help="evaluations per run (about)")
    p.add_argument("--seeds-per-program", type=int, default=None,
                   help="seeds run together in one program (default: all; AlexNet at --scale paper: 1)")
    p.add_argument("--data-dir", default=None, help="folder of the MNIST / Fashion-MNIST IDX files")
    p.add_argument("--tfds-data-dir", default=None, help="TFDS data folder (CIFAR-10; default $TFDS_DATA_DIR)")
    p.add_argument("--out", default="results/reproduce_asynflc_ef")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the scale's defaults filled in, checked, and the methods parsed (``method_specs``); a bad
    argument exits with a usage error."""
    p = build_parser()
    args = parse_checked(p, argv, apply_scale_defaults, argument_problem)
    try:
        args.method_specs = [parse_method(m, args.qsgd_norm) for m in dict.fromkeys(args.methods)]
        if args.windows:
            parse_method(args.window_method, args.qsgd_norm)
    except ValueError as e:
        p.error(str(e))
    if args.windows and parse_method(args.window_method).protocol != "window":
        p.error("--window-method must be an AsynFL-family method (it runs on window schedules)")
    return args


def apply_scale_defaults(args: argparse.Namespace) -> None:
    """Fills every argument left unset from ``--scale`` (and ``--quick``)."""
    scale = dict(SCALES[args.scale])
    if args.quick:
        scale.update({k: v for k, v in QUICK.items() if k != "rounds"})
    args.tasks = args.tasks or scale["tasks"]
    for name in ("clients", "batch_size", "seeds", "server_lr", "fedbuff_server_lr", "evals"):
        if getattr(args, name) is None:
            setattr(args, name, scale[name])
    if args.quick and args.rounds is None:
        args.rounds = QUICK["rounds"]
    if args.windows is None:
        args.windows = list(scale.get("windows", WINDOWS))
    if args.methods is None:
        args.methods = list(scale.get("methods", TABLE3_METHODS))
    if args.fractions is None:
        args.fractions = list(scale.get("fractions", FRACTIONS))


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the (filled-in) arguments, or None."""
    if distinct_seeds_problem(args.seeds):
        return distinct_seeds_problem(args.seeds)
    if args.clients < 2:
        return "--clients must be >= 2"
    if not args.window > 0 or any(not w > 0 for w in args.windows):
        return "waiting times must be > 0"
    if any(not 0 < f <= 1 for f in args.fractions):
        return "--fractions must be in (0, 1]"
    if any(not 2 <= b <= 24 for b in args.quant_bits):
        return "--quant-bits must be in [2, 24]"
    return None


def heatmap_cells(args: AsynflcEfSettings) -> list[tuple[float, int | None, str]]:
    """(fraction, bits or None for top-k alone, method name) of every heat-map cell."""
    return [(f, b, ef_name(f, b)) for f in args.fractions for b in [*sorted(args.quant_bits), None]]


def all_methods(args: AsynflcEfSettings) -> list[Method]:
    """The main comparison's methods, then the heat-map cells not among them."""
    names = [m.name for m in args.method_specs]
    extra = [parse_method(name, args.qsgd_norm) for _, _, name in heatmap_cells(args) if name not in names]
    return list(args.method_specs) + extra


def settings_of(task_name: str, args: AsynflcEfSettings) -> dict:
    """The resolved settings of one task."""
    t = TASKS[task_name]
    model = args.model or t["model"]
    row = t.get("paper_row", task_name)
    return {
        "task": task_name, "dataset": t["dataset"], "model": model, "paper_row": row,
        "client_lr": args.client_lr if args.client_lr is not None else t["client_lr"],
        "target": args.target if args.target is not None else t["target"],
        "rounds": args.rounds if args.rounds is not None else t["rounds"],
        "clients": args.clients, "batch_size": args.batch_size, "local_steps": args.local_steps,
        "window": args.window, "window_semantics": args.window_semantics, "buffer_size": args.buffer_size,
        "partition": "iid" if args.iid else f"dirichlet({args.dirichlet_alpha:g})",
        "seeds": list(args.seeds), "server_lr": list(args.server_lr),
        "fedbuff_server_lr": list(args.fedbuff_server_lr),
        "seeds_per_program": seeds_per_program(task_name, args),
    }


def seeds_per_program(task_name: str, args: AsynflcEfSettings) -> int:
    """``--seeds-per-program``, else 1 for a task that asks for it (AlexNet: n x d state per replica), else all."""
    if args.seeds_per_program:
        return int(args.seeds_per_program)
    return int(TASKS[task_name].get("seeds_per_program", len(args.seeds)))


def model_options(task_name: str, model: str) -> dict[str, Any]:
    """``make_model``'s options of a task's model: the hidden widths of a task that fixes them (``fmnist_mlp_cpu``:
    784-64-10) when its model is the MLP; none otherwise (the MLP's default is the paper's 784-200-200-10)."""
    hidden = TASKS[task_name].get("hidden")
    return {"hidden": tuple(hidden)} if hidden and model == "mlp" else {}


# ------------------------------------------------------------------------------------------------ data
def check_data(task_name: str, args: AsynflcEfSettings) -> str | None:
    """None if the task's dataset can be read, else a message saying what is missing and how to get it."""
    problem = check_dataset(TASKS[task_name]["dataset"], args.data_dir, args.tfds_data_dir)
    return None if problem is None else f"task {task_name}: {problem}"


def load_task_dataset(task_name: str, clients: int, args: AsynflcEfSettings) -> Dataset:
    """The task's dataset (IDX files from ``--data-dir``, TFDS from ``--tfds-data-dir``; Synthetic(1, 1) with one
    generator per client)."""
    return load_dataset(TASKS[task_name]["dataset"], args.data_dir, args.tfds_data_dir, synthetic_clients=clients)


# ------------------------------------------------------------------------------------------------ virtual time
def delay_model() -> DelayModel:
    """The digest's job times (A2), in seconds: ``mu_i ~ N(500, 150^2)`` (>= 50), each job ``mu_i`` times
    ``LogNormal(0, 0.1^2)``."""
    return DelayModel(speed="normal", speed_mean=MEAN_DURATION, speed_std=DURATION_STD, speed_min=MIN_MEAN,
                      noise="lognormal", noise_sigma=0.1)


def window_schedules(n: int, rounds: int, window: float, seeds: list[int], semantics: str) -> list[Schedule]:
    """One window schedule per seed (the engine pads them to common widths to run them as one program): ``wait``, the
    digest's
    window server (:func:`asyncfl_jax.timing.window_schedule`, jobs capped at 1000 s), or ``immediate``, the package's
    ``all_active`` protocol with a periodic server clock."""
    delays = delay_model()
    if semantics == "wait":
        out = [window_schedule(n, rounds, window, delays, s, max_duration=MAX_DURATION) for s in seeds]
    else:
        out = [make_schedule("all_active", n, rounds, delays, s, aggregation="periodic", period=window) for s in seeds]
    return out


def buffer_schedules(n: int, steps: int, buffer_size: int, seeds: list[int]) -> list[Schedule]:
    """FedBuff's schedules: all n clients training, a step every ``buffer_size`` arrivals, the same job times."""
    return [make_schedule("concurrent", n, steps, delay_model(), s, concurrency=n, buffer_size=buffer_size,
                          refill="immediate") for s in seeds]


# ------------------------------------------------------------------------------------------------ the runs
def run_program(task: Task, method: Method, replicas: list[ReplicaSpec], per_program: int, eval_every: int,
                cfg: dict, label: str) -> dict[str, Any]:
    """Runs ``method`` on ``replicas``, ``per_program`` of them to a program (:func:`run_grid`), and returns its
    evaluations per replica (in the replicas' order) as numpy arrays."""
    local = LocalConfig(steps=cfg["local_steps"], batch_size=cfg["batch_size"])
    algorithm = method.build()
    frames = [run_grid(task, algorithm, replicas[i:i + per_program], local=local, name=label, eval_every=eval_every)
              for i in range(0, len(replicas), max(1, per_program))]
    info = frames[0].attrs["run"]
    parts = [replica_arrays(f, {"times": "time", "uploads": "uploads", "accuracy": "test_accuracy",
                                "test_loss": "test_loss"},
                            {"accuracy": metric_dtype(f), "test_loss": metric_dtype(f)}) for f in frames]
    out = {
        "steps": np.sort(frames[0]["step"].unique()),
        **{k: np.concatenate([p[k] for p in parts]) for k in ("times", "uploads", "accuracy", "test_loss")},
        "diverged_at": np.concatenate([f.groupby("replica").diverged_at.first().to_numpy() for f in frames]),
        "message_bits": info["message_bits"], "algorithm": info["algorithm"],
        "algorithm_options": info["algorithm_options"],
        "seconds": round(sum(f.attrs["run"]["compile_seconds"] + f.attrs["run"]["run_seconds"] for f in frames), 1),
        "compile_seconds": round(sum(f.attrs["run"]["compile_seconds"] for f in frames), 1),
    }
    out["paper_bits"] = out["uploads"].astype(np.float64) * method.paper_bits(int(task.num_params))
    m = info["message_bits"] or {"payload": 0, "index": 0}
    out["bits_with_index"] = out["uploads"].astype(np.float64) * (m["payload"] + m["index"])
    return out


def seed_grid(schedules: list[Schedule], seeds: list[int], hparams: dict, grid: list[float],
              labels: list[dict]) -> list[ReplicaSpec]:
    """The replicas of seeds x server learning rates (seed-major): seed ``i`` with ``schedules[i]``, label
    ``labels[i]`` and every value of ``grid``."""
    return [ReplicaSpec(schedules[i], seed=seed, hparams={**hparams, "server_lr": lr}, label=labels[i])
            for i, seed in enumerate(seeds) for lr in grid]


def grid_of(method: Method, cfg: dict) -> list[float]:
    """The server learning rates swept for a method (FedBuff has its own grid)."""
    return cfg["fedbuff_server_lr"] if method.protocol == "buffer" else cfg["server_lr"]


def summarise(method: Method, run: dict, cfg: dict) -> dict:
    """The row of ``method``: every grid value's final accuracy and costs to the target, and the chosen value (best
    final accuracy, the mean of the last three evaluations over seeds; a value that diverged on a seed ranks last)."""
    lrs = grid_of(method, cfg)
    S, G = len(cfg["seeds"]), len(lrs)
    target = cfg["target"]

    def grid(a):  # [R] (seed-major) -> [S, G]
        return np.asarray(a, dtype=np.float64).reshape(S, G)

    acc = run["accuracy"]
    costs = {
        "bits": grid(first_reach(acc, run["paper_bits"], target)),
        "bits_with_index": grid(first_reach(acc, run["bits_with_index"], target)),
        "uploads": grid(first_reach(acc, run["uploads"], target)),
        "time": grid(first_reach(acc, run["times"], target)),
        "rounds": grid(first_reach(acc, run["steps"][None, :], target)),
    }
    diverged = grid(run["diverged_at"] >= 0).astype(bool)
    best, final = best_on_grid(grid(np.nanmean(acc[:, -3:], axis=1)), diverged)
    reached = np.isfinite(costs["bits"]).sum(axis=0)
    fewest = fewest_on_grid(costs["bits"], diverged)
    cells = []
    for g, value in enumerate(lrs):
        cell = {"server_lr": value, "final_accuracy": float(final[g]), "seeds_reached": int(reached[g]),
                "diverged_seeds": int(diverged[:, g].sum())}
        cell.update({f"{k}_to_target": mean_if_all(v[:, g]) for k, v in costs.items()})
        cell["bits_to_target_per_seed"] = [None if not np.isfinite(b) else float(b) for b in costs["bits"][:, g]]
        cells.append(cell)
    row = {"method": method.name, "algorithm": run["algorithm"], "algorithm_options": run["algorithm_options"],
           "error_feedback": method.error_feedback, "fraction": method.fraction, "quant_bits": method.quant_bits,
           "paper_bits_per_upload": method.paper_bits(cfg["d"]), "message_bits": run["message_bits"],
           "best": best, "grid": cells, **{k: v for k, v in cells[best].items() if k != "server_lr"},
           "server_lr": lrs[best],
           "fewest_bits_server_lr": None if fewest is None else lrs[fewest],
           "fewest_bits_to_target": None if fewest is None else float(costs["bits"][:, fewest].mean()),
           "diverged_in_grid": int(diverged.sum()), "uploads": int(run["uploads"][:, -1].min()),
           "seconds": run["seconds"], "compile_seconds": run["compile_seconds"]}
    row["replicas"] = [s * G + best for s in range(S)]
    return row


def paper_reference(row_name: str | None, method: str) -> dict | None:
    """Table III's GB for ``method``, its ratio to AsynFL's GB and its uploads relative to AsynFL's."""
    if row_name is None or row_name not in PAPER_TABLE3 or method not in PAPER_TABLE3[row_name]["gb"]:
        return None
    gb = PAPER_TABLE3[row_name]["gb"]
    spec = parse_method(method)
    return {"gb": gb[method], "bits_ratio": gb["AsynFL"] / gb[method],
            "uploads_ratio": gb[method] / (gb["AsynFL"] * spec.bit_fraction)}


def run_task(task_name: str, args: AsynflcEfSettings) -> dict[str, Any]:
    """Every method of the main comparison and the heat map, and the waiting-time part, on one task."""
    cfg = settings_of(task_name, args)
    dataset = load_task_dataset(task_name, cfg["clients"], args)
    model = make_model(cfg["model"], dataset.input_shape, dataset.num_classes, seed=0,
                       **model_options(task_name, cfg["model"]))
    parts = (partition("iid", dataset.train_y, cfg["clients"], seed=0) if args.iid else
             partition("dirichlet", dataset.train_y, cfg["clients"], seed=0, alpha=args.dirichlet_alpha))
    task = make_task(dataset, parts, model)
    cfg["d"] = int(task.num_params)
    cfg["test_examples"] = int(len(dataset.test_y))
    every = max(1, math.ceil(cfg["rounds"] / args.evals))
    cfg["rounds"] = round_up(cfg["rounds"], every)
    windows = window_schedules(cfg["clients"], cfg["rounds"], cfg["window"], cfg["seeds"], cfg["window_semantics"])
    cfg["delay_statistics"] = [delay_statistics(s) for s in windows]
    cfg["fastest_share"] = task_fastest_share(windows, cfg["seeds"]) if args.window_semantics == "wait" else None
    rows, runs = run_methods(task, dataset.name, windows, every, args, cfg)
    reference = next((r for r in rows if r["method"] == "AsynFL"), None)
    for r in rows:
        r["bits_ratio"] = ratio(reference and reference["bits_to_target"], r["bits_to_target"])
        r["uploads_ratio"] = ratio(r["uploads_to_target"], reference and reference["uploads_to_target"])
    result = {"settings": cfg, "rows": rows, "curves": curves_of(rows, runs), "heatmap": heatmap(rows, args, cfg)}
    if args.windows:
        result["waiting_time"] = run_windows(task, args, cfg, rows)
    result["checks"] = direction_checks(result, cfg)
    result["verdicts"] = [verdict_json(v) for v in task_verdicts(result)]
    return result


def run_methods(task: Task, dataset_name: str, windows: list[Schedule], every: int, args: AsynflcEfSettings,
                cfg: dict) -> tuple[list[dict], dict[str, dict]]:
    """One program per method (the AsynFL family on the window schedules, FedBuff on buffer schedules with as many
    uploads as the window runs make at most): the rows and the runs, by method name."""
    n, T, seeds = cfg["clients"], cfg["rounds"], cfg["seeds"]
    uploads = max(int(s.uploads_per_step.sum()) for s in windows)
    buffer_every = max(1, math.ceil(math.ceil(uploads / cfg["buffer_size"]) / args.evals))
    buffer_steps = round_up(math.ceil(uploads / cfg["buffer_size"]), buffer_every)
    buffered = None
    print(f"[{cfg['task']}] {dataset_name}, {cfg['model']} (d = {cfg['d']:,}), n = {n}, {cfg['partition']}, T = {T} "
          f"rounds of W = {cfg['window']:g} s ({uploads} uploads at most), FedBuff {buffer_steps} steps of "
          f"M = {cfg['buffer_size']}", file=sys.stderr, flush=True)
    rows, runs = [], {}
    for method in all_methods(args):
        if method.protocol == "buffer":
            buffered = buffered or buffer_schedules(n, buffer_steps, cfg["buffer_size"], seeds)
            schedules, eval_every = buffered, buffer_every
        else:
            schedules, eval_every = windows, every
        grid = list(grid_of(method, cfg))
        replicas = seed_grid(schedules, seeds, {"client_lr": cfg["client_lr"]}, grid,
                             [{"method": method.name, "timing_seed": s} for s in seeds])
        run = run_program(task, method, replicas, max(1, int(cfg["seeds_per_program"])) * len(grid), eval_every,
                          cfg, method.name)
        row = summarise(method, run, cfg)
        row["paper"] = paper_reference(cfg["paper_row"], method.name)
        rows.append(row)
        runs[method.name] = run
        print(f"[{cfg['task']}] {method.name:<24} acc {row['final_accuracy']:.4f} (server_lr {row['server_lr']:g}; "
              f"grid {[round(c['final_accuracy'], 4) for c in row['grid']]}), bits to {cfg['target']:g}: "
              f"{fmt_bits(row['bits_to_target'])}  {run['seconds']:.0f} s", file=sys.stderr, flush=True)
    return rows, runs


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None if either is missing or ``b <= 0``."""
    return float(a / b) if a is not None and b is not None and b > 0 else None


def curves_of(rows: list[dict], runs: dict) -> dict:
    """Per method, at its chosen server lr: every seed's evaluations (steps, time, uploads, bits, accuracy, loss)."""
    out = {}
    for r in rows:
        run, rep = runs[r["method"]], r["replicas"]
        out[r["method"]] = {"steps": run["steps"].tolist(),
                            **{k: run[k][rep].tolist() for k in ("times", "uploads", "paper_bits", "bits_with_index",
                                                                 "accuracy", "test_loss")}}
    return out


def heatmap(rows: list[dict], args: AsynflcEfSettings, cfg: dict) -> list[dict]:
    """The cells of the k/d x quantization-bits grid of AsynFLC-EF, beside the paper's where Table III has them."""
    at = {r["method"]: r for r in rows}
    cells = []
    for fraction, bits, name in heatmap_cells(args):
        r = at[name]
        cells.append({"fraction": fraction, "quant_bits": bits or 32, "method": name,
                      "final_accuracy": r["final_accuracy"], "bits_to_target": r["bits_to_target"],
                      "bits_ratio": r["bits_ratio"], "uploads_ratio": r["uploads_ratio"], "server_lr": r["server_lr"],
                      "paper": paper_reference(cfg["paper_row"], name)})
    return cells


def run_windows(task: Task, args: AsynflcEfSettings, cfg: dict, rows: list[dict]) -> dict[str, Any]:
    """Fig. 4: the window method at every waiting time W as one program (replica (W_j, seed s): the window schedule
    of timing seed s, training seed ``setting_seed(j, s)``), at the server lr chosen for it in the main comparison."""
    method = parse_method(args.window_method, args.qsgd_norm)
    chosen = next((r["server_lr"] for r in rows if r["method"] == method.name), None)
    server_lr = chosen if chosen is not None else (1.0 if 1.0 in cfg["server_lr"] else cfg["server_lr"][0])
    n, T, seeds = cfg["clients"], cfg["rounds"], cfg["seeds"]
    every = max(1, math.ceil(T / args.evals))
    settings = [(w, j, s) for j, w in enumerate(args.windows) for s in seeds]
    schedules = [window_schedules(n, T, w, [s], cfg["window_semantics"])[0] for w, _, s in settings]
    stats = [delay_statistics(s) for s in schedules]
    replicas = seed_grid(schedules, [setting_seed(j, s) for _, j, s in settings], {"client_lr": cfg["client_lr"]},
                         [server_lr], [{"window": w, "timing_seed": s} for w, _, s in settings])
    # All (W, seed) replicas in one program, unless the task runs its seeds one by one (AlexNet's memory).
    together = cfg["seeds_per_program"] >= len(seeds)
    run = run_program(task, method, replicas, len(settings) if together else max(1, int(cfg["seeds_per_program"])),
                      every, cfg, f"{method.name} over W")
    target = cfg["target"]
    per_w = []
    for j, w in enumerate(args.windows):
        idx = [i for i, (_, jj, _) in enumerate(settings) if jj == j]
        acc = run["accuracy"][idx]
        entry = {"window": w, "final_accuracy": float(np.nanmean(acc[:, -3:])), "seeds": seeds,
                 "delay_statistics": [stats[i] for i in idx]}
        for key, axis in (("bits", run["paper_bits"][idx]), ("rounds", run["steps"][None, :]),
                          ("time", run["times"][idx]), ("uploads", run["uploads"][idx])):
            entry[f"{key}_to_target"] = mean_if_all(first_reach(acc, axis, target))
        entry["seeds_reached"] = int(np.isfinite(first_reach(acc, run["steps"][None, :], target)).sum())
        entry["curves"] = {"steps": run["steps"].tolist(), "times": run["times"][idx].tolist(),
                           "paper_bits": run["paper_bits"][idx].tolist(), "accuracy": acc.tolist()}
        per_w.append(entry)
        print(f"[{cfg['task']}] {method.name} W = {w:g}: acc {entry['final_accuracy']:.4f}, |S_t| "
              f"{np.mean([s['S_mean'] for s in entry['delay_statistics']]):.1f}, rounds to {target:g}: "
              f"{entry['rounds_to_target']}", file=sys.stderr, flush=True)
    return {"method": method.name, "server_lr": server_lr, "seconds": run["seconds"], "windows": per_w}


# ------------------------------------------------------------------------------------------------ claims and tables
def direction_checks(result: dict, cfg: dict) -> list[str]:
    """The paper's claims (digest section 4), checked on the measured means."""
    at = {r["method"]: r for r in result["rows"]}
    out = []
    asynfl = at.get("AsynFL")

    def reached(r):
        return r is not None and r["bits_to_target"] is not None

    if asynfl is None:
        return ["AsynFL was not run: no ratio can be checked"]
    if not reached(asynfl):
        return ["AsynFL did not reach the target on every seed: no ratio can be checked"]
    fedbuff = at.get("FedBuff")
    if fedbuff is not None:
        out.append("FedBuff needs at least AsynFL's bits (paper: 1.0-1.05x on (F)MNIST, 1.37-1.41x on CIFAR-10): "
                   + (f"{yes_no(fedbuff['bits_to_target'] >= asynfl['bits_to_target'])} "
                      f"({fedbuff['bits_to_target'] / asynfl['bits_to_target']:.2f}x)" if reached(fedbuff)
                      else "yes (FedBuff did not reach the target)"))
    ef = [r for r in result["rows"] if r["error_feedback"]]
    if ef:
        done = [r for r in ef if reached(r)]
        out.append(f"Every AsynFLC-EF variant reaches the target: {yes_no(len(done) == len(ef))} "
                   f"({len(done)}/{len(ef)})")
        if done:
            ratios = [r["uploads_ratio"] for r in done]
            out.append(f"AsynFLC-EF needs about AsynFL's uploads (paper: 1.0-2.1x on (F)MNIST, 1.0-1.05x CNN, "
                       f"0.6-0.7x AlexNet): {min(ratios):.2f}-{max(ratios):.2f}x")
            gains = [r["bits_ratio"] for r in done]
            out.append(f"AsynFLC-EF needs far fewer bits than AsynFL: {min(gains):.1f}x-{max(gains):.1f}x fewer")
    top3, ef3 = at.get("AsynFLC(top3)"), at.get("AsynFLC-EF(top3)")
    if top3 is not None and ef3 is not None:
        if not reached(top3):
            out.append("Top-k without error feedback is worse than with it: yes (AsynFLC(top3) did not reach the "
                       f"target; final accuracy {top3['final_accuracy']:.4f} vs {ef3['final_accuracy']:.4f})")
        elif reached(ef3):
            out.append(f"Top-k without error feedback needs more uploads than with it (paper: 1.5-2.5x on (F)MNIST "
                       f"and CNN): {yes_no(top3['uploads_to_target'] > ef3['uploads_to_target'])} "
                       f"({top3['uploads_to_target'] / ef3['uploads_to_target']:.2f}x, at their own best server lr "
                       f"{top3['server_lr']:g} / {ef3['server_lr']:g})")
    q4 = at.get("AsynFLC(Q4b)")
    if q4 is not None and reached(q4):
        out.append(f"AsynFLC(Q4b) needs about AsynFL's uploads (paper: 0.96-1.03x): {q4['uploads_ratio']:.2f}x")
    cells = [c for c in result["heatmap"] if c["uploads_ratio"] is not None]
    if len(cells) > 1:
        heavy_first = sorted(cells, key=lambda c: c["fraction"] * c["quant_bits"])
        out.append(f"Heavier compression does not slow AsynFLC-EF (uploads to target, heaviest "
                   f"{heavy_first[0]['method']} vs lightest {heavy_first[-1]['method']}): "
                   f"{heavy_first[0]['uploads_ratio']:.2f}x vs {heavy_first[-1]['uploads_ratio']:.2f}x of AsynFL")
    return out


# ------------------------------------------------------------------------------------------------ verdicts
# The paper's claims with a direction (digest section 4.3, observations 2-6, and Table III), as (claim, method,
# baseline). "≈" marks a parity claim ("not below"): a gap within the noise, or in the method's favour, supports it;
# only "reversed" refutes it. The per-upload claims are read at equal uploads and equal virtual time (every method of
# the AsynFL family runs on the same window schedules, and every upload is K local steps, so equal uploads is also
# equal local computation); the communication claims at equal uploaded bits (the paper's cost model).
UPLOAD_CLAIMS = (
    ("error feedback helps top-k: AsynFLC-EF(top3) above AsynFLC(top3)", "AsynFLC-EF(top3)", "AsynFLC(top3)"),
    ("top-k without error feedback loses: AsynFL above AsynFLC(top3)", "AsynFL", "AsynFLC(top3)"),
    ("AsynFLC-EF(top3) ≈ AsynFL (EF restores full precision)", "AsynFLC-EF(top3)", "AsynFL"),
    ("AsynFLC-EF(top3+Q2b) ≈ AsynFLC-EF(top3) (heavier compression does not slow EF)", "AsynFLC-EF(top3+Q2b)",
     "AsynFLC-EF(top3)"),
    ("AsynFLC-EF(top3) above AsynFLC(Q4b) (EF beats unbiased quantization)", "AsynFLC-EF(top3)", "AsynFLC(Q4b)"),
    ("AsynFLC(Q4b) ≈ AsynFL (unbiased 4 bits cost nothing per upload)", "AsynFLC(Q4b)", "AsynFL"),
)
BITS_CLAIMS = (
    ("AsynFLC-EF(top3) above AsynFL at equal bits (24x fewer bits)", "AsynFLC-EF(top3)", "AsynFL"),
    ("AsynFLC-EF(top3+Q2b) above AsynFLC(Q4b) at equal bits", "AsynFLC-EF(top3+Q2b)", "AsynFLC(Q4b)"),
)
CLAIM_AXES = ("uploads", "times")
"""The budgets of :data:`UPLOAD_CLAIMS` (keys of :data:`asyncfl_jax.reproduce.verdicts.BUDGET_AXES`)."""


def paper_claim_text(row_name: str | None, method: str, baseline: str) -> str:
    """The paper's numbers of a claim: Table III's GB to the target and the uploads relative to AsynFL's, of the
    method and the baseline, on the paper's row of the task; "-" without that row."""
    a, b = paper_reference(row_name, method), paper_reference(row_name, baseline)
    if a is None or b is None:
        return "-"
    target = PAPER_TABLE3[row_name]["target"]
    return (f"GB to {target:.0%}: {a['gb']:g} vs {b['gb']:g}; uploads vs AsynFL {a['uploads_ratio']:.2f} vs "
            f"{b['uploads_ratio']:.2f} ({PAPER_ROW_NAMES[row_name]})")


def claim_runs(result: dict) -> dict[str, list[dict]]:
    """Per method, one record per seed at its chosen server lr (the task's ``curves``): ``uploads``, ``times``,
    ``bits`` (the paper's cost model), ``local_steps`` (K per upload) and ``accuracy``, for
    :func:`asyncfl_jax.reproduce.verdicts.claim_verdicts`."""
    K = result["settings"]["local_steps"]
    out = {}
    for method, c in result["curves"].items():
        out[method] = [{"uploads": c["uploads"][s], "times": c["times"][s], "bits": c["paper_bits"][s],
                        "local_steps": [K * u for u in c["uploads"][s]], "accuracy": c["accuracy"][s]}
                       for s in range(len(c["accuracy"]))]
    return out


def task_verdicts(result: dict) -> list:
    """The verdicts of the claims whose two methods ran on the task (:data:`UPLOAD_CLAIMS` at equal uploads and
    virtual time, :data:`BITS_CLAIMS` at equal bits), beside the paper's numbers of its row."""
    from asyncfl_jax.reproduce.verdicts import claim_verdicts

    runs, row = claim_runs(result), result["settings"]["paper_row"]

    def with_paper(claims):
        return [(text, m, b, paper_claim_text(row, m, b)) for text, m, b in claims]

    return (claim_verdicts(runs, with_paper(UPLOAD_CLAIMS), axes=CLAIM_AXES)
            + claim_verdicts(runs, with_paper(BITS_CLAIMS), axes=("bits",)))


def verdict_section(result: dict) -> list[str]:
    """The task's verdict table with how to read its parity claims; empty when no claim's two methods ran."""
    from asyncfl_jax.reproduce.verdicts import verdict_lines

    verdicts = task_verdicts(result)
    if not verdicts:
        return []
    cfg = result["settings"]
    lines = ["", *verdict_lines(verdicts, f"Verdicts on the paper's claims ({cfg['task']}, {len(cfg['seeds'])} seeds, "
                                         "each method at its chosen server lr)"),
            "A claim marked ≈ is one of parity (the method not below the baseline): 'holds' or 'within noise' "
            "supports it, 'reversed' refutes it."]
    if cfg.get("fastest_share") is not None:
        lines.append(f"Share of uploads made by the fastest 20% of the clients in the window schedules (uniform "
                     f"participation: 20%): {cfg['fastest_share']:.1%}.")
    return lines


def claims_figure(result: dict, path: str) -> str | None:
    """The paper-style figure of a task's claim methods (:data:`CLAIM_METHODS` and FedBuff that ran): one line per
    method with a min-max band over the seeds, against uploads, virtual time and uploaded bits (log scale), the
    y-axis fitted to the data (:func:`asyncfl_jax.figures.fitted_ylim`), the setting in the title; written as a PNG
    at ``path``, which is returned (None when fewer than two of them ran)."""
    from asyncfl_jax.figures import fitted_ylim, save_figure_files, seed_curve

    cfg = result["settings"]
    names = [m for m in ("FedBuff", *CLAIM_METHODS) if m in result["curves"]]
    if len(names) < 2:
        return None
    lr = {r["method"]: r["server_lr"] for r in result["rows"]}
    runs = claim_runs(result)
    curves = [seed_curve(f"{m} (eta_g {lr[m]:g})", runs[m], axes={"uploads": "uploads", "time": "times",
                                                                   "bits": "bits"}) for m in names]
    plt = pyplot()
    fig, panels = plt.subplots(1, 3, figsize=(13.8, 4.1), layout="constrained")
    limits = fitted_ylim(curves, key="uploads")
    handles = []
    for k, c in enumerate(curves):
        colour = f"C{k % 10}"
        for ax, key in zip(panels, ("uploads", "time", "bits")):
            x = np.asarray(c[key])
            keep = x > 0 if key == "bits" else np.ones(x.size, bool)
            (line,) = ax.plot(x[keep], c["mean"][keep], color=colour, lw=1.6, label=f"{c['label']} ({c['n']} seeds)")
            if c["n"] > 1:
                ax.fill_between(x[keep], c["lo"][keep], c["hi"][keep], color=colour, alpha=0.2, lw=0)
        handles.append(line)
    for ax, label in zip(panels, ("client uploads", "virtual time (s)", "uploaded bits (paper's cost model)")):
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        if limits is not None:
            ax.set_ylim(*limits)
    panels[1].xaxis.set_major_locator(plt.MaxNLocator(5))  # virtual times of five digits do not overlap
    panels[2].set_xscale("log")
    hidden = TASKS[cfg["task"]].get("hidden")
    model = f"MLP 784-{'-'.join(str(h) for h in hidden)}-10" if hidden and cfg["model"] == "mlp" else cfg["model"]
    fig.suptitle(f"AsynFLC-EF claims: {cfg['dataset']}, {model} (d = {cfg['d']:,}), n = {cfg['clients']}, "
                 f"{cfg['partition']}, W = {cfg['window']:g} s, K = {cfg['local_steps']}, B = {cfg['batch_size']}, "
                 f"eta_l = {cfg['client_lr']:g}, {cfg['rounds']} rounds\ntest accuracy (mean, min-max over seeds; "
                 f"each method at its best eta_g of {cfg['server_lr']})", fontsize="medium")
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize="small",
               frameon=False)
    save_figure_files(fig, path, dpi=90)
    return path


def task_fastest_share(windows: list[Schedule], seeds: list[int]) -> float:
    """The share of uploads made by the fastest 20% of the clients in the window schedules (mean over the seeds;
    :func:`asyncfl_jax.reproduce.verdicts.schedule_fastest_share`)."""
    from asyncfl_jax.reproduce.verdicts import schedule_fastest_share

    return float(np.mean([schedule_fastest_share(s, delay_model(), seed) for s, seed in zip(windows, seeds)]))


def format_task(result: dict) -> str:
    """The section of ``table.md`` of one task: its setup, every method beside Table III, the grids, the heat map and
    the waiting times, and the claims."""
    lines = task_setup_lines(result) + method_lines(result) + grid_lines(result) + heatmap_lines(result)
    lines += waiting_time_lines(result)
    if result["checks"]:
        lines += ["", "The paper's claims on these means:", ""] + [f"- {c}" for c in result["checks"]]
    lines += verdict_section(result)
    return "\n".join(lines) + "\n"


def task_setup_lines(result: dict) -> list[str]:
    """The task's title, its settings and delay statistics, and the head of the methods' table."""
    cfg = result["settings"]
    S = len(cfg["seeds"])
    target = cfg["target"]
    paper_row = PAPER_ROW_NAMES.get(cfg["paper_row"], None)
    stats = cfg["delay_statistics"]
    return [f"### {cfg['task']}: {cfg['dataset']}, {cfg['model']} (d = {cfg['d']:,}), target {target:.0%}", "",
            f"n = {cfg['clients']}, {cfg['partition']}, K = {cfg['local_steps']}, batch {cfg['batch_size']}, local "
            f"lr {cfg['client_lr']:g}, W = {cfg['window']:g} s ({cfg['window_semantics']}), T = {cfg['rounds']} "
            f"rounds, FedBuff M = {cfg['buffer_size']}; seeds {cfg['seeds']}; server lr grid {cfg['server_lr']} "
            f"(FedBuff: {cfg['fedbuff_server_lr']}; each method at the value with the best final accuracy). Test set: "
            f"{cfg['test_examples']} examples. "
            f"Window schedules: |S_t| mean {np.mean([s['S_mean'] for s in stats]):.1f} of {cfg['clients']}, "
            f"tau_max {max(s['tau_max'] for s in stats)}, tau_avg0 {np.mean([s['tau_avg0'] for s in stats]):.2f}, "
            f"tau_avg1 {np.mean([s['tau_avg1'] for s in stats]):.2f}, tau_avgm0 "
            f"{np.mean([s['tau_avgm0'] for s in stats]):.2f}, tau_avgm1 {np.mean([s['tau_avgm1'] for s in stats]):.2f}"
            f", arrival staleness mean {np.mean([s['staleness_mean'] or 0 for s in stats]):.2f}.", "",
            f"Bits to {target:.0%} in the paper's cost model (32 d, b d, 32 k, b k), the mean over seeds ('k/{S}': "
            "reached by k seeds only); beside it the paper's Table III" + (f" row {paper_row}" if paper_row else
                                                                            " (no row for this task)") +
            " as GB, bits ratio (AsynFL / method) and uploads relative to AsynFL.", "",
            "| method | server lr | final acc. | bits to target | x fewer bits than AsynFL (paper) | uploads vs "
            "AsynFL (paper) | paper GB | bits + scale + index | uploads to target | rounds / steps to target | "
            "time to target (s) | diverged |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]


def method_lines(result: dict) -> list[str]:
    """One row per method: its server lr, final accuracy, costs to the target and the paper's numbers."""
    S = len(result["settings"]["seeds"])
    lines = []
    for r in result["rows"]:
        p = r["paper"] or {}
        ok = r["seeds_reached"] == S

        def cost(v, digits=None):
            if not ok:
                return f"not reached ({r['seeds_reached']}/{S})"
            return fmt_bits(v) if digits is None else f"{v:.{digits}f}"

        div = yes_no(r["diverged_seeds"])
        if r["diverged_in_grid"]:
            div += f" ({r['diverged_in_grid']} grid runs)"
        lines.append(
            f"| {r['method']} | {r['server_lr']:g} | {r['final_accuracy']:.4f} | {cost(r['bits_to_target'])} | "
            f"{fmt_ratio(r['bits_ratio'])} ({fmt_ratio(p.get('bits_ratio'))}) | {fmt_ratio(r['uploads_ratio'], 2)} "
            f"({fmt_ratio(p.get('uploads_ratio'), 2)}) | {p.get('gb', '-')} | {cost(r['bits_with_index_to_target'])} | "
            f"{cost(r['uploads_to_target'], 0)} | {cost(r['rounds_to_target'], 0)} | {cost(r['time_to_target'], 0)} | "
            f"{div} |")
    return lines


def grid_lines(result: dict) -> list[str]:
    """Every server lr of the grid, per method (when a grid has more than one value)."""
    lines = []
    width = max(len(r["grid"]) for r in result["rows"])
    if width > 1:
        lines += ["", "Every server lr of the grid: server lr: final accuracy / bits to target ('-': not reached on "
                  "every seed; 'div': diverged on some seed).", "",
                  "| method | " + " | ".join(f"grid value {g + 1}" for g in range(width)) + " |",
                  "|---" * (width + 1) + "|"]
        for r in result["rows"]:
            lines.append(f"| {r['method']} | " + " | ".join(
                f"{c['server_lr']:g}: {c['final_accuracy']:.4f} / {fmt_bits(c['bits_to_target'])}"
                f"{' div' if c['diverged_seeds'] else ''}" for c in r["grid"]) + " |")
    return lines


def heatmap_lines(result: dict) -> list[str]:
    """AsynFLC-EF over the k/d x quantization-bits grid."""
    lines = []
    if result["heatmap"]:
        fractions = sorted({c["fraction"] for c in result["heatmap"]})
        bits = sorted({c["quant_bits"] for c in result["heatmap"]})
        at = {(c["fraction"], c["quant_bits"]): c for c in result["heatmap"]}
        lines += ["", "AsynFLC-EF over k/d x quantization bits (32: top-k alone): x fewer bits than AsynFL to the "
                  "target, measured (paper), / uploads vs AsynFL / final accuracy.", "",
                  "| k/d | " + " | ".join(f"{b} bits" for b in bits) + " |", "|---" * (len(bits) + 1) + "|"]
        for f in fractions:
            cells = []
            for b in bits:
                c = at[(f, b)]
                p = c["paper"] or {}
                cells.append(f"{fmt_ratio(c['bits_ratio'])} ({fmt_ratio(p.get('bits_ratio'))}) / "
                             f"{fmt_ratio(c['uploads_ratio'], 2)} / {c['final_accuracy']:.3f}")
            lines.append(f"| {f:g} | " + " | ".join(cells) + " |")
    return lines


def waiting_time_lines(result: dict) -> list[str]:
    """Fig. 4: the window method at every waiting time W, with the delay statistics of its schedules."""
    cfg = result["settings"]
    S = len(cfg["seeds"])
    lines = []
    wt = result.get("waiting_time")
    if wt:
        lines += ["", f"Waiting time W (Fig. 4): {wt['method']} at server lr {wt['server_lr']:g}, T = {cfg['rounds']} "
                  "rounds each; delay statistics of the window schedules (mean over seeds).", "",
                  "| W (s) | final acc. | rounds to target | time to target (s) | uploads to target | bits to target "
                  "| mean size of S_t | tau_max | tau_avg0 | tau_avg1 | tau_avgm0 | tau_avgm1 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in wt["windows"]:
            st = e["delay_statistics"]

            def mean(key):
                return float(np.mean([s[key] for s in st]))

            def reach(key, digits=0):
                v = e[key]
                return f"not reached ({e['seeds_reached']}/{S})" if v is None else (
                    fmt_bits(v) if key == "bits_to_target" else f"{v:.{digits}f}")

            lines.append(f"| {e['window']:g} | {e['final_accuracy']:.4f} | {reach('rounds_to_target')} | "
                         f"{reach('time_to_target')} | {reach('uploads_to_target')} | {reach('bits_to_target')} | "
                         f"{mean('S_mean'):.1f} | {max(s['tau_max'] for s in st)} | {mean('tau_avg0'):.2f} | "
                         f"{mean('tau_avg1'):.2f} | {mean('tau_avgm0'):.2f} | {mean('tau_avgm1'):.2f} |")
    return lines


def format_paper_table() -> str:
    """The paper's Table III as Markdown."""
    lines = ["### The paper's Table III (GB to the target, non-IID)", "",
             "| task | " + " | ".join(TABLE3_METHODS) + " |", "|---" * (len(TABLE3_METHODS) + 1) + "|"]
    for row, name in PAPER_ROW_NAMES.items():
        lines.append(f"| {name} | " + " | ".join(f"{PAPER_TABLE3[row]['gb'][m]:g}" for m in TABLE3_METHODS) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ figures
STYLE = {"FedBuff": ("k", ":"), "AsynFL": ("tab:blue", "-")}
COLORS = ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
          "tab:gray", "gold", "navy", "lime", "teal", "crimson", "darkkhaki", "slateblue"]


def style_of(name: str, index: int) -> tuple[str, str]:
    """(color, line style) of a method: FedBuff and AsynFL fixed, the others by their index among a task's methods
    (so a method has one color in every panel); dashed without error feedback."""
    if name in STYLE:
        return STYLE[name]
    return COLORS[index % len(COLORS)], "-" if "-EF" in name else "--"


def figure_groups(result: dict) -> list[tuple[str, list[str]]]:
    """The panels of a task's curves: the methods of the paper's Figs. 1-3 that ran, and the others."""
    have = set(result["curves"])
    groups = [(title, [m for m in names if m in have]) for title, names in
              (("Fig. 1 methods", FIG1), ("Fig. 2: top-k ratios", FIG2), ("Fig. 3: top-k + quantization", FIG3))]
    groups = [(t, names) for t, names in groups if len(names) > 1]
    rest = [m for m in result["curves"] if not any(m in names for _, names in groups)]
    if rest:
        groups.append(("other methods", [m for m in ("FedBuff", "AsynFL") if m in have and m not in rest] + rest))
    return groups


def plot_curves(results: list[dict], path: str, axis: str) -> None:
    """Test accuracy against uploaded bits (``axis="bits"``) or virtual time, one row per task, one panel per
    figure group."""
    plt = pyplot()

    rows = [(res, figure_groups(res)) for res in results]
    cols = max(len(g) for _, g in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(4.6 * cols, 3.5 * len(rows)), squeeze=False, sharey="row")
    for i, (res, groups) in enumerate(rows):
        cfg = res["settings"]
        order = [m for m in res["curves"] if m not in STYLE]
        for j, (title, names) in enumerate(groups):
            ax = axes[i, j]
            for name in names:
                k = order.index(name) if name in order else 0
                c = res["curves"][name]
                x = np.mean(np.asarray(c["paper_bits" if axis == "bits" else "times"]), axis=0)
                y = np.mean(np.asarray(c["accuracy"]), axis=0)
                keep = x > 0 if axis == "bits" else np.ones_like(x, dtype=bool)
                color, ls = style_of(name, k)
                ax.plot(x[keep], y[keep], color=color, linestyle=ls, label=name, linewidth=1.2)
            ax.axhline(cfg["target"], color="grey", linewidth=0.6)
            if axis == "bits":
                ax.set_xscale("log")
                ax.set_xlabel("cumulative uploaded bits (paper's cost model)")
            else:
                ax.set_xlabel("virtual time (s)")
            ax.set_title(f"{cfg['task']}: {title}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6.5)
        for j in range(len(groups), cols):
            axes[i, j].axis("off")
        axes[i, 0].set_ylabel("test accuracy (mean over seeds)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_heatmap(results: list[dict], path: str) -> None:
    """The heat maps of AsynFLC-EF over k/d x quantization bits: bits ratio, uploads ratio, final accuracy."""
    plt = pyplot()

    results = [r for r in results if r["heatmap"]]
    if not results:
        return
    fig, axes = plt.subplots(len(results), 3, figsize=(13, 3.4 * len(results)), squeeze=False)
    for i, res in enumerate(results):
        cells = res["heatmap"]
        fractions = sorted({c["fraction"] for c in cells})
        bits = sorted({c["quant_bits"] for c in cells})
        at = {(c["fraction"], c["quant_bits"]): c for c in cells}
        panels = (("bits_ratio", "x fewer bits than AsynFL (paper)", True),
                  ("uploads_ratio", "uploads to target vs AsynFL (paper)", False),
                  ("final_accuracy", "final test accuracy", False))
        for ax, (key, title, log) in zip(axes[i], panels):
            grid = np.array([[np.nan if at[(f, b)][key] is None else at[(f, b)][key] for b in bits]
                             for f in fractions], dtype=np.float64)
            shown = np.log10(grid) if log else grid
            im = ax.imshow(shown, cmap="viridis", aspect="auto", origin="lower")
            fig.colorbar(im, ax=ax, fraction=0.046, label="log10" if log else None)
            finite = shown[np.isfinite(shown)]
            middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
            for a, f in enumerate(fractions):
                for b_i, b in enumerate(bits):
                    v = grid[a, b_i]
                    color = "black" if np.isfinite(shown[a, b_i]) and shown[a, b_i] > middle else "white"
                    text = "n/r" if not np.isfinite(v) else (f"{v:.0f}" if key == "bits_ratio" else
                                                             f"{v:.2f}" if key == "uploads_ratio" else f"{v:.3f}")
                    p = at[(f, b)]["paper"]
                    if p is not None and key in p:
                        text += f"\n({p[key]:.0f})" if key == "bits_ratio" else f"\n({p[key]:.2f})"
                    ax.text(b_i, a, text, ha="center", va="center", fontsize=7, color=color)
            ax.set_xticks(range(len(bits)), [f"{b}" if b < 32 else "32 (top-k)" for b in bits])
            ax.set_yticks(range(len(fractions)), [f"{f:g}" for f in fractions])
            ax.set_xlabel("quantization bits b")
            ax.set_ylabel("k/d")
            ax.set_title(f"{res['settings']['task']}: {title}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot_windows(results: list[dict], path: str) -> None:
    """Fig. 4: the window method at every waiting time W against rounds, virtual time and uploaded bits."""
    plt = pyplot()

    results = [r for r in results if r.get("waiting_time")]
    if not results:
        return
    fig, axes = plt.subplots(len(results), 3, figsize=(13.5, 3.4 * len(results)), squeeze=False, sharey="row")
    for i, res in enumerate(results):
        wt, cfg = res["waiting_time"], res["settings"]
        for k, e in enumerate(wt["windows"]):
            c = e["curves"]
            y = np.mean(np.asarray(c["accuracy"]), axis=0)
            color = plt.cm.viridis(k / max(1, len(wt["windows"]) - 1))
            label = f"{wt['method']} ({e['window']:g} s)"
            axes[i, 0].plot(c["steps"], y, color=color, label=label)
            axes[i, 1].plot(np.mean(np.asarray(c["times"]), axis=0), y, color=color, label=label)
            bits = np.mean(np.asarray(c["paper_bits"]), axis=0)
            axes[i, 2].plot(bits[bits > 0], y[bits > 0], color=color, label=label)
        for name in ("FedBuff", "AsynFL"):
            if name in res["curves"]:
                c = res["curves"][name]
                y = np.mean(np.asarray(c["accuracy"]), axis=0)
                color, ls = style_of(name, 0)
                label = name if name == "FedBuff" else f"AsynFL ({cfg['window']:g} s)"
                if name != "FedBuff":  # a FedBuff step is a buffer flush, not a round
                    axes[i, 0].plot(c["steps"], y, color=color, linestyle=ls, label=label)
                axes[i, 1].plot(np.mean(np.asarray(c["times"]), axis=0), y, color=color, linestyle=ls, label=label)
                bits = np.mean(np.asarray(c["paper_bits"]), axis=0)
                axes[i, 2].plot(bits[bits > 0], y[bits > 0], color=color, linestyle=ls, label=label)
        for ax, xl in zip(axes[i], ("round (server step)", "virtual time (s)",
                                    "cumulative uploaded bits")):
            ax.axhline(cfg["target"], color="grey", linewidth=0.6)
            ax.set_xlabel(xl)
            ax.grid(alpha=0.3, which="both")
        axes[i, 2].set_xscale("log")
        axes[i, 0].set_ylabel("test accuracy")
        axes[i, 0].set_title(f"{cfg['task']}: waiting time W (Fig. 4)", fontsize=9)
        axes[i, 1].legend(fontsize=6.5)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------------------------------------ main
def plan(args: AsynflcEfSettings) -> str:
    """The settings, the programs and an estimate of the biggest program's memory, per task."""
    lines = []
    for name in args.tasks:
        cfg = settings_of(name, args)
        shape = (32, 32, 3) if TASKS[name]["dataset"] == "cifar10" else (60,) if TASKS[name]["dataset"] == \
            "synthetic" else (28, 28, 1)
        d = make_model(cfg["model"], shape, 10, **model_options(name, cfg["model"])).num_params
        methods = all_methods(args)
        replicas = cfg["seeds_per_program"] * max(len(cfg["server_lr"]), len(cfg["fedbuff_server_lr"]))
        # EF residuals and pending messages (n x d each) and the jobs of a step (up to n models and their gradients
        # and updates, about 3 n d); activations not counted.
        gib = 5 * cfg["clients"] * d * 4 * replicas / 2**30
        lines.append(f"{name}: {cfg['dataset']}, {cfg['model']} (d = {d:,}), n = {cfg['clients']}, "
                     f"{cfg['partition']}, K = {cfg['local_steps']}, batch {cfg['batch_size']}, local lr "
                     f"{cfg['client_lr']:g}, W = {cfg['window']:g} s ({cfg['window_semantics']}), T = {cfg['rounds']} "
                     f"rounds, target {cfg['target']:g}, seeds {cfg['seeds']} ({cfg['seeds_per_program']} per "
                     f"program), server lr {cfg['server_lr']} (FedBuff {cfg['fedbuff_server_lr']}); "
                     f"{len(methods)} methods "
                     f"({', '.join(m.name for m in methods)})" + (f", Fig. 4 part: {args.window_method} at W = "
                                                                    f"{args.windows}" if args.windows else "") +
                     f"; about {gib:.1f} GiB per program (5 n d floats per replica: client residuals, pending "
                     "messages, the jobs of a step; activations not counted)")
        problem = check_data(name, args)
        if problem:
            lines.append(f"  data: NOT AVAILABLE. {problem.splitlines()[0]}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class AsynflcEfSettings(ReproductionSettings):
    """The settings of one AsynFLC-EF reproduction: the command line's options after :func:`parse_args` filled in
    the defaults of ``--scale`` and ``--quick`` and parsed the methods (``method_specs``). Build it with
    :func:`parse_settings` (a command line) or :meth:`from_keywords` (the options as keywords); both check it alike.

    Attributes:
        scale: the scale of ``SCALES`` (``cpu``: Fashion-MNIST logreg, n = 50; ``paper``: the paper's tasks).
        tasks: the tasks run (``TASKS`` keys).
        quick: one seed, 30 rounds, a server lr grid of two values.
        dry_run: print the plan (settings, programs, memory) and stop.
        from_results: a ``results.json`` whose table and figures are remade without running, or None.
        methods: the methods of the main comparison (their names, e.g. ``AsynFLC-EF(top3)``).
        fractions: the k/d of the heat map (empty: no heat map).
        quant_bits: the quantization bits of the heat map.
        windows: the waiting times W (s) of the Fig. 4 part (empty: no Fig. 4 part).
        window_method: the method of the Fig. 4 part.
        clients: n, the number of clients.
        rounds: T, the AsynFL rounds per run (None: per task).
        seeds: the training and timing seeds (distinct, in [0, 1000)).
        server_lr: the eta_g grid of the AsynFL family.
        fedbuff_server_lr: the eta_g grid of FedBuff.
        client_lr: the local SGD step size eta (None: per task).
        target: the test accuracy to reach (None: per task).
        model: the model overriding the task's, or None.
        local_steps: K, the local SGD steps per job.
        batch_size: the clients' minibatch.
        window: the AsynFL servers' waiting time W in seconds.
        window_semantics: ``wait`` (a reporting client restarts from x_{t+1} when the window closes) or
            ``immediate`` (it restarts at once from x_t).
        buffer_size: FedBuff's M.
        dirichlet_alpha: the concentration of the Dirichlet label split.
        iid: a uniform split instead of the Dirichlet one.
        qsgd_norm: the scale of AsynFLC(Qb): ``max`` (max-abs) or ``l2`` (literal QSGD).
        evals: the evaluations per run (about).
        seeds_per_program: the seeds run together in one program (None: all, or the task's).
        data_dir: the folder of the MNIST / Fashion-MNIST IDX files; None: the default places.
        tfds_data_dir: the TFDS data folder (CIFAR-10); None: ``$TFDS_DATA_DIR``.
        out: the output folder.
        method_specs: the parsed methods of ``methods`` (:class:`Method`), in order, without repeats.
    """

    scale: str
    tasks: list[str]
    quick: bool
    dry_run: bool
    from_results: str | None
    methods: list[str]
    fractions: list[float]
    quant_bits: list[int]
    windows: list[float]
    window_method: str
    clients: int
    rounds: int | None
    seeds: list[int]
    server_lr: list[float]
    fedbuff_server_lr: list[float]
    client_lr: float | None
    target: float | None
    model: str | None
    local_steps: int
    batch_size: int
    window: float
    window_semantics: str
    buffer_size: int
    dirichlet_alpha: float
    iid: bool
    qsgd_norm: str
    evals: int
    seeds_per_program: int | None
    data_dir: str | None
    tfds_data_dir: str | None
    out: str
    method_specs: list[Method]

    @classmethod
    def from_keywords(cls, **options: Any) -> AsynflcEfSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, methods=["AsynFL", "AsynFLC-EF(top3)"], windows=[]``): the same defaults, filling and checks
        as :func:`parse_args`; a refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with
        the command line's message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> AsynflcEfSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return AsynflcEfSettings.from_args(parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    """The command: ``--dry-run`` prints the plan, ``--from-results`` remakes the table and figures, else every task
    runs and ``table.md``, ``results.json`` and the figures are written to ``--out``; 2 when data are missing."""
    return command_main(argv, parse_settings, lambda args, _: [run_task(name, args) for name in args.tasks],
                        report_runs, load=check_tasks_data, early=without_running)


def without_running(args: AsynflcEfSettings) -> int | None:
    """``--dry-run`` (the plan) and ``--from-results`` (the table and figures of saved results): 0; else None."""
    if args.dry_run:
        print(plan(args))
        return 0
    if args.from_results:
        with open(args.from_results) as f:
            data = json.load(f)
        os.makedirs(args.out, exist_ok=True)
        print(write_report(data, args.out, write_json=os.path.abspath(os.path.dirname(args.from_results)) !=
                           os.path.abspath(args.out)))
        return 0
    return None


def check_tasks_data(args: AsynflcEfSettings) -> None:
    """``DataUnavailable`` listing every task whose data are missing."""
    missing = [m for m in (check_data(t, args) for t in args.tasks) if m]
    if missing:
        raise DataUnavailable("\n\n".join(missing) + "\n\nGet the data (see above) or choose tasks with --tasks (e.g. "
                              "--tasks fmnist_mlp; --tasks synthetic_logreg needs no download).")


def report_runs(args: AsynflcEfSettings, results: list[dict], seconds: float) -> str:
    """``table.md``, ``results.json`` and the figures of the tasks' results; returns the table."""
    saved = {k: v for k, v in vars(args).items() if k != "method_specs"}
    return write_report(to_json({"args": saved, "paper_table3": PAPER_TABLE3, "tasks": results,
                                 "seconds": round(seconds, 1)}), args.out, write_json=True)


def write_report(data: dict, out: str, write_json: bool) -> str:
    """``table.md``, the figures and (``write_json``) ``results.json`` from the results; returns the table."""
    results, saved = data["tasks"], data["args"]
    title = (f"# AsynFLC-EF reproduction (--scale {saved['scale']}{', --quick' if saved['quick'] else ''})\n\n"
             "Upload volume to reach the target test accuracy (Table III), AsynFLC-EF's compression grid, and the "
             "waiting time W (Fig. 4).\n")
    table = "\n".join([title, *(format_task(r) for r in results), format_paper_table(),
                       f"Wall time: {data['seconds']} s.\n"])
    write_atomic(os.path.join(out, "table.md"), table)
    plot_curves(results, os.path.join(out, "accuracy_vs_bits.png"), "bits")
    plot_curves(results, os.path.join(out, "accuracy_vs_time.png"), "time")
    plot_heatmap(results, os.path.join(out, "heatmap.png"))
    plot_windows(results, os.path.join(out, "waiting_time.png"))
    for r in results:
        claims_figure(r, os.path.join(out, f"claims_{r['settings']['task']}.png"))
    if write_json:
        write_atomic(os.path.join(out, "results.json"), json.dumps(data, indent=1))
    return table
