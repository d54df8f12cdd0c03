"""2x2 max pooling (stride 2) whose gradient XLA:CPU runs at memory speed.

``flax.linen.max_pool`` is a ``reduce_window``; its gradient is a ``select_and_scatter``, which XLA:CPU runs on a
generic loop: in one local step of the small CNN (conv5x5(32)-pool-conv5x5(64)-pool-FC 512-FC 10, B = 32, inside a
``fori_loop``) the two pools' gradients took about 40% of the step (28-29 ms of CPU time per step with
``nn.max_pool``, 16-19 ms with this form; docs/benchmarks.md, "Issue 24 leftovers").

:func:`max_pool_2x2` computes the same maximum as a reshape (``[B, H/2, 2, W/2, 2, C]``) and a ``max`` over the two
window axes, with a gradient of its own that gives each window's output gradient to the **first** maximal element of
the window in row-major order, as ``select_and_scatter`` does (ties, frequent after a ReLU on constant image regions,
go to the same element, so the gradient is the same, bit for bit). Odd heights or widths drop the last row or column,
as the ``VALID`` pooling does. On other backends, and for anything but a 4-D NHWC input, it is ``nn.max_pool``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn


@jax.custom_vjp
def _pool(x: jax.Array) -> jax.Array:
    b, h, w, c = x.shape
    return x[:, : h - h % 2, : w - w % 2].reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _pool_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _pool(x), x


def _pool_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    """``dx``: ``g`` at the first maximal element of each window in row-major order (``(0, 0), (0, 1), (1, 0),
    (1, 1)``), zero elsewhere (and in a cropped last row or column): one elementwise pass, no scatter."""
    b, h, w, c = x.shape
    h2, w2 = h // 2, w // 2
    win = x[:, : 2 * h2, : 2 * w2].reshape(b, h2, 2, w2, 2, c)
    top = win.max(axis=(2, 4))
    hit = [win[:, :, i, :, j] == top for i in (0, 1) for j in (0, 1)]  # each [B, H/2, W/2, C]
    taken = hit[0]
    first = [hit[0]]
    for later in hit[1:]:
        first.append(later & ~taken)
        taken = taken | later
    zero = jnp.zeros((), g.dtype)
    parts = [jnp.where(f, g, zero) for f in first]
    rows = [jnp.stack(parts[2 * i: 2 * i + 2], axis=3) for i in (0, 1)]  # [B, H/2, W/2, 2 (j), C]
    dx = jnp.stack(rows, axis=2).reshape(b, 2 * h2, 2 * w2, c)  # [B, H/2, 2 (i), W/2, 2 (j), C]
    if h % 2 or w % 2:
        dx = jnp.pad(dx, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    return (dx.astype(x.dtype),)


_pool.defvjp(_pool_fwd, _pool_bwd)


def max_pool_2x2(x: jax.Array) -> jax.Array:
    """``nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))`` for NHWC ``x``: the same values and gradient, in the
    reshape form of :func:`_pool` on the CPU backend (see the module docstring)."""
    if jax.default_backend() != "cpu" or x.ndim != 4 or x.shape[1] < 2 or x.shape[2] < 2:
        return nn.max_pool(x, window_shape=(2, 2), strides=(2, 2))
    return _pool(x)
