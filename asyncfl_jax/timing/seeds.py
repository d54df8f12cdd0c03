"""The seed of every timing stream (see :mod:`asyncfl_jax.timing.streams` for the streams themselves)."""

from __future__ import annotations

import numpy as np

TIMING_TAG = 0x7157


def timing_rng(seed: int, stream: int) -> np.random.Generator:
    """The numpy generator of timing stream ``stream`` for ``seed`` (see :mod:`asyncfl_jax.timing.streams`)."""
    return np.random.default_rng([seed, TIMING_TAG, stream])
