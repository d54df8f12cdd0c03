"""Local training: a pure, vmappable function from (start model, client id, key, hyper-parameters) to a result.

A client ``i`` that receives the server model ``x`` runs K optimizer steps on its own data

    y_0 = x,   y_{k+1} = y_k - eta_l * u_k,   u_k = opt(g_k),   g_k = grad F_i(y_k; batch_k) + wd * y_k + mu * (y_k - x)

(``wd``: coupled L2 weight decay as in PyTorch's SGD; ``mu``: the FedProx proximal term; ``opt``: optional heavy-ball
momentum) and returns the model delta ``Delta = y_K - x``. Gradient-based methods (ACE) instead ask for a single
minibatch gradient ``grad F_i(x; batch_0)``.

Minibatches: at the start of each job the client's examples are shuffled once; step ``k`` takes positions
``k*B .. k*B+B-1`` of that order, wrapping around (so ``K*B > n_i`` cycles through the data in the same order); a
client with ``n_i < B`` uses all its examples, each once, at every step.
``batch_size=None`` uses the client's full data at every step (deterministic; used by the exact tests).
With ``epochs`` set, client ``i`` runs ``K_i = ceil(epochs * ceil(n_i / B))`` steps (at most ``steps``; CA2FL's
"2 local epochs at batch 50" is ``K_i = 2 ceil(n_i / 50)``); the static
maximum is unrolled and the surplus steps are masked out.

All hyper-parameters that may differ between replicas (``client_lr``, ``momentum``, ``weight_decay``, ``prox_mu``)
are read from a dict of arrays at call time, so a sweep over them is a ``vmap``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from asyncfl_jax.data.client_data import ClientData
from asyncfl_jax.models.core import Model, cross_entropy_loss

HParams = Mapping[str, jax.Array]
LocalFn = Callable[..., jax.Array]

LOCAL_HPARAMS = {"client_lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "prox_mu": 0.0}
"""Local-training hyper-parameters (sweepable) and their defaults."""


@dataclasses.dataclass(frozen=True)
class LocalConfig:
    """Static settings of local training (they fix the shapes of the compiled program).

    Attributes:
      steps: K, the number of local steps (the maximum when ``epochs`` is set).
      batch_size: B, examples per step; ``None`` for full-batch steps.
      epochs: if set, client i runs ``ceil(epochs * ceil(n_i / B))`` steps, capped at ``steps``.
      use_momentum: keep a momentum buffer (needed when any replica has ``momentum > 0``).
    """

    steps: int = 10
    batch_size: int | None = 32
    epochs: float | None = None
    use_momentum: bool = False

    def validate(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"local.steps must be an integer >= 1, got {self.steps!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"local.batch_size must be an integer >= 1 or null (full batch), got {self.batch_size!r}")
        if self.epochs is not None:
            if self.batch_size is None:
                raise ValueError("local.epochs needs local.batch_size (steps per epoch = ceil(n_i / batch_size))")
            if not self.epochs > 0:
                raise ValueError(f"local.epochs must be > 0, got {self.epochs!r}")


def client_optimizer(hp: HParams, use_momentum: bool) -> optax.GradientTransformation:
    """SGD with coupled weight decay and optional heavy-ball momentum: ``u = m*u + (g + wd*y)``, ``y -= lr*u``."""
    parts = [optax.add_decayed_weights(hp["weight_decay"])]
    if use_momentum:
        parts.append(optax.trace(decay=hp["momentum"], nesterov=False))
    parts.append(optax.scale(-hp["client_lr"]))
    return optax.chain(*parts)


def _batch_loss(model: Model, flat: jax.Array, x: jax.Array, y: jax.Array, w: jax.Array | None) -> jax.Array:
    return cross_entropy_loss(model.flat_apply(flat, x), y, w)


def _shuffled_order(key: jax.Array, count: jax.Array, size: int, needed: int) -> jax.Array:
    """The first ``min(needed, size)`` entries of a random order of the client's ``count`` examples.

    When ``needed >= count`` the first ``count`` entries are a random permutation of ``0..count-1`` (padding comes
    after them); otherwise they are ``needed`` distinct random examples. ``top_k`` of random scores does this without
    a full sort (sorting is slow on XLA:CPU).
    """
    scores = jax.random.uniform(key, (size,))
    scores = jnp.where(jnp.arange(size) < count, scores, -1.0)  # padding comes last
    return jax.lax.top_k(scores, min(needed, size))[1]


def make_local_update(model: Model, config: LocalConfig, output: str = "delta",
                      max_steps: int | None = None) -> LocalFn:
    """Returns ``local(x, client, key, hp, data, steps=None) -> result`` (a flat vector of length d).

    ``data`` (every client's :class:`ClientData`) is an argument rather than a constant of the function, so the
    compiled program does not embed the dataset (which makes compiling slow).

    Args:
      model: the model (its ``flat_apply`` is used).
      config: static local-training settings.
      output: ``"delta"`` for ``y_K - x`` or ``"gradient"`` for one minibatch gradient at ``x``.
      max_steps: when given, ``local`` takes a per-job step count ``steps`` (an int32 array, ``1 <= steps <=
        max_steps``; AsyncFedED's adaptive K) and runs exactly that many steps (a loop with a traced bound) instead
        of ``config.steps``; minibatches are drawn as for a job of ``max_steps`` steps, so a job's first ``k`` steps
        do not depend on its length.
    """
    config.validate()
    if output not in ("delta", "gradient"):
        raise ValueError(f"output must be 'delta' or 'gradient', got {output!r}")
    if max_steps is not None:
        if output != "delta" or config.epochs is not None:
            raise ValueError("a per-job number of local steps needs output='delta' and local.epochs unset")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    batch = config.batch_size
    examples_needed = (1 if output == "gradient" else max(config.steps, max_steps or 0)) * (batch or 0)

    def minibatch(data: ClientData, client: jax.Array, order: jax.Array, count: jax.Array, k: jax.Array):
        size = data.max_size
        if batch is None:  # full batch: every example, padding masked out
            rows = data.indices[client]
            weights = (jnp.arange(size) < count).astype(jnp.float32)
            return data.features[rows], data.labels[rows], weights
        positions = (k * batch + jnp.arange(batch)) % count
        rows = data.indices[client, order[positions]]
        # A client with fewer than B examples uses each once per step (the wrapped-around repeats get weight 0).
        weights = (jnp.arange(batch) < count).astype(jnp.float32)
        return data.features[rows], data.labels[rows], weights

    def local(x: jax.Array, client: jax.Array, key: jax.Array, hp: HParams, data: ClientData,
              steps: jax.Array | None = None) -> jax.Array:
        count = data.counts[client]
        order = _shuffled_order(key, count, data.max_size, examples_needed) if batch is not None else None
        grad_fn = jax.grad(lambda flat, xb, yb, wb: _batch_loss(model, flat, xb, yb, wb))

        if output == "gradient":
            return grad_fn(x, *minibatch(data, client, order, count, jnp.int32(0)))

        opt = client_optimizer(hp, config.use_momentum)

        def one_step(k, carry):
            y, opt_state = carry
            g = grad_fn(y, *minibatch(data, client, order, count, k))
            g = g + hp["prox_mu"] * (y - x)  # FedProx: grad of (mu/2)||y - x||^2
            updates, opt_state = opt.update(g, opt_state, y)
            return y + updates, opt_state

        def masked_step(k, carry):  # per-client step count: the static maximum runs, surplus steps are masked
            steps_per_epoch = -(-count // batch)  # ceil(n_i / B): the last partial batch counts as a step
            steps_i = jnp.clip(jnp.ceil(config.epochs * steps_per_epoch).astype(jnp.int32), 1, config.steps)
            return jax.tree_util.tree_map(lambda n, o: jnp.where(k < steps_i, n, o), one_step(k, carry), carry)

        body = one_step if config.epochs is None else masked_step
        if max_steps is not None:
            if steps is None:
                raise ValueError("this local update takes a per-job number of steps")
            y, _ = jax.lax.fori_loop(0, jnp.clip(steps, 1, max_steps), one_step, (x, opt.init(x)))
            return y - x
        y, _ = jax.lax.fori_loop(0, config.steps, body, (x, opt.init(x)))
        return y - x

    return local


def local_flops_per_job(model: Model, data: ClientData, config: LocalConfig) -> float:
    """FLOPs of one local job (K forward+backward passes on B examples), from XLA's cost analysis."""
    b = config.batch_size or data.max_size
    x = jnp.zeros((b, *data.features.shape[1:]), jnp.float32)
    y = jnp.zeros((b,), jnp.int32)
    grad = jax.jit(jax.grad(lambda flat: _batch_loss(model, flat, x, y, None)))
    cost = grad.lower(model.flat_params).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    flops = float(cost.get("flops", math.nan)) if cost else math.nan
    return flops * config.steps
