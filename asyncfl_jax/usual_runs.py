"""The schedules of an algorithm's usual run from Python: the same as ``asyncfl run --algorithm NAME`` builds.

The table of usual runs (protocol, uploads, evaluation points) lives with the algorithms
(:mod:`asyncfl_jax.algorithms.defaults`); this module builds schedules from it through the configuration and the
experiment's own schedule builder, so that Python and the command line cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from asyncfl_jax.algorithms.defaults import DEFAULT_DELAYS, run_defaults
from asyncfl_jax.config import DataConfig, ExperimentConfig, validate
from asyncfl_jax.experiment import build_schedules


def default_schedules(algorithm: Any, num_clients: int, seeds: Sequence[int] = (0,), delays: Any = None,
                      arrivals: int | None = None, steps: int | None = None,
                      protocol: Mapping[str, Any] | None = None) -> list[Any]:
    """One schedule per seed (timing seed ``s`` for training seed ``s``, as ``asyncfl run`` does) under the
    algorithm's usual protocol and length, for :func:`~asyncfl_jax.engine.simulate` with the same ``seeds``.

    Args:
      algorithm: a registered name or an :class:`~asyncfl_jax.algorithms.Algorithm` built by one.
      num_clients: ``n``.
      seeds: the training seeds the schedules are for.
      delays: a :class:`~asyncfl_jax.timing.delays.DelayModel` or its dict form (default
        :data:`~asyncfl_jax.algorithms.defaults.DEFAULT_DELAYS`, the command line's).
      arrivals, steps: the run's length in uploads or in server steps (at most one; default: the algorithm's
        uploads).
      protocol: protocol fields over the algorithm's (:meth:`RunDefaults.protocol_with`), e.g.
        ``{"concurrency": 50}``.

    Returns the schedules (an :class:`~asyncfl_jax.timing.clock.EventClock` each for AsyncFedED's event clock),
    padded to common widths, exactly as ``asyncfl run`` builds them.
    """
    if arrivals is not None and steps is not None:
        raise ValueError("give the run's length as arrivals or as steps, not both")
    if delays is None:
        delays = dict(DEFAULT_DELAYS)
    elif not isinstance(delays, Mapping):
        delays = dataclasses.asdict(delays)
    name = algorithm if isinstance(algorithm, str) else algorithm.name
    raw = {"algorithm": name, "protocol": run_defaults(name).protocol_with(protocol)}
    if steps is not None:
        raw["steps"] = steps
    if arrivals is not None:
        raw["arrivals"] = arrivals
    cfg = ExperimentConfig.from_dict({"data": dataclasses.asdict(DataConfig(num_clients=num_clients)),
                                      "delays": dict(delays), "runs": [raw], "seeds": list(seeds)})
    validate(cfg, check_files=False)  # a ConfigError (a ValueError) naming the option, the value and what is allowed
    return build_schedules(cfg, cfg.runs[0])


def usual_hparams(algorithm: Any, num_clients: int, hparams: Mapping[str, Any] | None = None,
                  protocol: Mapping[str, Any] | None = None,
                  local: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The hyper-parameters ``asyncfl run`` gives the algorithm's usual run (for ``simulate(..., hparams=)`` with
    :func:`default_schedules`' schedules): local training's (``local``: ``client_lr``, ``momentum``,
    ``weight_decay``, what ``--lr`` / a configuration's ``local`` section set) < the algorithm's for the run's
    concurrency (delay-adaptive ASGD's ``tau_c`` = the clients training at once) < ``hparams``, merged by
    :func:`~asyncfl_jax.engine.hparams.resolve_hparams` as every entry point merges them. ``protocol``: protocol
    fields over the algorithm's, as for :func:`default_schedules`.

    ``simulate(hparams=...)`` alone keeps the algorithm's numbers (``tau_c`` = 10), since schedules carry no
    protocol; this function gives the command line's."""
    from asyncfl_jax.algorithms import get_algorithm
    from asyncfl_jax.config import run_concurrency
    from asyncfl_jax.engine.hparams import resolve_hparams

    name = algorithm if isinstance(algorithm, str) else algorithm.name
    raw = {"algorithm": name, "protocol": run_defaults(name).protocol_with(protocol)}
    cfg = ExperimentConfig.from_dict({"data": dataclasses.asdict(DataConfig(num_clients=num_clients)),
                                      "runs": [raw]})
    validate(cfg, check_files=False)
    built = get_algorithm(name) if isinstance(algorithm, str) else algorithm
    return resolve_hparams(built, hparams, local=local, concurrency=run_concurrency(cfg.runs[0], num_clients))
