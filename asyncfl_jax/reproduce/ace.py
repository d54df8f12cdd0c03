"""The ACE/ACED paper's experiments (Chang et al., "Mitigating Participation Imbalance Bias in Asynchronous
Federated Learning"; digest 000): ACE and ACED against FedBuff, CA2FL, Vanilla ASGD and Delay-adaptive ASGD.

Methods (every client computes ONE minibatch gradient per upload, K = 1, as in the paper's App. F.4):

====================  =========================================================  ==================================
method                server rule (``asyncfl_jax`` algorithm)                     protocol
====================  =========================================================  ==================================
ACE                   x -= eta (1/n) sum_i U_i on every arrival, U_i the latest  ``all_active``: every client always
                      gradient of EVERY client (``ace``, init round at x0)        training, one arrival per step
ACED (tau_algo)       the same over A(t) = {i : t - t_i^start <= tau_algo},       ``all_active``
                      1/|A(t)| (``aced``, Alg. a.1 literally)
FedBuff               x += eta mean of M = 10 buffered deltas (``fedbuff``)       ``concurrent``, Mc clients,
CA2FL                 FedBuff step calibrated by every client's cached delta      refill on arrival (Alg. a.2/a.3)
                      (``ca2fl``)
Vanilla ASGD          x -= eta g on every arrival                                 ``concurrent``, buffer 1
Delay-adaptive ASGD   x -= eta min(1, tau_C / tau) g, tau_C = its concurrency     (``--asgd-concurrency``, default n)
                      (``delay_adaptive_asgd``)
====================  =========================================================  ==================================

FedBuff and CA2FL clients upload the delta of one local SGD step, ``Delta = -eta_l g`` (eta_l = ``--client-lr``,
0.05 in Tab. a.4); the others upload the raw gradient. Vanilla ASGD runs as ``delay_adaptive_asgd`` with
``tau_C = 1e9``, which is exactly ``x -= eta g`` (``min(1, 1e9 / tau) = 1``), so that both ASGDs share one compiled
program.

Delays (digest section 3.3-3.4; ``--delay-model``). ``client_exp`` (default): client i has a persistent speed
``s_i ~ Exp(mean beta)`` drawn once per seed, and a job takes ``t_fix + s_i * Exp(1)`` (t_fix = ``--t-fix`` = 1):
client i's mean job time is ``1 + s_i``, so beta sets the SPREAD of the client speeds and with it the participation
imbalance (``DelayModel(speed="exponential", speed_value=beta, noise="exponential", comm_time=t_fix)``).
``iid_exp`` is the paper-literal reading (every job ``Exp(mean beta)``, all clients alike): under it beta only
rescales time, so it cannot change any result measured in server steps (digest 3.3.1).

Two experiments:

1. **Fig. 2 (and Fig. a.2, CIFAR-100)**: test accuracy against virtual time, one panel per heterogeneity setting
   (Dirichlet alpha x delay beta), and a table of final accuracies (mean +- 2 standard errors over seeds, the
   convention of Tab. a.2) beside the paper's Table a.2 (20Newsgroup; the only numeric table of the paper, shown as
   its reference: 20Newsgroup itself is not reproduced, this project has no text loader nor BERT models).
2. **Fig. 3 (dropout robustness)**: at setting ``--dropout-setting`` (Dir(0.3), beta 5 in the paper) a fraction of
   the clients leaves for good halfway through each run (at the virtual time of the method's server step T/2 in its
   own schedule; ``DelayModel(dropout_fraction, dropout_time)``), for fractions ``--dropout-fractions``: final
   accuracy of ACED (tau_algo = 10) against ACE (whose 1/n mean keeps the dropped clients' last gradients forever),
   CA2FL and Vanilla ASGD (3a), and the tau_algo ablation of ACED (3b), with ACED's mean |A(t)| after the dropout
   (computed on the host from the schedule: A(t) depends on the arrivals only).

Scales (``--scale``):

* ``cpu`` (default): Fashion-MNIST (IDX files; ``--dataset synthetic`` uses LEAF Synthetic(1, 1) pooled and
  re-split instead), the MLP 784-200-200-10 (non-convex, as the paper's models; ``--model logreg`` for the earlier
  convex setting), n = 100 clients, a Dirichlet(0.1) split and strongly skewed client speeds (beta = 30: the fastest
  20% of the clients make about two thirds of the uploads), seeds 0-4, batch 50, **every client always training**
  (FedBuff and CA2FL at concurrency n with buffer 10, the ASGDs at concurrency n) and **the same number of client
  uploads for every method** (``--uploads``, 2,000: 2,000 server steps of ACE/ACED/ASGD, 200 of FedBuff/CA2FL; ACE
  and ACED also upload n gradients in their initialization round at x0, which takes no virtual time). Every upload
  is one minibatch gradient, so equal uploads are equal local computation too. Each method's server step size is
  ``CPU_DEFAULT_LR``, chosen by a sweep over ``CPU_GRIDS`` on seed 0 (``--tune`` repeats it: a vmapped sweep per
  method, the lowest final training loss, the global objective F = (1/n) sum F_i on a fixed 5,000-example sample of
  the clients' data, so the test set never chooses). The dropout study runs with ``--no-skip-dropout``; it keeps, for
  every fraction, each method's step size selected at 0% dropout (the main comparison's at that (alpha, beta) when it
  ran the method with the same hyper-parameters). ``table.md`` ends with a verdict table per setting
  (:mod:`asyncfl_jax.reproduce.verdicts`) and the share of uploads of the fastest 20% of the clients.
* ``paper``: CIFAR-10 (``--dataset cifar100``: CIFAR-100, alpha in {0.1, 0.3, 1, 10} x beta in {1, 5, 20, 30}, as
  Fig. a.2) through TensorFlow Datasets, ResNet-18 with GroupNorm (``resnet18_gn``), n = 100, T = 500 server
  iterations for every method (the paper's x-axis: FedBuff/CA2FL then use 10x the uploads), 5 seeds, Tab. a.4: eta =
  0.2 sqrt(n/T) for every method, eta_l = 0.05, batch 50, M = 10, Mc = 20 for FedBuff/CA2FL, ACED tau_algo = 50
  (Fig. a.2) and 10 in the dropout study with fractions 0, 0.1, ..., 0.7. ``--tune`` sweeps the paper's grid
  c in {10, 5, 2, 1, 0.5, 0.2, 0.1} (eta = c sqrt(n/T)); ``--delta-lr matched`` gives FedBuff/CA2FL eta / eta_l, the
  same step per gradient as ACE (digest section 8, item 4: the literal setting makes their step 20x smaller). Images are
  standardized per channel; the paper's random-crop/flip augmentation is NOT reproduced (clients draw minibatches
  from fixed arrays). It needs the TFDS copy of the dataset (``tfds build cifar10 --file_format=array_record``,
  ``--data-dir``) and, for ResNet-18 at n = 100 (a 4.5 GB cache of 100 x 11.2M floats per replica for ACE, ACED and
  CA2FL, plus as much for the in-flight messages), an accelerator: a program whose replicas exceed the simulator's
  memory budget is split in halves automatically (``--max-replicas`` caps them from the start), and
  ``--cache bfloat16`` halves the caches.

The command is ``scripts/reproduce_ace.py`` (examples in its docstring, options in ``--help``).

It writes ``table.md`` (also printed), ``results.json`` (arguments, selected step sizes, per-setting summaries, the
checks of the paper's claims, schedule statistics, every evaluation of every selected run), ``accuracy.png``
(accuracy vs virtual time, one panel per (alpha, beta)), ``accuracy_steps.png`` (the same vs server iterations, the
paper's axis) and ``dropout.png`` (Fig. 3a/3b and the curves at the largest fraction) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any

import numpy as np

from asyncfl_jax import (LocalConfig, ReplicaSpec, Schedule, Task, get_algorithm, make_model, make_schedule,
                         make_task)
from asyncfl_jax.algorithms import Algorithm
from asyncfl_jax.data import Dataset, partition
from asyncfl_jax.reproduce.curves import final_value, mean_on_grid
from asyncfl_jax.reproduce.data import CIFAR_STATS, DATASET_TITLES, DataUnavailable, load_dataset, standardize_channels
from asyncfl_jax.engine.hparams import make_replicas
from asyncfl_jax.reproduce.grid import command_main, replica_runs, run_grid, setting_seed
from asyncfl_jax.reproduce.report import (distinct_seeds_problem, parse_checked, pyplot, save_png, table_row,
                                          write_outputs, yes_no)
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.reproduce.verdicts import (claim_verdicts, participation_line, plot_methods, schedule_fastest_share,
                                            verdict_json, verdict_lines)
from asyncfl_jax.timing import DelayModel, schedule_summary

DROPOUT_SEEDS = 100_000  # the dropout study's training seeds start here
METHODS = ("ace", "aced", "fedbuff", "ca2fl", "da_asgd", "vanilla_asgd")
LABELS = {"ace": "ACE", "aced": "ACED", "fedbuff": "FedBuff", "ca2fl": "CA2FL", "da_asgd": "Delay-adaptive ASGD",
          "vanilla_asgd": "Vanilla ASGD"}
GRADIENT_METHODS = ("ace", "aced", "da_asgd", "vanilla_asgd")  # clients upload a raw gradient
DELTA_METHODS = ("fedbuff", "ca2fl")  # clients upload Delta = -eta_l g
# The order of Tab. a.2 (every column), worst to best.
PAPER_ORDER = ("vanilla_asgd", "da_asgd", "fedbuff", "ca2fl", "aced", "ace")
DROPOUT_METHODS = ("ace", "aced", "ca2fl", "vanilla_asgd")  # Fig. 3a
VANILLA_TAU_C = 1e9  # delay_adaptive_asgd with tau_C = 1e9 is Vanilla ASGD exactly: min(1, 1e9 / tau) = 1

# Table a.2 (20Newsgroup, beta = 5, mean +- 2 SE over 5 runs, %): DistilBERT alpha 0.1 / 1 / 10, BERT-base 0.1 / 1 / 10.
PAPER_TABLE_A2_COLUMNS = ("DistilBERT α=0.1", "DistilBERT α=1", "DistilBERT α=10", "BERT α=0.1", "BERT α=1",
                          "BERT α=10")
PAPER_TABLE_A2 = {
    "vanilla_asgd": ("49.3 ± 2.8", "59.1 ± 2.2", "62.2 ± 1.8", "54.2 ± 2.9", "64.3 ± 2.3", "67.1 ± 1.9"),
    "da_asgd": ("52.4 ± 2.6", "61.8 ± 2.0", "65.3 ± 1.6", "57.3 ± 2.7", "66.8 ± 2.1", "70.2 ± 1.7"),
    "fedbuff": ("55.7 ± 2.4", "65.2 ± 1.8", "68.1 ± 1.5", "60.4 ± 2.5", "70.3 ± 1.9", "73.1 ± 1.6"),
    "ca2fl": ("61.6 ± 2.0", "69.3 ± 1.5", "71.2 ± 1.2", "66.2 ± 2.1", "74.1 ± 1.6", "76.3 ± 1.3"),
    "aced": ("63.1 ± 1.8", "70.7 ± 1.3", "72.6 ± 1.1", "68.3 ± 1.9", "75.7 ± 1.4", "77.6 ± 1.1"),
    "ace": ("63.7 ± 1.7", "71.4 ± 1.2", "73.1 ± 1.0", "68.7 ± 1.8", "76.6 ± 1.3", "78.2 ± 1.0"),
}

# CPU scale: server step sizes swept per method (x -= eta g for the gradient methods; x += eta mean Delta with
# Delta = -0.05 g for FedBuff/CA2FL, so their eta 0.6 .. 20 is 0.03 .. 1 per gradient). The sweep behind
# CPU_DEFAULT_LR (docs/reproduce_ace.md): the cpu setting (MLP, Dir(0.1), beta 30, 2,000 uploads), seed 0, the
# lowest final training loss; every chosen value lies inside its grid (the largest value diverged or was the worst
# for every method).
CPU_GRIDS = {
    "ace": [0.003, 0.01, 0.03, 0.1],
    "aced": [0.003, 0.01, 0.03, 0.1],
    "fedbuff": [0.6, 2.0, 6.0, 20.0],
    "ca2fl": [0.6, 2.0, 6.0, 20.0],
    "da_asgd": [0.003, 0.01, 0.03, 0.1],
    "vanilla_asgd": [0.003, 0.01, 0.03, 0.1],
}
CPU_DEFAULT_LR = {"ace": 0.01, "aced": 0.01, "fedbuff": 2.0, "ca2fl": 2.0, "da_asgd": 0.01,
                  "vanilla_asgd": 0.01}  # the cpu scale's step sizes (the sweep's choices; --tune sweeps again)
PAPER_C_GRID = [10.0, 5.0, 2.0, 1.0, 0.5, 0.2, 0.1]  # eta = c sqrt(n / T), App. F.2

SCALES = {
    # cpu: the 784-200-200-10 MLP at the heterogeneity ACE is about, strongly skewed client speeds (beta = 30) on a
    # Dir(0.1) split; 2,000 uploads per method, 5 seeds, each method at the step size a sweep on seed 0 chose
    # (CPU_DEFAULT_LR; --tune sweeps CPU_GRIDS again); the dropout study only with --no-skip-dropout.
    "cpu": {
        "dataset": "fashion_mnist", "model": "mlp", "clients": 100, "alphas": [0.1], "betas": [30.0],
        "seeds": [0, 1, 2, 3, 4], "budget": "uploads", "uploads": 2000, "steps": 500, "concurrency": None,
        "dropout_fractions": [0.0, 0.2, 0.4, 0.6], "tau_ablation": [1.0, 10.0, 50.0, 100.0], "evals": 30,
        "final_window": 5, "max_replicas": 0, "tune": False, "skip_dropout": True,
    },
    "paper": {
        "dataset": "cifar10", "model": "resnet18_gn", "clients": 100, "alphas": [0.1, 0.3], "betas": [5.0, 30.0],
        "seeds": [0, 1, 2, 3, 4], "budget": "steps", "uploads": 5000, "steps": 500, "concurrency": 20,
        "dropout_fractions": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], "tau_ablation": [1.0, 10.0, 50.0, 100.0, 200.0],
        "evals": 50, "final_window": 1, "max_replicas": 0, "tune": False, "skip_dropout": False,
    },
}
CIFAR100_GRID = {"alphas": [0.1, 0.3, 1.0, 10.0], "betas": [1.0, 5.0, 20.0, 30.0]}  # Fig. a.2 / Tab. a.5
QUICK = {"clients": 20, "alphas": [0.1], "betas": [5.0, 30.0], "seeds": [0], "uploads": 400, "steps": 60,
         "dropout_fractions": [0.0, 0.5], "tau_ablation": [1.0, 50.0], "evals": 10, "final_window": 2}
QUICK_CPU = {"tune": True, "skip_dropout": False}  # the cpu smoke test goes through the sweep and the dropout study
DATASETS = ("fashion_mnist", "synthetic", "cifar10", "cifar100", "20newsgroup")
UNAVAILABLE = ("the paper's 20Newsgroup experiment (Tab. a.2, DistilBERT / BERT-base) is not available in this "
               "project: it has no text-dataset loader and no transformer models; its numbers are printed beside the "
               "reproduced table as the paper's reference")


# ------------------------------------------------------------------------------------------------ arguments
def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/reproduce_ace.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu",
                   help="cpu: Fashion-MNIST MLP, Dir(0.1), skewed speeds, equal uploads, swept step sizes (default); paper: "
                        "CIFAR-10/100 ResNet-18, T = 500 server iterations, Tab. a.4's hyper-parameters")
    p.add_argument("--quick", action="store_true",
                   help="a smoke-sized run: 20 clients, 400 uploads (60 steps at paper scale), alpha 0.1, one seed, "
                        "two grid values, dropout 0 and 50%%")
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="default: fashion_mnist (cpu), cifar10 (paper); synthetic = LEAF Synthetic(1, 1) pooled and "
                        "re-split; 20newsgroup is not available (exits with an error)")
    p.add_argument("--data-dir", default=None, help="IDX folder (Fashion-MNIST) or TFDS data folder (CIFAR)")
    p.add_argument("--model", default=None, help="default: logreg (cpu), resnet18_gn (paper); any make_model name")
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--alphas", type=float, nargs="+", default=None, help="Dirichlet concentrations (lower: more skew)")
    p.add_argument("--betas", type=float, nargs="+", default=None, help="delay parameters beta")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--budget", choices=["uploads", "steps"], default=None,
                   help="uploads: every method gets --uploads client uploads (cpu default); steps: every method gets "
                        "--steps server iterations (paper default)")
    p.add_argument("--uploads", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--client-lr", type=float, default=0.05, help="eta_l of FedBuff/CA2FL's one local step")
    p.add_argument("--buffer-size", type=int, default=10, help="M of FedBuff and CA2FL")
    p.add_argument("--concurrency", type=int, default=None,
                   help="Mc of FedBuff and CA2FL (default: every client (cpu), 20 (paper))")
    p.add_argument("--asgd-concurrency", type=int, default=None,
                   help="clients in flight for the two ASGDs (default: every client; digest section 8, item 2); "
                        "also Delay-adaptive ASGD's tau_C")
    p.add_argument("--tau-algo", type=float, default=50.0, help="ACED's tau_algo in the main comparison (Fig. a.2)")
    p.add_argument("--dropout-tau-algo", type=float, default=10.0, help="ACED's tau_algo in the dropout study")
    p.add_argument("--tau-ablation", type=float, nargs="*", default=None, help="tau_algo values of Fig. 3b")
    p.add_argument("--dropout-fractions", type=float, nargs="+", default=None)
    p.add_argument("--dropout-setting", type=float, nargs=2, default=[0.3, 5.0], metavar=("ALPHA", "BETA"),
                   help="(alpha, beta) of the dropout study (paper: 0.3 5)")
    p.add_argument("--dropout-methods", nargs="+", choices=METHODS, default=list(DROPOUT_METHODS))
    p.add_argument("--skip-dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="run only the Fig. 2 comparison (default: yes at cpu scale, no at paper scale)")
    p.add_argument("--delay-model", choices=["client_exp", "iid_exp"], default="client_exp")
    p.add_argument("--t-fix", type=float, default=1.0, help="fixed part of every job time under client_exp")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                   help="sweep step sizes (cpu: CPU_GRIDS, default on, off: CPU_DEFAULT_LR; paper: c in {10, ..., "
                        "0.1}, default off: c = --lr-c)")
    p.add_argument("--lr-c", type=float, default=0.2, help="paper scale without --tune: eta = c sqrt(n / T)")
    p.add_argument("--delta-lr", choices=["literal", "matched"], default="literal",
                   help="paper scale: FedBuff/CA2FL server eta as Tab. a.4 (literal) or eta / eta_l (matched)")
    p.add_argument("--lr", action="append", default=[], metavar="METHOD=V1,V2",
                   help="server step sizes of a method, overriding the scale's grid (repeatable), e.g. ace=0.1,0.3")
    p.add_argument("--select", choices=["train_loss", "test_accuracy"], default="train_loss",
                   help="how a step size is chosen from a grid: lowest final training loss (default) or highest final "
                        "test accuracy")
    p.add_argument("--cache", choices=["float32", "bfloat16", "int8"], default="float32",
                   help="storage of the per-client caches of ACE, ACED and CA2FL (int8: ACE-8bit / ACED-8bit of "
                        "Fig. a.3, stochastic rounding)")
    p.add_argument("--evals", type=int, default=None, help="evaluations per run (about)")
    p.add_argument("--final-window", type=int, default=None,
                   help="final accuracy = mean of this many last evaluations (cpu 5; paper 1: the value at T)")
    p.add_argument("--max-replicas", type=int, default=None,
                   help="at most this many replicas per compiled program (0: no limit; a program over the memory "
                        "budget is split in halves anyway)")
    p.add_argument("--partition-seed", type=int, default=0, help="seed of the Dirichlet split (shared by all runs)")
    p.add_argument("--out", default="results/reproduce_ace")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the scale's defaults filled in, checked and normalized (sorted grids, 0% dropout added,
    ``lr_override`` parsed); a bad argument exits with a usage error."""
    p = build_parser()
    args = parse_checked(p, argv, apply_scale_defaults, argument_problem)
    normalize_arguments(args)
    try:
        args.lr_override = parse_lr_overrides(args.lr)
    except ValueError as e:
        p.error(str(e))
    return args


@dataclasses.dataclass(frozen=True)
class AceSettings(ReproductionSettings):
    """The settings of one ACE/ACED reproduction: the command line's options after :func:`parse_args` filled in the
    scale's defaults (``--scale``, ``--quick``, CIFAR-100's grid) and normalized them (sorted distinct grids, 0%
    dropout added, methods in table order). Build it with :func:`parse_settings` (a command line) or
    :meth:`from_keywords` (the options as keywords); both check it alike.

    Attributes:
        scale: ``cpu`` (Fashion-MNIST MLP, equal uploads) or ``paper`` (CIFAR ResNet-18, T server iterations).
        quick: the smoke-sized run (20 clients, 400 uploads or 60 steps, one seed, two grid values).
        dataset: ``fashion_mnist``, ``synthetic``, ``cifar10``, ``cifar100`` or ``20newsgroup`` (never available).
        data_dir: the IDX (Fashion-MNIST) or TFDS (CIFAR) data folder; None: the default places.
        model: the model's ``make_model`` name (``mlp`` at cpu scale, ``resnet18_gn`` at paper scale).
        clients: n, the number of clients.
        alphas: the Dirichlet concentrations of the splits (sorted, distinct; lower: more skew).
        betas: the delay parameters beta (sorted, distinct): the spread of the client speeds under ``client_exp``.
        seeds: the seeds (distinct, in [0, 1000)): timing seed s, training seed ``setting_seed(j, s)``.
        budget: ``uploads`` (every method gets ``uploads`` client uploads) or ``steps`` (``steps`` server steps).
        uploads: the client uploads of every method under ``budget == "uploads"``.
        steps: the server iterations T of every method under ``budget == "steps"``.
        batch_size: the minibatch of every client gradient.
        client_lr: eta_l, the step of FedBuff's and CA2FL's one local SGD step.
        buffer_size: M, the buffer of FedBuff and CA2FL.
        concurrency: Mc, the clients in flight of FedBuff and CA2FL.
        asgd_concurrency: the clients in flight of the two ASGDs (also Delay-adaptive ASGD's tau_C).
        tau_algo: ACED's tau_algo in the main comparison (Fig. a.2).
        dropout_tau_algo: ACED's tau_algo in the dropout study (Fig. 3a).
        tau_ablation: the tau_algo values of Fig. 3b (sorted, distinct).
        dropout_fractions: the fractions of clients that leave at T/2 (sorted, distinct, 0 included).
        dropout_setting: ``[alpha, beta]`` of the dropout study.
        dropout_methods: the methods of the dropout study (table order).
        skip_dropout: run only the Fig. 2 comparison.
        delay_model: ``client_exp`` (persistent speeds Exp(beta), jobs ``t_fix + s_i Exp(1)``) or ``iid_exp``.
        t_fix: the fixed part of every job time under ``client_exp``.
        methods: the methods of the main comparison (table order).
        tune: sweep the step sizes (cpu: ``CPU_GRIDS``; paper: c in ``PAPER_C_GRID``) rather than take one.
        lr_c: the paper scale's c without ``tune``: eta = c sqrt(n / T).
        delta_lr: ``literal`` (FedBuff/CA2FL's eta as Tab. a.4) or ``matched`` (eta / eta_l).
        lr: the ``--lr METHOD=V1,V2`` items as given (parsed into ``lr_override``).
        select: how a step size is chosen from a grid: ``train_loss`` (lowest final) or ``test_accuracy``.
        cache: the storage of ACE's, ACED's and CA2FL's per-client caches: ``float32``, ``bfloat16`` or ``int8``.
        evals: the evaluations per run (about).
        final_window: the final accuracy is the mean of this many last evaluations.
        max_replicas: at most this many replicas per compiled program (0: no limit).
        partition_seed: the seed of the Dirichlet split (shared by every run).
        out: the output folder.
        lr_override: {method: server step sizes} of ``lr``, replacing the scale's grid for those methods.
    """

    scale: str
    quick: bool
    dataset: str
    data_dir: str | None
    model: str
    clients: int
    alphas: list[float]
    betas: list[float]
    seeds: list[int]
    budget: str
    uploads: int
    steps: int
    batch_size: int
    client_lr: float
    buffer_size: int
    concurrency: int
    asgd_concurrency: int
    tau_algo: float
    dropout_tau_algo: float
    tau_ablation: list[float]
    dropout_fractions: list[float]
    dropout_setting: list[float]
    dropout_methods: list[str]
    skip_dropout: bool
    delay_model: str
    t_fix: float
    methods: list[str]
    tune: bool
    lr_c: float
    delta_lr: str
    lr: list[str]
    select: str
    cache: str
    evals: int
    final_window: int
    max_replicas: int
    partition_seed: int
    out: str
    lr_override: dict[str, list[float]]

    @classmethod
    def from_keywords(cls, **options: Any) -> AceSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, seeds=[0, 1], lr=["ace=0.1"]``): the same defaults, filling and checks as :func:`parse_args`;
        a refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the command line's
        message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> AceSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return AceSettings.from_args(parse_args(argv))


def apply_scale_defaults(args: argparse.Namespace) -> None:
    """Fills every argument left unset from ``--scale`` (and ``--quick``, CIFAR-100's grid)."""
    defaults = dict(SCALES[args.scale])
    dataset = args.dataset or defaults["dataset"]
    if dataset == "cifar100":
        defaults.update(CIFAR100_GRID)
    if args.quick:
        defaults.update(QUICK, **(QUICK_CPU if args.scale == "cpu" else {}))
    args.dataset = dataset
    for name in ("model", "clients", "alphas", "betas", "seeds", "budget", "uploads", "steps", "concurrency",
                 "dropout_fractions", "tau_ablation", "evals", "final_window", "max_replicas", "tune",
                 "skip_dropout"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    if args.clients >= 2:
        if args.concurrency is None:
            args.concurrency = args.clients
        if args.asgd_concurrency is None:
            args.asgd_concurrency = args.clients


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the (filled-in) arguments, or None."""
    n = args.clients
    if n < 2:
        return "--clients must be >= 2"
    if not 1 <= args.buffer_size <= args.concurrency <= n:
        return (f"need 1 <= --buffer-size ({args.buffer_size}) <= --concurrency ({args.concurrency}) "
                f"<= --clients ({n})")
    if not 1 <= args.asgd_concurrency <= n:
        return f"--asgd-concurrency must be in [1, {n}]"
    if distinct_seeds_problem(args.seeds):
        return distinct_seeds_problem(args.seeds)
    if any(a <= 0 for a in args.alphas) or any(b <= 0 for b in args.betas):
        return "--alphas and --betas must be > 0"
    if any(not 0 <= f < 1 for f in args.dropout_fractions):
        return "--dropout-fractions must be in [0, 1)"
    if min(args.uploads, args.steps) < 2 or args.evals < 1 or args.final_window < 1:
        return "--uploads and --steps must be >= 2, --evals and --final-window >= 1"
    if args.budget == "uploads" and args.uploads < 2 * args.buffer_size:
        return f"--uploads must be at least 2 buffers ({2 * args.buffer_size})"
    return None


def normalize_arguments(args: argparse.Namespace) -> None:
    """Sorted, distinct grids; 0% dropout always run (the step sizes are selected there); methods in table order."""
    args.alphas = sorted(set(args.alphas))
    args.betas = sorted(set(args.betas))
    args.dropout_fractions = sorted(set(args.dropout_fractions))
    if 0.0 not in args.dropout_fractions:
        args.dropout_fractions = [0.0, *args.dropout_fractions]  # the step sizes are selected at 0% dropout
    args.tau_ablation = sorted(set(args.tau_ablation))
    args.methods = [m for m in METHODS if m in args.methods]
    args.dropout_methods = [m for m in METHODS if m in args.dropout_methods]


def parse_lr_overrides(items: list[str]) -> dict[str, list[float]]:
    """``--lr METHOD=V1,V2`` values as {method: [step sizes]} (ValueError with the message for a bad one)."""
    overrides = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in METHODS or not values:
            raise ValueError(f"--lr expects METHOD=V1,V2 with METHOD in {list(METHODS)}, got {item!r}")
        try:
            overrides[name] = [float(v) for v in values.split(",")]
        except ValueError:
            raise ValueError(f"--lr {item!r}: the values must be numbers") from None
    return overrides


# ------------------------------------------------------------------------------------------------ budget and step sizes
def server_steps(setup: AceSettings, method: str) -> int:
    """Server iterations of a method: ``--steps``, or ``--uploads`` divided by the uploads per step."""
    if setup.budget == "steps":
        return setup.steps
    per_step = setup.buffer_size if method in DELTA_METHODS else 1
    return setup.uploads // per_step


def lr_grid(setup: AceSettings, method: str) -> list[float]:
    """The server step sizes (``server_lr``) swept for a method."""
    if method in setup.lr_override:
        return setup.lr_override[method]
    if setup.scale == "cpu":
        if not setup.tune:
            return [CPU_DEFAULT_LR[method]]
        grid = CPU_GRIDS[method]
        return grid[1:3] if setup.quick else grid
    # paper: eta = c sqrt(n / T) with T = the method's server iterations (Tab. a.4, App. F.2)
    scale = math.sqrt(setup.clients / server_steps(setup, method))
    if method in DELTA_METHODS and setup.delta_lr == "matched":
        scale /= setup.client_lr
    cs = (PAPER_C_GRID[2:5] if setup.quick else PAPER_C_GRID) if setup.tune else [setup.lr_c]
    return [c * scale for c in cs]


# ------------------------------------------------------------------------------------------------ data and task
def load_ace_dataset(setup: AceSettings) -> Dataset:
    """The dataset of ``--dataset`` (CIFAR standardized per channel); raises :class:`DataUnavailable` with the reason
    when it cannot be read (20Newsgroup never can)."""
    if setup.dataset == "20newsgroup":
        raise DataUnavailable(UNAVAILABLE)
    data = load_dataset(setup.dataset, setup.data_dir, setup.data_dir, synthetic_clients=max(setup.clients, 30))
    return standardize_channels(data, setup.dataset) if setup.dataset in CIFAR_STATS else data


def make_tasks(setup: AceSettings, dataset: Dataset) -> dict[float, Task]:
    """One task per alpha: the Dirichlet split (seed ``--partition-seed``, at least 10 examples per client) is shared by
    every method and seed; the model starts from the same x0 everywhere."""
    model = make_model(setup.model, dataset.input_shape, dataset.num_classes, seed=0)
    alphas = sorted(set(setup.alphas) | ({setup.dropout_setting[0]} if run_dropout(setup) else set()))
    tasks = {}
    for alpha in alphas:
        parts = partition("dirichlet", dataset.train_y, setup.clients, seed=setup.partition_seed, alpha=alpha)
        tasks[alpha] = make_task(dataset, parts, model)
    return tasks


def run_dropout(setup: AceSettings) -> bool:
    """Whether the dropout study (Fig. 3) runs."""
    return not setup.skip_dropout and bool(setup.dropout_methods)


# ------------------------------------------------------------------------------------------------ schedules
def delay_model(kind: str, t_fix: float, beta: float, dropout_fraction: float = 0.0,
                dropout_time: float = math.inf) -> DelayModel:
    """The delays of ``--delay-model`` ``kind``: ``client_exp``: persistent speed s_i ~ Exp(beta), job time
    ``t_fix + s_i Exp(1)``; ``iid_exp``: every job Exp(beta) (``t_fix`` unused)."""
    drop = {"dropout_fraction": dropout_fraction, "dropout_time": dropout_time} if dropout_fraction > 0 else {}
    if kind == "iid_exp":
        return DelayModel(speed="constant", speed_value=beta, noise="exponential", noise_scale=1.0, **drop)
    return DelayModel(speed="exponential", speed_value=beta, noise="exponential", noise_scale=1.0,
                      comm_time=t_fix, **drop)


def protocol_of(setup: AceSettings, method: str) -> tuple[str, dict]:
    """The arrival protocol of a method and its options."""
    if method in ("ace", "aced"):
        return "all_active", {}
    if method in DELTA_METHODS:
        return "concurrent", {"concurrency": setup.concurrency, "buffer_size": setup.buffer_size, "refill": "immediate"}
    return "concurrent", {"concurrency": setup.asgd_concurrency, "buffer_size": 1, "refill": "immediate"}


def make_method_schedule(setup: AceSettings, method: str, beta: float, seed: int,
                         fraction: float = 0.0) -> Schedule:
    """The schedule of a method for timing seed ``seed``. With ``fraction > 0``, ``floor(fraction n)`` clients leave
    for good at the virtual time of the method's step T/2 in its schedule without dropouts (so that every method
    trains on all clients for the first half of its run, and the events before then are those of 0%)."""
    name, options = protocol_of(setup, method)
    steps = server_steps(setup, method)
    base = make_schedule(name, setup.clients, steps, delay_model(setup.delay_model, setup.t_fix, beta), seed,
                         **options)
    if fraction <= 0 or math.floor(fraction * setup.clients + 1e-9) < 1:
        return base
    drop_time = float(base.step_times[steps // 2 - 1])
    delays = delay_model(setup.delay_model, setup.t_fix, beta, fraction, drop_time)
    return make_schedule(name, setup.clients, steps, delays, seed, **options)


def aced_active_counts(schedule: Schedule, taus: list[float]) -> np.ndarray:
    """float [len(taus), T]: ACED's n_t = |A(t)| at every server step for each tau_algo (Alg. a.1 literally).

    A(t) depends on the arrivals only: after the initialization round every t_i^start is 0; at step t,
    A(t) = {i : t - t_i^start <= tau} with the timestamps before this step's resets, then t_j^start = t + 1 for the
    clients arriving at t (the engine's ``aced``, ``active="since_report"``).
    """
    taus = np.asarray(taus, dtype=np.float64)
    n, T = schedule.num_clients, schedule.num_steps
    t_start = np.zeros(n, dtype=np.int64)
    out = np.empty((taus.size, T))
    for t in range(T):
        age = t - t_start
        out[:, t] = (age[None, :] <= taus[:, None]).sum(axis=1)
        arriving = schedule.arrival_clients[t]
        t_start[arriving[arriving >= 0]] = t + 1
    return out


def participation_stats(schedule: Schedule) -> dict[str, Any]:
    """Participation (coefficient of variation of the uploads per client, share of clients with at most one upload,
    max / median uploads), staleness, virtual time and uploads of a schedule."""
    s = schedule_summary(schedule)
    counts = np.asarray(s["participation"], dtype=np.float64)
    return {"participation_cv": float(counts.std() / max(counts.mean(), 1e-12)),
            "share_at_most_one_upload": float(np.mean(counts <= 1)),
            "max_over_median_uploads": float(counts.max() / max(np.median(counts), 1.0)),
            "staleness_mean": s["staleness_mean"], "staleness_max": s["staleness_max"],
            "virtual_time": s["total_time"], "uploads": s["num_uploads"]}


# ------------------------------------------------------------------------------------------------ the runs
def make_algorithm(setup: AceSettings, method: str) -> Algorithm:
    """The algorithm of a method (the two ASGDs are ``delay_adaptive_asgd`` on gradients; ``--cache``)."""
    cache = {"cache": setup.cache} if setup.cache != "float32" else {}
    if method in ("ace", "aced", "ca2fl"):
        return get_algorithm(method, **cache)
    if method == "fedbuff":
        return get_algorithm("fedbuff")
    return get_algorithm("delay_adaptive_asgd", upload="gradient")


def chunks(settings: list, per_setting: int, max_replicas: int) -> list[list]:
    """Splits the settings into groups of at most ``max_replicas`` replicas (0: one group)."""
    if max_replicas <= 0:
        return [settings]
    size = max(1, max_replicas // max(per_setting, 1))
    return [settings[i:i + size] for i in range(0, len(settings), size)]


def run_program(task: Task, setup: AceSettings, method: str, settings: list[dict], label: str,
                grid: list[float], variants: list[tuple[str, dict]] | None = None) -> list[dict]:
    """Runs ``method`` on every setting and step size of ``grid`` (and every variant) as the replicas of one compiled
    program (of several when ``--max-replicas`` splits the settings; a program over the memory budget stops with the
    budget's error, which says what to lower).

    Each setting is a dict with ``beta``, ``seed`` (the timing seed), ``train_seed`` (unique) and optionally
    ``fraction`` (clients dropping out). ``variants`` are (record name, {hyper-parameter: value}) pairs that differ in
    one swept hyper-parameter (the two ASGDs: ``tau_c``; the ACED ablation: ``tau_algo``); the other
    hyper-parameters are shared. Returns one record per (setting, step size, variant) with its evaluations.
    """
    variants = variants or [(method, {})]
    hp = program_hparams(setup, method, grid, variants)
    algorithm = make_algorithm(setup, method)
    local = LocalConfig(steps=1, batch_size=setup.batch_size)
    eval_every = max(1, server_steps(setup, method) // setup.evals)
    records = []
    for part in chunks(settings, len(grid) * len(variants), setup.max_replicas):
        replicas, meta = [], []
        for setting in part:
            schedule = make_method_schedule(setup, method, setting["beta"], setting["seed"],
                                            setting.get("fraction", 0.0))
            stats = stats_of(schedule)
            for point in make_replicas(algorithm, [setting["train_seed"]], hp):  # the grid's points, in sweep order
                name, extra = next((nm, v) for nm, v in variants if all(point.hparams[k] == v[k] for k in v))
                replicas.append(ReplicaSpec(schedule, seed=setting["train_seed"], hparams=point.hparams,
                                            label={"method": name, "beta": setting["beta"],
                                                   "timing_seed": setting["seed"],
                                                   "fraction": setting.get("fraction", 0.0)}))
                meta.append({**setting, "method": name, **({"tau": float(extra["tau_algo"])}
                                                           if "tau_algo" in extra else {}),
                             "server_lr": float(point.hparams["server_lr"]), "schedule": stats})
        frame = run_grid(task, algorithm, replicas, local=local, name=label, eval_every=eval_every)
        counted = "local_steps" in frame.columns
        runs = replica_runs(frame, ("diverged_at",), {"steps": "step", "times": "time", "uploads": "uploads",
                                                      **({"local_steps": "local_steps"} if counted else {}),
                                                      "test_accuracy": "test_accuracy", "train_loss": "train_loss"})
        records += [{**m, **r} for m, r in zip(meta, runs)]
    return records


def program_hparams(setup: AceSettings, method: str, grid: list[float],
                    variants: list[tuple[str, dict]]) -> dict[str, Any]:
    """The hyper-parameters of one program: the method's fixed ones, the variants' swept one, the step-size grid."""
    swept = sorted({k for _, v in variants for k in v})
    if len(swept) > 1 or any(set(v) != set(swept) for _, v in variants):
        raise ValueError(f"variants must differ in one hyper-parameter, got {variants}")
    hp: dict = {"client_lr": setup.client_lr} if method in DELTA_METHODS else {}
    if method == "aced":
        hp["tau_algo"] = setup.tau_algo
    for key in swept:
        values = [v[key] for _, v in variants]
        hp[key] = values if len(values) > 1 else values[0]
    hp["server_lr"] = list(grid)
    return hp


def stats_of(schedule: Schedule) -> dict[str, Any]:
    """:func:`participation_stats` and the dropout time of a schedule."""
    stats = participation_stats(schedule)
    if schedule.info.get("dropout_time") is not None:
        stats["dropout_time"] = float(schedule.info["dropout_time"])
    return stats


def select(records: list[dict], setup: AceSettings, key_fields: tuple[str, ...]) -> dict:
    """{(method, *key): server_lr}: per group, the step size with the best final ``--select`` metric averaged over
    seeds (lowest training loss or highest test accuracy). A diverged run makes its step size the worst."""
    groups: dict[tuple, dict[float, list[float]]] = {}
    for r in records:
        key = (r["method"], *(r[k] for k in key_fields))
        groups.setdefault(key, {}).setdefault(r["server_lr"], []).append(final_value(r[setup.select],
                                                                                      setup.final_window))

    def score(values: list[float]) -> float:
        v = np.asarray(values)
        if not np.all(np.isfinite(v)):
            return math.inf
        return float(v.mean()) if setup.select == "train_loss" else -float(v.mean())

    return {key: min(sorted(by_lr), key=lambda lr: score(by_lr[lr])) for key, by_lr in groups.items()}


def volatility(accuracy) -> float:
    """Mean |change| of the test accuracy between consecutive evaluations over the second half of a run (the
    stability Fig. a.1 shows as bands); NaN for a diverged run."""
    a = np.asarray(accuracy, dtype=np.float64)
    tail = a[len(a) // 2:]
    return float(np.abs(np.diff(tail)).mean()) if tail.size > 1 else math.nan


def summarize(records: list[dict], setup: AceSettings, key_fields: tuple[str, ...]) -> list[dict]:
    """Per (method, *key_fields): mean, std and 2 standard errors over seeds of the final accuracy (records of one
    step size per group, e.g. the selected ones)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], *(r[k] for k in key_fields)), []).append(r)
    rows = []
    for key, recs in groups.items():
        acc = np.array([final_value(r["test_accuracy"], setup.final_window) for r in recs])
        loss = np.array([final_value(r["train_loss"], setup.final_window) for r in recs])
        ok = np.isfinite(acc)
        k = int(ok.sum())
        std = float(acc[ok].std(ddof=1)) if k > 1 else None
        row = {"method": key[0], **dict(zip(key_fields, key[1:])), "server_lr": recs[0]["server_lr"],
               "seeds": [r["seed"] for r in recs], "finite_runs": k,
               "accuracy": float(acc[ok].mean()) if k else None, "accuracy_std": std,
               "accuracy_2se": 2 * std / math.sqrt(k) if std is not None else None,
               "train_loss": float(loss[ok].mean()) if k else None,
               "volatility": float(np.mean([volatility(r["test_accuracy"]) for r in recs])),
               "last_accuracy": float(np.mean([r["test_accuracy"][-1] for r in recs])),
               "uploads": float(np.mean([r["uploads"][-1] for r in recs])),
               "server_steps": int(recs[0]["steps"][-1]),
               "virtual_time": float(np.mean([r["times"][-1] for r in recs])),
               "staleness_mean": float(np.mean([r["schedule"]["staleness_mean"] for r in recs])),
               "participation_cv": float(np.mean([r["schedule"]["participation_cv"] for r in recs]))}
        if "aced_active_mean" in recs[0]:
            row["aced_active_mean"] = float(np.mean([r["aced_active_mean"] for r in recs]))
            row["aced_active_after_dropout"] = float(np.mean([r["aced_active_after_dropout"] for r in recs]))
        rows.append(row)
    return rows


def main_settings(setup: AceSettings) -> list[dict]:
    """(beta, seed) settings; the training seed of (beta_j, seed s) is ``setting_seed(j, s)``, its timing seed s."""
    return [{"beta": b, "seed": s, "train_seed": setting_seed(j, s)} for j, b in enumerate(setup.betas)
            for s in setup.seeds]


def dropout_settings(setup: AceSettings) -> list[dict]:
    """(fraction, seed) settings at the dropout study's beta; training seed ``DROPOUT_SEEDS + setting_seed(k, s)``
    for fraction k (apart from the main comparison's)."""
    beta = setup.dropout_setting[1]
    return [{"beta": beta, "seed": s, "fraction": f, "train_seed": DROPOUT_SEEDS + setting_seed(k, s)}
            for k, f in enumerate(setup.dropout_fractions) for s in setup.seeds]


def method_groups(methods: list[str]) -> list[list[str]]:
    """One program per method, except the two ASGDs, which share one (they differ only in tau_C)."""
    groups = [[m] for m in METHODS if m in methods and m not in ("da_asgd", "vanilla_asgd")]
    asgds = [m for m in ("da_asgd", "vanilla_asgd") if m in methods]
    return groups + ([asgds] if asgds else [])


def group_variants(setup: AceSettings, group: list[str]) -> list[tuple[str, dict]] | None:
    """The variants of a program: the two ASGDs differ in ``tau_c`` only; other methods have none."""
    if group[0] in ("da_asgd", "vanilla_asgd"):
        tau_c = {"da_asgd": float(setup.asgd_concurrency), "vanilla_asgd": VANILLA_TAU_C}
        return [(m, {"tau_c": tau_c[m]}) for m in group]
    return None


def run_main(tasks: dict[float, Task], setup: AceSettings) -> list[dict]:
    """Fig. 2: for each alpha and method (the two ASGDs together), one vmapped program holds every (beta, seed, step
    size) (split by ``--max-replicas``)."""
    grids = {m: lr_grid(setup, m) for m in METHODS}
    records = []
    for alpha in setup.alphas:
        for group in method_groups(setup.methods):
            if len(group) == 2 and grids["da_asgd"] != grids["vanilla_asgd"]:
                raise ValueError("the two ASGDs share one program and need the same step-size grid")
            label = f"{'+'.join(LABELS[m] for m in group)} α={alpha:g}"
            for r in run_program(tasks[alpha], setup, group[0], main_settings(setup), label, grids[group[0]],
                                 group_variants(setup, group)):
                r["alpha"] = alpha
                if r["method"] == "aced":
                    r["tau"] = setup.tau_algo
                records.append(r)
    return records


def single_variant(setup: AceSettings, method: str,
                   tau_algo: float | None = None) -> list[tuple[str, dict]] | None:
    """The one variant of a method run alone (ACED at ``tau_algo``, default ``--tau-algo``)."""
    if method == "aced":
        return [("aced", {"tau_algo": setup.tau_algo if tau_algo is None else tau_algo})]
    return group_variants(setup, [method])


def run_dropout_study(tasks: dict[float, Task], setup: AceSettings, main_records: list[dict],
                      main_chosen: dict) -> tuple[list[dict], list[dict], dict]:
    """Fig. 3a and 3b at (alpha, beta) = ``--dropout-setting``.

    Step sizes: each method's is the one selected at 0% dropout, kept for every fraction. When the main comparison
    ran that method at this (alpha, beta) with the same hyper-parameters, its selection and its 0% runs are reused
    (the 0% schedules are the main ones); otherwise a program of the 0% settings over the grid selects it. Then one
    program per method runs the fractions > 0 at that step size; ACED's runs every fraction for tau_algo =
    ``--dropout-tau-algo`` and every ``--tau-ablation`` value (Fig. 3b; its tau = --dropout-tau-algo runs are the
    ACED points of Fig. 3a). Training seeds 100000 + 1000 k + s for fraction k.
    Returns the Fig. 3a records, the ablation records and the step sizes.
    """
    alpha, beta = setup.dropout_setting
    task = tasks[alpha]
    settings = dropout_settings(setup)
    zero = [s for s in settings if s["fraction"] == 0.0]
    later = [s for s in settings if s["fraction"] > 0.0]
    taus = [setup.dropout_tau_algo] + [t for t in setup.tau_ablation if t != setup.dropout_tau_algo]
    figure, ablation, chosen = [], [], {}
    for m in setup.dropout_methods:
        reuse = ((m, alpha, beta) in main_chosen and (m != "aced" or setup.tau_algo == setup.dropout_tau_algo))
        if reuse:
            lr = main_chosen[(m, alpha, beta)]
            at_zero = [dict(r, fraction=0.0) for r in main_records
                       if (r["method"], r["alpha"], r["beta"], r["server_lr"]) == (m, alpha, beta, lr)]
        else:
            recs = run_program(task, setup, m, zero, f"dropout {LABELS[m]} 0% (step sizes)", lr_grid(setup, m),
                               single_variant(setup, m, setup.dropout_tau_algo))
            lr = select(recs, setup, ())[(m,)]
            at_zero = [r for r in recs if r["server_lr"] == lr]
        chosen[m] = lr
        if m == "aced":  # every fraction and every tau_algo at ACED's step size
            recs = run_program(task, setup, m, settings, "dropout ACED, τ_algo ablation", [lr],
                               [("aced", {"tau_algo": t}) for t in taus])
            ablation += recs if len(taus) > 1 else []
            figure += [r for r in recs if r["tau"] == setup.dropout_tau_algo]
        else:
            figure += at_zero
            if later:
                figure += run_program(task, setup, m, later, f"dropout {LABELS[m]}", [lr], single_variant(setup, m))
    for r in figure + ablation:
        r["alpha"] = alpha
    return figure, ablation, chosen


def add_active_counts(records: list[dict], setup: AceSettings) -> None:
    """ACED's mean |A(t)| (host side, from the schedule), overall and over the second half (after the dropout)."""
    cache: dict[tuple, np.ndarray] = {}
    half = server_steps(setup, "aced") // 2
    for r in records:
        if r["method"] != "aced":
            continue
        key = (r["beta"], r["seed"], r.get("fraction", 0.0), r["tau"])
        if key not in cache:
            schedule = make_method_schedule(setup, "aced", r["beta"], r["seed"], r.get("fraction", 0.0))
            cache[key] = aced_active_counts(schedule, [r["tau"]])[0]
        r["aced_active_mean"] = float(cache[key].mean())
        r["aced_active_after_dropout"] = float(cache[key][half:].mean())


# ------------------------------------------------------------------------------------------------ checks
def direction_checks(main_rows: list[dict], dropout_rows: list[dict], ablation_rows: list[dict],
                     setup: AceSettings) -> list[str]:
    """The paper's claims, checked on the measured means (yes / no, and where)."""
    at = {(r["method"], r["alpha"], r["beta"]): r["accuracy"] for r in main_rows if r["accuracy"] is not None}
    out = ranking_checks(at, setup) + heterogeneity_checks(at, setup) + stability_checks(main_rows)
    if dropout_rows:
        out += dropout_checks(dropout_rows, setup)
    if ablation_rows:
        out += ablation_checks(ablation_rows, setup)
    return out


def ranking_checks(at: dict[tuple, float], setup: AceSettings) -> list[str]:
    """Fig. 2 / Tab. a.2: ACE highest, the paper's order of the methods, and the gaps of three pairs."""
    out = []
    settings = [(a, b) for a in setup.alphas for b in setup.betas]
    methods = setup.methods
    if "ace" in methods and len(methods) > 1:
        wins = [(a, b) for a, b in settings if ("ace", a, b) in at
                and all(at[("ace", a, b)] >= at[(m, a, b)] for m in methods if (m, a, b) in at)]
        out.append(f"ACE has the highest final accuracy (Fig. 2, Tab. a.2): {yes_no(len(wins) == len(settings))} "
                   f"({len(wins)}/{len(settings)} settings{_where(wins)})")
    order = [m for m in PAPER_ORDER if m in methods]
    if len(order) > 2:
        pairs = [(order[i], order[j]) for i in range(len(order)) for j in range(i + 1, len(order))]
        parts = []
        for a, b in settings:
            if all((m, a, b) in at for m in order):
                agree = sum(at[(lo, a, b)] < at[(hi, a, b)] for lo, hi in pairs)
                ranking = " < ".join(LABELS[m] for m in sorted(order, key=lambda m: at[(m, a, b)]))
                parts.append(f"α={a:g} β={b:g}: {agree}/{len(pairs)} ({ranking})")
        out.append("Pairs ordered as in Tab. a.2 (Vanilla < Delay-adaptive < FedBuff < CA2FL < ACED < ACE): "
                   + "; ".join(parts))
    for better, worse in (("ace", "fedbuff"), ("ace", "vanilla_asgd"), ("ca2fl", "fedbuff")):
        if better in methods and worse in methods:
            gaps = [at[(better, a, b)] - at[(worse, a, b)] for a, b in settings
                    if (better, a, b) in at and (worse, a, b) in at]
            out.append(f"{LABELS[better]} - {LABELS[worse]}: " + ", ".join(
                f"{g:+.4f}" for g in gaps) + f" (α x β = {', '.join(f'{a:g}x{b:g}' for a, b in settings)}; "
                f"{'positive everywhere' if gaps and min(gaps) > 0 else 'not positive everywhere'})")
    return out


def heterogeneity_checks(at: dict[tuple, float], setup: AceSettings) -> list[str]:
    """The heterogeneity-amplification index and the direction of alpha and beta (needs two of each)."""
    if not (len(setup.alphas) > 1 and len(setup.betas) > 1):
        return []
    methods = setup.methods
    a_lo, a_hi, b_lo, b_hi = setup.alphas[0], setup.alphas[-1], setup.betas[0], setup.betas[-1]
    out, index = [], {}
    for m in methods:
        keys = [(m, a_lo, b_lo), (m, a_lo, b_hi), (m, a_hi, b_lo), (m, a_hi, b_hi)]
        if all(k in at for k in keys):
            v = [at[k] for k in keys]
            index[m] = (v[0] - v[1]) - (v[2] - v[3])
    if index:
        out.append(f"Heterogeneity-amplification index [A(α={a_lo:g},β={b_lo:g}) - A(α={a_lo:g},β={b_hi:g})] - "
                   f"[A(α={a_hi:g},β={b_lo:g}) - A(α={a_hi:g},β={b_hi:g})] (paper: > 0 for FedBuff and the "
                   "ASGDs, about 0 for ACE): " + ", ".join(f"{LABELS[m]} {v:+.4f}" for m, v in index.items()))
    drops = [m for m in methods if all((m, a_lo, b) in at and (m, a_hi, b) in at
                                         and at[(m, a_lo, b)] < at[(m, a_hi, b)] for b in setup.betas)]
    out.append(f"Lower α lowers every method's accuracy at every β: {yes_no(len(drops) == len(methods))} "
               f"(does for: {', '.join(LABELS[m] for m in drops) or 'none'})")
    slower = [m for m in methods if all((m, a, b_lo) in at and (m, a, b_hi) in at
                                          and at[(m, a, b_hi)] < at[(m, a, b_lo)] for a in setup.alphas)]
    out.append(f"Larger β lowers every method's accuracy at every α: {yes_no(len(slower) == len(methods))} "
               f"(does for: {', '.join(LABELS[m] for m in slower) or 'none'})")
    return out


def stability_checks(main_rows: list[dict]) -> list[str]:
    """Fig. a.1: ACE's accuracy curve is the most stable (the smallest mean change between evaluations)."""
    vol = {}
    for r in main_rows:
        if r.get("volatility") is not None and math.isfinite(r["volatility"]):
            vol.setdefault(r["method"], []).append(r["volatility"])
    if not ("ace" in vol and len(vol) > 1):
        return []
    mean = {m: float(np.mean(v)) for m, v in vol.items()}
    order = sorted(mean, key=mean.get)
    return [f"ACE's accuracy curve is the most stable (Fig. a.1): {yes_no(order[0] == 'ace')} (mean |change| "
            "between evaluations, second half: " + ", ".join(f"{LABELS[m]} {mean[m]:.4f}" for m in order) + ")"]


def dropout_checks(dropout_rows: list[dict], setup: AceSettings) -> list[str]:
    """Fig. 3a: ACED keeps more of its accuracy than ACE under dropouts, and is the most accurate."""
    d = {(r["method"], r["fraction"]): r["accuracy"] for r in dropout_rows if r["accuracy"] is not None}
    fr = setup.dropout_fractions
    top = fr[-1]
    if not (("ace", 0.0) in d and ("aced", 0.0) in d and top > 0 and ("ace", top) in d and ("aced", top) in d):
        return []
    change_ace = d[("ace", top)] - d[("ace", 0.0)]
    change_aced = d[("aced", top)] - d[("aced", 0.0)]
    out = [f"ACED (τ_algo={setup.dropout_tau_algo:g}) keeps more of its accuracy than ACE from 0% to "
           f"{top:.0%} dropout (Fig. 3a): {yes_no(change_aced > change_ace)} (change: ACED "
           f"{change_aced:+.4f}, ACE {change_ace:+.4f})"]
    wins = [f for f in fr if f > 0 and d[("aced", f)] >= d[("ace", f)]]
    out.append(f"ACED >= ACE at every dropout fraction > 0: {yes_no(len(wins) == len(fr) - 1)} "
               f"(at: {', '.join(f'{f:.0%}' for f in wins) or 'none'})")
    others = [m for m in setup.dropout_methods if m not in ("ace", "aced") and (m, top) in d]
    if others:
        best = [m for m in ["aced", "ace", *others] if d[(m, top)] == max(d[(k, top)] for k in
                                                                             ["aced", "ace", *others])]
        out.append(f"Most accurate at {top:.0%} dropout: {', '.join(LABELS[m] for m in best)} (paper: ACED)")
    return out


def ablation_checks(ablation_rows: list[dict], setup: AceSettings) -> list[str]:
    """Fig. 3b: the best tau_algo per dropout fraction, and tau_algo = 1 below every tau_algo in [10, 50]."""
    a = {(r["tau"], r["fraction"]): r["accuracy"] for r in ablation_rows if r["accuracy"] is not None}
    taus = sorted({t for t, _ in a})
    best = []
    for f in setup.dropout_fractions:
        vals = {t: a[(t, f)] for t in taus if (t, f) in a}
        if vals:
            best.append(f"{f:.0%}: τ={max(vals, key=vals.get):g}")
    out = ["Best τ_algo per dropout fraction (Fig. 3b: 1 bad, 10-50 good, >= 100 bad): " + ", ".join(best)]
    mid = [t for t in taus if 10 <= t <= 50]
    if 1.0 in taus and mid:
        worse = [f for f in setup.dropout_fractions if (1.0, f) in a
                 and all(a[(1.0, f)] < a[(t, f)] for t in mid if (t, f) in a)]
        out.append(f"τ_algo = 1 is below every τ_algo in [10, 50] at every fraction: "
                   f"{yes_no(len(worse) == len(setup.dropout_fractions))} "
                   f"(at: {', '.join(f'{f:.0%}' for f in worse) or 'none'})")
    return out


def _where(settings: list[tuple[float, float]]) -> str:
    return (": " + ", ".join(f"α={a:g} β={b:g}" for a, b in settings)) if settings else ""


# ------------------------------------------------------------------------------------------------ verdicts
# The paper's claims checked in every (alpha, beta) setting: (claim, method, baseline, the paper's numbers: Tab. a.2,
# DistilBERT, alpha 0.1, beta 5, %).
CLAIMS = (("ACE above FedBuff", "ace", "fedbuff", "63.7 vs 55.7"),
          ("ACE above CA2FL", "ace", "ca2fl", "63.7 vs 61.6"),
          ("ACE above Vanilla ASGD", "ace", "vanilla_asgd", "63.7 vs 49.3"),
          ("ACED above FedBuff", "aced", "fedbuff", "63.1 vs 55.7"),
          ("CA2FL above FedBuff", "ca2fl", "fedbuff", "61.6 vs 55.7"))


def setting_verdicts(selected: list[dict], setup: AceSettings) -> dict[tuple[float, float], list]:
    """Per (alpha, beta): the verdicts on :data:`CLAIMS` (the selected step sizes' runs) at equal uploads, virtual
    time and local computation (one gradient per upload for every method here, so uploads and local steps agree)."""
    out = {}
    for a in setup.alphas:
        for b in setup.betas:
            runs = {m: [r for r in selected if (r["method"], r["alpha"], r["beta"]) == (m, a, b)] for m in METHODS}
            out[(a, b)] = claim_verdicts(runs, CLAIMS, y="test_accuracy")
    return out


def verdict_section(verdicts: dict[tuple[float, float], list], stats: dict, setup: AceSettings) -> list[str]:
    """The verdict tables, one per setting, each with the share of uploads of the fastest 20% of the clients."""
    lines = []
    for (a, b), vs in verdicts.items():
        s = stats.get(b, {})
        lines += ["", *verdict_lines(vs, f"Verdicts, Dir(α={a:g}), β={b:g}, seeds {setup.seeds}")]
        if "fastest_share_ace" in s:
            lines.append(participation_line({"ACE/ACED (every client training)": s["fastest_share_ace"],
                                             f"FedBuff/CA2FL (Mc = {setup.concurrency})": s["fastest_share_fedbuff"]}))
    return lines


def plot_verdict_figures(selected: list[dict], setup: AceSettings, model_title: str) -> list[str]:
    """``claims_a{alpha}_b{beta}.png``: the paper-style figure of each setting (one line per method, band over
    seeds, against uploads, virtual time and local steps)."""
    written = []
    for a in setup.alphas:
        for b in setup.betas:
            runs = {m: [r for r in selected if (r["method"], r["alpha"], r["beta"]) == (m, a, b)] for m in METHODS}
            name = f"claims_a{a:g}_b{b:g}.png"
            plot_methods(runs, os.path.join(setup.out, name), f"{model_title}, n = {setup.clients}, Dir({a:g}), "
                         f"client speeds Exp(β = {b:g}), selected step sizes", y="test_accuracy", labels=LABELS)
            written.append(name)
    return written


# ------------------------------------------------------------------------------------------------ table
def _cell(row: dict | None, digits: int = 4) -> str:
    """A final accuracy as ``mean ± 2 SE`` (and ``(k/n)`` when only k of n seeds stayed finite)."""
    if row is None or row.get("accuracy") is None:
        return "-" if row is None else "diverged"
    text = f"{row['accuracy']:.{digits}f}"
    if row.get("accuracy_2se") is not None:
        text += f" ± {row['accuracy_2se']:.{digits}f}"
    return text + (f" ({row['finite_runs']}/{len(row['seeds'])})" if row["finite_runs"] < len(row["seeds"]) else "")


def format_table(main_rows: list[dict], dropout_rows: list[dict], ablation_rows: list[dict], checks: list[str],
                 setting_stats: dict, setup: AceSettings, dataset_name: str, num_params: int,
                 grid_rows: list[dict] | None = None) -> str:
    """``table.md``: the setup, Fig. 2's accuracies beside Tab. a.2, the step sizes and grids, the schedules, the
    dropout study and the claims."""
    lines = setup_lines(setup, dataset_name, num_params) + main_table_lines(main_rows, setup)
    lines += step_size_lines(main_rows, setup, grid_rows) + schedule_lines(setting_stats, setup)
    if dropout_rows:
        lines += dropout_lines(dropout_rows, ablation_rows, setup)
    if checks:
        lines += ["", "**The paper's claims, on these means**", ""] + [f"- {c}" for c in checks]
    return "\n".join(lines) + "\n"


def setup_lines(setup: AceSettings, dataset_name: str, num_params: int) -> list[str]:
    """The title and the paragraph describing the run."""
    n = setup.clients
    budget = (f"{setup.uploads} client uploads per method" if setup.budget == "uploads"
              else f"{setup.steps} server iterations per method")
    delay = (f"client_exp (client i's job time {setup.t_fix:g} + s_i Exp(1), s_i ~ Exp(mean β) drawn once per seed)"
             if setup.delay_model == "client_exp" else "iid_exp (every job Exp(mean β), all clients alike)")
    return [
        f"# ACE/ACED reproduction ({setup.scale} scale{', quick' if setup.quick else ''})", "",
        f"{dataset_name}, model {setup.model} ({num_params:,} parameters), n = {n} clients, Dirichlet(α) label split, "
        f"delays {delay}; {budget}; one minibatch gradient of {setup.batch_size} examples per upload (K = 1; "
        f"FedBuff/CA2FL: one local SGD step, η_l = {setup.client_lr:g}, M = {setup.buffer_size}, "
        f"Mc = {setup.concurrency}; ASGDs: concurrency {setup.asgd_concurrency}, τ_C = {setup.asgd_concurrency}; "
        f"ACE/ACED: every client always training, plus the initialization round of n uploads"
        + (f"; {setup.cache} caches" if setup.cache != "float32" else "") + "). Final accuracy = "
        f"mean of the last {setup.final_window} evaluation(s); mean ± 2 SE over seeds {setup.seeds}. Step sizes: "
        + ("each method's best on its grid by final "
           f"{'training loss' if setup.select == 'train_loss' else 'test accuracy'} (per setting)."
           if any(len(lr_grid(setup, m)) > 1 for m in setup.methods)
           else "fixed (no sweep)."),
        "",
    ]


def main_table_lines(main_rows: list[dict], setup: AceSettings) -> list[str]:
    """Fig. 2's final accuracies beside Tab. a.2, the stability (Fig. a.1) and ACED's mean |A(t)|."""
    settings = [(a, b) for a in setup.alphas for b in setup.betas]
    at = {(r["method"], r["alpha"], r["beta"]): r for r in main_rows}
    ours = [f"α={a:g}, β={b:g}" for a, b in settings]
    lines = [f"**Final test accuracy (Fig. 2{' / Fig. a.2' if setup.dataset == 'cifar100' else ''}), beside the "
             "paper's Table a.2** (20Newsgroup, β = 5, %, mean ± 2 SE over 5 runs: the paper's reference numbers; "
             "20Newsgroup itself is not reproduced here, the project has no text loader or BERT models)", "",
             "| method | " + " | ".join(ours) + " | paper: " + " | paper: ".join(PAPER_TABLE_A2_COLUMNS) + " |",
             "|" + "---|" * (1 + len(ours) + len(PAPER_TABLE_A2_COLUMNS))]
    for m in PAPER_ORDER[::-1]:
        if m in setup.methods or m in PAPER_TABLE_A2:
            label = LABELS[m] + (f" (τ_algo={setup.tau_algo:g})" if m == "aced" else "")
            cells = [_cell(at.get((m, a, b))) if m in setup.methods else "not run" for a, b in settings]
            lines.append(table_row([label, *cells, *PAPER_TABLE_A2[m]]))
    vol = {m: [at[(m, a, b)]["volatility"] for a, b in settings if (m, a, b) in at] for m in setup.methods}
    if any(vol.values()):
        lines += ["", "Stability (Fig. a.1): mean |change| of the test accuracy between consecutive evaluations over "
                      "the second half of the runs: " + ", ".join(
                          f"{LABELS[m]} {np.nanmean(v):.4f}" for m, v in vol.items() if v) + "."]
    aced = [f"α={a:g}, β={b:g}: {at[('aced', a, b)]['aced_active_mean']:.1f}" for a, b in settings
            if ("aced", a, b) in at and "aced_active_mean" in at[("aced", a, b)]]
    if aced:
        lines += ["", f"ACED (τ_algo={setup.tau_algo:g}) averages over mean |A(t)| = " + "; ".join(aced)
                  + f" of the {setup.clients} clients (from the schedules)."]
    return lines


def step_size_lines(main_rows: list[dict], setup: AceSettings, grid_rows: list[dict] | None) -> list[str]:
    """The selected server step sizes and, with a sweep, every grid value's loss and accuracy."""
    settings = [(a, b) for a in setup.alphas for b in setup.betas]
    ours = [f"α={a:g}, β={b:g}" for a, b in settings]
    chosen = {(r["method"], r["alpha"], r["beta"]): r["server_lr"] for r in main_rows}
    lines = ["", "**Selected server step sizes η** (FedBuff/CA2FL: x += η mean Δ with Δ = -η_l g; others: "
                 "x -= η g)", "", "| method | " + " | ".join(ours) + " | grid |", "|" + "---|" * (len(ours) + 2)]
    for m in setup.methods:
        cells = [f"{chosen[(m, a, b)]:.4g}" if (m, a, b) in chosen else "-" for a, b in settings]
        lines.append(table_row([LABELS[m], *cells, ", ".join(f"{v:.4g}" for v in lr_grid(setup, m))]))
    if grid_rows and any(len(lr_grid(setup, m)) > 1 for m in setup.methods):
        lines += ["", "**The step-size grids**: final training loss / test accuracy per η, mean over the settings and "
                      "seeds (the training loss chooses, per setting)", "", "| method | η: loss / accuracy |",
                  "|---|---|"]
        for m in setup.methods:
            cells = []
            for lr in lr_grid(setup, m):
                rows = [g for g in grid_rows if g["method"] == m and g["server_lr"] == lr]
                loss = [g["train_loss"] for g in rows if g["train_loss"] is not None]
                acc = [g["accuracy"] for g in rows if g["accuracy"] is not None]
                cells.append(f"{lr:.4g}: " + (f"{np.mean(loss):.3f} / {np.mean(acc):.4f}" if loss else "diverged"))
            lines.append(f"| {LABELS[m]} | " + "; ".join(cells) + " |")
    return lines


def schedule_lines(setting_stats: dict, setup: AceSettings) -> list[str]:
    """Participation and staleness of the schedules, per beta."""
    lines = ["", "**Schedules** (per β, mean over seeds; all-clients-active schedule of ACE: uploads per client "
                 "and staleness in server steps)", "",
             "| β | participation CV | clients with <= 1 upload | max / median uploads | mean staleness (ACE) | "
             "mean staleness (FedBuff, flushes) | virtual time (ACE) | uploads of the fastest 20% (ACE / FedBuff) |",
             "|---|---|---|---|---|---|---|---|"]
    for b in setup.betas:
        s = setting_stats.get(b)
        if s:
            lines.append(f"| {b:g} | {s['participation_cv']:.2f} | {s['share_at_most_one_upload']:.0%} | "
                         f"{s['max_over_median_uploads']:.1f} | {s['staleness_ace']} | {s['staleness_fedbuff']} | "
                         f"{s['virtual_time']:.1f} | {s['fastest_share_ace']:.0%} / "
                         f"{s['fastest_share_fedbuff']:.0%} |")
    return lines


def dropout_lines(dropout_rows: list[dict], ablation_rows: list[dict], setup: AceSettings) -> list[str]:
    """Fig. 3a's final accuracies per dropout fraction and Fig. 3b's tau_algo ablation with ACED's mean |A(t)|."""
    alpha, beta = setup.dropout_setting
    fr = setup.dropout_fractions
    n = setup.clients
    d = {(r["method"], r["fraction"]): r for r in dropout_rows}
    lines = ["", f"**Dropout robustness (Fig. 3a)**: final test accuracy, Dir({alpha:g}), β = {beta:g}, "
                 "a fraction of the clients leaves for good at the virtual time of the method's step T/2; "
                 "step size selected at 0%", "",
             "| method | η | " + " | ".join(f"{f:.0%}" for f in fr) + " |", "|" + "---|" * (len(fr) + 2)]
    for m in setup.dropout_methods:
        label = LABELS[m] + (f" (τ_algo={setup.dropout_tau_algo:g})" if m == "aced" else "")
        lr = next((r["server_lr"] for r in dropout_rows if r["method"] == m), None)
        lines.append(f"| {label} | {lr:.4g} | " + " | ".join(_cell(d.get((m, f))) for f in fr) + " |")
    if not ablation_rows:
        return lines
    a = {(r["tau"], r["fraction"]): r for r in ablation_rows}
    taus = sorted({t for t, _ in a})
    lines += ["", "**ACED τ_algo ablation (Fig. 3b)**: final test accuracy, and mean |A(t)| over the second "
                  "half of the run (after the dropout)", "",
              "| τ_algo | " + " | ".join(f"{f:.0%}" for f in fr) + " | " + " | ".join(
                  f"mean n_t, {f:.0%}" for f in fr) + " |", "|" + "---|" * (2 * len(fr) + 1)]
    for t in taus:
        acc = [_cell(a.get((t, f))) for f in fr]
        nt = [f"{a[(t, f)]['aced_active_after_dropout']:.1f}" if (t, f) in a else "-" for f in fr]
        lines.append(table_row([f"{t:g}", *acc, *nt]))
    if ("ace", fr[0]) in d:
        lines.append("| ACE (all n) | " + " | ".join(_cell(d.get(("ace", f))) for f in fr) + " | "
                     + " | ".join(f"{n} ({n - math.floor(f * n + 1e-9)} live)" for f in fr) + " |")
    return lines


# ------------------------------------------------------------------------------------------------ figures
STYLES = {"ace": ("-", 2.0), "aced": ("-", 1.4), "ca2fl": ("--", 1.2), "fedbuff": ("--", 1.0),
          "da_asgd": (":", 1.2), "vanilla_asgd": (":", 1.0)}


def plot_main(selected: list[dict], setup: AceSettings) -> list[str]:
    """``accuracy.png`` and ``accuracy_steps.png``: the mean test accuracy against virtual time and against server
    iterations, one panel per (alpha, beta)."""
    plt = pyplot()
    written = []
    for axis, name, xlabel in (("times", "accuracy.png", "virtual time"),
                               ("steps", "accuracy_steps.png", "server iteration")):
        rows, cols = len(setup.alphas), len(setup.betas)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False, sharey=True)
        for i, a in enumerate(setup.alphas):
            for j, b in enumerate(setup.betas):
                ax = axes[i][j]
                for m in setup.methods:
                    recs = [r for r in selected if r["method"] == m and r["alpha"] == a and r["beta"] == b]
                    if not recs:
                        continue
                    end = min(float(np.asarray(r[axis])[-1]) for r in recs)
                    grid = np.linspace(0.0, end, 300)
                    style, width = STYLES[m]
                    ax.plot(grid, mean_on_grid(recs, grid, axis, "test_accuracy"), style, linewidth=width,
                            label=LABELS[m])
                ax.set_title(f"Dir(α={a:g}), β={b:g}", fontsize=10)
                ax.set_xlabel(xlabel)
                ax.grid(alpha=0.3)
            axes[i][0].set_ylabel("test accuracy")
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        written.append(save_png(fig, setup.out, name))
    return written


def plot_dropout(dropout_rows: list[dict], ablation_rows: list[dict], dropout_selected: list[dict],
                 setup: AceSettings) -> str:
    """``dropout.png``: Fig. 3a, Fig. 3b and the accuracy curves at the largest dropout fraction."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    fr = setup.dropout_fractions
    for m in setup.dropout_methods:
        rows = {r["fraction"]: r for r in dropout_rows if r["method"] == m and r["accuracy"] is not None}
        xs = [f for f in fr if f in rows]
        style, width = STYLES[m]
        label = LABELS[m] + (f" (τ={setup.dropout_tau_algo:g})" if m == "aced" else "")
        axes[0].errorbar([100 * f for f in xs], [rows[f]["accuracy"] for f in xs],
                         yerr=[rows[f]["accuracy_2se"] or 0.0 for f in xs], fmt=style + "o", markersize=3, capsize=2,
                         linewidth=width, label=label)
    axes[0].set_title("(a) final accuracy vs dropout", fontsize=10)
    taus = sorted({r["tau"] for r in ablation_rows})
    for t in taus:
        rows = {r["fraction"]: r for r in ablation_rows if r["tau"] == t and r["accuracy"] is not None}
        xs = [f for f in fr if f in rows]
        axes[1].errorbar([100 * f for f in xs], [rows[f]["accuracy"] for f in xs],
                         yerr=[rows[f]["accuracy_2se"] or 0.0 for f in xs], fmt="-o", markersize=3, capsize=2,
                         label=f"ACED τ={t:g}")
    ace = {r["fraction"]: r for r in dropout_rows if r["method"] == "ace" and r["accuracy"] is not None}
    if ace and taus:
        xs = [f for f in fr if f in ace]
        axes[1].plot([100 * f for f in xs], [ace[f]["accuracy"] for f in xs], "k--", linewidth=1, label="ACE")
    axes[1].set_title("(b) ACED τ_algo ablation", fontsize=10)
    for ax in axes[:2]:
        ax.set_xlabel("clients dropped (%)")
        ax.set_ylabel("final test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    top = fr[-1]
    drop_times = []
    for m in setup.dropout_methods:
        recs = [r for r in dropout_selected if r["method"] == m and r["fraction"] == top]
        if recs:
            end = min(float(r["times"][-1]) for r in recs)
            grid = np.linspace(0.0, end, 300)
            style, width = STYLES[m]
            axes[2].plot(grid, mean_on_grid(recs, grid, "times", "test_accuracy"), style, linewidth=width,
                         label=LABELS[m])
            drop_times += [r["schedule"]["dropout_time"] for r in recs if r["schedule"].get("dropout_time")]
    for t in sorted(set(np.round(drop_times, 6))):
        axes[2].axvline(float(t), color="grey", linewidth=0.6)
    axes[2].set_title(f"(c) {top:.0%} of the clients leave (grey: dropout times)", fontsize=10)
    axes[2].set_xlabel("virtual time")
    axes[2].set_ylabel("test accuracy")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, setup.out, "dropout.png")


# ------------------------------------------------------------------------------------------------ main
def setting_statistics(setup: AceSettings) -> dict:
    """Per beta, participation and staleness of the all-active (ACE) schedule and staleness of FedBuff's, over seeds."""
    out = {}
    for b in setup.betas:
        ace = [participation_stats(make_method_schedule(setup, "ace", b, s)) for s in setup.seeds]
        buf = [participation_stats(make_method_schedule(setup, "fedbuff", b, s)) for s in setup.seeds]
        out[b] = {k: float(np.mean([x[k] for x in ace])) for k in ("participation_cv", "share_at_most_one_upload",
                                                                      "max_over_median_uploads", "virtual_time")}
        delays = delay_model(setup.delay_model, setup.t_fix, b)
        out[b]["fastest_share_ace"] = float(np.mean([schedule_fastest_share(
            make_method_schedule(setup, "ace", b, s), delays, s) for s in setup.seeds]))
        out[b]["fastest_share_fedbuff"] = float(np.mean([schedule_fastest_share(
            make_method_schedule(setup, "fedbuff", b, s), delays, s) for s in setup.seeds]))
        out[b]["staleness_ace"] = f"{np.mean([x['staleness_mean'] for x in ace]):.1f}"
        out[b]["staleness_fedbuff"] = f"{np.mean([x['staleness_mean'] for x in buf]):.2f}"
    return out


def main(argv: list[str] | None = None) -> int:
    """The command: runs the experiments of the arguments and writes ``table.md``, ``results.json`` and the figures
    to ``--out``; 2 when the dataset is not available."""
    return command_main(argv, parse_settings, run_all, write_report, load=load_checked)


def load_checked(setup: AceSettings) -> Dataset:
    """The dataset (a ``DataUnavailable`` says how to run without files), and a note for CIFAR at ``--scale cpu``."""
    try:
        dataset = load_ace_dataset(setup)
    except DataUnavailable as e:
        raise DataUnavailable(f"{e}" + ("\n(--dataset synthetic needs no files)" if setup.dataset == "fashion_mnist"
                                        else "")) from None
    if setup.scale == "cpu" and setup.dataset in ("cifar10", "cifar100"):
        print("note: CIFAR at --scale cpu keeps the CPU settings (equal uploads, tuned step sizes)", file=sys.stderr)
    return dataset


def run_all(setup: AceSettings, dataset: Dataset) -> tuple[dict[float, Task], dict[str, Any]]:
    """The tasks (one per alpha) and the results of :func:`run_experiments`."""
    tasks = make_tasks(setup, dataset)
    return tasks, run_experiments(tasks, setup)


def write_report(setup: AceSettings, results: tuple[dict[float, Task], dict[str, Any]], seconds: float) -> str:
    """``table.md``, ``results.json`` and the figures; returns the table."""
    tasks, result = results
    seconds = round(seconds, 1)
    dataset_name = ("LEAF Synthetic(1, 1) (pooled, re-split)" if setup.dataset == "synthetic"
                    else DATASET_TITLES[setup.dataset])
    table = format_table(result["main"], result["dropout"], result["ablation"], result["checks"], result["stats"],
                         setup, dataset_name, next(iter(tasks.values())).num_params, result["grid"])
    verdicts = setting_verdicts(result["runs"], setup)
    table += "\n".join(verdict_section(verdicts, result["stats"], setup)) + "\n"
    table += f"\nWall time: {seconds} s.\n"
    write_outputs(setup.out, table, {
        "verdicts": {f"{a:g}/{b:g}": [verdict_json(v) for v in vs] for (a, b), vs in verdicts.items()},
        "args": {k: v for k, v in vars(setup).items()},
        "grids": {m: lr_grid(setup, m) for m in METHODS},
        "main": result["main"], "grid": result["grid"], "dropout": result["dropout"], "ablation": result["ablation"],
        "dropout_server_lr": result["dropout_server_lr"], "checks": result["checks"],
        "schedules": {f"{b:g}": s for b, s in result["stats"].items()},
        "paper_table_a2": {"columns": PAPER_TABLE_A2_COLUMNS, "rows": PAPER_TABLE_A2},
        "runs": result["runs"], "dropout_runs": result["dropout_runs"], "seconds": seconds,
    }, indent=1, default=float)
    if result["runs"]:
        plot_main(result["runs"], setup)
        plot_verdict_figures(result["runs"], setup, f"{dataset_name} {setup.model}")
    if result["dropout"]:
        plot_dropout(result["dropout"], result["ablation"], result["dropout_runs"], setup)
    return table


def run_experiments(tasks: dict[float, Task], setup: AceSettings) -> dict[str, Any]:
    """Fig. 2's comparison (with the step-size selection), the dropout study and the checks: the per-setting rows
    (``main``, ``grid``, ``dropout``, ``ablation``), the selected runs and the schedule statistics."""
    records = run_main(tasks, setup) if setup.methods else []
    chosen = select(records, setup, ("alpha", "beta"))
    selected = [r for r in records if r["server_lr"] == chosen[(r["method"], r["alpha"], r["beta"])]]
    add_active_counts(selected, setup)
    main_rows = summarize(selected, setup, ("alpha", "beta"))
    grid_rows = [{k: r[k] for k in ("method", "alpha", "beta", "server_lr", "accuracy", "train_loss")}
                 for r in summarize(records, setup, ("alpha", "beta", "server_lr"))]
    dropout_rows, ablation_rows, dropout_selected, dropout_chosen = [], [], [], {}
    if run_dropout(setup):
        dropout_selected, ablation, dropout_chosen = run_dropout_study(tasks, setup, records, chosen)
        add_active_counts(dropout_selected + ablation, setup)
        dropout_rows = summarize(dropout_selected, setup, ("fraction",))
        ablation_rows = summarize(ablation, setup, ("tau", "fraction"))
    checks = direction_checks(main_rows, dropout_rows, ablation_rows, setup)
    return {"main": main_rows, "grid": grid_rows, "dropout": dropout_rows, "ablation": ablation_rows,
            "dropout_server_lr": dropout_chosen, "checks": checks, "stats": setting_statistics(setup),
            "runs": selected, "dropout_runs": dropout_selected}
