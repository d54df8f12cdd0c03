"""A 2-D convolution whose gradient XLA:CPU runs at the dense rate inside loops.

The gradient of a convolution is two more convolutions: the input gradient (the output gradient convolved with the
flipped kernel, its in and out channels swapped) and the kernel gradient (the input and the output gradient
convolved with the examples as the contracted features). JAX writes them with permuted dimension labels
(``b01f_01oi->b01f`` and ``f01b_i01o->01bf``). At the top level of a program XLA:CPU rewrites them into its library
form (``b01f_01io->b01f``, with explicit transposes), but inside a loop body (``lax.fori_loop`` of the local steps,
``lax.scan`` of the server steps: where every local step of the simulator runs) it left them in the permuted form and
ran them on its generic loop emitter: one local step of the small CNN took 2.6 to 3.5 times as long inside a loop as
at the top level (jax 0.10.2, measured side by side in one process; see docs/benchmarks.md).

:func:`conv_general_dilated` is a drop-in for ``jax.lax.conv_general_dilated`` (Flax's ``nn.Conv`` takes it as its
``conv_general_dilated`` attribute) that, on the CPU backend and for NHWC/HWIO convolutions with unit strides and no
dilation, defines the gradient itself with both convolutions already in the library form, so loops keep the fast
path. For the same inputs the gradient is the same (the same convolutions, only the transposes are explicit); every
other case, and every other backend, is ``jax.lax.conv_general_dilated`` itself. The choice is made while tracing.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

NHWC = ("NHWC", "HWIO", "NHWC")
Pads = tuple[tuple[int, int], tuple[int, int]]


def _conv(x: jax.Array, w: jax.Array, pads: Pads, precision: Any) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), pads, dimension_numbers=NHWC, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_nhwc(x: jax.Array, w: jax.Array, pads: Pads, precision: Any = None) -> jax.Array:
    """``y[b, i, j, o] = sum_{di, dj, c} x_pad[b, i + di, j + dj, c] w[di, dj, c, o]`` (unit strides; ``x`` NHWC,
    ``w`` HWIO, ``pads`` the (low, high) zero padding of H and W), with the gradient of :func:`_conv_bwd`."""
    return _conv(x, w, pads, precision)


def _conv_fwd(x: jax.Array, w: jax.Array, pads: Pads, precision: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _conv(x, w, pads, precision), (x, w)


def _conv_bwd(pads: Pads, precision: Any, saved: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array,
                                                                                                        jax.Array]:
    """Both gradients as NHWC x HWIO convolutions:

    * ``dx = conv(g, flip(w)^T)`` with padding ``k - 1 - p`` on each side (the transposed convolution);
    * ``dw[di, dj, c, o] = sum_{b, i, j} x_pad[b, i + di, j + dj, c] g[b, i, j, o]``: the input with its channels as
      the batch and its examples as the features (``[C, H, W, B]``), convolved with the output gradient as the kernel
      (``[H', W', B, O]``), then put back in HWIO order.
    """
    x, w = saved
    kh, kw = w.shape[:2]
    flipped = jnp.transpose(w[::-1, ::-1], (0, 1, 3, 2))
    back = ((kh - 1 - pads[0][0], kh - 1 - pads[0][1]), (kw - 1 - pads[1][0], kw - 1 - pads[1][1]))
    dx = _conv(g, flipped, back, precision)
    dw = _conv(jnp.transpose(x, (3, 1, 2, 0)), jnp.transpose(g, (1, 2, 0, 3)), pads, precision)
    return dx.astype(x.dtype), jnp.transpose(dw, (1, 2, 0, 3)).astype(w.dtype)


conv_nhwc.defvjp(_conv_fwd, _conv_bwd)


def _unit(values: Sequence[int] | None) -> bool:
    return values is None or all(int(v) == 1 for v in values)


def library_form_applies(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], lhs_dilation: Any,
                         rhs_dilation: Any, dimension_numbers: Any, feature_group_count: int, batch_group_count: int,
                         preferred_element_type: Any) -> bool:
    """Whether :func:`conv_general_dilated` uses :func:`conv_nhwc`: the CPU backend, a 2-D NHWC x HWIO convolution
    with unit strides, no dilation, one group, no output type of its own, and any padding ``p <= k - 1``."""
    if jax.default_backend() != "cpu" or lhs.ndim != 4 or rhs.ndim != 4:
        return False
    if not (_unit(window_strides) and _unit(lhs_dilation) and _unit(rhs_dilation)):
        return False
    if feature_group_count != 1 or batch_group_count != 1 or preferred_element_type is not None:
        return False
    return lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) == lax.conv_dimension_numbers(
        lhs.shape, rhs.shape, NHWC)


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding: Any,
                         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1, batch_group_count: int = 1,
                         precision: Any = None, preferred_element_type: Any = None) -> jax.Array:
    """``jax.lax.conv_general_dilated`` with the loop-friendly gradient of :func:`conv_nhwc` where it applies
    (:func:`library_form_applies`); the same signature and values."""
    if library_form_applies(lhs, rhs, window_strides, lhs_dilation, rhs_dilation, dimension_numbers,
                            feature_group_count, batch_group_count, preferred_element_type):
        if isinstance(padding, str):
            padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], (1, 1), padding)
        pads = tuple((int(lo), int(hi)) for lo, hi in padding)
        kernel = rhs.shape[:2]
        if all(0 <= p <= k - 1 for (lo, hi), k in zip(pads, kernel) for p in (lo, hi)):
            return conv_nhwc(lhs, rhs, pads, precision)
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                                    feature_group_count, batch_group_count, precision, preferred_element_type)
