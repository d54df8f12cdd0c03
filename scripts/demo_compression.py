#!/usr/bin/env python
"""How many uploaded bits does each method need to reach a target accuracy? A CPU-scale demonstration of
AsynFLC-EF against AsynFL, FedBuff and top-k without error feedback.

The demonstration (setting, methods and grids, runner, table, figure) is in :mod:`asyncfl_jax.reproduce.compression`,
whose docstring describes it; ``--help`` lists the options. Results: ``docs/simulator.md``.

Usage::

    python scripts/demo_compression.py                         # about 4 minutes on 2 CPU cores
    python scripts/demo_compression.py --quick                 # about 1.5 minutes (1000 uploads, one seed)
    python scripts/demo_compression.py --dirichlet-alpha 0.1 --target 0.7 --seeds 0 1 2 --out results/compression

It writes ``table.md``, ``results.json`` and ``accuracy_vs_bits.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.compression import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
