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
from asyncfl_jax.client import LOCAL_HPARAMS


def default_hparams(algorithm: Algorithm) -> dict[str, float]:
    """Every hyper-parameter the run reads (local training + the algorithm's), with its default."""
    return {**LOCAL_HPARAMS, **dict(algorithm.hyperparams)}


def resolve_hparams(algorithm: Algorithm, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults updated with ``overrides``; an unknown name is an error that suggests the closest valid one."""
    known = default_hparams(algorithm)
    for name in overrides or {}:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"hyper-parameter {name!r} is not used by {algorithm.name} (known: {sorted(known)}){hint}"
            )
    return {**known, **dict(overrides or {})}


@dataclasses.dataclass(frozen=True)
class Replica:
    """One simulated run of a sweep: a training seed and scalar hyper-parameters."""

    seed: int
    hparams: dict[str, float]


def make_replicas(algorithm: Algorithm, seeds: Sequence[int], hparams: Mapping[str, Any] | None = None) -> list[Replica]:
    """The cartesian product of ``seeds`` and every hyper-parameter given as a list (a sweep); scalars are shared.

    Example: ``seeds=[0, 1]``, ``hparams={"client_lr": [0.01, 0.1], "server_lr": 1.0}`` gives 4 replicas.
    """
    if len(seeds) == 0:
        raise ValueError("seeds must not be empty")
    resolved = resolve_hparams(algorithm, hparams)
    swept = {k: list(v) for k, v in resolved.items() if isinstance(v, (list, tuple, np.ndarray))}
    for k, v in swept.items():
        if len(v) == 0:
            raise ValueError(f"hyper-parameter {k!r} has an empty list of values")
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
