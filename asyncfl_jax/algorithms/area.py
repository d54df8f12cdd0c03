"""AREA (Houdard et al.; AREA digest §2.1, Algorithms 1-2) and its baseline AS-FedAvg (digest §2.2).

AREA keeps a memory ``y_i`` on every client (``y_i = x_{s,0}`` at the start). A client's job starts from the server
model ``x_s``, runs local SGD to ``x_i^M``, and the client sends the residual between its new and previous local model::

    m_i = x_i^M - y_i,     y_i <- x_i^M                           (Alg. 2)

The server adds ``m_i / n`` to an aggregator ``u`` and, when its aggregation criterion fires, applies it::

    u <- u + (1/n) m_i                 (every receipt; uniform 1/n, whatever the client's data size)   (Alg. 1)
    x_s <- x_s + u,  u <- 0            (every aggregation)

Hence ``x_s + u = (1/n) sum_i y_i`` at all times (App. A), and after each aggregation the server model is the mean
of every client's latest local model (clients that never reported still count with ``x_{s,0}``).

In this simulator a server step is one aggregation and its arrivals are the receipts since the previous one, so
``x_{t+1} = x_t + (1/n) sum_{i in S_t} m_i`` and ``u`` never has to be stored. The criterion is the schedule's:
every Delta arrivals (the paper's experiments: the "concurrent"/"all_active" protocols with ``buffer_size = Delta``
and immediate refill, so a client is sent the current model as soon as it reports, and the Delta-th reporter gets
the post-aggregation model, the digest's recommendation A5), or an independent server clock (the protocols'
``aggregation="periodic"`` / ``"poisson"``; the theory's setting).

Step sizes (option ``lr_schedule``): ``"constant"`` uses ``client_lr`` (the experiments); ``"decreasing"`` is the
schedule of the paper's Theorem 7 in its Lemma 11 form, ``alpha_k = lr_c / (k + lr_d)``, where ``k`` counts the
server's events (receipts and aggregations) before the job is dispatched; a client keeps its step size for the whole
job.

AS-FedAvg (asynchronous FedAvg with FedBuff buffering; digest §2.2, A2): clients send their local model and the server
*replaces* its model with the mean of the buffered ones, ``x_s <- (1/|S_t|) sum_{i in S_t} x_i^M``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    JobPolicy,
    ServerMeta,
    ServerState,
    masked_weighted_sum,
    model_of,
    model_only_algorithm,
)
from asyncfl_jax.algorithms.fedasync import upload_local_model

LR_SCHEDULES = ("constant", "decreasing")


class AREAState(NamedTuple):
    """Server state of AREA.

    Attributes:
      x: the server model ``x_s`` [d].
      events: float32 scalar, ``k``: receipts plus aggregations so far (read by the decreasing step size).
      num_clients: float32 scalar, n.
    """

    x: jax.Array
    events: jax.Array
    num_clients: jax.Array


def area(lr_schedule: str = "constant") -> Algorithm:
    """AREA: the server model is the mean of every client's latest local model (client memory ``y_i``, 1/n scaling).

    Hyper-parameters: ``client_lr`` (the constant local step size alpha), and for ``lr_schedule="decreasing"``
    ``lr_c`` and ``lr_d`` (``alpha_k = lr_c / (k + lr_d)``; Theorem 7 gives ``lr_c = 48 / (p_min M gamma)``,
    ``lr_d = lr_c / D``). There is no server learning rate. The client memory takes n x d float32 on the clients.
    """
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {list(LR_SCHEDULES)}, got {lr_schedule!r}")

    def init(x0: jax.Array, num_clients: int) -> AREAState:
        return AREAState(x=x0, events=jnp.zeros((), x0.dtype), num_clients=jnp.asarray(num_clients, x0.dtype))

    def init_clients(x0: jax.Array, num_clients: int) -> jax.Array:
        return jnp.tile(x0[None, :], (num_clients, 1))  # y_i = x_{s,0}

    def client(x_start: jax.Array, delta: jax.Array, memory: jax.Array, hp: HParams):
        del hp
        local_model = x_start + delta  # x_i^M
        return local_model - memory, local_model  # m_i = x_i^M - y_i;  y_i <- x_i^M   (Alg. 2)

    def server(state: AREAState, messages: jax.Array, meta: ServerMeta, hp: HParams) -> AREAState:
        del hp
        u = masked_weighted_sum(messages, meta.mask.astype(messages.dtype)) / state.num_clients  # u = (1/n) sum m_i
        receipts = jnp.sum(meta.mask).astype(state.events.dtype)
        return state._replace(x=state.x + u, events=state.events + receipts + 1.0)  # x_s <- x_s + u

    def local_hparams(state: AREAState, hp: HParams) -> HParams:
        if lr_schedule == "constant":
            return hp
        return {**hp, "client_lr": hp["lr_c"] / (state.events + hp["lr_d"])}  # alpha_k = c / (k + d)

    hyperparams = {"lr_c": 1.0, "lr_d": 10.0} if lr_schedule == "decreasing" else {}
    return Algorithm(
        name="area",
        init=init,
        client=client,
        server=server,
        params=model_of,
        init_clients=init_clients,
        hyperparams=hyperparams,
        options={"lr_schedule": lr_schedule},
        jobs=JobPolicy(hparams=local_hparams),
    )


def as_fedavg() -> Algorithm:
    """AS-FedAvg: the server model becomes the mean of the local models that arrive at a step (no hyper-parameters)."""

    def server(state: ServerState, local_models: jax.Array, meta: ServerMeta, hp: HParams) -> ServerState:
        del hp
        count = jnp.sum(meta.mask)
        mean = masked_weighted_sum(local_models, meta.mask.astype(local_models.dtype)) / jnp.maximum(count, 1)
        return ServerState(x=jnp.where(count > 0, mean, state.x))  # x_s <- (1/|S_t|) sum x_i^M

    return model_only_algorithm("as_fedavg", server, hyperparams={}, client=upload_local_model, upload="model")
