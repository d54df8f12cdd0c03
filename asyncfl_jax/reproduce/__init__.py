"""The papers' experiments, as library code: what ``scripts/reproduce_*.py`` and ``scripts/demo_*.py`` run.

One module per paper holds that paper's experiment logic (setups, hyper-parameter grids, the paper's reference tables
as data, the runners, the checks of the paper's claims, the tables and figures) and its command line (``main``):

* :mod:`~asyncfl_jax.reproduce.ace` — ACE and ACED (digest 000), ``scripts/reproduce_ace.py``.
* :mod:`~asyncfl_jax.reproduce.asyncfeded` — AsyncFedED (digest 001), ``scripts/reproduce_asyncfeded.py``.
* :mod:`~asyncfl_jax.reproduce.area` — AREA (digest 002), ``scripts/reproduce_area.py``.
* :mod:`~asyncfl_jax.reproduce.ca2fl` — CA2FL and MF-CA2FL (digest 003), ``scripts/reproduce_ca2fl.py``.
* :mod:`~asyncfl_jax.reproduce.asynflc_ef` — AsynFL, AsynFLC and AsynFLC-EF (digest 004),
  ``scripts/reproduce_asynflc_ef.py``.
* :mod:`~asyncfl_jax.reproduce.bias_correction` and :mod:`~asyncfl_jax.reproduce.compression` — the two CPU-scale
  demonstrations, ``scripts/demo_bias_correction.py`` and ``scripts/demo_compression.py``.

What they share is written once: :mod:`~asyncfl_jax.reproduce.grid` (the runner, ``run_grid``: one program of
explicit replicas, each setting x seed with its own schedule and label, returned as a DataFrame; and the command
skeleton, ``command_main``), :mod:`~asyncfl_jax.reproduce.data` (finding and reading the datasets),
:mod:`~asyncfl_jax.reproduce.curves` (values on a grid, first passages, final values, choosing a grid value) and
:mod:`~asyncfl_jax.reproduce.report` (table pieces, JSON, figures, output files). The timing pieces they need are in
:mod:`asyncfl_jax.timing` (``window``, ``rates``, ``horizon``, ``rounds``, ``client_delays``, ``padding``) and the
algorithm wrapper in :mod:`asyncfl_jax.algorithms.wrappers`.

The package itself imports none of these modules (``import asyncfl_jax`` stays light); import the one you need.
"""
