"""The engine's options: one value, each option written once with its rule, its command-line help and its part of a
checkpoint's identity.

:class:`EngineOptions` holds how a run is laid out and recorded, never what it computes: the placement over devices
(``shard_jobs``, ``shard_replicas``, ``shard_clients``), lookahead batching, the replica grouping, the job executor,
the float precision and the trajectory. Every entry point reads the options from here:

* Python: ``simulate(..., lookahead=4)`` and ``prepare_run(...)`` take them as keywords
  (:meth:`EngineOptions.from_keywords`);
* a configuration file: they are top-level keys (:class:`~asyncfl_jax.config.ExperimentConfig` inherits these
  fields, so ``--print-config`` writes them and ``config.validate`` applies the same rules);
* the command line: one flag each (``--lookahead``, ``--replica-batch``, ...), made from :func:`add_flags`;
* a checkpoint's identity: :meth:`EngineOptions.identity` (the options that change a run's numbers or its carry).

An option is a field made by :func:`option`: its default, its rule (a function of the value that returns the value
or raises :class:`OptionError` with what is allowed, written in JSON words: ``true``, ``false``, ``null``), its flag's
help and, when it enters a checkpoint's identity, how. Rules that involve two options (:data:`COMBINATIONS`) are
written here too. Adding an option is then a field here and its use in the engine module that implements it: the
modules it used to be threaded through (the command line, the configuration, the experiment driver, ``simulate``,
the memory preflight, the checkpoint identity) name no option (``tests/test_engine_options.py`` checks it).

Error dialects: the Python API raises :class:`OptionError` (a ``ValueError`` and a ``TypeError``) worded
``"lookahead must be an integer >= 1 (1: no lookahead batching), got 0"``; a configuration or the command line raises
``ConfigError("invalid option lookahead = 0: must be an integer >= 1 (1: no lookahead batching)")``
(:meth:`OptionError.config_message`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Callable, Mapping

import numpy as np

from asyncfl_jax.engine.placement import Placement, make_placement, placement_conflict
from asyncfl_jax.precision import PRECISIONS


class OptionError(ValueError, TypeError):
    """An engine option refused by its rule: ``name``, the ``value`` given and what is ``allowed`` (JSON words).

    ``str(error)`` is the Python API's wording (``True``/``False``/``None``); :meth:`config_message` the
    configuration's (``invalid option NAME = VALUE: ...``). Both a ``ValueError`` and a ``TypeError``, as the checks
    it replaces raised either."""

    def __init__(self, name: str, value: Any, allowed: str, combination: bool = False) -> None:
        self.name, self.value, self.allowed, self.combination = name, value, allowed, combination
        super().__init__(self.python_message())

    def python_message(self) -> str:
        text = python_words(self.allowed)
        if self.combination:
            return f"{self.name} {text}"
        return f"{self.name} {text}, got {self.value!r}"

    def config_message(self) -> str:
        return f"invalid option {self.name} = {self.value!r}: {self.allowed}"


def python_words(text: str) -> str:
    """``text`` with JSON's ``true``, ``false`` and ``null`` written as Python's ``True``, ``False`` and ``None``."""
    words = {"true": "True", "false": "False", "null": "None"}
    return re.sub(r"\b(true|false|null)\b", lambda m: words[m.group(1)], text)


# ---------------------------------------------------------------------------------------------------- rules
def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def flag_rule(name: str, value: Any) -> bool:
    """A switch: ``True`` or ``False``."""
    if not isinstance(value, (bool, np.bool_)):
        raise OptionError(name, value, "must be true or false")
    return bool(value)


def lookahead_rule(name: str, value: Any) -> int:
    """The lookahead window ``L``: an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise OptionError(name, value, "must be an integer >= 1 (1: no lookahead batching)")
    return int(value)


def replica_batch_rule(name: str, value: Any) -> int | None:
    """Replicas per group: None (the backend's default) or an integer >= 1."""
    if value is not None and (not _is_int(value) or value < 1):
        raise OptionError(name, value, "must be null (the backend's default grouping) or an integer >= 1")
    return None if value is None else int(value)


def job_executor_rule(name: str, value: Any) -> Any:
    """An executor's name (``auto``, ``vmap``, ``unrolled``, ``grouped:G``) or an executor object."""
    from asyncfl_jax.engine.executors import EXECUTOR_NAMES, parse_job_executor

    try:
        parse_job_executor(value)
    except (ValueError, TypeError):
        raise OptionError(name, value, f"must be one of {list(EXECUTOR_NAMES)} (G an integer >= 1)") from None
    return value


def precision_rule(name: str, value: Any) -> str:
    """``"float32"`` or ``"float64"``."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise OptionError(name, value, f"must be one of {list(PRECISIONS)}")
    return value


def trajectory_rule(name: str, value: Any) -> Any:
    """``True``/``False`` (from Python also None, or a function of the flat global model)."""
    if not (value is None or isinstance(value, (bool, np.bool_)) or callable(value)):
        raise OptionError(name, value, "must be true or false (from Python also null, or a function of the flat "
                                       "global model, e.g. lambda x: x[:10])")
    return bool(value) if isinstance(value, (bool, np.bool_)) else value


# ---------------------------------------------------------------------------------------------------- identity
def _placement_identity(name: str, run: Any) -> dict[str, Any]:
    return {name: run.placement.name == name}


def _trajectory_identity(name: str, run: Any) -> dict[str, Any]:
    from asyncfl_jax.checkpoint import tree_signature

    return {} if run.trajectory is None else {name: tree_signature(run.trajectory)}


def _replica_batch_identity(name: str, run: Any) -> dict[str, Any]:
    return {} if run.replica_batch is None else {name: int(run.replica_batch)}


def _job_executor_identity(name: str, run: Any) -> dict[str, Any]:
    return {} if run.job_executor == "vmap" else {name: str(run.job_executor)}


def option(default: Any, rule: Callable[[str, Any], Any], help: str, flag: Mapping[str, Any] | None = None,
           identity: Callable[[str, Any], dict[str, Any]] | None = None) -> Any:
    """A field of :class:`EngineOptions`: its default, its ``rule(name, value) -> value`` (raising
    :class:`OptionError`), its command-line ``help`` (with ``flag``: extra ``argparse`` keywords, e.g. a ``type``
    or ``metavar``; a ``bool`` default makes a switch), and ``identity(name, run) -> dict``, its part of a
    checkpoint's identity (None: it does not change the numbers a run computes nor its carry)."""
    return dataclasses.field(default=default, metadata={"rule": rule, "help": help, "flag": dict(flag or {}),
                                                        "identity": identity})


@dataclasses.dataclass
class EngineOptions:
    """How a run is laid out and recorded (see the module docstring): ``simulate``'s and ``prepare_run``'s keywords,
    top-level keys of a configuration, ``asyncfl run`` flags.

    Attributes:
      shard_jobs, shard_replicas, shard_clients: spread the jobs of a step, the replicas, or the per-client state
        over all devices (at most one; see :mod:`asyncfl_jax.engine.placement`). Results equal the single-device run
        up to float rounding. ``shard_replicas`` needs a number of replicas, ``shard_clients`` a number of clients,
        that is a multiple of the number of devices.
      lookahead: lookahead batching (``L > 1``, pre-sampled schedules only): the jobs dispatched over up to ``L``
        server steps are trained together in one vmapped call when the schedule shows that none of them is needed
        before (see :func:`lookahead_plan`); ``History.lookahead`` reports the windows. The same results as
        ``L = 1`` up to float rounding (a batched matmul may sum in another order).
      precision: ``"float32"`` (default) or ``"float64"``: the float precision of the data, the model, the server
        and client states, the updates, the staleness weights, the hyper-parameters and the metrics (see
        :mod:`asyncfl_jax.precision`). The run is made with ``jax_enable_x64`` set to match, for its duration
        only (``jax.enable_x64``; restored afterwards), so a float64 run leaves later float32 runs unchanged.
      trajectory: record the global model at every server step (small runs): ``True`` records the flat model
        ``x_t`` [d], a function ``fn(x)`` of the flat model (``task.model.unravel(x)`` gives the parameter pytree)
        records what it returns (an array or a pytree of arrays, e.g. ``lambda x: x[:10]`` or
        ``lambda x: {"norm": jnp.linalg.norm(x)}``). ``History.trajectory`` is then ``[R, T + 1, ...]``, index
        ``t`` the record of ``x_t`` (``t = 0``: the initial model). Recorded inside the compiled scan (its per-step
        outputs; off: the program is unchanged) and kept in host memory; refused before compiling when ``R x (T +
        1) x`` one record's bytes exceeds ``engine.loop.MAX_TRAJECTORY_BYTES`` (1 GiB). Works with any
        ``eval_every``, ``lookahead`` and with checkpoints (the trajectory so far is saved with the state, so a
        resumed run's trajectory equals the uninterrupted one's). A diverged replica's trajectory repeats the
        model it keeps once it is frozen.
      replica_batch: compute the replicas ``g`` at a time in each chunk (the vmapped chunk of ``g`` replicas,
        called by the host on each group: :mod:`~asyncfl_jax.engine.replica_groups`); ``g`` >= the number of
        replicas: all together. None (default): all together on an accelerator, and on a CPU groups sized from the
        local training of a step (one MLP replica at a time, logistic regression in groups of a few, light steps all
        together), where a vmap over many replicas is slower than the replicas one after another (see
        docs/benchmarks.md). The same results up to float rounding; one device only (not with ``shard_*``).
      job_executor: how the jobs trained together at a step are laid out in the program
        (:mod:`asyncfl_jax.engine.executors`): ``"vmap"`` (one vmapped call), ``"unrolled"`` (written out one after
        another), ``"grouped:G"`` (vmapped groups of ``G``), or ``"auto"`` (default: ``unrolled`` for convolutional
        and recurrent models on the CPU backend, where a vmapped convolution runs as a slow grouped convolution;
        ``vmap`` otherwise). The same results up to float rounding.
    """

    shard_jobs: bool = option(
        False, flag_rule, "spread each step's jobs over all JAX devices (on a CPU, one device per core needs "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N in the environment)", identity=_placement_identity)
    shard_replicas: bool = option(
        False, flag_rule, "spread the replicas (seeds x swept hyper-parameters) over all JAX devices; their number "
        "must be a multiple of the device count", identity=_placement_identity)
    shard_clients: bool = option(
        False, flag_rule, "spread the per-client state (n x d caches, error-feedback residuals) over all JAX devices "
        "along the client axis; the number of clients must be a multiple of the device count",
        identity=_placement_identity)
    lookahead: int = option(
        1, lookahead_rule, "lookahead batching: train the jobs of up to L server steps in one vmapped call when the "
        "schedule allows (default 1: off)", {"type": int, "metavar": "L"})
    replica_batch: int | None = option(
        None, replica_batch_rule, "compute the replicas G at a time in each chunk (default: all together on an "
        "accelerator, groups sized from the work of a step on a CPU; G >= the replicas: all together; same results up "
        "to float rounding)", {"type": int, "metavar": "G"}, identity=_replica_batch_identity)
    job_executor: str = option(
        "auto", job_executor_rule, "how the jobs of a server step are laid out: auto (default: unrolled for CNNs and "
        "RNNs on CPU, vmap otherwise), vmap, unrolled or grouped:G; same results up to float rounding",
        {"metavar": "E"}, identity=_job_executor_identity)
    precision: str = option(
        "float32", precision_rule, "float precision of data, model, server state, updates and metrics (default "
        "float32; float64 turns on jax_enable_x64 for the run, for exact comparisons with reference code)",
        {"choices": list(PRECISIONS)})
    trajectory: bool = option(
        False, trajectory_rule, "record the flat global model x_t at every server step (small runs) and write it to "
        "trajectory/<run>.npz in the results folder (array [replicas, steps + 1, d])", identity=_trajectory_identity)

    # ------------------------------------------------------------------------------------------------ making
    @classmethod
    def names(cls) -> list[str]:
        """The options' names, in order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], where: str = "simulate()") -> "EngineOptions":
        """The options given as keywords (``simulate(..., lookahead=4)``); an unknown keyword is a ``TypeError``
        naming it (and the closest option), as Python's own is."""
        known = cls.names()
        for key in keywords:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f" (engine options: {', '.join(known)})"
                raise TypeError(f"{where} got an unexpected keyword argument {key!r}{hint}")
        return cls(**keywords)

    @classmethod
    def from_config(cls, cfg: Any) -> "EngineOptions":
        """The options of a configuration (its top-level keys of the same names)."""
        return cls(**{name: getattr(cfg, name) for name in cls.names()})

    def checked(self) -> "EngineOptions":
        """These options with every rule applied (each option's, then :data:`COMBINATIONS`); raises
        :class:`OptionError` for the first option refused."""
        values = {f.name: f.metadata["rule"](f.name, getattr(self, f.name)) for f in dataclasses.fields(self)}
        out = dataclasses.replace(self, **values)
        for combination in COMBINATIONS:
            combination(out)
        return out

    def check_config(self) -> None:
        """The rules as a configuration applies them (:meth:`checked`); a switch (an option whose default is
        ``false``) must be ``true`` or ``false`` there: a JSON file holds no function and ``null`` is not off."""
        for f in dataclasses.fields(EngineOptions):
            value = getattr(self, f.name)
            if isinstance(f.default, bool) and not isinstance(value, bool):
                raise OptionError(f.name, value, "must be true or false")
        self.checked()

    def for_run(self, event_clock: bool) -> "EngineOptions":
        """The options of one run of a configuration (whose options are the experiment's): an event-clock run trains
        each job at its arrival, so lookahead batching does not apply to it (``lookahead`` 1)."""
        return dataclasses.replace(self, lookahead=1) if event_clock else self

    def as_keywords(self) -> dict[str, Any]:
        """The options as ``simulate`` keywords."""
        return {name: getattr(self, name) for name in self.names()}

    # ------------------------------------------------------------------------------------------------ reading
    @property
    def placement(self) -> Placement:
        """The placement the three ``shard_*`` switches ask for."""
        return make_placement(self.shard_jobs, self.shard_replicas, self.shard_clients)

    def identity(self, run: Any) -> dict[str, Any]:
        """The options' part of a checkpoint's identity for the prepared ``run``
        (:func:`~asyncfl_jax.checkpoint.run_identity`): what each option's ``identity`` says; an option left at a
        value that does not change the run adds nothing, so earlier checkpoints keep their identity."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.metadata["identity"] is not None:
                out.update(f.metadata["identity"](f.name, run))
        return out


# ---------------------------------------------------------------------------------------------------- combinations
def one_placement(options: EngineOptions) -> None:
    """At most one of the ``shard_*`` switches."""
    conflict = placement_conflict(options.shard_jobs, options.shard_replicas, options.shard_clients)
    if conflict is not None:
        name, others = conflict
        raise OptionError(name, True, f"cannot be combined with {others}: choose one axis to spread over the "
                                      "devices", combination=True)


def replica_batch_on_one_device(options: EngineOptions) -> None:
    """``replica_batch`` groups the replicas of one device: not with a placement over several."""
    spread = options.placement.name
    if options.replica_batch is not None and spread:
        raise OptionError("replica_batch", options.replica_batch, f"cannot be combined with {spread}: it computes "
                          "the replicas of one device in groups; use one of them", combination=True)


def lookahead_without_shard_jobs(options: EngineOptions) -> None:
    """The jobs a lookahead window buffers are not placed over the devices."""
    if options.lookahead > 1 and options.shard_jobs:
        raise OptionError("lookahead", options.lookahead, "cannot be combined with shard_jobs (the buffered jobs are "
                          "not placed over the devices); use one of them, or shard_replicas", combination=True)


COMBINATIONS: tuple[Callable[[EngineOptions], None], ...] = (
    one_placement, replica_batch_on_one_device, lookahead_without_shard_jobs)
"""The rules that involve two options, applied in this order after each option's own."""


def add_flags(group: Any) -> None:
    """One command-line flag per option (``--replica-batch G``; a switch for a ``bool`` option) in the argparse
    ``group``; every flag's default is None (not given: the configuration's value stays)."""
    for f in dataclasses.fields(EngineOptions):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            group.add_argument(flag, action="store_true", default=None, help=f.metadata["help"])
        else:
            group.add_argument(flag, help=f.metadata["help"], **f.metadata["flag"])


def from_flags(args: Any) -> dict[str, Any]:
    """The options the command-line flags in ``args`` set (those given), as configuration keys."""
    return {name: getattr(args, name) for name in EngineOptions.names() if getattr(args, name, None) is not None}
