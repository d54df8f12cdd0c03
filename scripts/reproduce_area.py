#!/usr/bin/env python
"""The AREA paper's experiments (Iakovidou & Kim, arXiv 2405.10123; digest 002), on the simulator.

The experiment logic (settings, grids, the paper's Tables 3-10, the Poisson event model with its horizon, runners,
checks, figures) is in :mod:`asyncfl_jax.reproduce.area`, whose docstring describes the task, methods, event model,
metrics and scales; ``--help`` lists the options. Results: ``docs/reproduce_area.md``.

Usage::

    python scripts/reproduce_area.py                               # --scale cpu
    python scripts/reproduce_area.py --quick
    python scripts/reproduce_area.py --scale paper --data-dir ~/data/mnist
    python scripts/reproduce_area.py --settings n4_m1 --rate-stds 0 2.5 5 7.5 --extras --out results/area_n4

It writes ``table.md``, ``results.json``, ``curves_<setting>.png`` and, with two or more heterogeneity levels,
``heterogeneity_<setting>.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.area import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
