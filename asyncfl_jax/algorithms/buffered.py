"""Delta-averaging algorithms: FedAvg, FedBuff and plain asynchronous SGD.

Clients upload their model delta ``Delta_i = y_K - x_{t - tau_i}`` (it points downhill) and the server adds an
average of the buffered deltas:

    FedBuff (CA2FL digest Alg. 2, line 9; Nguyen et al. 2022):
        v_t = (1/Z) sum_{i in S_t} w(tau_i) Delta_i,      x_{t+1} = x_t + eta_g v_t
    with w = 1 ("constant") or w = 1/sqrt(1 + tau) ("inverse_sqrt"), and the normalization Z one of
        "buffer":  Z = |S_t| (= M; the default, as in FedBuff and the CA2FL analysis),
        "weights": Z = sum_i w(tau_i),
        "none":    Z = 1 (the literal sum of CA2FL's Algorithm 2 as printed).

    FedAvg (McMahan et al. 2017, with a server learning rate as in FedOpt):
        x_{t+1} = x_t + eta_g (1/|S_t|) sum_{i in S_t} Delta_i      (S_t: this round's participants)
    Clients are weighted uniformly, as in all the source papers (not by data size).

    Asynchronous SGD (buffer of one): every arrival is applied on its own,
        x <- x + eta_g Delta_i.
"""

from __future__ import annotations

import jax.numpy as jnp

from asyncfl_jax.algorithms import staleness as staleness_lib
from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    ServerMeta,
    ServerState,
    masked_weighted_sum,
    model_only_algorithm,
)

NORMALIZATIONS = ("buffer", "weights", "none")


def fedbuff(staleness: str = "constant", normalization: str = "buffer") -> Algorithm:
    """FedBuff: average the M buffered deltas (optionally staleness-weighted) and take a server step.

    Args:
      staleness: weighting ``w(tau)``: "constant" (default) or "inverse_sqrt" (FedBuff paper), or any name in
        :data:`asyncfl_jax.algorithms.staleness.STALENESS_FUNCTIONS`.
      normalization: "buffer" (divide by the number of arrivals, default), "weights" (by the sum of weights) or
        "none" (sum).
    Hyper-parameters: ``server_lr`` (eta_g, default 1.0), and those of the staleness function.
    """
    weight_fn = staleness_lib.get(staleness)
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"fedbuff normalization must be one of {list(NORMALIZATIONS)}, got {normalization!r}")

    def server(state: ServerState, deltas: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        w = jnp.where(meta.mask, weight_fn(meta.staleness, hp), 0.0)
        if normalization == "buffer":
            z = jnp.sum(meta.mask)
        elif normalization == "weights":
            z = jnp.sum(w)
        else:
            z = 1.0
        v = masked_weighted_sum(deltas, w) / jnp.maximum(z, 1e-12)  # v_t = (1/Z) sum w_i Delta_i
        return ServerState(x=state.x + hp["server_lr"] * v)  # x_{t+1} = x_t + eta_g v_t

    return model_only_algorithm(
        "fedbuff",
        server,
        hyperparams={"server_lr": 1.0, **staleness_lib.STALENESS_HPARAMS[staleness]},
        options={"staleness": staleness, "normalization": normalization},
    )


def fedavg() -> Algorithm:
    """FedAvg: ``x <- x + eta_g * mean_{i in S_t} Delta_i`` over one synchronous round's participants.

    Use it with the "synchronous" protocol (full or sampled participation). Hyper-parameter: ``server_lr`` (1.0 is
    the original FedAvg).
    """

    def server(state: ServerState, deltas: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        w = meta.mask.astype(deltas.dtype)
        mean_delta = masked_weighted_sum(deltas, w) / jnp.maximum(jnp.sum(w), 1.0)
        return ServerState(x=state.x + hp["server_lr"] * mean_delta)

    return model_only_algorithm("fedavg", server, hyperparams={"server_lr": 1.0})


def asgd() -> Algorithm:
    """Plain asynchronous SGD: each arriving delta is added as it comes, ``x <- x + eta_g Delta_i``.

    With one local step this is ``x <- x - eta_g eta_l grad F_i(x_{t-tau}; xi)``. Meant for a buffer of one (every
    arrival is a server step); with a larger buffer the arrivals of a step are summed.
    """

    def server(state: ServerState, deltas: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        total = masked_weighted_sum(deltas, meta.mask.astype(deltas.dtype))
        return ServerState(x=state.x + hp["server_lr"] * total)

    return model_only_algorithm("asgd", server, hyperparams={"server_lr": 1.0})
