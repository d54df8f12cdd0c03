"""Federated algorithms as pure functions (see :mod:`asyncfl_jax.algorithms.base` for the interface)."""

from __future__ import annotations

from typing import Any, Callable

from asyncfl_jax.algorithms import staleness
from asyncfl_jax.algorithms.base import Algorithm, ServerMeta, ServerState
from asyncfl_jax.algorithms.area import area, as_fedavg
from asyncfl_jax.algorithms.asyncfeded import asyncfeded
from asyncfl_jax.algorithms.buffered import asgd, delay_adaptive_asgd, fedavg, fedbuff
from asyncfl_jax.algorithms.ca2fl import ca2fl, mf_ca2fl
from asyncfl_jax.algorithms.compression import (COMPRESSORS, Compressor, asynfl, asynflc, asynflc_ef, compressed,
                                                error_feedback, make_compressor, message_bits,
                                                with_compression_options)
from asyncfl_jax.algorithms.fedasync import fedasync
from asyncfl_jax.algorithms.memory import ace, aced, mifa
from asyncfl_jax.algorithms.server_opt import (SERVER_OPT_HPARAMS, SERVER_OPTIMIZERS, server_optimizer,
                                               with_server_optimizer)
from asyncfl_jax.algorithms.wrappers import skip_empty_steps

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
    "asynfl": asynfl,
}
# Every constructor also accepts ``compressor`` (a name in COMPRESSORS), the compressor's options, ``error_feedback``
# and ``compression_seed`` (see asyncfl_jax.algorithms.compression); AsynFLC and AsynFLC-EF have their own names.
# AsyncFedED's messages carry the job's start model beside the delta, so it takes no compressor.
REGISTRY = {name: with_compression_options(make) for name, make in REGISTRY.items()}
REGISTRY.update({"asynflc": asynflc, "asynflc_ef": asynflc_ef, "asyncfeded": asyncfeded})
"""Algorithm constructors by name; keyword options are passed through."""


def get_algorithm(name: str, **options: Any) -> Algorithm:
    """Builds an algorithm by name with its static options (e.g. ``get_algorithm("fedasync", staleness="hinge")``).

    Every algorithm also takes the option ``server_optimizer`` (one of :data:`SERVER_OPTIMIZERS`): its server update
    then goes through FedAdam, FedYogi or FedAvgM (:func:`with_server_optimizer`)."""
    if name not in REGISTRY:
        raise ValueError(f"algorithm must be one of {sorted(REGISTRY)}, got {name!r}")
    server_opt = options.pop("server_optimizer", None)
    try:
        algorithm = REGISTRY[name](**options)
    except TypeError as e:
        raise ValueError(f"algorithm {name!r} got invalid options {sorted(options)}: {e}") from None
    if server_opt is None:
        return algorithm
    if server_opt not in SERVER_OPTIMIZERS:
        raise ValueError(f"option server_optimizer must be one of {list(SERVER_OPTIMIZERS)}, got {server_opt!r}")
    return with_server_optimizer(algorithm, server_opt)


__all__ = ["Algorithm", "COMPRESSORS", "Compressor", "REGISTRY", "ServerMeta", "ServerState", "ace", "aced", "area",
           "as_fedavg", "asyncfeded", "asgd", "asynfl", "asynflc", "asynflc_ef", "ca2fl", "compressed", "delay_adaptive_asgd",
           "error_feedback", "fedasync", "fedavg", "fedbuff", "get_algorithm", "make_compressor", "message_bits",
           "mf_ca2fl", "mifa", "SERVER_OPTIMIZERS", "SERVER_OPT_HPARAMS", "server_optimizer", "skip_empty_steps",
           "staleness", "with_server_optimizer"]
