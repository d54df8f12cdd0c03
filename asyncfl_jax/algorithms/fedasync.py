"""FedAsync (Xie et al. 2019): staleness-weighted mixing of the server model with each arriving local model.

The client uploads its final local model ``x_i = x_{t-tau} + Delta_i`` (not the delta), and on every arrival

    alpha_t = alpha * s(tau),         x_{t+1} = (1 - alpha_t) x_t + alpha_t x_i        (CA2FL digest Eq. D.3;
                                                                                       AsyncFedED Eqs. 40-41)

with ``s`` one of the staleness functions (constant, polynomial ``(tau+1)^-a``, hinge). When a step carries several
arrivals (buffer > 1) they are mixed in one at a time, in arrival order; each uses its own staleness.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms import staleness as staleness_lib
from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    ServerMeta,
    ServerState,
    model_only_algorithm,
)
from asyncfl_jax.client import LOCAL_HPARAMS


def upload_local_model(x_start: jax.Array, delta: jax.Array, client_state, hp: HParams):
    """The client sends its local model ``x_start + Delta`` instead of the delta."""
    del hp
    return x_start + delta, client_state


def fedasync(staleness: str | Callable[..., Any] = "constant",
             staleness_params: Mapping[str, float] | None = None) -> Algorithm:
    """FedAsync with staleness function ``staleness`` in {"constant", "polynomial", "hinge"} (or "inverse_sqrt"),
    or a user's function ``fn(tau, params) -> weights`` whose hyper-parameters (names and defaults) are
    ``staleness_params`` (:func:`asyncfl_jax.algorithms.staleness.resolve`), e.g.
    ``fedasync(lambda tau, p: jnp.exp(-p["decay"] * tau), {"decay": 0.3})``.

    Hyper-parameters: ``alpha`` (mixing weight, default 0.5), ``staleness_a``/``staleness_b`` for polynomial/hinge,
    or those of ``staleness_params``.
    """
    rule = staleness_lib.resolve(staleness, staleness_params, reserved=("alpha", *LOCAL_HPARAMS))
    weight_fn = rule.weights

    def server(state: ServerState, local_models: jax.Array, meta: ServerMeta, hp: HParams) -> ServerState:
        alphas = jnp.where(meta.mask, hp["alpha"] * weight_fn(meta.staleness, hp), 0.0)  # alpha_t = alpha s(tau)

        def mix(x, item):
            alpha_t, x_i = item
            return (1.0 - alpha_t) * x + alpha_t * x_i, None  # x <- (1 - alpha_t) x + alpha_t x_i

        x, _ = jax.lax.scan(mix, state.x, (alphas.astype(state.x.dtype), local_models))
        return ServerState(x=x)

    return model_only_algorithm(
        "fedasync",
        server,
        hyperparams={"alpha": 0.5, **rule.hparams},
        client=upload_local_model,
        options={"staleness": rule.label},
        upload="model",
    )
