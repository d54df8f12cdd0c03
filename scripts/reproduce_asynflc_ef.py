#!/usr/bin/env python
"""The AsynFLC-EF paper's experiment (Yang, Hou and Wu, "Convergence Analysis of Asynchronous Federated Learning with
Gradient Compression for Non-Convex Optimization"; digest 004): uploaded bits to a target test accuracy (Table III),
accuracy against bits and virtual time (Figs. 1-3), AsynFLC-EF's compression grid and the waiting time W (Fig. 4).

The experiment logic (methods and their bit costs, the paper's Table III, tasks and scales, the window schedules,
runners, checks, tables, figures) is in :mod:`asyncfl_jax.reproduce.asynflc_ef`, whose docstring describes the
protocol and the scales; ``--help`` lists the options. Results: ``docs/reproduce_asynflc_ef.md``.

Usage::

    python scripts/reproduce_asynflc_ef.py                         # --scale cpu: about 14 CPU-minutes
    python scripts/reproduce_asynflc_ef.py --quick                 # one seed, 30 rounds, grid {1, 2}
    python scripts/reproduce_asynflc_ef.py --scale paper --tasks fmnist_mlp cifar10_cnn --out results/asynflc_ef
    python scripts/reproduce_asynflc_ef.py --scale paper --dry-run # the plan (settings, programs, memory), no run
    python scripts/reproduce_asynflc_ef.py --dirichlet-alpha 0.1 --seeds 0 1 2 --methods AsynFL "AsynFLC(top3)"
    python scripts/reproduce_asynflc_ef.py --from-results results/reproduce_asynflc_ef/results.json --out replot

It writes ``table.md``, ``results.json``, ``accuracy_vs_bits.png``, ``accuracy_vs_time.png``, ``heatmap.png`` and
``waiting_time.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.asynflc_ef import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
