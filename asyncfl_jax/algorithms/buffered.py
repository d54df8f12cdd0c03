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
    Clients are weighted uniformly by default, as in all the source papers' own methods; ``weights="data_size"`` is
    McMahan et al.'s ``n_k / n`` weighting (AsyncFedED's Eq. 38 baseline, without its spurious 1/m, digest 001 §3.1):
        x_{t+1} = x_t + eta_g sum_{i in S_t} n_i Delta_i / sum_{i in S_t} n_i
    normalized by the sizes of the step's arrivals (with full participation, the ``n`` of all clients).

    Asynchronous SGD (buffer of one): every arrival is applied on its own,
        x <- x + eta_g Delta_i        (or x <- x - eta_g g_i when clients upload gradients).
    Delay-adaptive ASGD: the same with eta_g min(1, tau_C / tau) for an arrival of staleness tau.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

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
from asyncfl_jax.client import LOCAL_HPARAMS

NORMALIZATIONS = ("buffer", "weights", "none")


def fedbuff(staleness: str | Callable[..., Any] = "constant", normalization: str = "buffer",
            staleness_params: Mapping[str, float] | None = None) -> Algorithm:
    """FedBuff: average the M buffered deltas (optionally staleness-weighted) and take a server step.

    Args:
      staleness: weighting ``w(tau)``: "constant" (default) or "inverse_sqrt" (FedBuff paper), or any name in
        :data:`asyncfl_jax.algorithms.staleness.STALENESS_FUNCTIONS`, or a user's function ``fn(tau, params) ->
        weights`` (:func:`asyncfl_jax.algorithms.staleness.resolve`).
      normalization: "buffer" (divide by the number of arrivals, default), "weights" (by the sum of weights) or
        "none" (sum).
      staleness_params: the hyper-parameters of a user's staleness function, ``{name: default}``.
    Hyper-parameters: ``server_lr`` (eta_g, default 1.0), and those of the staleness function.
    """
    rule = staleness_lib.resolve(staleness, staleness_params, reserved=("server_lr", *LOCAL_HPARAMS))
    weight_fn = rule.weights
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
        hyperparams={"server_lr": 1.0, **rule.hparams},
        options={"staleness": rule.label, "normalization": normalization},
    )


def fedavg(weights: str = "uniform") -> Algorithm:
    """FedAvg: ``x <- x + eta_g * sum_i w_i Delta_i / sum_i w_i`` over one synchronous round's participants ``S_t``.

    Use it with the "synchronous" protocol (full or sampled participation); FedProx is this server with the local
    ``prox_mu`` term, S-FedAvg this server with sampled participants. Hyper-parameter: ``server_lr`` (1.0 is the
    original FedAvg).

    Args:
      weights: "uniform" (``w_i = 1``, the default) or "data_size" (``w_i = n_i``, the client's number of training
        examples, read from :attr:`ServerMeta.sizes`: McMahan et al.'s ``n_k / n`` weights, AsyncFedED's Eq. 38).
        The weights are normalized over the step's arrivals; a client that arrives twice in a step counts twice.
    """
    if weights not in FEDAVG_WEIGHTS:
        raise ValueError(f"fedavg weights must be one of {list(FEDAVG_WEIGHTS)}, got {weights!r}")

    def server(state: ServerState, deltas: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        w = arrival_weights(meta, weights).astype(deltas.dtype)
        mean_delta = masked_weighted_sum(deltas, w) / jnp.maximum(jnp.sum(w), 1.0)  # sum w_i Delta_i / sum w_i
        return ServerState(x=state.x + hp["server_lr"] * mean_delta)

    return model_only_algorithm("fedavg", server, hyperparams={"server_lr": 1.0}, options={"weights": weights})


FEDAVG_WEIGHTS = ("uniform", "data_size")


def arrival_weights(meta: ServerMeta, weights: str) -> jnp.ndarray:
    """The weight of each arrival: 1 ("uniform") or its client's data size ``n_i`` ("data_size"); 0 for padding."""
    if weights == "uniform":
        return meta.mask.astype(jnp.float32)
    if meta.sizes is None:
        raise ValueError('weights="data_size" needs the clients\' data sizes in ServerMeta.sizes (the engine fills '
                         "them; a ServerMeta built by hand must give sizes)")
    return jnp.where(meta.mask, meta.sizes, 0.0).astype(jnp.float32)


UPLOADS = ("delta", "gradient")


def asgd(upload: str = "delta") -> Algorithm:
    """Plain asynchronous SGD: each arrival is applied as it comes.

    ``upload="delta"``: ``x <- x + eta_g Delta_i`` (with one local step, ``x - eta_g eta_l grad F_i(x_{t-tau})``).
    ``upload="gradient"``: clients send one minibatch gradient and ``x <- x - eta_g g_i`` (Vanilla ASGD of the ACE
    paper, Mishchenko et al. 2022; ACE digest §2.7). Meant for a buffer of one (every arrival is a server step); with a
    larger buffer the arrivals of a step are summed.
    """
    _check_upload(upload)
    direction = 1.0 if upload == "delta" else -1.0

    def server(state: ServerState, messages: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        total = masked_weighted_sum(messages, meta.mask.astype(messages.dtype))
        return ServerState(x=state.x + direction * hp["server_lr"] * total)

    algorithm = model_only_algorithm("asgd", server, hyperparams={"server_lr": 0.3},  # docs/defaults.md
                                     options={"upload": upload})
    return algorithm._replace(upload=upload)


def delay_adaptive_asgd(upload: str = "gradient") -> Algorithm:
    """Delay-adaptive asynchronous SGD (Koloskova et al. 2022; ACE digest §2.8, Alg. a.4).

    Each arrival with staleness ``tau`` is applied with the step size ``eta_t = eta min(1, tau_C / tau)``::

        x <- x - eta_t g_i          (upload="gradient", the default)   or   x <- x + eta_t Delta_i   ("delta")

    Hyper-parameters: ``server_lr`` (eta) and ``tau_c`` (the delay threshold; the recommended value is the
    concurrency, i.e. the number of clients in flight).
    """
    _check_upload(upload)
    direction = 1.0 if upload == "delta" else -1.0

    def server(state: ServerState, messages: jnp.ndarray, meta: ServerMeta, hp: HParams) -> ServerState:
        tau = meta.staleness.astype(jnp.float32)
        rate = hp["server_lr"] * jnp.minimum(1.0, hp["tau_c"] / jnp.maximum(tau, 1e-12))  # eta min(1, tau_C / tau)
        total = masked_weighted_sum(messages, jnp.where(meta.mask, rate, 0.0))
        return ServerState(x=state.x + direction * total)

    algorithm = model_only_algorithm("delay_adaptive_asgd", server, hyperparams={"server_lr": 0.02, "tau_c": 10.0},
                                     options={"upload": upload})
    return algorithm._replace(upload=upload)


def _check_upload(upload: str) -> None:
    if upload not in UPLOADS:
        raise ValueError(f"upload must be one of {list(UPLOADS)}, got {upload!r}")
