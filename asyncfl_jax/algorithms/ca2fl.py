"""CA2FL: cache-aided asynchronous FL (Wang et al. 2023; CA2FL digest §2.3, Algorithm 1).

The server keeps the latest delta ``h_i`` of every client (zeros at the start) and their mean ``hbar``. At a step
with arrivals ``S_t`` (each bringing ``Delta_i``):

    v_t     = hbar_t + (1/|S_t|) sum_{i in S_t} (Delta_i - h_t^i)        (Alg. 1, line 9: calibrated update)
    x_{t+1} = x_t + eta v_t                                             (line 10)
    h_{t+1}^i = Delta_i for i in S_t;  h^j unchanged otherwise          (line 11)

``hbar`` and the ``h_t^i`` on the right of line 9 are the values from before this step's arrivals. The state is kept
in the digest's streaming form, so a step costs O(|S_t| d), never O(n d) (one gather and one scatter of |S_t| rows):

    acc = sum_{i in S_t} (Delta_i - H[i]);  H[i] = Delta_i;  v = hbar + acc / |S_t|;  x += eta v;  hbar += acc / n

Arrivals are applied in order, so a client that arrives twice in one step (possible with immediate refill)
contributes ``(Delta_1 - h_old) + (Delta_2 - Delta_1)`` and ends with ``h = Delta_2``, as the sequential rule does. With ``h = 0`` at the start the first step is
FedBuff's average.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    ServerMeta,
    after,
    model_of,
    no_client_state,
    read_rows,
    send_result,
)


class CA2FLState(NamedTuple):
    """Server state of CA2FL.

    Attributes:
      x: global model [d].
      cache: ``h_i``, every client's latest delta [n, d] (float32).
      cache_mean: ``hbar = (1/n) sum_i h_i`` [d].
    """

    x: jax.Array
    cache: jax.Array
    cache_mean: jax.Array


def ca2fl() -> Algorithm:
    """CA2FL: the FedBuff step calibrated by a server cache of every client's latest delta.

    Use it with the paper's schedule: the "concurrent" protocol with ``refill="boundary"`` (Mc = 20, M = 10).
    Hyper-parameters: ``server_lr`` (eta, 1.0 as tuned in the paper's Table 6). The cache takes n x d float32.
    """

    def init(x0: jax.Array, num_clients: int) -> CA2FLState:
        return CA2FLState(x=x0, cache=jnp.zeros((num_clients, x0.shape[0]), x0.dtype), cache_mean=jnp.zeros_like(x0))

    def server(state: CA2FLState, deltas: jax.Array, meta: ServerMeta, hp: HParams) -> CA2FLState:
        n = state.cache.shape[0]
        rows = jnp.where(meta.mask, meta.clients, 0)
        previous = _previous_value(state.cache, rows, meta.mask, deltas)  # h_i before each arrival
        acc = jnp.sum(jnp.where(meta.mask[:, None], deltas - previous, 0.0), axis=0)  # sum (Delta_i - h_i)
        arrivals = jnp.maximum(jnp.sum(meta.mask), 1)
        v = state.cache_mean + acc / arrivals  # v_t = hbar + (1/|S_t|) sum (Delta_i - h_i)   (line 9)
        keep = meta.mask & ~_has_later_duplicate(rows, meta.mask)  # a client's last arrival of the step wins
        new_rows = after(deltas, previous)  # read the old rows before the in-place write (see base.after)
        cache = state.cache.at[jnp.where(keep, rows, n)].set(new_rows, mode="drop")  # h_i <- Delta_i   (line 11)
        return CA2FLState(
            x=state.x + hp["server_lr"] * v,  # x_{t+1} = x_t + eta v_t   (line 10)
            cache=cache,
            cache_mean=state.cache_mean + acc / n,  # hbar_{t+1} = (1/n) sum_i h_{t+1}^i
        )

    return Algorithm(
        name="ca2fl",
        init=init,
        client=send_result,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        hyperparams={"server_lr": 1.0},
    )


def _has_later_duplicate(rows: jax.Array, mask: jax.Array) -> jax.Array:
    """bool [M]: entry k is followed, in the same buffer, by another real entry of the same client."""
    m = rows.shape[0]
    later = jnp.arange(m)[None, :] > jnp.arange(m)[:, None]  # later[k, j]: j comes after k
    same = (rows[:, None] == rows[None, :]) & mask[:, None] & mask[None, :]
    return jnp.any(same & later, axis=1)


def _previous_value(cache: jax.Array, rows: jax.Array, mask: jax.Array, deltas: jax.Array) -> jax.Array:
    """[M, d]: the cache row each arrival replaces: the client's delta from an earlier arrival of the same step if
    there is one (the arrivals are applied in order), else its cached ``h_i``. Costs O(M d) (a gather of M rows)."""
    m = rows.shape[0]
    earlier = jnp.arange(m)[None, :] < jnp.arange(m)[:, None]  # earlier[k, j]: j comes before k
    same = (rows[:, None] == rows[None, :]) & mask[:, None] & mask[None, :] & earlier
    last_earlier = jnp.max(jnp.where(same, jnp.arange(m)[None, :], -1), axis=1)
    return jnp.where((last_earlier >= 0)[:, None], deltas[jnp.maximum(last_earlier, 0)], read_rows(cache, rows))
