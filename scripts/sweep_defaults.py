#!/usr/bin/env python
"""The small sweep that chose every algorithm's default hyper-parameters on the default task (``docs/defaults.md``).

The sweep (grids, runner, choice rule, table) is in :mod:`asyncfl_jax.reproduce.defaults`; ``--help`` lists the
options. It writes ``table.md`` and ``results.json`` to ``--out``.
"""

import sys

from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.reproduce.defaults import main

if __name__ == "__main__":
    enable_compile_cache()  # reuse compiled programs across runs; ASYNCFL_COMPILE_CACHE=off turns it off
    sys.exit(main())
