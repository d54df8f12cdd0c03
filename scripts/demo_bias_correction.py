#!/usr/bin/env python
"""Do the bias-correcting methods do what their papers claim? A CPU-scale demonstration: ACE, CA2FL and AREA
against FedBuff and FedAsync under growing client-speed spread.

The demonstration (setting, methods and grids, runner, table, figure) is in
:mod:`asyncfl_jax.reproduce.bias_correction`, whose docstring describes it; ``--help`` lists the options. Results:
``docs/simulator.md``.

Usage::

    python scripts/demo_bias_correction.py                     # about 3 minutes on 2 CPU cores
    python scripts/demo_bias_correction.py --quick             # about 1.5 minutes (fewer uploads, one seed)
    python scripts/demo_bias_correction.py --spreads 0 1.5 --alpha 0.1 1.0 --out results/bias

It writes ``table.md``, ``results.json`` and ``accuracy.png`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.bias_correction import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
