"""Each algorithm's usual run: the arrival protocol it runs under, its number of uploads and the evaluation points.

One table, read by every entry point, so that ``asyncfl run --algorithm NAME``, a configuration file whose run omits
``protocol`` (or some of its fields) and ``arrivals``/``steps``, and Python
(:func:`asyncfl_jax.usual_runs.default_schedules` with :func:`~asyncfl_jax.engine.simulate`) run the same experiment:

=================================  ===========================================================  ==========
algorithms                         protocol                                                     uploads
=================================  ===========================================================  ==========
fedbuff, ca2fl, mf_ca2fl, mifa,    concurrent, ``Mc = 20`` in flight, a step every ``M = 10``   3,000
asynfl, asynflc, asynflc_ef        arrivals, boundary refill
fedasync, asgd                     concurrent, ``Mc = 20``, ``M = 1``, immediate refill         3,000
fedavg                             synchronous rounds of 20 sampled clients (FedBuff's ``Mc``)  3,000
ace, aced, delay_adaptive_asgd     all_active: every client always training (ACE paper)         3,000
asyncfeded                         event_clock: all active, durations follow the adaptive K     3,000
area, as_fedavg                    concurrent, every client in flight, ``M = 4``, immediate     12,000
=================================  ===========================================================  ==========

AREA and AS-FedAvg average all ``n`` clients' memories, so an upload moves the model by ``1/n`` of a local update:
3,000 uploads leave them near 0.33-0.46 on the default task, 12,000 learn (docs/defaults.md). A run evaluates the
global model at :data:`EVAL_POINTS` evenly spaced server steps (``ceil(T / 30)`` apart) and at the end.

Merging rule (:meth:`RunDefaults.protocol_with`): the fields a run gives override the algorithm's protocol when the
run keeps its protocol's name (or gives none); a run that names another protocol gets that protocol with the generic
defaults of :class:`~asyncfl_jax.config.ProtocolConfig` for the fields it omits.
"""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any, Mapping

EVAL_POINTS = 30
"""Evaluations per run, evenly spaced (:func:`eval_every_for`), at every entry point."""
DEFAULT_ARRIVALS = 3000
"""Uploads of an algorithm's usual run."""
AREA_DEFAULT_ARRIVALS = 12_000
"""Uploads of AREA's and AS-FedAvg's usual run instead of :data:`DEFAULT_ARRIVALS` (docs/defaults.md)."""
DEFAULT_DELAYS: Mapping[str, Any] = MappingProxyType(
    {"speed": "uniform", "speed_low": 0.5, "speed_high": 5.0, "noise": "half_normal"})
"""The delay model of the default experiment (per-client speed scale U(0.5, 5) times half-normal noise); the
:class:`~asyncfl_jax.timing.delays.DelayModel` fields it omits keep their defaults."""


@dataclasses.dataclass(frozen=True)
class RunDefaults:
    """An algorithm's usual run: ``protocol`` (fields of :class:`~asyncfl_jax.config.ProtocolConfig`; ``concurrency``
    ``None`` means every client) and its length in uploads, ``arrivals``."""

    protocol: Mapping[str, Any]
    arrivals: int = DEFAULT_ARRIVALS

    def protocol_with(self, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The protocol of a run that gives the fields ``given``: the algorithm's protocol with ``given`` over it when
        ``given`` keeps its name (or names none), else ``given`` alone (the generic defaults fill the rest)."""
        given = dict(given or {})
        if given.get("name", self.protocol["name"]) != self.protocol["name"]:
            return given
        return {**self.protocol, **given}


_BUFFERED = MappingProxyType({"name": "concurrent", "concurrency": 20, "buffer_size": 10, "refill": "boundary"})
_ONE_BY_ONE = MappingProxyType({"name": "concurrent", "concurrency": 20, "buffer_size": 1, "refill": "immediate"})
_ALL_ACTIVE = MappingProxyType({"name": "all_active"})

RUN_DEFAULTS: Mapping[str, RunDefaults] = MappingProxyType({
    "fedbuff": RunDefaults(_BUFFERED),
    "ca2fl": RunDefaults(_BUFFERED),
    "mf_ca2fl": RunDefaults(_BUFFERED),
    "mifa": RunDefaults(_BUFFERED),
    "asynfl": RunDefaults(_BUFFERED),
    "asynflc": RunDefaults(_BUFFERED),
    "asynflc_ef": RunDefaults(_BUFFERED),
    "fedasync": RunDefaults(_ONE_BY_ONE),
    "asgd": RunDefaults(_ONE_BY_ONE),
    # rounds of 20 sampled clients: as many training at once as FedBuff's Mc
    "fedavg": RunDefaults(MappingProxyType({"name": "synchronous", "participants": 20})),
    "ace": RunDefaults(_ALL_ACTIVE),  # every client always computing (ACE paper)
    "aced": RunDefaults(_ALL_ACTIVE),
    "delay_adaptive_asgd": RunDefaults(_ALL_ACTIVE),
    "asyncfeded": RunDefaults(MappingProxyType({"name": "event_clock"})),  # durations follow the adaptive K
    # every client always computing, Delta = 4 (AREA paper); concurrency None: every client
    "area": RunDefaults(MappingProxyType({"name": "concurrent", "concurrency": None, "buffer_size": 4,
                                          "refill": "immediate"}), AREA_DEFAULT_ARRIVALS),
    "as_fedavg": RunDefaults(MappingProxyType({"name": "concurrent", "concurrency": None, "buffer_size": 4,
                                               "refill": "immediate"}), AREA_DEFAULT_ARRIVALS),
})
"""Each registered algorithm's usual run (see the module docstring)."""


def run_defaults(algorithm: Any) -> RunDefaults:
    """The usual run of ``algorithm``: a name of :data:`~asyncfl_jax.algorithms.REGISTRY`, or an
    :class:`~asyncfl_jax.algorithms.Algorithm` built by one (found by its ``name``)."""
    name = algorithm if isinstance(algorithm, str) else getattr(algorithm, "name", None)
    if name not in RUN_DEFAULTS:
        raise ValueError(f"no usual run is known for the algorithm {name!r}: give one of {sorted(RUN_DEFAULTS)}, or "
                         "build the schedule with make_schedule(protocol, ...) yourself")
    return RUN_DEFAULTS[name]


RUN_DEPENDENT_HPARAMS: Mapping[str, str] = MappingProxyType({
    "tau_c": "concurrency",  # delay-adaptive ASGD's staleness threshold tau_C = Mc, the clients in flight (ACE digest)
})
"""Hyper-parameters whose default is a property of the run rather than a number: name -> that property (the clients
training at once, ``concurrency``)."""


def run_hparam_defaults(hyperparams: Mapping[str, float], concurrency: int) -> dict[str, float]:
    """An algorithm's hyper-parameter defaults ``hyperparams`` (``Algorithm.hyperparams``) in a run with
    ``concurrency`` clients training at once: those of :data:`RUN_DEPENDENT_HPARAMS` follow the run."""
    run = {"concurrency": float(concurrency)}
    return {k: run[RUN_DEPENDENT_HPARAMS[k]] if k in RUN_DEPENDENT_HPARAMS else v for k, v in hyperparams.items()}


def eval_every_for(num_steps: int, eval_points: int = EVAL_POINTS) -> int:
    """Server steps between two evaluations of a run of ``num_steps`` steps: ``ceil(T / eval_points)``."""
    return max(1, math.ceil(num_steps / eval_points))
