"""Replicas and hyper-parameters: a sweep is the cartesian product of seeds and swept values, run as one vmap axis."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.algorithms.defaults import run_hparam_defaults
from asyncfl_jax.client import LOCAL_HPARAMS, spelling_hint


def default_hparams(algorithm: Algorithm) -> dict[str, float]:
    """Every hyper-parameter the run reads (local training + the algorithm's), with its default."""
    return {**LOCAL_HPARAMS, **dict(algorithm.hyperparams)}


def resolve_hparams(algorithm: Algorithm, overrides: Mapping[str, Any] | None, *,
                    local: Mapping[str, float] | None = None, concurrency: int | None = None) -> dict[str, Any]:
    """The hyper-parameters of a run: the one place where their defaults are merged, for ``asyncfl run``, a
    configuration file (:func:`~asyncfl_jax.config.resolve`, :func:`~asyncfl_jax.experiment.run_experiment`) and
    :func:`~asyncfl_jax.engine.simulate` alike. Later layers win:

    1. local training's defaults (:data:`~asyncfl_jax.client.LOCAL_HPARAMS`), with ``local`` over them (a
       configuration's ``local`` section: ``client_lr``, ``momentum``, ``weight_decay``);
    2. the algorithm's own defaults (``Algorithm.hyperparams``); given the run's ``concurrency`` (the clients training
       at once under its protocol, :func:`~asyncfl_jax.config.run_concurrency`), those that follow the run take it
       (:func:`~asyncfl_jax.algorithms.defaults.run_hparam_defaults`: delay-adaptive ASGD's ``tau_c``); without it
       (Python's ``simulate``, which sees schedules, not a protocol) the algorithm's numbers;
    3. ``overrides``: the run's explicit values (a list is a sweep).

    A name of ``overrides`` the run does not read is an error that suggests the closest valid one (as is a name of
    ``local`` that is not a local-training hyper-parameter)."""
    for name in local or {}:
        if name not in LOCAL_HPARAMS:
            raise ValueError(f"{name!r} is not a local-training hyper-parameter (known: {sorted(LOCAL_HPARAMS)})")
    own = dict(algorithm.hyperparams)
    if concurrency is not None:
        own = run_hparam_defaults(own, concurrency)
    known = {**LOCAL_HPARAMS, **dict(local or {}), **own}
    for name in overrides or {}:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = spelling_hint(name) or (f"; did you mean {close[0]!r}?" if close else "")
            raise ValueError(
                f"hyper-parameter {name!r} is not used by {algorithm.name} (known: {sorted(known)}){hint}"
            )
    return {**known, **dict(overrides or {})}


MAX_SEED = 2**32 - 1
"""The largest seed: JAX's ``PRNGKey`` and numpy's generators take 32-bit seeds here."""

NONNEGATIVE_HPARAMS = ("client_lr", "server_lr", "lr_c", "lr_d", "server_opt_lr", "weight_decay", "prox_mu")
"""Hyper-parameters that a negative value would turn into something else (a step against the gradient, a negative
penalty): refused by :func:`check_hparam_value`. The command line's ranges are stricter (``config.HPARAM_RANGES``)."""


def check_seeds(seeds: Any) -> list[int]:
    """``seeds`` as a list of distinct integers in ``[0, 2^32 - 1]``; else a ValueError naming ``seeds`` and the
    value at fault (a fractional, negative, too large or repeated seed, or an empty list)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (Sequence, np.ndarray)):
        raise ValueError(f"seeds must be a sequence of integers, got {seeds!r}")
    out = []
    for seed in seeds:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seeds must be integers in [0, {MAX_SEED}], got {seed!r} in {list(seeds)!r}")
        if not 0 <= int(seed) <= MAX_SEED:
            raise ValueError(f"seeds must be integers in [0, {MAX_SEED}], got {int(seed)}")
        out.append(int(seed))
    if not out:
        raise ValueError("seeds must not be empty")
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must not repeat a seed (a repeated seed is the same replica twice), got {out}")
    return out


def check_hparam_value(name: str, value: Any) -> float:
    """``value`` of hyper-parameter ``name`` as a float: a finite real number, >= 0 for
    :data:`NONNEGATIVE_HPARAMS`; else a ValueError naming it."""
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything that is not array-like
        array = np.asarray(None)
    if array.ndim != 0 or array.dtype.kind not in "iuf":  # bool, complex, strings, objects: refused
        raise ValueError(f"hparams[{name!r}] must be a real number (or a list of them), got {value!r}")
    value = float(array)
    if not np.isfinite(value):
        raise ValueError(f"hparams[{name!r}] must be finite, got {value!r}")
    if name in NONNEGATIVE_HPARAMS and value < 0:
        raise ValueError(f"hparams[{name!r}] must be >= 0 (a negative value turns the rule around), got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Replica:
    """One simulated run of a sweep: a training seed and scalar hyper-parameters (and, for an explicit replica,
    its label: :mod:`~asyncfl_jax.engine.replicas`)."""

    seed: int
    hparams: dict[str, float]
    label: dict[str, Any] | None = None


def make_replicas(algorithm: Algorithm, seeds: Sequence[int], hparams: Mapping[str, Any] | None = None) -> list[Replica]:
    """The cartesian product of ``seeds`` and every hyper-parameter given as a list (a sweep); scalars are shared.

    Example: ``seeds=[0, 1]``, ``hparams={"client_lr": [0.01, 0.1], "server_lr": 1.0}`` gives 4 replicas.
    """
    seeds = check_seeds(seeds)
    resolved = resolve_hparams(algorithm, hparams)
    swept = {k: list(v) for k, v in resolved.items() if isinstance(v, (list, tuple, np.ndarray))}
    for k, v in swept.items():
        if len(v) == 0:
            raise ValueError(f"hyper-parameter {k!r} has an empty list of values")
    for k, v in resolved.items():
        for value in (swept[k] if k in swept else [v]):
            check_hparam_value(k, value)
    fixed = {k: float(v) for k, v in resolved.items() if k not in swept}
    replicas = []
    for seed in seeds:
        for combo in itertools.product(*swept.values()):
            replicas.append(Replica(seed=int(seed), hparams={**fixed, **{k: float(c) for k, c in zip(swept, combo)}}))
    return replicas


def stack_hparams(replicas: Sequence[Replica], dtype: Any = jnp.float32) -> dict[str, jax.Array]:
    """The replicas' hyper-parameters as ``dtype`` arrays (float32; float64 in a float64 run) with a leading replica
    axis."""
    return {k: jnp.asarray([r.hparams[k] for r in replicas], dtype) for k in replicas[0].hparams}


def replica_keys(replicas: Sequence[Replica]) -> jax.Array:
    """``PRNGKey(seed)`` of every replica, stacked."""
    return jnp.stack([jax.random.PRNGKey(r.seed) for r in replicas])
