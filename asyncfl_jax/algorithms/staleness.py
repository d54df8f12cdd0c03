"""Staleness weighting functions ``s(tau)`` for asynchronous aggregation.

``tau`` is the staleness of an update (server version when applied minus version it was computed on, >= 0).

* constant:     ``s(tau) = 1``
* polynomial:   ``s(tau) = (tau + 1)^(-a)``                              (FedAsync, Xie et al. 2019)
* hinge:        ``s(tau) = 1 if tau <= b else 1 / (a (tau - b) + 1)``   (FedAsync; AsyncFedED Eq. 41)
* inverse_sqrt: ``s(tau) = 1 / sqrt(1 + tau)``                           (FedBuff, Nguyen et al. 2022)

The parameters ``a`` and ``b`` are read from the hyper-parameters ``staleness_a`` and ``staleness_b``.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from asyncfl_jax.precision import float_dtype

StalenessFn = Callable[[jax.Array, Mapping[str, jax.Array]], jax.Array]


def constant(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    return jnp.ones_like(tau, dtype=float_dtype(*hp.values()))


def polynomial(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    return (tau.astype(float_dtype(*hp.values())) + 1.0) ** (-hp["staleness_a"])


def hinge(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    tau = tau.astype(float_dtype(*hp.values()))
    a, b = hp["staleness_a"], hp["staleness_b"]
    return jnp.where(tau <= b, 1.0, 1.0 / (a * (tau - b) + 1.0))


def inverse_sqrt(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    return 1.0 / jnp.sqrt(1.0 + tau.astype(float_dtype(*hp.values())))


STALENESS_FUNCTIONS: dict[str, StalenessFn] = {
    "constant": constant,
    "polynomial": polynomial,
    "hinge": hinge,
    "inverse_sqrt": inverse_sqrt,
}

STALENESS_HPARAMS: dict[str, dict[str, float]] = {
    "constant": {},
    "polynomial": {"staleness_a": 0.5},
    "hinge": {"staleness_a": 10.0, "staleness_b": 4.0},
    "inverse_sqrt": {},
}
"""The hyper-parameters each staleness function reads, with defaults."""


def get(name: str) -> StalenessFn:
    if name not in STALENESS_FUNCTIONS:
        raise ValueError(f"staleness must be one of {sorted(STALENESS_FUNCTIONS)}, got {name!r}")
    return STALENESS_FUNCTIONS[name]
