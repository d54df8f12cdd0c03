"""Explicit replicas: any grid of settings as one program.

The shorthand of :func:`~asyncfl_jax.engine.simulate.simulate` is ``seeds`` x hyper-parameter points, every replica
over one shared schedule or the schedule of its seed. A :class:`ReplicaSpec` list says instead, replica by replica,
which schedule (or event clock) it goes through, its training seed, its hyper-parameters and a label naming its
setting::

    replicas = [afl.ReplicaSpec(schedules[(model, s)], seed=s, label={"delays": model})
                for model in ("uniform", "lognormal") for s in (0, 1)]
    history = afl.simulate(task, afl.fedbuff(), replicas=replicas)
    history.to_dataframe()  # one column "delays" beside "seed"

So one compiled program runs several delay models, protocols (schedules of other widths), suspension probabilities
or hyper-parameter settings side by side; each replica's result is the one it gets alone (to float rounding: the
engine pads the schedules to common buffer and dispatch widths, see :func:`pad_replica_schedules`).

What must agree between the replicas (a clear error names the first replica and field that does not): the kind of
timing (all schedules or all event clocks), the number of server steps, the number of clients (the task's) and the
names of the label. The data partition is the task's, shared by every replica (the data are not a replica axis).

A replica's label is a small dict of plain values (``{"delays": "lognormal", "P": 0.5}``) or a string (the column
``setting``); it travels with the replica into :class:`~asyncfl_jax.results.History` (``History.labels``), its
``rows()`` / ``to_dataframe()`` / ``metrics.csv`` (one column per label key), its hyper-parameter points (replicas
are grouped by label and hyper-parameters, so the point statistics and the plotted curves are per setting) and
``summary.json``.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping, Sequence

from asyncfl_jax.algorithms.base import Algorithm
from asyncfl_jax.engine.hparams import MAX_SEED, Replica, check_hparam_value, resolve_hparams
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.schedule import Schedule

STRING_LABEL_KEY = "setting"
"""The column of a label given as a string."""

RESERVED_LABEL_KEYS = ("run", "algorithm", "replica", "seed", "point", "step", "time", "uploads", "local_steps",
                       "diverged_at", "test_accuracy", "test_loss", "train_loss")
"""Names a label key may not take: the columns ``History.rows()`` writes itself (and the usual metrics)."""


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """One replica of an explicit grid (see the module docstring).

    Attributes:
      schedule: its :class:`~asyncfl_jax.timing.schedule.Schedule`, or an
        :class:`~asyncfl_jax.timing.clock.EventClock` for the in-scan event clock.
      seed: its training seed (``PRNGKey(seed)``: client sampling, minibatches, the algorithm's randomness).
      hparams: its hyper-parameters (scalars), over the algorithm's defaults.
      label: what names its setting: a dict of plain values (str, int, float, bool) or a string (key ``setting``);
        None: no label.
    """

    schedule: Any
    seed: int = 0
    hparams: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    label: str | Mapping[str, Any] | None = None


def label_dict(label: Any, where: str) -> dict[str, Any]:
    """A replica's label as a dict: ``{}`` for None, ``{"setting": label}`` for a string, a copy of a dict whose
    keys are strings and whose values are str, int, float or bool; anything else is a ValueError naming ``where``."""
    if label is None:
        return {}
    if isinstance(label, str):
        return {STRING_LABEL_KEY: label}
    if not isinstance(label, Mapping):
        raise ValueError(f"{where}.label must be a string, a dict of plain values or None, got {label!r}")
    out = {}
    for key, value in label.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}.label keys must be non-empty strings, got {key!r}")
        if key in RESERVED_LABEL_KEYS:
            raise ValueError(f"{where}.label key {key!r} is a column History.rows() writes itself; use another name "
                             f"(reserved: {', '.join(RESERVED_LABEL_KEYS)})")
        if isinstance(value, bool) or isinstance(value, str):
            out[key] = value
        elif isinstance(value, numbers.Integral):
            out[key] = int(value)
        elif isinstance(value, numbers.Real):
            out[key] = float(value)
        else:
            raise ValueError(f"{where}.label[{key!r}] must be a str, int, float or bool, got {value!r}")
    return out


def check_specs(specs: Any) -> list[ReplicaSpec]:
    """``specs`` as a non-empty list of :class:`ReplicaSpec` with valid seeds and labels of the same keys; else a
    ValueError naming the first replica (``replicas[i]``) and field at fault."""
    if isinstance(specs, (str, bytes, ReplicaSpec)) or not isinstance(specs, Sequence):
        raise ValueError(f"replicas must be a list of ReplicaSpec, got {type(specs).__name__}")
    specs = list(specs)
    if not specs:
        raise ValueError("replicas must not be empty")
    keys = None
    for i, spec in enumerate(specs):
        where = f"replicas[{i}]"
        if not isinstance(spec, ReplicaSpec):
            raise ValueError(f"{where} must be a ReplicaSpec, got {type(spec).__name__}")
        if not isinstance(spec.schedule, (Schedule, EventClock)):
            raise ValueError(f"{where}.schedule must be a Schedule or an EventClock, got "
                             f"{type(spec.schedule).__name__}")
        seed = spec.seed
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
            raise ValueError(f"{where}.seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
        if not isinstance(spec.hparams, Mapping):
            raise ValueError(f"{where}.hparams must be a dict of scalars, got {type(spec.hparams).__name__}")
        label = label_dict(spec.label, where)
        if keys is None:
            keys = list(label)
        elif sorted(label) != sorted(keys):
            raise ValueError(f"{where}.label has the keys {sorted(label)}, replicas[0].label has {sorted(keys)}: "
                             "every replica's label must name the same things (its columns in the results)")
    return specs


def spec_replicas(algorithm: Algorithm, specs: Sequence[ReplicaSpec]) -> list[Replica]:
    """The engine's replicas of ``specs``: seed, every hyper-parameter (the algorithm's defaults updated with the
    replica's own; a list of values is refused: an explicit replica has one value each) and label."""
    out = []
    for i, spec in enumerate(specs):
        resolved = resolve_hparams(algorithm, spec.hparams)
        values = {}
        for name, value in resolved.items():
            if isinstance(value, (list, tuple)) or getattr(value, "ndim", 0):
                raise ValueError(f"replicas[{i}].hparams[{name!r}] is a list ({value!r}): an explicit replica has one "
                                 "value per hyper-parameter; give one ReplicaSpec per value")
            values[name] = check_hparam_value(name, value)
        out.append(Replica(seed=int(spec.seed), hparams=values,
                           label=label_dict(spec.label, f"replicas[{i}]") or None))
    for i, replica in enumerate(out):
        clash = sorted(set(replica.label or {}) & set(replica.hparams))
        if clash:
            raise ValueError(f"replicas[{i}].label key {clash[0]!r} is also a hyper-parameter (a column of its own in "
                             "the results); use another name")
    return out


def pad_replica_schedules(items: Sequence[Any]) -> list[Any]:
    """The replicas' schedules padded to one buffer width and one dispatch width (``Schedule.pad``: empty entries,
    read as no arrival / no dispatch, so each replica runs as it does alone), after checking that they can share one
    program: all schedules or all event clocks, the same number of server steps and of clients. Event clocks are
    returned as they are (their tables have the task's shapes). A ValueError names the first replica at fault."""
    first = items[0]
    kind = type(first)
    for i, item in enumerate(items):
        if type(item) is not kind:
            raise ValueError(f"replicas[{i}].schedule is a {type(item).__name__}, replicas[0].schedule a "
                             f"{kind.__name__}: the replicas of one program are all schedules or all event clocks")
        for field in ("num_steps", "num_clients"):
            if getattr(item, field) != getattr(first, field):
                raise ValueError(f"replicas[{i}].schedule has {field} = {getattr(item, field)}, replicas[0].schedule "
                                 f"has {getattr(first, field)}: the replicas of one program must agree on it "
                                 + ("(one scan of server steps; truncate the longer schedules)"
                                    if field == "num_steps" else "(the task's clients)"))
    if kind is EventClock:
        return list(items)
    buffer_width = max(s.buffer_width for s in items)
    dispatch_width = max(s.dispatch_width for s in items)
    padded: dict[int, Schedule] = {}  # a schedule shared by several replicas stays one object (and one input)
    for s in items:
        if id(s) not in padded:
            padded[id(s)] = s.pad(buffer_width=buffer_width, dispatch_width=dispatch_width)
    return [padded[id(s)] for s in items]


class PerReplica(list):
    """The timing of every replica, one entry each in the replicas' order (from explicit :class:`ReplicaSpec`
    replicas): :func:`~asyncfl_jax.engine.timelines.make_timeline` takes it as it is, with no matching by seed."""


def explicit_run_inputs(algorithm: Algorithm, specs: Any) -> tuple[PerReplica, list[Replica]]:
    """The per-replica timing (padded) and the engine replicas of explicit ``specs``, checked (nothing compiled)."""
    specs = check_specs(specs)
    replicas = spec_replicas(algorithm, specs)
    return PerReplica(pad_replica_schedules([s.schedule for s in specs])), replicas


__all__ = ["PerReplica", "ReplicaSpec", "check_specs", "explicit_run_inputs", "label_dict", "pad_replica_schedules",
           "spec_replicas"]
