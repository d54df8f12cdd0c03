"""Combinators that change how an :class:`~asyncfl_jax.algorithms.base.Algorithm` treats some server steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import Algorithm


def skip_empty_steps(algorithm: Algorithm) -> Algorithm:
    """``algorithm`` whose server leaves its state unchanged at a step with no arrival (``meta.mask`` all false).

    A schedule cut at a time horizon (:func:`asyncfl_jax.timing.cut_at_horizon`) ends with empty steps. FedAvg,
    FedBuff, AS-FedAvg and AREA already leave their state unchanged there; MIFA would re-apply its memory at every one.
    """

    def server(state, messages, meta, hp):
        new = algorithm.server(state, messages, meta, hp)
        any_arrival = jnp.any(meta.mask)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(any_arrival, a, b), new, state)

    return algorithm._replace(server=server)
