"""AsyncFedED (Wang et al. 2022): Euclidean-distance staleness, an adaptive global rate and adaptive local steps.

Every arrival is applied on its own (one server update per result, in arrival order). Client ``i`` trained ``K_i``
local steps from the stale model ``x_{t-tau}`` and uploads ``Delta_i = y_K - x_{t-tau}``; the server computes

    gamma   = ||x_t - x_{t-tau}||_2 / ||Delta_i||_2                      (Eq. 6, Euclidean staleness)
    eta_g   = lambda / (gamma + epsilon)                                 (Eq. 7, adaptive global rate)
    x_{t+1} = x_t + eta_g Delta_i                                        (Eq. 5)
    K_i    <- clip(K_i + floor(kappa (gamma_bar - gamma)), K_min, K_max)  (Eq. 8, adaptive local steps)

and sends ``x_{t+1}`` with the new ``K_i`` back to the client. ``gamma = 0`` when nothing was applied while the client
trained (``tau = 0``). The clip is not in the paper; ``K >= 1`` is needed (FEMNIST's ``kappa = 0.05`` only ever
lowers K, which would reach 0) and ``K_max`` bounds the growth when every client's staleness stays below target
(digest 001, section 2.6). A result with ``||Delta|| < 1e-12`` changes nothing (the rule is undefined for it).

The stale models. The paper keeps every past global model (GMIS) to look up ``x_{t-tau}``; only the models that
clients still training started from are ever read, so here each message carries the model its job started from
(:class:`StaleDelta`): the engine keeps it in the job's in-flight slot, which holds at most one model per job in
flight and frees it when the result is applied (digest 001, section 11, fix 1).

Durations. With a pre-sampled schedule the adaptive K changes the work of each job but not its duration; with the
in-scan event clock (:class:`asyncfl_jax.timing.clock.EventClock`) a job of K steps takes ``K / local.steps`` times the
delay model's compute time, so fast clients (small gamma) get more steps and slow ones fewer, as in the paper.

Options: ``initial_steps`` (K_init, default 10; give ``local.steps`` the same value so that a job of K_init steps
takes the delay model's time), ``max_steps`` (K_max, 50), ``min_steps`` (1), ``adaptive_steps`` (False: the paper's
constant-K ablation, Fig. 4), ``rounding`` (``"floor"`` as the paper, or ``"trunc"``), ``discard_above`` (drop a
result whose gamma exceeds this bound, the theory's Assumption 4 device; ``None``: never, as in the experiments).
Hyper-parameters: ``feded_lambda`` (lambda), ``feded_epsilon`` (epsilon), ``target_staleness`` (gamma_bar),
``kappa``; defaults are the paper's Synthetic(1,1) selection (Table 4).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncfl_jax.algorithms.base import Algorithm, HParams, JobPolicy, ServerMeta, no_client_state

ROUNDINGS = ("floor", "trunc")
TINY_NORM = 1e-12
HPARAMS = {"feded_lambda": 0.5, "feded_epsilon": 5.0, "target_staleness": 3.0, "kappa": 1.0}  # default chosen on the default task: docs/defaults.md


class StaleDelta(NamedTuple):
    """What the server receives for one job: the delta and the model ``x_{t-tau}`` the job started from."""

    delta: jax.Array
    start: jax.Array


class AsyncFedEDState(NamedTuple):
    """Server state: the global model, every client's next number of local steps, and the last staleness each
    client's result had (``nan`` before its first result; for inspection)."""

    x: jax.Array
    steps: jax.Array  # int32 [n]: K_i
    last_gamma: jax.Array  # float32 [n]


def safe_norm(v: jax.Array) -> jax.Array:
    """``||v||_2``, the same value as ``jnp.linalg.norm(v)``, with derivative 0 at ``v = 0`` (``sqrt`` has none
    there: ``jnp.linalg.norm`` gives NaN tangents and cotangents at 0). The double ``where`` keeps the NaN out of
    the unused branch's derivative."""
    squares = jnp.sum(v * v)
    nonzero = squares > 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, squares, 1.0)), 0.0)


def euclidean_staleness(x: jax.Array, start: jax.Array, delta: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(gamma, ||Delta||)`` with ``gamma = ||x - start|| / max(||Delta||, 1e-12)`` (Eq. 6). ``x = start`` (no
    server step while the job trained, ``tau = 0``) is the usual case, so the norms are :func:`safe_norm` (a
    hyper-gradient through the run stays finite)."""
    delta_norm = safe_norm(delta)
    return safe_norm(x - start) / jnp.maximum(delta_norm, TINY_NORM), delta_norm


def next_local_steps(steps: jax.Array, gamma: jax.Array, hp: HParams, min_steps: int, max_steps: int,
                     rounding: str = "floor") -> jax.Array:
    """``clip(K + R(kappa (gamma_bar - gamma)), K_min, K_max)`` with ``R`` floor or truncation (Eq. 8)."""
    change = hp["kappa"] * (hp["target_staleness"] - gamma)
    change = jnp.floor(change) if rounding == "floor" else jnp.trunc(change)
    change = jnp.clip(change, -(max_steps + 1), max_steps + 1)  # no int overflow for huge gamma
    return jnp.clip(steps + change.astype(jnp.int32), min_steps, max_steps)


def asyncfeded(initial_steps: int = 10, max_steps: int = 50, min_steps: int = 1, adaptive_steps: bool = True,
               rounding: str = "floor", discard_above: float | None = None) -> Algorithm:
    """AsyncFedED (see the module docstring for the rules and the options)."""
    for name, value in (("initial_steps", initial_steps), ("max_steps", max_steps), ("min_steps", min_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"asyncfeded: {name} must be an integer >= 1, got {value!r}")
    if not min_steps <= initial_steps <= max_steps:
        raise ValueError(f"asyncfeded: need min_steps <= initial_steps <= max_steps, got {min_steps}, "
                         f"{initial_steps}, {max_steps}")
    if not isinstance(adaptive_steps, bool):
        raise ValueError(f"asyncfeded: adaptive_steps must be true or false, got {adaptive_steps!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"asyncfeded: rounding must be one of {list(ROUNDINGS)}, got {rounding!r}")
    if discard_above is not None and (isinstance(discard_above, bool) or not isinstance(discard_above, (int, float))
                                      or math.isnan(discard_above) or discard_above <= 0):
        raise ValueError(f"asyncfeded: discard_above must be a number > 0 or None, got {discard_above!r}")
    bound = math.inf if discard_above is None else float(discard_above)

    def init(x0: jax.Array, num_clients: int) -> AsyncFedEDState:
        return AsyncFedEDState(x=x0, steps=jnp.full((num_clients,), initial_steps, jnp.int32),
                               last_gamma=jnp.full((num_clients,), jnp.nan, x0.dtype))

    def client(x_start: jax.Array, delta: jax.Array, client_state, hp: HParams):
        del hp
        return StaleDelta(delta=delta, start=x_start), client_state

    def server(state: AsyncFedEDState, messages: StaleDelta, meta: ServerMeta, hp: HParams) -> AsyncFedEDState:
        def apply_one(s: AsyncFedEDState, item):
            message, client, real = item
            gamma, delta_norm = euclidean_staleness(s.x, message.start, message.delta)  # Eq. 6
            # (written so that a NaN delta is applied, not skipped: divergence must show in x)
            used = real & ~(delta_norm < TINY_NORM) & ~(gamma > bound)
            eta_g = hp["feded_lambda"] / (gamma + hp["feded_epsilon"])  # Eq. 7
            x = jnp.where(used, s.x + eta_g * message.delta, s.x)  # Eq. 5
            k = s.steps[client]
            if adaptive_steps:
                k = jnp.where(used, next_local_steps(k, gamma, hp, min_steps, max_steps, rounding), k)  # Eq. 8
            row = jnp.where(real, client, 0)
            steps = s.steps.at[row].set(jnp.where(real, k, s.steps[row]))
            last = s.last_gamma.at[row].set(jnp.where(real & (delta_norm >= TINY_NORM), gamma, s.last_gamma[row]))
            return AsyncFedEDState(x=x, steps=steps, last_gamma=last), None

        state, _ = jax.lax.scan(apply_one, state, (messages, meta.clients, meta.mask))
        return state

    def job_steps(state: AsyncFedEDState, clients: jax.Array, hp: HParams) -> jax.Array:
        del hp
        return state.steps[clients]

    return Algorithm(
        name="asyncfeded",
        init=init,
        client=client,
        server=server,
        params=lambda state: state.x,
        init_clients=no_client_state,
        hyperparams=dict(HPARAMS),
        options={"initial_steps": initial_steps, "max_steps": max_steps, "min_steps": min_steps,
                 "adaptive_steps": adaptive_steps, "rounding": rounding, "discard_above": discard_above},
        jobs=JobPolicy(steps=job_steps, max_steps=max_steps),
    )
