"""Federated algorithms as pure functions (see :mod:`asyncfl_jax.algorithms.base` for the interface)."""

from __future__ import annotations

from typing import Any, Callable

from asyncfl_jax.algorithms import staleness
from asyncfl_jax.algorithms.base import Algorithm, ServerMeta, ServerState
from asyncfl_jax.algorithms.buffered import asgd, fedavg, fedbuff
from asyncfl_jax.algorithms.ca2fl import ca2fl
from asyncfl_jax.algorithms.fedasync import fedasync

REGISTRY: dict[str, Callable[..., Algorithm]] = {
    "fedavg": fedavg,
    "fedbuff": fedbuff,
    "fedasync": fedasync,
    "asgd": asgd,
    "ca2fl": ca2fl,
}
"""Algorithm constructors by name; keyword options are passed through."""


def get_algorithm(name: str, **options: Any) -> Algorithm:
    """Builds an algorithm by name with its static options (e.g. ``get_algorithm("fedasync", staleness="hinge")``)."""
    if name not in REGISTRY:
        raise ValueError(f"algorithm must be one of {sorted(REGISTRY)}, got {name!r}")
    try:
        return REGISTRY[name](**options)
    except TypeError as e:
        raise ValueError(f"algorithm {name!r} got invalid options {sorted(options)}: {e}") from None


__all__ = ["Algorithm", "REGISTRY", "ServerMeta", "ServerState", "asgd", "ca2fl", "fedasync", "fedavg", "fedbuff",
           "get_algorithm", "staleness"]
