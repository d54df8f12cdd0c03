"""Staleness weighting functions ``s(tau)`` for asynchronous aggregation.

``tau`` is the staleness of an update (server version when applied minus version it was computed on, >= 0).

* constant:     ``s(tau) = 1``
* polynomial:   ``s(tau) = (tau + 1)^(-a)``                              (FedAsync, Xie et al. 2019)
* hinge:        ``s(tau) = 1 if tau <= b else 1 / (a (tau - b) + 1)``   (FedAsync; AsyncFedED Eq. 41)
* inverse_sqrt: ``s(tau) = 1 / sqrt(1 + tau)``                           (FedBuff, Nguyen et al. 2022)

The parameters ``a`` and ``b`` are read from the hyper-parameters ``staleness_a`` and ``staleness_b``.

A user-defined staleness function is an argument of the algorithms that weight by staleness
(``fedasync(staleness=fn, staleness_params={...})``, the same for ``fedbuff``): ``fn(tau, params) -> weights``
with ``tau`` the float staleness values [M] and ``params`` a dict of its own hyper-parameters (the names and
defaults of ``staleness_params``), which join the algorithm's hyper-parameters, so they can be swept and
differentiated (:func:`asyncfl_jax.hypergrad.hypergradient`). See :func:`resolve`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.precision import float_dtype

StalenessFn = Callable[[jax.Array, Mapping[str, jax.Array]], jax.Array]


def constant(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    return jnp.ones_like(tau, dtype=float_dtype(*hp.values()))


def polynomial(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    return (tau.astype(float_dtype(*hp.values())) + 1.0) ** (-hp["staleness_a"])


def hinge(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
    tau = tau.astype(float_dtype(*hp.values()))
    a, b = hp["staleness_a"], hp["staleness_b"]
    over = ~(tau <= b)
    # the unused branch's denominator is kept away from 0 (a (tau - b) + 1 = 0 for some tau <= b), else its inf
    # would turn the derivative into NaN (the double-where idiom); the values are unchanged
    denominator = jnp.where(over, a * (tau - b) + 1.0, 1.0)
    return jnp.where(over, 1.0 / denominator, 1.0)


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


@dataclasses.dataclass(frozen=True)
class StalenessRule:
    """A staleness function as an algorithm uses it: ``weights(tau_int, hp)``, the hyper-parameters it reads (with
    their defaults) and the label recorded in the algorithm's options."""

    label: str
    weights: StalenessFn
    hparams: dict[str, float]


CUSTOM_PREFIX = "custom:"
"""Options label of a user-defined staleness function: ``custom:<the function's __name__>``."""


def resolve(staleness: str | Callable[..., Any], params: Mapping[str, float] | None = None,
            reserved: tuple[str, ...] = ()) -> StalenessRule:
    """The :class:`StalenessRule` of ``staleness``: a name in :data:`STALENESS_FUNCTIONS`, or a user's function.

    A user's function ``fn(tau, params) -> weights`` receives ``tau``, the staleness values as floats of the run's
    precision (shape [M]), and ``params``, a dict with the current value of each hyper-parameter named in
    ``params`` (``{"name": default}``); it returns M weights ``s(tau) >= 0``. Its hyper-parameters are added to
    the algorithm's (they must not shadow one of ``reserved``, the algorithm's and local training's own), so they
    can be swept like any other and differentiated through a run. The function is checked once here, on
    ``tau = 0, 1, ..., 7`` at the defaults: it must read no other hyper-parameter and return finite weights >= 0
    of tau's shape; a ValueError says what is wrong. ``params`` is refused with a built-in name (whose parameters
    are ``staleness_a`` / ``staleness_b``).
    """
    if isinstance(staleness, str):
        if params is not None:
            raise ValueError(f"staleness_params is for a user-defined staleness function; {staleness!r} reads "
                             f"{sorted(STALENESS_HPARAMS.get(staleness, {}))}, set them as hyper-parameters")
        return StalenessRule(staleness, get(staleness), dict(STALENESS_HPARAMS[staleness]))
    if not callable(staleness):
        raise ValueError(f"staleness must be one of {sorted(STALENESS_FUNCTIONS)} or a function fn(tau, params) -> "
                         f"weights, got {staleness!r}")
    defaults = _check_params(params or {}, reserved)
    fn = staleness

    def weights(tau: jax.Array, hp: Mapping[str, jax.Array]) -> jax.Array:
        dtype = float_dtype(*hp.values())
        return jnp.asarray(fn(tau.astype(dtype), {k: hp[k] for k in defaults}), dtype)

    label = CUSTOM_PREFIX + getattr(fn, "__name__", type(fn).__name__)
    _check_custom(fn, defaults, label)
    return StalenessRule(label, weights, defaults)


def _check_params(params: Mapping[str, float], reserved: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(params, Mapping):
        raise ValueError(f"staleness_params must be a dict {{name: default value}}, got {params!r}")
    out = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"staleness_params: a name must be an identifier string, got {name!r}")
        if name in reserved:
            raise ValueError(f"staleness_params: {name!r} is already a hyper-parameter of the algorithm or of local "
                             f"training; choose another name (e.g. 'staleness_{name}')")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(value)):
            raise ValueError(f"staleness_params[{name!r}] must be a finite number (its default), got {value!r}")
        out[name] = float(value)
    return out


def _check_custom(fn: Callable[..., Any], defaults: dict[str, float], label: str) -> None:
    """Runs ``fn`` on ``tau = 0..7`` at the defaults: a clear error now rather than inside a compiled run."""
    tau = jnp.arange(8, dtype=jnp.float32)
    try:
        out = fn(tau, {k: jnp.float32(v) for k, v in defaults.items()})
    except KeyError as e:
        raise ValueError(f"staleness function {label}: reads the hyper-parameter {e} that is not in "
                         f"staleness_params {sorted(defaults)} (give it there with its default)") from None
    out = np.asarray(out)
    if out.shape != tau.shape or out.dtype.kind != "f":
        raise ValueError(f"staleness function {label}: must return one float weight per staleness value (shape "
                         f"{tuple(tau.shape)}), got {out.dtype} of shape {out.shape} for tau = 0..7")
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise ValueError(f"staleness function {label}: weights must be finite and >= 0, got {out.tolist()} for "
                         f"tau = 0..7 at the defaults {defaults}")
