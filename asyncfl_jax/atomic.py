"""Atomic files: moved to :mod:`asyncfl_jax.outputs.atomic` (the output folder's code lives in :mod:`asyncfl_jax.outputs`);
this module keeps the old import path working."""

from asyncfl_jax.outputs.atomic import atomic_file, write_atomic

__all__ = ["atomic_file", "write_atomic"]
