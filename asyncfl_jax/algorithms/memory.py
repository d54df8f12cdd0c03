"""Latest-update memory: ACE, ACED (Chang et al.; ACE digest §2.1-2.4) and MIFA (Gu et al. 2021).

The server remembers the latest message of every client and steps with their mean, so every client counts once per
step however fast or slow it is: the participation-imbalance bias of asynchronous SGD is removed.

ACE (all-client engagement; digest §2.1, Alg. 1). Clients upload one minibatch gradient ``g_j`` at the model they
hold. The cache ``U_i`` starts from an initialization round at ``w^0`` (every client's gradient), then at every
server step with arrivals ``S_t``::

    U_j <- g_j  for j in S_t                       (Alg. 1)
    u_t  = (1/n) sum_{i=1}^n U_i                   (the 1/n mean over ALL clients)
    w_{t+1} = w_t - eta u_t

Two equal ways to compute ``u_t`` (option ``rule``): ``"direct"`` averages the n cached rows (O(n d) per step);
``"incremental"`` (Alg. a.5, eq. a.17) keeps ``u`` and adds ``(g_j - U_j^old) / n`` (O(|S_t| d) per step).

ACED (bounded-delay-aware ACE; digest §2.3, App. D.1 Alg. a.1). It also keeps ``t_i^start``, the version of the model
client ``i`` is computing on (0 for every client after the initialization round), and averages only over the clients
heard from within ``tau_algo`` steps::

    A(t) = { i : t - t_i^start <= tau_algo }        (with the timestamps before this step's resets)
    w_{t+1} = w_t - eta (1/|A(t)|) sum_{i in A(t)} U_i    if A(t) is not empty, else w_{t+1} = w_t (skip)
    t_j^start <- t + 1  for j in S_t                  ("rejoin": the arriving client becomes fresh)

``active="cache_age"`` is the alternative reading (digest §2.3): ``A(t) = {i : t - v_i <= tau_algo}`` with ``v_i`` the
version the cached gradient was computed on (``-1`` for the initialization round's gradients). The masked mean is
O(n d) per step; the cache write is O(|S_t| d).

MIFA (memory-augmented FedAvg; Gu et al. 2021, AREA digest §2.3). The same memory with local-SGD deltas, which point
downhill: ``G_j <- Delta_j`` for the arrivals (``G_i = 0`` before client ``i``'s first report), and
``x_{t+1} = x_t + eta (1/n) sum_i G_i``. With the "synchronous" protocol (sampled participants) this is the original
MIFA for arbitrary participation; asynchronously it is ACE with local steps.

With ``cache="int8"`` (and int4/int2, bfloat16) the cache is stored quantized (ACE-8bit, ACED-8bit; digest §2.4):
clients still send full-precision vectors and the server averages the stored ``Q(U_i)``. ``cache_code="absmax"``
stores the symmetric per-row absmax code instead of the min-max one (ACE digest §8 item 19; see
:mod:`asyncfl_jax.algorithms.cache`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import (Algorithm, HParams, InitRound, ServerMeta, model_of, no_client_state,
                                         send_result)
from asyncfl_jax.algorithms.cache import make_cache, replace_rows

RULES = ("incremental", "direct")
ACTIVE_SETS = ("since_report", "cache_age")


class MemoryState(NamedTuple):
    """Server state of ACE and MIFA.

    Attributes:
      x: global model [d].
      cache: every client's latest message [n, d] (a :class:`~asyncfl_jax.algorithms.cache.ClientCache` store).
      cache_mean: ``(1/n) sum_i`` of the stored rows [d] (``u`` of Alg. a.5).
    """

    x: jax.Array
    cache: object
    cache_mean: jax.Array


class ACEDState(NamedTuple):
    """Server state of ACED.

    Attributes:
      x: global model [d].
      cache: every client's latest gradient ``U_i`` [n, d] (a cache store).
      t_start: int32 [n], ``t_i^start``: the version of the model client ``i`` is computing on.
      cached_version: int32 [n], the version ``U_i`` was computed on (-1: the initialization round).
    """

    x: jax.Array
    cache: object
    t_start: jax.Array
    cached_version: jax.Array


def _check(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _memory_algorithm(name: str, direction: float, rule: str, cache: str, cache_rounding: str, init_round: bool,
                      upload: str, server_lr: float, cache_code: str) -> Algorithm:
    """ACE (``direction = -1``, gradients) and MIFA (``+1``, deltas): ``x <- x + direction * eta * mean_i U_i``."""
    _check("rule", rule, RULES)
    store = make_cache(cache, cache_rounding, cache_code)

    def init(x0: jax.Array, num_clients: int) -> MemoryState:
        return MemoryState(x=x0, cache=store.init(num_clients, x0.shape[0], x0.dtype), cache_mean=jnp.zeros_like(x0))

    def remember(state: MemoryState, messages: jax.Array, meta: ServerMeta) -> MemoryState:
        """``U_j <- g_j`` for the arrivals, and the mean of the cache; the model is unchanged."""
        d = state.x.shape[0]
        n = jax.tree_util.tree_leaves(state.cache)[0].shape[0]
        r = replace_rows(store, state.cache, messages, meta.clients, meta.mask, meta.key)  # U_j <- g_j
        if rule == "direct":
            mean = jnp.mean(store.read_all(r.store, d), axis=0)  # u_t = (1/n) sum_i U_i   (Alg. 1)
        else:
            mean = state.cache_mean + r.change / n  # u <- u + (g_j - U_j^old) / n   (Alg. a.5)
        return MemoryState(x=state.x, cache=r.store, cache_mean=mean)

    def server(state: MemoryState, messages: jax.Array, meta: ServerMeta, hp: HParams) -> MemoryState:
        state = remember(state, messages, meta)
        return state._replace(x=state.x + direction * hp["server_lr"] * state.cache_mean)  # w - eta u_t

    def absorb(state: MemoryState, messages: jax.Array, meta: ServerMeta, hp: HParams) -> MemoryState:
        del hp
        return remember(state, messages, meta)  # the initialization round's groups fill the cache

    return Algorithm(
        name=name,
        init=init,
        client=send_result,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        upload=upload,
        hyperparams={"server_lr": server_lr},
        options={"rule": rule, "cache": cache, "cache_rounding": cache_rounding, "init_round": init_round,
                 "cache_code": cache_code},
        init_round=InitRound(absorb=absorb) if init_round else None,
    )


def ace(rule: str = "incremental", cache: str = "float32", cache_rounding: str = "stochastic",
        init_round: bool = True, cache_code: str = "minmax") -> Algorithm:
    """ACE: a step on every arrival with the 1/n mean of all clients' latest gradients.

    Use it with the "all_active" protocol (every client always computing, one arrival per step). Clients upload one
    minibatch gradient (``local.steps`` is ignored). Hyper-parameter ``server_lr`` (eta; the paper uses
    ``0.2 sqrt(n / T)``).

    Args:
      rule: "incremental" (Alg. a.5, O(d) per arrival) or "direct" (Alg. 1, O(n d)); equal up to float rounding.
      cache: cache storage: "float32", "bfloat16", or "int8"/"int4"/"int2" (``"int8"`` is ACE-8bit).
      cache_rounding: "stochastic" (unbiased, default) or "nearest" for the int caches.
      init_round: start with the initialization round at ``w^0`` (the paper); else the cache starts at zero.
      cache_code: the code of the int caches: "minmax" (per-row min-max, default) or "absmax" (symmetric per-row
        absmax, levels ``-(2^(b-1)-1)..2^(b-1)-1``: the ACE digest's item 19 reading of ACE-8bit).
    """
    return _memory_algorithm("ace", -1.0, rule, cache, cache_rounding, init_round, "gradient", 0.002,  # docs/defaults.md
                             cache_code)


def mifa(rule: str = "incremental", cache: str = "float32", cache_rounding: str = "stochastic",
         init_round: bool = False, cache_code: str = "minmax") -> Algorithm:
    """MIFA: ``x <- x + eta (1/n) sum_i G_i`` with ``G_i`` every client's latest delta (zero before its first report).

    Use it with the "synchronous" protocol with sampled participants (the original setting) or asynchronously.
    Hyper-parameter ``server_lr`` (eta, default 1.0). ``init_round=True`` fills the memory with every client's delta
    at ``x0`` first (and takes that step), instead of starting from zeros. ``cache``, ``cache_rounding`` and
    ``cache_code`` as for :func:`ace`.
    """
    return _memory_algorithm("mifa", 1.0, rule, cache, cache_rounding, init_round, "delta", 1.0, cache_code)


def aced(active: str = "since_report", cache: str = "float32", cache_rounding: str = "stochastic",
         init_round: bool = True, cache_code: str = "minmax") -> Algorithm:
    """ACED: ACE averaged over the clients heard from within ``tau_algo`` steps (Alg. a.1, literally).

    Hyper-parameters: ``server_lr`` (eta) and ``tau_algo`` (10 in the paper's CIFAR-10 dropout study, 50 otherwise).
    With ``tau_algo`` at least the largest staleness of the schedule, ACED equals ACE.

    Args:
      active: "since_report" (Alg. a.1: ``t - t_i^start <= tau_algo``) or "cache_age" (the age of the cached
        gradient, ``t - v_i <= tau_algo``).
      cache, cache_rounding, init_round, cache_code: as for :func:`ace` (``cache="int8"`` is ACED-8bit).
    """
    _check("active", active, ACTIVE_SETS)
    store = make_cache(cache, cache_rounding, cache_code)

    def init(x0: jax.Array, num_clients: int) -> ACEDState:
        return ACEDState(x=x0, cache=store.init(num_clients, x0.shape[0], x0.dtype),
                         t_start=jnp.zeros((num_clients,), jnp.int32),
                         cached_version=jnp.full((num_clients,), -1, jnp.int32))

    def remember(state: ACEDState, grads: jax.Array, meta: ServerMeta) -> tuple[ACEDState, jax.Array]:
        """``U_j <- g_j``, the versions and ``t_j^start <- t + 1`` of the arrivals; also returns the ages before the
        resets. The model is unchanged."""
        n = state.t_start.shape[0]
        t = meta.step  # -1 for the initialization round: every client is in A, and t_start <- 0 afterwards
        r = replace_rows(store, state.cache, grads, meta.clients, meta.mask, meta.key)  # U_j <- g_j
        arriving = jnp.where(meta.mask, meta.clients, n)  # n = dropped by the scatters
        version = t - meta.staleness  # the model version each gradient was computed on
        cached_version = state.cached_version.at[arriving].set(version, mode="drop")
        if active == "since_report":
            age = t - state.t_start  # iterations since client i last reported (timestamps before the resets)
        else:
            age = t - cached_version  # age of the cached gradient
        return ACEDState(
            x=state.x,
            cache=r.store,
            t_start=state.t_start.at[arriving].set(t + 1, mode="drop"),  # t_j^start <- t + 1
            cached_version=cached_version,
        ), age

    def server(state: ACEDState, grads: jax.Array, meta: ServerMeta, hp: HParams) -> ACEDState:
        d = state.x.shape[0]
        state, age = remember(state, grads, meta)
        in_window = (age <= hp["tau_algo"]).astype(jnp.float32)  # A(t)
        n_t = jnp.sum(in_window)
        total = in_window @ store.read_all(state.cache, d)  # sum_{i in A(t)} U_i
        step = jnp.where(n_t > 0, hp["server_lr"] * total / jnp.maximum(n_t, 1.0), 0.0)  # skip when A(t) is empty
        return state._replace(x=state.x - step)

    def absorb(state: ACEDState, grads: jax.Array, meta: ServerMeta, hp: HParams) -> ACEDState:
        del hp
        return remember(state, grads, meta)[0]  # the initialization round's groups fill the cache

    return Algorithm(
        name="aced",
        init=init,
        client=send_result,
        server=server,
        params=model_of,
        init_clients=no_client_state,
        upload="gradient",
        hyperparams={"server_lr": 0.01, "tau_algo": 10.0},  # default chosen on the default task: docs/defaults.md
        options={"active": active, "cache": cache, "cache_rounding": cache_rounding, "init_round": init_round,
                 "cache_code": cache_code},
        init_round=InitRound(absorb=absorb) if init_round else None,
    )
