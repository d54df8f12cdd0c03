#!/usr/bin/env python
"""The ACE/ACED paper's experiments (Chang et al., "Mitigating Participation Imbalance Bias in Asynchronous
Federated Learning"; digest 000): ACE and ACED against FedBuff, CA2FL, Vanilla ASGD and Delay-adaptive ASGD.

The experiment logic (setups, grids, the paper's Table a.2, runners, checks, figures) is in
:mod:`asyncfl_jax.reproduce.ace`, whose docstring describes the methods, delays, experiments and scales;
``--help`` lists the options. Results: ``docs/reproduce_ace.md``.

Usage::

    python scripts/reproduce_ace.py                      # --scale cpu: Fashion-MNIST MLP, Dir(0.1), beta 30, 5 seeds
    python scripts/reproduce_ace.py --quick              # 20 clients, 400 uploads, one seed: 1-2 minutes
    python scripts/reproduce_ace.py --scale paper --data-dir ~/tensorflow_datasets          # CIFAR-10, a GPU
    python scripts/reproduce_ace.py --scale paper --dataset cifar100 --tune --out results/ace_c100
    python scripts/reproduce_ace.py --alphas 0.1 --betas 5 30 --delay-model iid_exp --skip-dropout

It writes ``table.md``, ``results.json``, ``accuracy.png``, ``accuracy_steps.png`` and ``dropout.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.ace import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
