"""Federated algorithms as pure functions (see :mod:`asyncfl_jax.algorithms.base` for the interface)."""

from __future__ import annotations

from typing import Any, Callable

from asyncfl_jax.algorithms import staleness
from asyncfl_jax.algorithms.base import Algorithm, ServerMeta, ServerState
from asyncfl_jax.algorithms.area import area, as_fedavg
from asyncfl_jax.algorithms.buffered import asgd, delay_adaptive_asgd, fedavg, fedbuff
from asyncfl_jax.algorithms.ca2fl import ca2fl, mf_ca2fl
from asyncfl_jax.algorithms.fedasync import fedasync
from asyncfl_jax.algorithms.memory import ace, aced, mifa

REGISTRY: dict[str, Callable[..., Algorithm]] = {
    "fedavg": fedavg,
    "fedbuff": fedbuff,
    "fedasync": fedasync,
    "asgd": asgd,
    "delay_adaptive_asgd": delay_adaptive_asgd,
    "ca2fl": ca2fl,
    "mf_ca2fl": mf_ca2fl,
    "ace": ace,
    "aced": aced,
    "mifa": mifa,
    "area": area,
    "as_fedavg": as_fedavg,
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


__all__ = ["Algorithm", "REGISTRY", "ServerMeta", "ServerState", "ace", "aced", "area", "as_fedavg", "asgd", "ca2fl",
           "delay_adaptive_asgd", "fedasync", "fedavg", "fedbuff", "get_algorithm", "mf_ca2fl", "mifa", "staleness"]
