"""The AREA paper's experiments (Iakovidou & Kim, arXiv 2405.10123; digest 002), on the simulator.

Task (digest section 4): l2-regularised multinomial logistic regression, the project's ``area_logreg`` (784 -> 10,
no bias, ``W = 0`` at the start), nu = 1e-3 as the local SGD's coupled weight decay (the gradient of the paper's
``(nu/2) ||W||^2``), batch 32, a constant local step size alpha swept over a grid. The data are split over n clients
by a label-wise Dirichlet(0.1) (``--split dirichlet``, sections 5 and App. D) or the paper's IID split
(``--split iid``, App. E: per-class floor(N_c / n) to clients 1..n-1 and the remainder to client n for n = 128; an
even per-class split for n = 4).

Methods (digest section 2.2): every method the paper runs is available in the project.

=========  ====================================================================  ==================================
method     rule (project algorithm)                                              protocol (project)
=========  ====================================================================  ==================================
S-FedAvg   x <- mean of the sampled clients' local models (``fedavg``,           ``synchronous``, 4 clients sampled
           server_lr 1)                                                          per round (all 4 when n = 4)
AS-FedAvg  x <- mean of the Delta buffered local models (``as_fedavg``)           ``concurrent``: all n clients
FedBuff    x <- x + mean of the Delta buffered pseudo-gradients (``fedbuff``,     always training, a server step
           no staleness weight, server_lr 1)                                     every Delta arrivals, each
AREA       client memory y_i; sends x_i^M - y_i; x <- x + (1/n) sum (``area``)   arriving client re-sent the
                                                                                 current model at once
=========  ====================================================================  ==================================

Not in the paper, opt-in with ``--extras`` (clearly labelled as such in every output): vanilla asynchronous SGD
(``asgd``: every arrival applied on its own, the naive aggregation of the paper's Fig. 1), MIFA (``mifa``: server
memory of every client's latest pseudo-gradient, a step with their 1/n mean every Delta arrivals; the paper cites it
only in its theory) and FedAsync (``fedasync``, polynomial staleness ``(tau+1)^-0.5``, mixing weight 0.6, on every
arrival). Not available: AsyncCommSGD and AFA-CD (related work only in the paper; not in the project).

Event model (digest section 3, Example 3). Client i's updates arrive as a Poisson process of rate lambda_i: a job of
client i takes ``s_i * Exp(1)`` with ``s_i = 1 / lambda_i`` (``DelayModel`` with ``noise="exponential"``; the speeds
come from :class:`asyncfl_jax.timing.PoissonRates`, a ``DelayModel`` whose ``s_i`` are the inverse of rates drawn once
per schedule). Uniform rates: lambda_i = 10. Non-uniform: lambda_i ~ N(10, sd^2) with sd = 5 (digest A1), redrawn while
<= 0 (a truncated normal); ``--rate-stds`` adds more heterogeneity levels. Every asynchronous method aggregates after
every Delta client messages (count rule, Delta = 4 for n = 128, 2 for n = 4; a fast client may fill several buffer
slots); the arriving client restarts at once from the current model, and the client completing a buffer gets the
post-aggregation model (digest A5). Theory's independent server clock (``aggregation="poisson"``) is not what the
experiments use and is not run here. The horizon t_h is virtual time (15 for n = 128, M = 1; 2 for n = 128, M = 50; 100
for n = 4): steps after t_h are removed from each trial's schedule (the jobs in flight are discarded, digest A17), so
the final model is the model at t_h. Trial s uses timing seed s for every method and alpha (common random numbers: the
same rates and job times), and training seed 1000 j + s for heterogeneity level j.

Metrics (digest section 4, A11): test accuracy of the server model on the full test set at t_h; the loss
``f = mean CE over all training examples + (nu/2) ||W||^2`` at t_h (from the final models); rho = t_target / t_h,
where t_target is the first time the trial-mean test accuracy reaches the target (80% on MNIST as in the paper;
``--target``), on a grid of 400 points in [0, t_h] (">1" if never). Tables give mean (min - max) over trials and, for
every alpha the paper printed, the paper's numbers beside the measured ones (the paper's numbers are on MNIST: with
``--dataset fashion_mnist`` they are a reference for the direction only). "retained" marks the two largest alphas
whose final loss is finite in every trial (the paper's rule); "*" the alpha with the highest mean final accuracy
(drawn in the figures; the two differ when large alphas stay finite but useless). The loss curves in the figures
are the cross-entropy on a fixed sample of ``--train-eval-size`` training examples, without the ``(nu/2)||W||^2``
term (the simulator's evaluation); the table's loss is the exact f.

Scales:

* ``--scale cpu`` (default; several minutes on 2 CPU cores): Fashion-MNIST (installed by Debian's
  ``dataset-fashion-mnist``), the paper's headline setting (n = 128, Dirichlet(0.1), M = 1, t_h = 15, Delta = 4,
  Table 3), uniform and non-uniform rates, 2 trials, 3-4 alphas per method around its best on Fashion-MNIST
  (``CPU_GRIDS``; the large alphas the paper retained on MNIST collapse on Fashion-MNIST), about 50 evaluations per
  run, rho at 75% test accuracy.
* ``--scale paper``: MNIST (IDX files via ``--data-dir`` or ``$ASYNCFL_MNIST_DIR``, or a prepared TFDS ``mnist``),
  all four settings of Tables 3-6 (``--split iid``: Tables 7-10), the full grid alpha in {1e-2, ..., 1e4} for every
  method, 10 trials, 200 evaluations, the loss curves on all 60,000 training examples. Hours on a CPU; meant for an
  accelerator.
* ``--quick``: the cpu setting cut to t_h = 4, one trial, two alphas per method.

The command is ``scripts/reproduce_area.py`` (examples in its docstring, options in ``--help``).

It writes ``table.md``, ``results.json`` (every run's curves, per-row statistics, per-trial times to target, the
rates drawn, the paper's numbers), ``curves_<setting>.png`` (test accuracy and training loss against virtual time,
one column per heterogeneity level, each method at its best alpha, min-max band over trials) and, with two
or more heterogeneity levels, ``heterogeneity_<setting>.png`` (final accuracy and rho against the rate spread).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from asyncfl_jax import LocalConfig, ReplicaSpec, Schedule, Task, get_algorithm, make_model, make_task
from asyncfl_jax.algorithms import skip_empty_steps
from asyncfl_jax.data import partition
from asyncfl_jax.reproduce.curves import first_passage, mean_on_grid, value_on_grid
from asyncfl_jax.reproduce.data import DATASET_TITLES, load_dataset
from asyncfl_jax.reproduce.grid import command_main, replica_runs, run_grid, setting_seed
from asyncfl_jax.reproduce.report import pyplot, save_png, write_outputs, yes_no
from asyncfl_jax.reproduce.settings import ReproductionSettings
from asyncfl_jax.reproduce.verdicts import (claim_verdicts, participation_line, plot_methods, schedule_fastest_share,
                                            verdict_json, verdict_lines)
from asyncfl_jax.timing import (PoissonRates, build_past, client_rates, concurrent, cut_at_horizon, poisson_delays,
                                rates_info, steps_within, synchronous)

# ------------------------------------------------------------------------------------------------ the paper's data
SETTINGS = {
    # n, local steps M, horizon t_h, buffer Delta, S-FedAvg participants (None: all), paper table per split
    "n128_m1": {"n": 128, "local_steps": 1, "horizon": 15.0, "buffer": 4, "participants": 4,
                "tables": {"dirichlet": 3, "iid": 7}},
    "n128_m50": {"n": 128, "local_steps": 50, "horizon": 2.0, "buffer": 4, "participants": 4,
                 "tables": {"dirichlet": 4, "iid": 8}},
    "n4_m1": {"n": 4, "local_steps": 1, "horizon": 100.0, "buffer": 2, "participants": None,
              "tables": {"dirichlet": 5, "iid": 9}},
    "n4_m50": {"n": 4, "local_steps": 50, "horizon": 100.0, "buffer": 2, "participants": None,
               "tables": {"dirichlet": 6, "iid": 10}},
}

PAPER_METHODS = ("S-FedAvg", "AS-FedAvg", "FedBuff", "AREA")
EXTRA_METHODS = ("AsyncSGD", "MIFA", "FedAsync")
METHODS = {
    # label: (project algorithm, options, protocol kind, fixed hyper-parameters)
    "S-FedAvg": ("fedavg", {}, "synchronous", {"server_lr": 1.0}),
    "AS-FedAvg": ("as_fedavg", {}, "buffered", {}),
    "FedBuff": ("fedbuff", {"staleness": "constant", "normalization": "buffer"}, "buffered", {"server_lr": 1.0}),
    "AREA": ("area", {"lr_schedule": "constant"}, "buffered", {}),
    "AsyncSGD": ("asgd", {"upload": "delta"}, "per_arrival", {"server_lr": 1.0}),
    "MIFA": ("mifa", {}, "buffered", {"server_lr": 1.0}),
    "FedAsync": ("fedasync", {"staleness": "polynomial"}, "per_arrival", {"alpha": 0.6, "staleness_a": 0.5}),
}
UNAVAILABLE = {"AsyncCommSGD": "needs a shared global clock with client-side step decay (theory comparison only)",
               "AFA-CD": "related work only; not implemented in the project"}

PAPER_GRID = [1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4]
# CPU scale (Fashion-MNIST): three decades per method around its best final accuracy (four for FedBuff, whose best
# is at the low end) in a one-trial scan of the
# whole paper grid (docs/reproduce_area.md). On Fashion-MNIST every method collapses at the alphas the paper retained
# on MNIST (accuracy 20-45% at alpha >= 100, loss in the thousands) without becoming non-finite, so they are left out.
CPU_GRIDS = {"S-FedAvg": [1e-1, 1e0, 1e1], "AS-FedAvg": [1e-2, 1e-1, 1e0], "FedBuff": [1e-3, 1e-2, 1e-1, 1e0],
             "AREA": [1e-1, 1e0, 1e1], "AsyncSGD": [1e-3, 1e-2, 1e-1], "MIFA": [1e-2, 1e-1, 1e0],
             "FedAsync": [1e-1, 1e0, 1e1]}
QUICK_GRIDS = {"S-FedAvg": [1e-1, 1e0], "AS-FedAvg": [1e-2, 1e-1], "FedBuff": [1e-2, 1e-1], "AREA": [1e0, 1e1],
               "AsyncSGD": [1e-3, 1e-2], "MIFA": [1e-2, 1e-1], "FedAsync": [1e-1, 1e0]}

# Tables 3-10 as printed (digest section 5): table, method | uniform | non-uniform, each "alpha rho acc acc_min
# acc_max loss loss_min loss_max" or "-" (Table 7 prints no uniform row for AREA at alpha = 1e2).
PAPER_TEXT = """
3 S-FedAvg | 1e1 >1 61.16 52.75 66.46 1.56 1.41 1.78 | 1e1 >1 42.23 19.07 55.31 2.22 1.72 3.55
3 S-FedAvg | 1e2 0.80 74.06 41.21 85.20 1.69 0.90 5.55 | 1e2 >1 60.36 9.65 78.08 2.78 1.16 9.48
3 AS-FedAvg | 1e2 0.28 84.14 79.15 87.89 0.89 0.74 1.09 | 1e2 0.28 84.40 70.04 88.96 0.89 0.71 1.56
3 AS-FedAvg | 1e3 0.30 79.83 66.79 88.70 8.19 5.27 11.91 | 1e3 0.33 70.20 20.91 88.59 16.29 4.80 76.90
3 FedBuff | 1e0 0.46 85.38 84.74 86.21 0.81 0.79 0.82 | 1e0 0.48 85.21 83.82 86.15 0.81 0.79 0.85
3 FedBuff | 1e1 0.06 78.56 61.01 89.78 3.79 1.74 8.06 | 1e1 0.05 78.57 65.32 88.88 3.51 1.66 9.69
3 AREA | 1e2 0.29 87.38 87.07 87.92 0.74 0.73 0.75 | 1e2 0.55 84.37 81.83 86.11 0.84 0.79 0.93
3 AREA | 1e3 0.09 87.54 79.38 91.41 0.59 0.47 0.91 | 1e3 0.09 87.53 81.46 90.43 0.64 0.55 1.01
4 S-FedAvg | 1e2 >1 73.99 45.06 85.90 1.17 0.63 3.08 | 1e2 >1 59.69 11.02 81.14 2.44 0.84 10.11
4 S-FedAvg | 1e3 >1 53.45 24.65 77.09 13.20 3.48 50.69 | 1e3 >1 48.52 9.71 75.88 11.12 2.78 34.85
4 AS-FedAvg | 1e1 >1 76.92 66.63 81.14 1.00 0.89 1.24 | 1e1 >1 77.17 68.80 80.59 0.99 0.93 1.19
4 AS-FedAvg | 1e2 0.54 79.66 69.47 87.49 0.86 0.54 1.38 | 1e2 0.57 80.98 74.76 86.09 0.78 0.56 1.37
4 FedBuff | 1e-1 >1 40.22 28.34 47.01 2.21 2.00 2.63 | 1e-1 >1 39.63 32.13 46.41 2.25 2.08 2.50
4 FedBuff | 1e0 0.36 84.16 78.19 89.38 0.80 0.63 1.39 | 1e0 0.27 85.12 78.60 89.44 0.73 0.64 0.88
4 AREA | 1e2 0.38 88.02 87.53 88.32 0.59 0.58 0.61 | 1e2 0.52 86.03 85.14 87.24 0.68 0.65 0.73
4 AREA | 1e3 0.12 87.29 85.45 88.11 1.58 1.49 1.79 | 1e3 0.11 87.28 86.21 87.99 1.44 1.33 1.55
5 S-FedAvg | 1e0 0.15 89.34 88.90 90.00 0.65 0.64 0.65 | 1e0 0.34 86.86 67.80 90.24 0.74 0.60 1.37
5 S-FedAvg | 1e1 0.06 84.17 77.35 88.94 0.85 0.60 1.21 | 1e1 0.16 84.70 65.53 90.78 1.00 0.53 3.90
5 AS-FedAvg | 1e0 0.13 89.72 89.13 90.26 0.61 0.60 0.62 | 1e0 0.19 87.39 69.92 90.30 0.70 0.58 1.59
5 AS-FedAvg | 1e1 0.08 84.94 79.78 89.68 1.38 0.99 2.07 | 1e1 0.09 81.75 65.08 89.97 1.76 0.90 5.66
5 FedBuff | 1e-1 >1 60.43 57.18 65.16 1.55 1.43 1.64 | 1e-1 >1 58.53 37.87 64.27 1.67 1.44 2.76
5 FedBuff | 1e0 0.05 90.80 89.42 91.48 0.48 0.46 0.53 | 1e0 0.08 89.20 82.85 91.33 0.52 0.43 0.70
5 AREA | 1e0 0.15 89.30 88.87 89.69 0.65 0.64 0.66 | 1e0 0.16 89.14 87.75 90.04 0.65 0.61 0.71
5 AREA | 1e1 0.07 84.66 74.37 90.43 0.96 0.56 2.57 | 1e1 0.08 84.27 67.71 89.69 0.90 0.60 2.04
6 S-FedAvg | 1e0 0.13 87.59 86.59 88.35 0.48 0.46 0.49 | 1e0 0.26 86.17 75.78 87.69 0.56 0.46 1.01
6 S-FedAvg | 1e1 0.07 82.95 78.47 85.66 1.27 1.09 1.71 | 1e1 0.11 82.93 77.05 85.61 1.27 1.07 1.76
6 AS-FedAvg | 1e0 0.72 75.36 53.02 88.79 0.80 0.44 1.49 | 1e0 >1 70.48 49.17 88.10 1.01 0.43 1.74
6 AS-FedAvg | 1e1 >1 64.83 51.04 79.13 3.80 1.50 10.22 | 1e1 >1 63.72 42.68 76.98 4.13 2.05 8.45
6 FedBuff | 1e-1 0.92 80.76 78.67 81.98 0.93 0.91 0.98 | 1e-1 >1 77.12 66.49 81.93 1.04 0.87 1.33
6 FedBuff | 1e0 >1 55.13 27.04 78.08 2.80 0.79 6.25 | 1e0 >1 57.48 37.98 84.94 2.08 0.52 3.79
6 AREA | 1e0 0.13 87.46 86.12 88.38 0.48 0.46 0.52 | 1e0 0.21 85.83 53.72 88.55 0.56 0.45 1.65
6 AREA | 1e1 0.06 82.88 76.87 85.19 1.27 1.08 1.63 | 1e1 0.13 82.65 73.56 84.81 1.28 1.11 1.92
7 S-FedAvg | 1e1 >1 62.86 58.96 65.74 1.50 1.40 1.62 | 1e1 >1 41.51 22.28 56.14 2.21 1.77 3.07
7 S-FedAvg | 1e2 0.42 85.44 82.94 86.42 0.79 0.76 0.85 | 1e2 >1 73.16 30.42 84.82 1.24 0.84 3.20
7 AS-FedAvg | 1e1 >1 74.71 72.81 76.46 1.14 1.11 1.20 | 1e1 >1 75.28 68.76 77.54 1.13 1.06 1.31
7 AS-FedAvg | 1e2 0.18 88.80 87.90 89.49 0.67 0.65 0.68 | 1e2 0.16 88.70 87.33 89.50 0.66 0.64 0.70
7 FedBuff | 1e0 0.44 85.64 84.94 86.11 0.80 0.79 0.82 | 1e0 0.44 85.64 84.90 86.44 0.81 0.79 0.82
7 FedBuff | 1e1 0.04 83.36 68.14 91.03 1.26 0.76 2.80 | 1e1 0.03 85.31 76.51 89.35 0.99 0.61 2.50
7 AREA | - | 1e2 0.53 84.14 80.47 85.80 0.85 0.79 0.98
7 AREA | 1e3 0.05 90.20 88.20 91.53 0.48 0.45 0.52 | 1e3 0.08 89.95 86.77 91.39 0.54 0.48 0.63
8 S-FedAvg | 1e2 0.15 89.60 88.17 90.39 0.57 0.51 0.66 | 1e2 0.30 87.76 81.34 90.49 0.68 0.52 0.94
8 S-FedAvg | 1e3 0.18 84.57 75.58 87.94 4.01 2.66 13.51 | 1e3 0.33 85.22 79.39 87.96 3.37 2.80 4.39
8 AS-FedAvg | 1e1 0.22 88.05 87.40 88.58 0.71 0.69 0.72 | 1e1 0.21 88.01 87.41 88.66 0.70 0.69 0.73
8 AS-FedAvg | 1e2 0.00 90.77 90.04 91.24 0.44 0.43 0.48 | 1e2 0.00 90.75 90.32 91.31 0.44 0.42 0.46
8 FedBuff | 1e-1 >1 43.42 37.16 48.46 2.13 1.96 2.35 | 1e-1 >1 42.39 36.06 48.00 2.19 1.96 2.48
8 FedBuff | 1e0 0.15 90.53 89.48 91.03 0.62 0.59 0.66 | 1e0 0.14 90.71 90.25 91.04 0.61 0.56 0.69
8 AREA | 1e2 0.14 90.87 90.67 91.11 0.51 0.50 0.52 | 1e2 0.17 90.09 88.98 90.61 0.57 0.54 0.61
8 AREA | 1e3 0.04 89.58 89.15 89.77 2.48 2.41 2.55 | 1e3 0.04 89.47 89.27 89.66 2.42 2.34 2.50
9 S-FedAvg | 1e0 0.15 89.39 88.95 89.81 0.64 0.63 0.65 | 1e0 0.32 86.87 63.53 89.94 0.74 0.61 1.45
9 S-FedAvg | 1e1 0.05 85.40 75.49 89.57 0.83 0.56 1.75 | 1e1 0.51 79.56 15.37 90.78 1.42 0.54 8.56
9 AS-FedAvg | 1e0 0.11 90.00 89.65 90.31 0.60 0.59 0.62 | 1e0 0.13 89.78 88.17 90.85 0.62 0.56 0.70
9 AS-FedAvg | 1e1 0.05 81.81 64.96 89.18 1.09 0.63 2.79 | 1e1 0.05 83.48 55.73 89.90 0.94 0.61 2.84
9 FedBuff | 1e-1 >1 60.38 55.22 63.03 1.57 1.52 1.71 | 1e-1 >1 60.07 38.34 68.07 1.58 1.33 2.23
9 FedBuff | 1e0 0.04 91.19 90.75 91.69 0.46 0.45 0.48 | 1e0 0.04 91.26 90.67 91.78 0.46 0.42 0.53
9 AREA | 1e0 0.15 89.27 88.87 89.57 0.65 0.64 0.66 | 1e0 0.26 87.88 83.75 90.33 0.71 0.61 0.88
9 AREA | 1e1 0.04 85.99 75.94 90.05 0.67 0.49 1.37 | 1e1 0.06 86.97 81.21 89.95 0.68 0.48 2.04
10 S-FedAvg | 1e0 0.02 91.86 91.66 92.08 0.39 0.38 0.40 | 1e0 0.11 91.15 87.88 92.12 0.48 0.38 0.73
10 S-FedAvg | 1e1 0.02 89.01 84.38 90.70 0.89 0.77 1.25 | 1e1 0.06 88.55 82.65 90.52 0.96 0.80 1.66
10 AS-FedAvg | 1e0 0.01 91.81 91.34 92.18 0.37 0.36 0.38 | 1e0 0.01 91.71 91.21 91.98 0.38 0.36 0.43
10 AS-FedAvg | 1e1 0.01 85.04 76.10 89.73 1.18 0.86 1.88 | 1e1 0.01 84.65 79.72 90.16 1.18 0.94 1.53
10 FedBuff | 1e-1 0.47 85.32 84.64 86.11 0.82 0.80 0.85 | 1e-1 0.45 85.65 81.55 87.61 0.81 0.74 0.92
10 FedBuff | 1e0 0.01 86.64 66.85 91.68 0.52 0.36 1.26 | 1e0 0.01 87.49 75.13 91.84 0.48 0.36 0.85
10 AREA | 1e0 0.03 91.84 91.58 92.05 0.39 0.39 0.39 | 1e0 0.06 91.25 86.54 92.10 0.46 0.38 0.75
10 AREA | 1e1 0.01 89.17 87.25 90.44 0.88 0.78 0.99 | 1e1 0.02 88.41 79.40 90.59 0.95 0.80 1.59
"""
PAPER_RATE_STDS = (0.0, 5.0)  # the two columns of every table: uniform, N(10, 5)


def parse_paper(text: str = PAPER_TEXT) -> dict[tuple[int, str, float], dict[float, dict[str, Any]]]:
    """``{(table, method, rate_std): {alpha: {"rho", "acc", "acc_min", "acc_max", "loss", "loss_min",
    "loss_max"}}}`` (``rho`` is ``None`` for the paper's ">1"; accuracies in %)."""
    out: dict[tuple[int, str, float], dict[float, dict[str, Any]]] = {}
    for line in text.strip().splitlines():
        head, *cols = [c.strip() for c in line.split("|")]
        table, method = head.split()
        for std, col in zip(PAPER_RATE_STDS, cols):
            if col == "-":
                continue
            alpha, rho, *vals = col.split()
            keys = ("acc", "acc_min", "acc_max", "loss", "loss_min", "loss_max")
            row = {"rho": None if rho == ">1" else float(rho), **{k: float(v) for k, v in zip(keys, vals)}}
            out.setdefault((int(table), method, std), {})[float(alpha)] = row
    return out


PAPER = parse_paper()


# ------------------------------------------------------------------------------------------------ virtual time
def build_schedule(kind: str, n: int, buffer: int, participants: int | None, delays: PoissonRates, seed: int,
                   steps: int) -> Schedule:
    """A method's schedule: synchronous rounds of ``participants`` clients, or every client always training with a
    server step every ``buffer`` arrivals (``per_arrival``: every arrival)."""
    if kind == "synchronous":
        return synchronous(n, steps, delays, seed, participants=participants)
    delta = 1 if kind == "per_arrival" else buffer
    return concurrent(n, steps, delays, seed, concurrency=n, buffer_size=delta, refill="immediate")


def first_guess(kind: str, setting: dict, delays: PoissonRates) -> int:
    """Server steps that should reach the horizon (about 15% more than the expected number, + 20)."""
    n, horizon, buffer = setting["n"], setting["horizon"], setting["buffer"]
    if kind == "synchronous":
        return int(horizon * delays.rate_mean) + 20
    rate = n * delays.rate_mean  # total arrivals per unit of time, about
    return int(1.15 * horizon * rate / (1 if kind == "per_arrival" else buffer)) + 20


def horizon_schedules(kind: str, setting: dict, delays_by_level: list[PoissonRates],
                      trials: list[int]) -> list[Schedule]:
    """One schedule per (level, trial), in that order, all cut at the horizon and of one length; each records its
    rates (``info["poisson_rates"]``)."""
    n, horizon = setting["n"], setting["horizon"]

    def builder(j: int, s: int) -> Callable[[int], Schedule]:
        def build(steps: int) -> Schedule:
            sched = build_schedule(kind, n, setting["buffer"], setting["participants"], delays_by_level[j], s, steps)
            return dataclasses.replace(sched, info={**sched.info,
                                                    "poisson_rates": rates_info(delays_by_level[j], n, s)})
        return build

    built = {}
    for j, delays in enumerate(delays_by_level):
        steps = first_guess(kind, setting, delays)
        for s in trials:  # the guess grows from trial to trial: the schedules' widths are those of the longest build
            built[(j, s)], steps = build_past(builder(j, s), horizon, steps)
    needed = max(1, max(steps_within(sc, horizon) for sc in built.values()))
    for (j, s), sched in built.items():
        if sched.num_steps < needed:  # a schedule is a prefix of a longer one: extend it to the common length
            built[(j, s)] = builder(j, s)(needed)
    return [cut_at_horizon(built[(j, s)], horizon, needed)  # the engine pads them to common widths
            for j in range(len(delays_by_level)) for s in trials]


# ------------------------------------------------------------------------------------------------ data
def even_iid(labels: np.ndarray, n: int, rng: np.random.Generator, remainder_to_last: bool) -> list[np.ndarray]:
    """The paper's IID splits (App. E, digest A7): per class, ``floor(N_c / n)`` examples to each of clients 1..n-1
    and the rest to client n (``remainder_to_last``, the nearly-IID n = 128 split), or near-equal parts
    (``np.array_split``, the "perfectly IID" n = 4 split)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if remainder_to_last:
            q = len(idx) // n
            chunks = [idx[i * q:(i + 1) * q] for i in range(n - 1)] + [idx[(n - 1) * q:]]
        else:
            chunks = np.array_split(idx, n)
        for i, chunk in enumerate(chunks):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def split_data(labels: np.ndarray, n: int, split: str, dirichlet_alpha: float, seed: int = 0) -> list[np.ndarray]:
    """The clients' example indices: a label-wise Dirichlet split or the paper's IID split (:func:`even_iid`)."""
    if split == "dirichlet":
        # Label-wise Dirichlet(alpha), every client at least 10 examples (digest A6; the project's FedMA-style
        # partitioner, which also stops giving a class to clients that already hold N / n examples).
        return partition("dirichlet", labels, n, seed=seed, alpha=dirichlet_alpha, min_size=min(10, len(labels) // n))
    return even_iid(labels, n, np.random.default_rng([seed, 0xA4EA]), remainder_to_last=n > 4)


# ------------------------------------------------------------------------------------------------ the runs
def grid_for(method: str, setup: AreaSettings) -> list[float]:
    """The local step sizes alpha swept for a method: ``--alphas``, else the scale's grid."""
    if setup.alphas:
        return sorted(setup.alphas)
    return sorted(PAPER_GRID if setup.scale == "paper" else (QUICK_GRIDS if setup.quick else CPU_GRIDS)[method])


def run_method(task: Task, method: str, setting_name: str, setting: dict, setup: AreaSettings) -> list[dict]:
    """One compiled program per (setting, method): replicas = heterogeneity levels x trials x alphas, replica
    (level j, trial s) with the training seed ``setting_seed(j, s)``. Returns one record per replica with its
    curves, its final accuracy and the exact final loss."""
    name, options, kind, fixed = METHODS[method]
    levels = [poisson_delays(setup.rate_mean, std) for std in setup.rate_stds]
    schedules = horizon_schedules(kind, setting, levels, setup.trials)
    grid = grid_for(method, setup)
    algorithm = skip_empty_steps(get_algorithm(name, **options))
    cells = [(j, i, s) for j in range(len(levels)) for i, s in enumerate(setup.trials)]
    shares = {(j, i): schedule_fastest_share(schedules[j * len(setup.trials) + i], levels[j], s) for j, i, s in cells}
    replicas = [ReplicaSpec(schedules[j * len(setup.trials) + i], seed=setting_seed(j, s),
                            hparams={**fixed, "weight_decay": setup.nu, "client_lr": alpha},
                            label={"method": method, "alpha": float(alpha), "rate_std": setup.rate_stds[j], "trial": s})
                for j, i, s in cells for alpha in grid]
    fastest = [shares[j, i] for j, i, _ in cells for _ in grid]
    eval_every = max(1, int(round(schedules[0].num_steps / setup.evals)))
    frame = run_grid(task, algorithm, replicas, local=LocalConfig(steps=setting["local_steps"],
                                                                  batch_size=setup.batch_size),
                     name=f"{setting_name} {method}", eval_every=eval_every,
                     per_replica=lambda history: {"final_loss": exact_losses(task, history.final_params, setup.nu),
                                                  "fastest_share": fastest,
                                                  **schedule_columns([r.schedule for r in replicas])})
    frame["time"] = np.minimum(frame["time"], setting["horizon"])  # after the horizon's last step: the model at t_h
    counted = "local_steps" in frame.columns
    runs = replica_runs(frame, ("method", "alpha", "rate_std", "trial", "seed", "final_loss", "diverged_at",
                                "uploads_total", "server_steps", "staleness_mean", "fastest_share"),
                        {"times": "time", "accuracy": "test_accuracy", "train_ce": "train_loss",
                         "upload_curve": "uploads", **({"local_step_curve": "local_steps"} if counted else {})})
    return [{"setting": setting_name, "method": method, "alpha": r["alpha"], "rate_std": r["rate_std"],
             "trial": r["trial"], "training_seed": r["seed"], "times": r["times"], "accuracy": r["accuracy"],
             "train_ce": r["train_ce"], "upload_curve": r["upload_curve"],
             "local_step_curve": r.get("local_step_curve"), "fastest_share": r["fastest_share"],
             "final_accuracy": r["accuracy"][-1], "final_loss": float(r["final_loss"]),
             "diverged_at": r["diverged_at"], "uploads": r["uploads_total"], "server_steps": r["server_steps"],
             "staleness_mean": r["staleness_mean"]} for r in runs]


def schedule_columns(schedules: list[Schedule]) -> dict[str, list]:
    """Per replica, from its schedule: the uploads, the server steps with an arrival and the mean staleness."""
    real = [s.arrival_clients >= 0 for s in schedules]
    return {"uploads_total": [int(m.sum()) for m in real],
            "server_steps": [int(m.any(axis=1).sum()) for m in real],
            "staleness_mean": [float(s.staleness[m].mean()) if m.any() else None for s, m in zip(schedules, real)]}


def exact_losses(task: Task, final_params: np.ndarray, nu: float) -> np.ndarray:
    """The paper's f at each final model: mean cross-entropy over every training example + (nu/2) ||W||^2."""
    x, y = task.train.features, task.train.labels

    @jax.jit
    def f(flat):
        def batch(i):
            xb = jax.lax.dynamic_slice_in_dim(xp, i * b, b)
            yb = jax.lax.dynamic_slice_in_dim(yp, i * b, b)
            wb = jax.lax.dynamic_slice_in_dim(wp, i * b, b)
            return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(task.model.flat_apply(flat, xb), yb) * wb)

        total = jnp.sum(jax.lax.map(batch, jnp.arange(nb)))
        return total / x.shape[0] + 0.5 * nu * jnp.sum(flat * flat)

    b = min(10_000, int(x.shape[0]))
    nb = -(-int(x.shape[0]) // b)
    pad = nb * b - int(x.shape[0])
    xp = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)])
    yp = jnp.concatenate([y, jnp.zeros((pad,), y.dtype)])
    wp = (jnp.arange(nb * b) < x.shape[0]).astype(jnp.float32)
    return np.array([float(f(jnp.asarray(p))) for p in np.asarray(final_params)])


# ------------------------------------------------------------------------------------------------ metrics
def summarize(records: list[dict], setup: AreaSettings) -> list[dict]:
    """One row per (setting, method, rate_std, alpha): mean/min/max over trials, rho from the trial-mean curve."""
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["setting"], rec["method"], rec["rate_std"], rec["alpha"]), []).append(rec)
    rows = []
    for (setting, method, std, alpha), recs in groups.items():
        horizon = SETTINGS[setting]["horizon"] if setup.horizon is None else setup.horizon
        grid = np.linspace(0.0, horizon, 400)
        finite = [r for r in recs if r["diverged_at"] < 0 and math.isfinite(r["final_loss"])]
        row = {"setting": setting, "method": method, "rate_std": std, "alpha": alpha, "trials": len(recs),
               "finite_trials": len(finite), "horizon": horizon}
        if finite:
            acc = np.array([100.0 * r["final_accuracy"] for r in finite])
            loss = np.array([r["final_loss"] for r in finite])
            curve = mean_on_grid(finite, grid, "times", "accuracy")
            t_hit = first_passage(grid, curve, setup.target)
            per_trial = [first_passage(grid, value_on_grid(r["times"], r["accuracy"], grid), setup.target)
                         for r in finite]
            row.update(acc=float(acc.mean()), acc_min=float(acc.min()), acc_max=float(acc.max()),
                       loss=float(loss.mean()), loss_min=float(loss.min()), loss_max=float(loss.max()),
                       rho=None if t_hit is None else t_hit / horizon,
                       rho_per_trial=[None if t is None else t / horizon for t in per_trial],
                       uploads=float(np.mean([r["uploads"] for r in finite])),
                       staleness_mean=float(np.mean([r["staleness_mean"] or 0.0 for r in finite])))
        rows.append(row)
    mark_retained(rows)
    return sorted(rows, key=lambda r: (list(SETTINGS).index(r["setting"]), r["rate_std"],
                                       list(METHODS).index(r["method"]), r["alpha"]))


def mark_retained(rows: list[dict]) -> None:
    """Per (setting, method, level): "retained" marks the two largest alphas with a finite final loss in every trial
    (the paper's rule); "best" the alpha with the highest mean final accuracy among those finite in every trial
    (the one drawn in the figures; on Fashion-MNIST the largest finite alphas are often useless)."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["setting"], r["method"], r["rate_std"]), []).append(r)
    for group in by.values():
        finite = sorted((r for r in group if r["finite_trials"] == r["trials"]), key=lambda r: r["alpha"])
        kept = finite[-2:]
        for r in group:
            r["retained"] = r in kept
            r["best"] = False
        if finite:
            max(finite, key=lambda r: r["acc"])["best"] = True


def paper_row(setting: str, split: str, method: str, std: float, alpha: float) -> dict | None:
    """The paper's printed row of a method at one alpha and rate level (None if the table has none)."""
    table = SETTINGS[setting]["tables"][split]
    return PAPER.get((table, method, std), {}).get(alpha)


def paper_best(setting: str, split: str, std: float, key: str) -> tuple[str, float] | None:
    """The paper's best method (highest accuracy, or lowest rho) over its printed rows at one rate level."""
    table = SETTINGS[setting]["tables"][split]
    best = None
    for method in PAPER_METHODS:
        for row in PAPER.get((table, method, std), {}).values():
            value = row["acc"] if key == "acc" else (math.inf if row["rho"] is None else row["rho"])
            better = best is None or (value > best[1] if key == "acc" else value < best[1])
            if better:
                best = (method, value)
    return best


def paper_change(setting: str, split: str, lo: float, hi: float) -> str:
    """The same comparison on the paper's table (its best printed row per method), when it has both levels."""
    if lo not in PAPER_RATE_STDS or hi not in PAPER_RATE_STDS:
        return ""
    table = SETTINGS[setting]["tables"][split]
    change = {}
    for m in PAPER_METHODS:
        a, b = PAPER.get((table, m, lo), {}), PAPER.get((table, m, hi), {})
        if a and b:
            change[m] = max(r["acc"] for r in b.values()) - max(r["acc"] for r in a.values())
    worst = all(change["S-FedAvg"] < d for m, d in change.items() if m != "S-FedAvg")
    return (f". Paper (Table {table}): {yes_no(worst)} ("
            + ", ".join(f"{m} {d:+.2f}" for m, d in change.items()) + ")")


# ------------------------------------------------------------------------------------------------ tables
def level_name(std: float, mean: float) -> str:
    """The name of a heterogeneity level (the rate distribution)."""
    return f"uniform (lambda_i = {mean:g})" if std == 0 else f"non-uniform (lambda_i ~ N({mean:g}, {std:g}^2))"


def fmt_range(mean: float, lo: float, hi: float, digits: int) -> str:
    """``mean (lo-hi)``."""
    return f"{mean:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def fmt_rho(rho: float | None) -> str:
    """rho with two decimals, ``>1`` for never."""
    return ">1" if rho is None else f"{rho:.2f}"


def direction_checks(rows: list[dict], setup: AreaSettings) -> list[str]:
    """The paper's claims for each setting, on the measured rows (each method at its best alpha)."""
    out = []
    for setting in setup.settings:
        best = {(r["method"], r["rate_std"]): r for r in rows if r["setting"] == setting and r["best"]}
        methods = [m for m in setup.methods if m in PAPER_METHODS]
        for std in setup.rate_stds:
            cand = [best[(m, std)] for m in methods if (m, std) in best]
            if not cand:
                continue
            top = max(cand, key=lambda r: r["acc"])
            fastest = min(cand, key=lambda r: math.inf if r["rho"] is None else r["rho"])
            narrow = min(cand, key=lambda r: r["acc_max"] - r["acc_min"])
            line = (f"{setting}, {level_name(std, setup.rate_mean)}: highest final accuracy {top['method']} "
                    f"({top['acc']:.2f}%, alpha {top['alpha']:g}); reaches {100 * setup.target:g}% first "
                    f"{fastest['method']} (rho {fmt_rho(fastest['rho'])}); narrowest trial range {narrow['method']}")
            if std in PAPER_RATE_STDS:
                pa, pr = paper_best(setting, setup.split, std, "acc"), paper_best(setting, setup.split, std, "rho")
                line += (f". Paper (MNIST): highest {pa[0]} ({pa[1]:.2f}%), first to 80% {pr[0]} "
                         f"(rho {fmt_rho(None if math.isinf(pr[1]) else pr[1])})")
            out.append(line)
        if len(setup.rate_stds) > 1:
            lo, hi = min(setup.rate_stds), max(setup.rate_stds)
            change = {m: best[(m, hi)]["acc"] - best[(m, lo)]["acc"] for m in methods
                      if (m, lo) in best and (m, hi) in best}
            if "S-FedAvg" in change and len(change) > 1:
                others = [m for m in change if m != "S-FedAvg"]
                worst = all(change["S-FedAvg"] < change[m] for m in others)
                out.append(f"{setting}: rate spread sd {lo:g} -> {hi:g} costs S-FedAvg more accuracy than every "
                           f"asynchronous method: {yes_no(worst)} (change of the best final accuracy, "
                           "points: " + ", ".join(f"{m} {d:+.2f}" for m, d in change.items())
                           + ")" + paper_change(setting, setup.split, lo, hi))
        largest = {}
        for m in ("AREA", "FedBuff"):
            group = [r for r in rows if r["setting"] == setting and r["method"] == m
                     and r["rate_std"] == min(setup.rate_stds)]
            finite = [r["alpha"] for r in group if r["finite_trials"] == r["trials"]]
            if finite:
                above = [r for r in group if r["alpha"] > max(finite)]
                largest[m] = (max(finite), bool(above))  # (largest finite alpha, a larger one diverged)
        if len(largest) == 2:
            (a, a_div), (b, b_div) = largest["AREA"], largest["FedBuff"]
            if a_div and b_div:
                out.append(f"{setting}: largest alpha with a finite loss, AREA {a:g} vs FedBuff {b:g} (ratio "
                           f"{a / b:g}; paper: 100 at n = 128, 10 at n = 4)")
            else:
                out.append(f"{setting}: the step-size tolerance (paper: AREA's largest finite alpha is 100x FedBuff's "
                           f"at n = 128) is not tested here: the grid of "
                           + " and ".join(m for m, (_, d) in largest.items() if not d)
                           + " has no diverging alpha (largest finite: "
                           + ", ".join(f"{m} {v:g}" for m, (v, _) in largest.items()) + ")")
    return out


def format_tables(rows: list[dict], setup: AreaSettings, seconds: float) -> str:
    """``table.md``: per setting and rate level, every method and alpha beside the paper's row; then the claims."""
    lines = [f"# AREA reproduction ({setup.scale} scale{', quick' if setup.quick else ''})", "",
             f"Dataset {setup.dataset}, split {setup.split}"
             + (f" (Dirichlet {setup.dirichlet_alpha:g})" if setup.split == "dirichlet" else "")
             + f", area_logreg (no bias, W = 0), nu = {setup.nu:g}, batch {setup.batch_size}, trials {setup.trials}, "
             f"target accuracy for rho {100 * setup.target:g}%. Accuracy in %, mean (min-max) over trials; loss = mean "
             "CE over all training examples + (nu/2)||W||^2 at t_h. 'retained': the two largest alphas with a finite "
             "loss in every trial (the paper's rule); '*': the alpha with the highest mean final accuracy among those "
             "finite in every trial (drawn in the figures). "
             "Paper columns: the paper's Tables 3-10 at the same alpha (MNIST)"
             + ("" if setup.dataset == "mnist" else "; this run is not on MNIST, so compare directions only") + ".",
             ""]
    for setting in setup.settings:
        s = SETTINGS[setting]
        n = setup.clients or s["n"]
        horizon = setup.horizon or s["horizon"]
        table = s["tables"][setup.split]
        lines += [f"## {setting}: n = {n}, M = {s['local_steps']}, t_h = {horizon:g}, Delta = {s['buffer']} "
                  f"(paper Table {table})", ""]
        for std in setup.rate_stds:
            lines += [f"**{level_name(std, setup.rate_mean)}**", "",
                      "| method | alpha | retained | rho | paper rho | acc % | paper acc % | loss | paper loss |"
                      " trials finite | uploads | mean staleness |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for method in setup.methods:
                ours = {r["alpha"]: r for r in rows if r["setting"] == setting and r["method"] == method
                        and r["rate_std"] == std}
                theirs = PAPER.get((table, method, std), {}) if std in PAPER_RATE_STDS else {}
                label = method + ("" if method in PAPER_METHODS else " (not in paper)")
                for alpha in sorted(set(ours) | set(theirs)):
                    r, p = ours.get(alpha), theirs.get(alpha)
                    cells = [label, f"{alpha:g}"]
                    if r is None:
                        cells += ["not run", "-"]
                    elif "acc" not in r:
                        cells += ["no (diverged)", "-"]
                    else:
                        cells += [yes_no(r["retained"]) + (" *" if r["best"] else ""), fmt_rho(r["rho"])]
                    cells.append("-" if p is None else fmt_rho(p["rho"]))
                    cells.append(fmt_range(r["acc"], r["acc_min"], r["acc_max"], 2) if r and "acc" in r else "-")
                    cells.append(fmt_range(p["acc"], p["acc_min"], p["acc_max"], 2) if p else "-")
                    cells.append(fmt_range(r["loss"], r["loss_min"], r["loss_max"], 2) if r and "acc" in r else "-")
                    cells.append(fmt_range(p["loss"], p["loss_min"], p["loss_max"], 2) if p else "-")
                    cells.append(f"{r['finite_trials']}/{r['trials']}" if r else "-")
                    cells.append(f"{r['uploads']:.0f}" if r and "uploads" in r else "-")
                    cells.append(f"{r['staleness_mean']:.1f}" if r and r.get("staleness_mean") is not None else "-")
                    lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    checks = direction_checks(rows, setup)
    if checks:
        lines += ["## The paper's claims, on these runs", ""] + [f"- {c}" for c in checks] + [""]
    lines += ["Not available in the project: " + "; ".join(f"{k} ({v})" for k, v in UNAVAILABLE.items()) + ".", "",
              f"Wall time: {seconds:.0f} s.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ verdicts
CLAIMS = (("AREA above FedBuff", "AREA", "FedBuff"), ("AREA above AS-FedAvg", "AREA", "AS-FedAvg"),
          ("AREA above S-FedAvg", "AREA", "S-FedAvg"))
"""The paper's claims with a direction (Tables 3-10): AREA's accuracy at t_h above each baseline's."""


def best_alpha_runs(records: list[dict], rows: list[dict], setting: str, std: float) -> dict[str, list[dict]]:
    """Per method, the trials at its best alpha (the rows marked ``best``) as curves over virtual time, uploads and
    local steps (``times``, ``uploads``, ``local_steps``, ``accuracy``)."""
    best = {r["method"]: r["alpha"] for r in rows if r["setting"] == setting and r["rate_std"] == std and r["best"]}
    return {m: [{"times": r["times"], "uploads": r["upload_curve"], "local_steps": r["local_step_curve"],
                 "accuracy": r["accuracy"]} for r in records
                if (r["setting"], r["rate_std"], r["method"], r["alpha"]) == (setting, std, m, a)]
            for m, a in best.items()}


def setting_verdicts(records: list[dict], rows: list[dict], setup: AreaSettings) -> dict[str, list]:
    """Per setting and rate level: the verdicts on :data:`CLAIMS`, each method at its best alpha, at equal virtual
    time (the paper's axis: the horizon t_h), equal uploads and equal local computation."""
    out = {}
    for setting in setup.settings:
        for std in setup.rate_stds:
            claims = [(text, m, b, paper_claim_text(setting, setup.split, std, m, b)) for text, m, b in CLAIMS]
            out[f"{setting}, rate sd {std:g}"] = claim_verdicts(best_alpha_runs(records, rows, setting, std), claims)
    return out


def paper_claim_text(setting: str, split: str, std: float, method: str, baseline: str) -> str:
    """The paper's best printed accuracies of the two methods at this level (MNIST), or ``-``."""
    table = SETTINGS[setting]["tables"][split]
    best = {m: max((row["acc"] for row in PAPER.get((table, m, std), {}).values()), default=None)
            for m in (method, baseline)}
    if None in best.values():
        return "-"
    return f"{best[method]:.2f} vs {best[baseline]:.2f} (Table {table}, MNIST, best alpha)"


def verdict_section(records: list[dict], verdicts: dict[str, list], setup: AreaSettings) -> list[str]:
    """The verdict tables, each with the share of uploads of the fastest 20% of the clients (AREA's schedules)."""
    lines = []
    for setting in setup.settings:
        for std in setup.rate_stds:
            key = f"{setting}, rate sd {std:g}"
            shares = [r["fastest_share"] for r in records if (r["setting"], r["rate_std"], r["method"]) ==
                      (setting, std, "AREA")]
            lines += verdict_lines(verdicts.get(key, []), f"Verdicts, {key}, trials {setup.trials}")
            if shares:
                lines += [participation_line({"AREA / FedBuff / AS-FedAvg (every client training)":
                                              float(np.mean(shares))}), ""]
    return lines


# ------------------------------------------------------------------------------------------------ figures
def plot(records: list[dict], rows: list[dict], setup: AreaSettings) -> list[str]:
    """``curves_<setting>.png`` (accuracy and training loss against virtual time, each method at its best alpha) and,
    with two or more levels, ``heterogeneity_<setting>.png`` (final accuracy and rho against the rate spread)."""
    plt = pyplot()
    written = []
    colors = {m: f"C{i}" for i, m in enumerate(METHODS)}
    for setting in setup.settings:
        horizon = setup.horizon or SETTINGS[setting]["horizon"]
        grid = np.linspace(0.0, horizon, 400)
        best = {(r["method"], r["rate_std"]): r["alpha"] for r in rows if r["setting"] == setting and r["best"]}
        fig, axes = plt.subplots(2, len(setup.rate_stds), figsize=(4.4 * len(setup.rate_stds), 6.4), squeeze=False,
                                 sharex=True)
        for col, std in enumerate(setup.rate_stds):
            for method in setup.methods:
                if (method, std) not in best:
                    continue
                recs = [r for r in records if r["setting"] == setting and r["method"] == method
                        and r["rate_std"] == std and r["alpha"] == best[(method, std)] and r["diverged_at"] < 0]
                if not recs:
                    continue
                for row, key, scale in ((0, "accuracy", 100.0), (1, "train_ce", 1.0)):
                    curves = scale * np.array([value_on_grid(r["times"], r[key], grid) for r in recs])
                    ax = axes[row][col]
                    ax.plot(grid, curves.mean(axis=0), color=colors[method],
                            linestyle="-" if method in PAPER_METHODS else ":",
                            linewidth=1.8 if method == "AREA" else 1.1,
                            label=f"{method} (alpha {best[(method, std)]:g})")
                    ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=colors[method], alpha=0.15)
            axes[0][col].axhline(100 * setup.target, color="grey", linewidth=0.6)
            axes[0][col].set_title(level_name(std, setup.rate_mean), fontsize=9)
            axes[0][col].set_ylim(0, 100)
            axes[1][col].set_yscale("log")
            axes[1][col].set_xlabel("virtual (wall-clock) time")
            for row in (0, 1):
                axes[row][col].grid(alpha=0.3)
            axes[0][col].legend(fontsize=7, loc="lower right")
        axes[0][0].set_ylabel("test accuracy (%)")
        axes[1][0].set_ylabel("training CE (sample, no l2 term)")
        fig.suptitle(f"{setting}, {setup.dataset}, {setup.split}: mean over trials, band = min-max", fontsize=10)
        fig.tight_layout()
        written.append(save_png(fig, setup.out, f"curves_{setting}.png"))
        if len(setup.rate_stds) > 1:
            fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
            for method in setup.methods:
                pts = [r for r in rows if r["setting"] == setting and r["method"] == method and r["best"]]
                pts.sort(key=lambda r: r["rate_std"])
                if not pts:
                    continue
                x = [r["rate_std"] for r in pts]
                axes[0].errorbar(x, [r["acc"] for r in pts], yerr=[[r["acc"] - r["acc_min"] for r in pts],
                                                                    [r["acc_max"] - r["acc"] for r in pts]],
                                 color=colors[method], marker="o", capsize=2, label=method)
                axes[1].plot(x, [1.05 if r["rho"] is None else r["rho"] for r in pts], color=colors[method],
                             marker="o", label=method)
            axes[0].set_ylabel("final test accuracy (%), best alpha")
            axes[1].set_ylabel(f"rho = t_{100 * setup.target:g} / t_h (1.05: never)")
            for ax in axes:
                ax.set_xlabel("sd of the client rates lambda_i")
                ax.grid(alpha=0.3)
            axes[0].legend(fontsize=7)
            fig.tight_layout()
            written.append(save_png(fig, setup.out, f"heterogeneity_{setting}.png"))
    return written


# ------------------------------------------------------------------------------------------------ main
SCALES = {
    # cpu: 5 trials (the gaps to FedBuff are within twice the seed noise); besides the paper's two levels, sd 10: more
    # skewed rates (truncated at 0; the fastest 20% of the clients
    # make about 38% of the uploads, against 32% at sd 5), the participation imbalance AREA's memory is about
    "cpu": {"dataset": "fashion_mnist", "settings": ["n128_m1"], "trials": [0, 1, 2, 3, 4], "evals": 50,
            "train_eval_size": 5000, "rate_stds": [0.0, 5.0, 10.0]},
    "paper": {"dataset": "mnist", "settings": list(SETTINGS), "trials": list(range(10)), "evals": 200,
              "train_eval_size": 60000, "rate_stds": [0.0, 5.0]},
}


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``scripts/reproduce_area.py``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=list(SCALES), default="cpu")
    p.add_argument("--quick", action="store_true", help="cpu setting with t_h = 4, one trial, two alphas per method")
    p.add_argument("--dataset", choices=["mnist", "fashion_mnist", "synthetic"], default=None)
    p.add_argument("--data-dir", default=None, help="folder of the IDX files (or the TFDS data folder)")
    p.add_argument("--split", choices=["dirichlet", "iid"], default="dirichlet")
    p.add_argument("--dirichlet-alpha", type=float, default=0.1)
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=None)
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=None,
                   help=f"default: the paper's {', '.join(PAPER_METHODS)}")
    p.add_argument("--extras", action="store_true", help=f"add {', '.join(EXTRA_METHODS)} (not in the paper)")
    p.add_argument("--trials", type=int, default=None, help="number of trials (timing seeds 0..N-1)")
    p.add_argument("--rate-mean", type=float, default=10.0)
    p.add_argument("--rate-stds", type=float, nargs="+", default=None,
                   help="heterogeneity levels: sd of lambda_i ~ N(mean, sd^2) (paper: 0 and 5; cpu: 0, 5 and 10)")
    p.add_argument("--alphas", type=float, nargs="+", default=None, help="one alpha grid for every method")
    p.add_argument("--nu", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--evals", type=int, default=None, help="evaluations per run (about)")
    p.add_argument("--train-eval-size", type=int, default=None, help="training examples of the loss curves")
    p.add_argument("--target", type=float, default=None, help="accuracy for rho (default 0.8; 0.75 on Fashion-MNIST)")
    p.add_argument("--clients", type=int, default=None, help="override n (tests)")
    p.add_argument("--horizon", type=float, default=None, help="override t_h")
    p.add_argument("--out", default="results/reproduce_area")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments with the scale's defaults filled in and checked (a bad one exits with a usage error)."""
    p = build_parser()
    args = p.parse_args(argv)
    defaults = SCALES[args.scale]
    args.dataset = args.dataset or defaults["dataset"]
    args.settings = args.settings or defaults["settings"]
    args.rate_stds = args.rate_stds or defaults["rate_stds"]
    if args.trials is None:
        args.trials = 1 if args.quick else len(defaults["trials"])
    if args.trials < 1:
        p.error("--trials must be >= 1")
    args.trials = list(range(args.trials))
    args.evals = args.evals or defaults["evals"]
    args.train_eval_size = args.train_eval_size or defaults["train_eval_size"]
    if args.quick and args.horizon is None:
        args.horizon = 4.0 if args.settings == ["n128_m1"] else None
    if args.target is None:
        args.target = 0.75 if args.dataset == "fashion_mnist" else 0.8
    methods = args.methods or list(PAPER_METHODS)
    if args.extras:
        methods += [m for m in EXTRA_METHODS if m not in methods]
    args.methods = [m for m in METHODS if m in methods]
    if any(s < 0 for s in args.rate_stds) or args.rate_mean <= 0:
        p.error("--rate-mean must be > 0 and --rate-stds >= 0")
    args.rate_stds = sorted(set(args.rate_stds))
    if args.horizon is not None and args.horizon <= 0:
        p.error("--horizon must be > 0")
    return args


@dataclasses.dataclass(frozen=True)
class AreaSettings(ReproductionSettings):
    """The settings of one AREA reproduction: the command line's options after :func:`parse_args` filled in the
    defaults of ``--scale`` and ``--quick``, added ``--extras`` to the methods (in table order), numbered the trials and
    sorted the rate levels. Build it with :func:`parse_settings` (a command line) or :meth:`from_keywords` (the
    options as keywords); both check it alike.

    Attributes:
        scale: ``cpu`` (Fashion-MNIST, the headline setting) or ``paper`` (MNIST, every setting of Tables 3-6).
        quick: the cpu setting cut to t_h = 4, one trial, two alphas per method.
        dataset: ``mnist``, ``fashion_mnist`` or ``synthetic``.
        data_dir: the folder of the IDX files (or the TFDS data folder); None: the default places.
        split: ``dirichlet`` or ``iid``, the split of the data over the clients.
        dirichlet_alpha: the Dirichlet concentration of the ``dirichlet`` split.
        settings: the paper's settings run (``SETTINGS`` keys: n, local steps M, horizon, buffer).
        methods: the methods run (table order; with ``extras``, AsyncSGD, MIFA and FedAsync too).
        extras: add the methods that are not in the paper.
        trials: the trials, ``[0, ..., N - 1]`` (trial s: timing seed s).
        rate_mean: the mean of the clients' rates lambda_i ~ N(mean, sd^2).
        rate_stds: the heterogeneity levels, sd of the rates (sorted, distinct).
        alphas: one local step size grid for every method, or None (each method's grid).
        nu: the local SGD's coupled weight decay ((nu/2) ||W||^2).
        batch_size: the clients' minibatch.
        evals: the evaluations per run (about).
        train_eval_size: the training examples of the loss curves.
        target: the test accuracy of rho = t_target / t_h.
        clients: n overriding the settings' (tests), or None.
        horizon: t_h overriding the settings', or None.
        out: the output folder.
    """

    scale: str
    quick: bool
    dataset: str
    data_dir: str | None
    split: str
    dirichlet_alpha: float
    settings: list[str]
    methods: list[str]
    extras: bool
    trials: list[int]
    rate_mean: float
    rate_stds: list[float]
    alphas: list[float] | None
    nu: float
    batch_size: int
    evals: int
    train_eval_size: int
    target: float
    clients: int | None
    horizon: float | None
    out: str

    @classmethod
    def from_keywords(cls, **options: Any) -> AreaSettings:
        """The settings of the command line that gives ``options`` (``dest=value`` as the flags take them, e.g.
        ``quick=True, trials=2, methods=["AREA", "FedBuff"]``): the same defaults, filling and checks as
        :func:`parse_args`; a refused value raises :class:`~asyncfl_jax.reproduce.settings.SettingsError` with the
        command line's message."""
        return cls._from_keywords(build_parser(), parse_args, options)


def parse_settings(argv: list[str] | None = None) -> AreaSettings:
    """The settings of a command line (:func:`parse_args`; a bad argument exits with a usage error)."""
    return AreaSettings.from_args(parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    """The command: runs every setting and method of the arguments and writes ``table.md``, ``results.json`` and the
    figures to ``--out``; 2 when the dataset is not available."""
    return command_main(argv, parse_settings, run_all, write_report,
                        load=lambda setup: load_dataset(setup.dataset, setup.data_dir, setup.data_dir,
                                                        synthetic_clients=30))


def run_all(setup: AreaSettings, dataset: Any) -> dict[str, Any]:
    """Every (setting, method) program: the runs, the clients' data sizes and rates of each setting."""
    records, partitions, rates = [], {}, {}
    model = make_model("area_logreg", dataset.input_shape, dataset.num_classes, seed=0)
    for setting_name in setup.settings:
        setting = setting_of(setting_name, setup)
        parts = split_data(dataset.train_y, setting["n"], setup.split, setup.dirichlet_alpha)
        partitions[setting_name] = [int(len(q)) for q in parts]
        rates[setting_name] = {f"{std:g}": [client_rates(setting["n"], setup.rate_mean, std, s).round(4).tolist()
                                            for s in setup.trials] for std in setup.rate_stds}
        task = make_task(dataset, parts, model, train_eval_size=setup.train_eval_size)
        for method in setup.methods:
            records += run_method(task, method, setting_name, setting, setup)
    return {"runs": records, "client_sizes": partitions, "rates": rates}


def write_report(setup: AreaSettings, results: dict[str, Any], seconds: float) -> str:
    """``table.md``, ``results.json`` and the figures; returns the table."""
    records = results["runs"]
    rows = summarize(records, setup)
    table = format_tables(rows, setup, seconds)
    verdicts = setting_verdicts(records, rows, setup)
    table += "\n".join(verdict_section(records, verdicts, setup)) + "\n"
    paper = [{"table": t, "method": m, "rate_std": s, "alpha": a, **v} for (t, m, s), d in PAPER.items()
             for a, v in d.items()]
    write_outputs(setup.out, table, {"args": vars(setup), "rows": rows, "checks": direction_checks(rows, setup),
                                    "runs": records, "client_sizes": results["client_sizes"],
                                    "rates": results["rates"], "paper": paper,
                                    "verdicts": {k: [verdict_json(v) for v in vs] for k, vs in verdicts.items()},
                                    "seconds": round(seconds, 1)})
    plot(records, rows, setup)
    for setting in setup.settings:
        for std in setup.rate_stds:
            plot_methods(best_alpha_runs(records, rows, setting, std),
                         os.path.join(setup.out, f"claims_{setting}_sd{std:g}.png"),
                         f"{DATASET_TITLES.get(setup.dataset, setup.dataset)} logreg, {setting}, "
                         f"rates N({setup.rate_mean:g}, {std:g}^2), each method at its best alpha")
    return table


def setting_of(name: str, setup: AreaSettings) -> dict[str, Any]:
    """A setting of ``SETTINGS`` with ``--clients`` and ``--horizon`` applied."""
    setting = dict(SETTINGS[name])
    if setup.clients:
        setting["n"] = setup.clients
        setting["participants"] = None if setup.clients <= 4 else min(4, setup.clients)
    if setup.horizon:
        setting["horizon"] = setup.horizon
    return setting
