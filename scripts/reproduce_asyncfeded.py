#!/usr/bin/env python
"""The AsyncFedED paper's experiment (Wang et al. 2022; digest 001), on the in-scan event clock: AsyncFedED against
FedAsync+Constant/+Hinge, FedAvg and FedProx across suspension probabilities P, and the constant-K ablation.

The experiment logic (the task, the presets, virtual time and budgets, runners, metrics, checks, tables, figures) is in
:mod:`asyncfl_jax.reproduce.asyncfeded`, whose docstring describes the methods, the clock and the scales; ``--help``
lists the options. Results: ``docs/reproduce_asyncfeded.md``.

Usage::

    python scripts/reproduce_asyncfeded.py                  # --scale cpu: Fashion-MNIST MLP, 5 seeds, verdict tables
    python scripts/reproduce_asyncfeded.py --sweep          # the client learning-rate (and lambda) sweep behind it
    python scripts/reproduce_asyncfeded.py --quick          # Fashion-MNIST, budget 4, two seeds: about 1.5 minutes
    python scripts/reproduce_asyncfeded.py --task synthetic # the paper's Synthetic(1, 1): about 2.5 minutes
    python scripts/reproduce_asyncfeded.py --task synthetic --quick  # under 1 minute (budget 12, P in {0, 0.9})
    python scripts/reproduce_asyncfeded.py --scale paper    # P = 0, 0.1, ..., 0.9, 5 seeds: about 35 min on 2 cores
    python scripts/reproduce_asyncfeded.py --probs 0 0.3 0.9 --budget 60 --sync-suspensions wait --out results/afed

It writes ``table.md``, ``results.json``, ``accuracy.png``, ``metrics_vs_p.png`` and ``ablation.png`` to ``--out``
(Fashion-MNIST: also ``claims_p<P>.png`` and ``claims_ablation.png``; ``--sweep``: ``sweep.md`` and ``sweep.json``).
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.asyncfeded import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
