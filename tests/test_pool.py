"""The 2x2 max pooling of the CNNs (``asyncfl_jax.models.pool``): the same values and gradient as ``nn.max_pool``,
bit for bit, ties included (the gradient goes to the first maximal element of a window, as ``select_and_scatter``
gives it), for even and odd sizes, inside ``jit`` and ``vmap``."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncfl_jax.models.pool import max_pool_2x2


def _reference(x):
    return nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))


@pytest.mark.parametrize("shape", [(3, 8, 6, 4), (2, 7, 9, 3)])
def test_values_and_gradient_equal_nn_max_pool_with_ties(shape):
    rng = np.random.default_rng(0)
    x = jax.nn.relu(jnp.asarray(rng.integers(0, 3, shape).astype(np.float32)) - 1)  # mostly tied windows
    g = jnp.asarray(rng.normal(size=_reference(x).shape).astype(np.float32))
    np.testing.assert_array_equal(max_pool_2x2(x), _reference(x))
    expected = jax.vjp(_reference, x)[1](g)[0]
    np.testing.assert_array_equal(jax.vjp(max_pool_2x2, x)[1](g)[0], expected)
    batched = jax.jit(jax.vmap(lambda a, b: jax.vjp(max_pool_2x2, a)[1](b)[0]))(x[None], g[None])[0]
    np.testing.assert_array_equal(batched, expected)
