#!/usr/bin/env python
"""The CA2FL paper's experiments (Wang et al. 2023, "Tackling the Data Heterogeneity in Asynchronous Federated
Learning with Cached Update Calibration"; digest 003): CA2FL and MF-CA2FL against the asynchronous baselines.

The experiment logic (methods, settings and scales, the paper's Tables 1-7, the delay tables, runners, checks, tables,
figures) is in :mod:`asyncfl_jax.reproduce.ca2fl`, whose docstring describes the protocol, the ablations, the scales
and the deviations from the paper; ``--help`` lists the options. Results: ``docs/reproduce_ca2fl.md``.

Usage::

    python scripts/reproduce_ca2fl.py                              # --scale cpu: MLP, Dir(0.1), 5 seeds
    python scripts/reproduce_ca2fl.py --quick                      # Dir(0.1) only, 40 rounds, 1 seed
    python scripts/reproduce_ca2fl.py --scale paper --data-dir ~/tensorflow_datasets --out results/ca2fl_paper
    python scripts/reproduce_ca2fl.py --scale paper --settings cifar10/ca2fl_cnn/0.3 --methods asyncfl ca2fl mf8

It writes ``table.md``, ``results.json``, ``accuracy.png``, ``fedasync.png``, ``ablation.png`` and, with ``--grid``,
``heatmap.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.ca2fl import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
