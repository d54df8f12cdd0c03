"""The loop-friendly convolution (asyncfl_jax.models.conv) has lax.conv_general_dilated's values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from asyncfl_jax.models import conv


@pytest.mark.parametrize("kernel,padding", [(5, "SAME"), (3, ((0, 2), (1, 0)))])
def test_values_and_gradients_equal_lax(kernel, padding):
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (3, 7, 6, 2), jnp.float32)
    w = jax.random.normal(kw, (kernel, kernel, 2, 4), jnp.float32)
    args = ((1, 1), padding)
    dn = dict(dimension_numbers=conv.NHWC)
    mine = conv.conv_general_dilated(x, w, *args, **dn)
    ref = lax.conv_general_dilated(x, w, *args, **dn)
    np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-5)
    g = jax.random.normal(kg, ref.shape, jnp.float32)
    loss = lambda f: lambda a, b: jnp.sum(f(a, b, *args, **dn) * g)  # noqa: E731
    for got, want in zip(jax.grad(loss(conv.conv_general_dilated), (0, 1))(x, w),
                         jax.grad(loss(lax.conv_general_dilated), (0, 1))(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_used_only_where_it_applies():
    x, w = jnp.zeros((1, 8, 8, 2)), jnp.zeros((3, 3, 2, 4))
    dn = conv.NHWC
    assert conv.library_form_applies(x, w, (1, 1), None, None, dn, 1, 1, None) == (jax.default_backend() == "cpu")
    assert not conv.library_form_applies(x, w, (2, 2), None, None, dn, 1, 1, None)  # strided: lax's own
    assert not conv.library_form_applies(x, w, (1, 1), None, (2, 2), dn, 1, 1, None)  # dilated
    assert not conv.library_form_applies(x, jnp.zeros((3, 3, 1, 4)), (1, 1), None, None, dn, 2, 1, None)  # grouped
    assert not conv.library_form_applies(jnp.zeros((1, 2, 8, 8)), jnp.zeros((4, 2, 3, 3)), (1, 1), None, None,
                                         ("NCHW", "OIHW", "NCHW"), 1, 1, None)
