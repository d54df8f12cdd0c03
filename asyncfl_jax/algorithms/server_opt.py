"""Server optimizers (FedOpt; Reddi et al. 2021, "Adaptive Federated Optimization") for any algorithm.

:func:`with_server_optimizer` wraps an algorithm whose server applies a model update. At server step ``t`` it lets
the wrapped server compute its new model ``x'`` from ``x_t`` as usual, takes the update it would apply,
``Delta_t = x' - x_t``, and feeds the pseudo-gradient ``g_t = -Delta_t`` to an optax transformation ``opt``::

    (u_t, s_{t+1}) = opt.update(g_t, s_t, x_t),      x_{t+1} = x_t + u_t

The optimizer state ``s`` is part of the server state, so checkpoints, replicas (vmap) and sharding need nothing
more. The built-in optimizers follow Reddi et al.'s Algorithm 2 (no bias correction; ``tau`` is the adaptivity
``eps`` added outside the square root), with ``m_{-1} = v_{-1} = 0``:

    "adam"     (FedAdam):  m_t = b1 m + (1 - b1) Delta_t,   v_t = b2 v + (1 - b2) Delta_t^2
    "yogi"     (FedYogi):  m_t as FedAdam,                  v_t = v - (1 - b2) Delta_t^2 sign(v - Delta_t^2)
                           x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
    "momentum" (FedAvgM, Hsu et al. 2019):  m_t = beta m + Delta_t,   x_{t+1} = x_t + eta m_t

Their hyper-parameters are ordinary (sweepable, vmapped) hyper-parameters of the run: ``server_opt_lr`` (eta),
``server_opt_beta1``, ``server_opt_beta2``, ``server_opt_eps`` (tau) and ``server_opt_momentum`` (beta); the
transformation is rebuilt from the replica's values inside the compiled step. The wrapped algorithm's own
``server_lr`` still scales ``Delta_t`` (keep it at 1.0 for Reddi et al.'s ``Delta_t`` = the averaged client update).

At a step where nothing arrives the whole step is skipped (the wrapped state and the optimizer state are unchanged,
as :func:`~asyncfl_jax.algorithms.wrappers.skip_empty_steps`), so an adaptive optimizer does not keep moving on its
momentum when no client reported. An initialization round (ACE, ACED) is a server step like the others: its update
goes through the optimizer too.

Refused (:data:`REFUSED`): algorithms that upload models (FedAsync, AS-FedAvg), whose server mixes in or replaces the
model with local models that started from stale server models, so ``x' - x_t`` also holds ``x_{t - tau} - x_t`` (the
server's own progress since the job started) rather than a pseudo-gradient; and AREA, whose server model is by
construction the mean of the clients' memories, ``x = (1/n) sum_i y_i`` (its unbiasedness rests on that invariant,
which a server optimizer would break).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from asyncfl_jax.algorithms.base import Algorithm, HParams, InitRound, JobPolicy, ServerMeta

SERVER_OPTIMIZERS = ("adam", "yogi", "momentum")
SERVER_OPT_HPARAMS: dict[str, dict[str, float]] = {
    "adam": {"server_opt_lr": 0.01, "server_opt_beta1": 0.9, "server_opt_beta2": 0.99, "server_opt_eps": 1e-3},
    "yogi": {"server_opt_lr": 0.01, "server_opt_beta1": 0.9, "server_opt_beta2": 0.99, "server_opt_eps": 1e-3},
    "momentum": {"server_opt_lr": 1.0, "server_opt_momentum": 0.9},
}
"""The hyper-parameters of each built-in server optimizer with their defaults (Reddi et al.: beta1 = 0.9,
beta2 = 0.99, tau = 1e-3; the learning rate is theirs to tune)."""

REFUSED = {
    "fedasync": "its clients upload models and the server mixes them in, so x' - x_t also holds the drift "
                "x_{t-tau} - x_t since the job started, not a pseudo-gradient",
    "as_fedavg": "its server replaces the model by the mean of uploaded local models that started from stale "
                 "models, so x' - x_t also holds the drift since the jobs started, not a pseudo-gradient",
    "area": "its server model is by construction the mean of the clients' memories, x = (1/n) sum_i y_i, "
            "an invariant a server optimizer would break",
}
"""Algorithms :func:`with_server_optimizer` refuses, and why."""

OptimizerFactory = Callable[[HParams], optax.GradientTransformation]


class FedAdamState(NamedTuple):
    """FedAdam/FedYogi moments: ``mu`` (first) and ``nu`` (second), both of the model's shape."""

    mu: Any
    nu: Any


def scale_by_fedadam(b1: Any, b2: Any, tau: Any, yogi: bool = False) -> optax.GradientTransformation:
    """Reddi et al.'s adaptive direction on a pseudo-gradient ``g``: ``m = b1 m + (1 - b1) g``, ``v`` Adam's or
    Yogi's second moment, output ``m / (sqrt(v) + tau)`` (no bias correction). Chain with ``optax.scale(-lr)``."""

    def init(params: Any) -> FedAdamState:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return FedAdamState(mu=zeros, nu=jax.tree_util.tree_map(jnp.zeros_like, params))

    def update(updates: Any, state: FedAdamState, params: Any = None) -> tuple[Any, FedAdamState]:
        del params
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
        if yogi:
            nu = jax.tree_util.tree_map(lambda v, g: v - (1.0 - b2) * g * g * jnp.sign(v - g * g), state.nu, updates)
        else:
            nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1.0 - b2) * g * g, state.nu, updates)
        out = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + tau), mu, nu)
        return out, FedAdamState(mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def server_optimizer(name: str) -> OptimizerFactory:
    """The factory ``hp -> GradientTransformation`` of a built-in server optimizer (see the module docstring)."""
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"server_optimizer must be one of {list(SERVER_OPTIMIZERS)}, got {name!r}")

    def make(hp: HParams) -> optax.GradientTransformation:
        if name == "momentum":
            return optax.sgd(hp["server_opt_lr"], momentum=hp["server_opt_momentum"])  # m = beta m + g; x -= eta m
        direction = scale_by_fedadam(hp["server_opt_beta1"], hp["server_opt_beta2"], hp["server_opt_eps"],
                                     yogi=name == "yogi")
        return optax.chain(direction, optax.scale(-hp["server_opt_lr"]))

    return make


class ServerOptState(NamedTuple):
    """The wrapped algorithm's server state and the server optimizer's state."""

    inner: Any
    opt_state: Any


def _check_model_field(algorithm: Algorithm) -> None:
    """The wrapper writes the new model into the wrapped state's ``x`` field: it must exist and be the model."""
    x0 = jnp.arange(3, dtype=jnp.float32)
    state = algorithm.init(x0, 2)
    fields = getattr(state, "_fields", ())
    if "x" not in fields or not np.array_equal(np.asarray(state.x), np.asarray(algorithm.params(state))):
        raise ValueError(f"with_server_optimizer: {algorithm.name}'s server state has no field 'x' holding the model "
                         "(a NamedTuple with x = params(state) is needed to apply the optimizer's step)")


def with_server_optimizer(algorithm: Algorithm,
                          optimizer: str | optax.GradientTransformation | OptimizerFactory,
                          hyperparams: Mapping[str, float] | None = None) -> Algorithm:
    """``algorithm`` whose server update goes through a server optimizer (see the module docstring).

    Args:
      algorithm: any algorithm whose server applies a model update, with the model in its state's ``x`` field (not
        one of :data:`REFUSED`).
      optimizer: ``"adam"``, ``"yogi"`` or ``"momentum"`` (their hyper-parameters :data:`SERVER_OPT_HPARAMS` are
        added to the algorithm's), an optax ``GradientTransformation`` (fixed), or a factory ``hp ->
        GradientTransformation`` called inside the compiled step with the replica's hyper-parameters (so they can be
        swept). A factory is also called once with the default hyper-parameters to build the optimizer's initial
        state, which must therefore not depend on them (true of optax's optimizers).
      hyperparams: new hyper-parameters (name -> default) a factory reads, added to the algorithm's.
    """
    if algorithm.name in REFUSED:
        raise ValueError(f"a server optimizer cannot be used with {algorithm.name}: {REFUSED[algorithm.name]}")
    if algorithm.upload == "model":
        raise ValueError(f"a server optimizer cannot be used with {algorithm.name}: its clients upload models, so "
                         "x' - x_t is not a pseudo-gradient")
    if "server_optimizer" in algorithm.options:
        raise ValueError(f"{algorithm.name} already has a server optimizer ({algorithm.options['server_optimizer']})")
    extra = dict(hyperparams or {})
    if isinstance(optimizer, str):
        if hyperparams:
            raise ValueError(f"server optimizer {optimizer!r} has its own hyper-parameters "
                             f"{sorted(SERVER_OPT_HPARAMS.get(optimizer, {}))}; hyperparams is for a factory")
        factory, label = server_optimizer(optimizer), optimizer
        extra = dict(SERVER_OPT_HPARAMS[optimizer])
    elif isinstance(optimizer, optax.GradientTransformation):
        factory, label = (lambda hp: optimizer), "custom"
    elif callable(optimizer):
        factory, label = optimizer, "custom"
    else:
        raise ValueError(f"optimizer must be a name in {list(SERVER_OPTIMIZERS)}, an optax GradientTransformation or a "
                         f"function hparams -> GradientTransformation, got {optimizer!r}")
    clash = sorted(set(extra) & set(algorithm.hyperparams))
    if clash:
        raise ValueError(f"server optimizer hyper-parameters {clash} clash with {algorithm.name}'s own")
    _check_model_field(algorithm)
    defaults = {**dict(algorithm.hyperparams), **extra}

    def init(x0: jax.Array, num_clients: int) -> ServerOptState:
        tx = factory({k: jnp.asarray(v, x0.dtype) for k, v in defaults.items()})
        return ServerOptState(inner=algorithm.init(x0, num_clients), opt_state=tx.init(x0))

    def server(state: ServerOptState, messages: Any, meta: ServerMeta, hp: HParams) -> ServerOptState:
        x_t = algorithm.params(state.inner)
        stepped = algorithm.server(state.inner, messages, meta, hp)
        delta = algorithm.params(stepped) - x_t  # the update the wrapped server would apply
        updates, opt_state = factory(hp).update(-delta, state.opt_state, x_t)  # pseudo-gradient -Delta_t
        new = ServerOptState(inner=stepped._replace(x=x_t + updates), opt_state=opt_state)
        any_arrival = jnp.any(meta.mask)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(any_arrival, a, b), new, state)

    def params(state: ServerOptState) -> jax.Array:
        return algorithm.params(state.inner)

    init_round = algorithm.init_round
    if init_round is not None and init_round.absorb is not None:
        absorb = init_round.absorb
        init_round = InitRound(absorb=lambda s, m, meta, hp: s._replace(inner=absorb(s.inner, m, meta, hp)))
    policy = algorithm.jobs
    jobs = JobPolicy(
        hparams=None if policy.hparams is None else (lambda s, hp: policy.hparams(s.inner, hp)),
        steps=None if policy.steps is None else (lambda s, clients, hp: policy.steps(s.inner, clients, hp)),
        max_steps=policy.max_steps)
    return algorithm._replace(init=init, server=server, params=params, init_round=init_round, jobs=jobs,
                              hyperparams=defaults,
                              options={**dict(algorithm.options), "server_optimizer": label})
