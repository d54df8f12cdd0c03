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
contributes ``(Delta_1 - h_old) + (Delta_2 - Delta_1)`` and ends with ``h = Delta_2``, as the sequential rule does.
With ``h = 0`` at the start the first step is FedBuff's average.

The divisor ``|S_t|`` (option ``normalize``) is the number of arrivals by default ("arrivals", the buffer size M of
CA2FL's Alg. 1, where every arrival is a distinct message); "distinct" divides by the number of distinct clients among
them, as the ACE paper's CA2FL baseline does (ACE digest §2.5, Alg. a.3: "S <- S u {i}", both calibrated terms of a
client that arrives twice accumulated). The two agree whenever no client arrives twice in a step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import (
    Algorithm,
    HParams,
    ServerMeta,
    model_of,
    no_client_state,
    send_result,
)
from asyncfl_jax.algorithms.cache import CODES, make_cache, replace_rows


class CA2FLState(NamedTuple):
    """Server state of CA2FL.

    Attributes:
      x: global model [d].
      cache: ``h_i``, every client's latest delta [n, d], in the storage of a
        :class:`~asyncfl_jax.algorithms.cache.ClientCache` (float32 [n, d] by default).
      cache_mean: ``hbar = (1/n) sum_i h_i`` [d].
    """

    x: jax.Array
    cache: jax.Array
    cache_mean: jax.Array


NORMALIZATIONS = ("arrivals", "distinct")


def ca2fl(cache: str = "float32", cache_rounding: str = "stochastic", quantize_fresh: bool = False,
          normalize: str = "arrivals", cache_code: str = "minmax") -> Algorithm:
    """CA2FL: the FedBuff step calibrated by a server cache of every client's latest delta.

    Use it with the paper's schedule: the "concurrent" protocol with ``refill="boundary"`` (Mc = 20, M = 10).
    Hyper-parameters: ``server_lr`` (eta, 1.0 as tuned in the paper's Table 6).

    Args:
      cache: how the n x d cache is stored (:data:`asyncfl_jax.algorithms.cache.CACHE_KINDS`). With ``"int8"``,
        ``"int4"`` or ``"int2"`` this is MF-CA2FL (digest §2.4): the server keeps ``h_i = Q(Delta_i)``, and ``hbar``
        is the mean of the stored ``Q`` values; the fresh term of ``v`` uses the full-precision ``Delta_i``.
      cache_rounding: "stochastic" (unbiased, the paper's assumption) or "nearest" (deterministic).
      quantize_fresh: use ``Q(Delta_i)`` in the fresh term too (the form of the paper's App. G proof).
      normalize: the ``|S_t|`` of line 9: "arrivals" (the number of arrivals, default) or "distinct" (the number of
        distinct arriving clients, the ACE paper's CA2FL baseline, Alg. a.3).
      cache_code: the code of the int caches, "minmax" or "absmax" (:mod:`asyncfl_jax.algorithms.cache`).
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"ca2fl normalize must be one of {list(NORMALIZATIONS)}, got {normalize!r}")
    store = make_cache(cache, cache_rounding, cache_code)

    def init(x0: jax.Array, num_clients: int) -> CA2FLState:
        return CA2FLState(x=x0, cache=store.init(num_clients, x0.shape[0], x0.dtype), cache_mean=jnp.zeros_like(x0))

    def server(state: CA2FLState, deltas: jax.Array, meta: ServerMeta, hp: HParams) -> CA2FLState:
        n = jax.tree_util.tree_leaves(state.cache)[0].shape[0]
        r = replace_rows(store, state.cache, deltas, meta.clients, meta.mask, meta.key)  # h_i <- Q(Delta_i) (l. 11)
        fresh = r.stored if quantize_fresh else deltas
        acc = jnp.sum(jnp.where(meta.mask[:, None], fresh - r.previous, 0.0), axis=0)  # sum (Delta_i - h_i)
        counted = meta.mask if normalize == "arrivals" else r.last  # every arrival, or each client once
        arrivals = jnp.maximum(jnp.sum(counted), 1)
        v = state.cache_mean + acc / arrivals  # v_t = hbar + (1/|S_t|) sum (Delta_i - h_i)   (line 9)
        return CA2FLState(
            x=state.x + hp["server_lr"] * v,  # x_{t+1} = x_t + eta v_t   (line 10)
            cache=r.store,
            cache_mean=state.cache_mean + r.change / n,  # hbar_{t+1} = (1/n) sum_i h_{t+1}^i
        )

    return Algorithm(
        name="ca2fl" if cache in ("float32", "bfloat16") else "mf_ca2fl",
        init=init,
        client=send_result,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        hyperparams={"server_lr": 1.0},
        options={"cache": cache, "cache_rounding": cache_rounding, "quantize_fresh": quantize_fresh,
                 "normalize": normalize, "cache_code": cache_code},
    )


def mf_ca2fl(bits: int = 8, rounding: str = "stochastic", quantize_fresh: bool = False, normalize: str = "arrivals",
             code: str = "minmax") -> Algorithm:
    """MF-CA2FL (memory-friendly CA2FL, digest §2.4): CA2FL with the cache stored in ``bits`` in {8, 4, 2} bits.

    ``rounding``, ``quantize_fresh``, ``normalize`` and ``code`` are :func:`ca2fl`'s ``cache_rounding``,
    ``quantize_fresh``, ``normalize`` and ``cache_code``."""
    if bits not in (8, 4, 2):
        raise ValueError(f"mf_ca2fl bits must be 8, 4 or 2, got {bits!r}")
    if code not in CODES:
        raise ValueError(f"mf_ca2fl code must be one of {list(CODES)}, got {code!r}")
    algorithm = ca2fl(cache=f"int{bits}", cache_rounding=rounding, quantize_fresh=quantize_fresh,
                      normalize=normalize, cache_code=code)
    return algorithm._replace(options={"bits": bits, "rounding": rounding, "quantize_fresh": quantize_fresh,
                                       "normalize": normalize, "code": code})
