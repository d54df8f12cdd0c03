"""Experiment configuration: one JSON-friendly object, validated before anything is compiled.

An experiment is a dataset + partition + model + local-training setting + delay model shared by one or more *runs*;
each run is an algorithm with its options, hyper-parameters (a list sweeps them) and arrival protocol. All runs use
the same seeds. A configuration file is a JSON object with the same nesting as :class:`ExperimentConfig` (see
``asyncfl run --print-config``); any option can also be set from the command line with ``--set section.key=value``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
from typing import Any, Mapping

from asyncfl_jax.algorithms import REGISTRY, get_algorithm
from asyncfl_jax.algorithms.defaults import EVAL_POINTS, RUN_DEFAULTS, eval_every_for
from asyncfl_jax.client import LOCAL_HPARAMS
from asyncfl_jax.engine.hparams import resolve_hparams
from asyncfl_jax.engine.options import EngineOptions, OptionError
from asyncfl_jax.errors import ConfigError, InputError  # noqa: F401 (ConfigError: importable from here)
from asyncfl_jax.option_rules import UnreadOption, check_config
from asyncfl_jax.timing.delays import DelayModel
from asyncfl_jax.timing.traces import check_trace_config, is_trace_config, trace_from_config

TFDS_DATASETS = ("tfds/mnist", "tfds/fashion_mnist", "tfds/emnist", "tfds/cifar10", "tfds/cifar100")
LEAF_DATASETS = ("leaf/femnist", "leaf/shakespeare")  # natural clients: writers / speaking roles
DATASETS = ("synthetic", "fashion_mnist", "mnist", *TFDS_DATASETS, *LEAF_DATASETS)
PARTITIONS = ("natural", "iid", "dirichlet", "shards", "power_law", "dirichlet_sampled")
IMAGE_MODELS = ("cnn", "ca2fl_cnn", "resnet18_gn", "alexnet_cifar", "femnist_cnn")
TEXT_MODELS = ("shakespeare_lstm",)  # character ids in, next character out: leaf/shakespeare only
MODELS = ("logreg", "mlp", *IMAGE_MODELS, "area_logreg", *TEXT_MODELS)
PROTOCOLS = ("all_active", "concurrent", "synchronous", "event_clock")
REFILLS = ("immediate", "boundary")
AGGREGATIONS = ("count", "periodic", "poisson")


def _fail(option: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"invalid option {option} = {value!r}: {allowed}")


@dataclasses.dataclass
class DataConfig:
    """Dataset and partition. ``partition="natural"`` keeps the dataset's own clients (LEAF Synthetic's generators;
    the writers of "leaf/femnist" and speaking roles of "leaf/shakespeare", of which ``num_clients`` are drawn with
    ``seed``, read from LEAF JSON or Flower parquet files in ``path``; see :mod:`asyncfl_jax.data.leaf`). ``name``
    "fashion_mnist" /
    "mnist" read IDX files from ``path``; "tfds/<name>" (mnist, fashion_mnist, emnist = EMNIST ByClass, cifar10,
    cifar100) reads a dataset prepared with TensorFlow Datasets (array_record) from the TFDS data folder ``path``
    (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).

    Evaluation splits (see :func:`asyncfl_jax.task.make_task`; all off by default): ``client_test_fraction`` holds
    that fraction of each client's examples out as its own test examples (per-client accuracy: ``client_accuracy_*``
    metrics); ``validation_fraction`` holds that fraction of each client's remaining examples out into a pooled
    validation set (``val_accuracy``, ``val_loss``); ``eval_clients`` reports the per-client metrics on a fixed random
    subset of that many clients (drawn with ``seed``; null: all)."""

    name: str = "synthetic"
    path: str | None = None
    num_clients: int = 100
    partition: str = "natural"
    dirichlet_alpha: float = 0.3
    min_size: int = 10
    shards_per_client: int = 2
    power_law_exponent: float = 1.5
    examples_per_client: int = 32
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    synthetic_max_samples: int | None = 500
    seed: int = 0
    client_test_fraction: float = 0.0
    validation_fraction: float = 0.0
    eval_clients: int | None = None


@dataclasses.dataclass
class ModelConfig:
    name: str = "mlp"
    hidden: list[int] = dataclasses.field(default_factory=lambda: [200, 200])
    seed: int = 0


@dataclasses.dataclass
class LocalTrainingConfig:
    """Local training: K steps of batch B (``batch_size: null`` = full batch), or ``epochs`` over each client's data,
    with SGD at learning rate ``lr`` (optional momentum and coupled weight decay)."""

    steps: int = 10
    batch_size: int | None = 32
    epochs: float | None = None
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

    def hparams(self) -> dict[str, float]:
        """The local-training hyper-parameters every run starts from (a run's ``hparams`` override them)."""
        return {"client_lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}


@dataclasses.dataclass
class ProtocolConfig:
    """Arrival protocol: "all_active" (every client always training, one arrival per step), "concurrent" (Mc
    clients in flight, a step every M arrivals, refill "immediate" or "boundary") or "synchronous" (FedAvg rounds
    with ``participants`` clients, null = all) or "event_clock" (all clients always training, one arrival per step,
    with the clock carried in the scan so that a job's duration may follow its number of local steps, as
    AsyncFedED's adaptive K needs; see :mod:`asyncfl_jax.timing.clock`).

    ``aggregation`` (all_active and concurrent): "count" (a step every ``buffer_size`` arrivals), or a server clock
    that applies a step with whatever arrived since the last one: "periodic" (every ``period`` units of virtual time)
    or "poisson" (at the points of a Poisson process of rate ``rate``). A clock needs refill "immediate", ignores
    ``buffer_size`` and needs the run's length in ``steps`` (the arrivals per step vary)."""

    name: str = "concurrent"
    concurrency: int = 20
    buffer_size: int = 10
    refill: str = "boundary"
    participants: int | None = None
    aggregation: str = "count"
    period: float | None = None
    rate: float | None = None

    def schedule_options(self) -> dict[str, Any]:
        """The keyword options of :func:`~asyncfl_jax.timing.protocols.make_schedule` for this protocol."""
        clock = {} if self.aggregation == "count" else {"aggregation": self.aggregation, "period": self.period,
                                                        "rate": self.rate}
        if self.name in ("all_active", "event_clock"):
            return clock
        if self.name == "synchronous":
            return {"participants": self.participants}
        if clock:
            return {"concurrency": self.concurrency, "refill": self.refill, **clock}
        return {"concurrency": self.concurrency, "buffer_size": self.buffer_size, "refill": self.refill}

    def arrivals_per_step(self, num_clients: int) -> int:
        if self.name in ("all_active", "event_clock"):
            return 1
        if self.name == "synchronous":
            return self.participants or num_clients
        return self.buffer_size


@dataclasses.dataclass
class RunConfig:
    """One algorithm run. Give its length as ``steps`` (server steps) or ``arrivals`` (client uploads).

    What a run omits comes from the algorithm's usual run (:mod:`asyncfl_jax.algorithms.defaults`), the same at every
    entry point: ``protocol`` (or the fields of it that are omitted, while the protocol's name is the algorithm's) and,
    without ``steps``, ``arrivals`` and ``schedule_files``, the number of uploads (3,000; AREA and AS-FedAvg 12,000).

    ``schedule_files`` replays recorded schedules (``.npz`` files written by ``Schedule.save``, e.g. the
    ``schedules/`` folder of an earlier run), one per seed in the order of ``seeds``; the protocol and delay model are
    then not used, and without ``steps``/``arrivals`` the whole recorded schedule runs."""

    algorithm: str = "fedbuff"
    label: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: ProtocolConfig | None = None
    steps: int | None = None
    arrivals: int | None = None
    schedule_files: list[str] | None = None

    def __post_init__(self) -> None:
        usual = RUN_DEFAULTS.get(self.algorithm) if isinstance(self.algorithm, str) else None  # validate() refuses
        if self.protocol is None or isinstance(self.protocol, Mapping):
            given = dict(self.protocol or {})
            self.protocol = ProtocolConfig(**(usual.protocol_with(given) if usual is not None else given))
        if self.steps is None and self.arrivals is None and self.schedule_files is None and usual is not None:
            self.arrivals = usual.arrivals

    @property
    def name(self) -> str:
        return self.label or self.algorithm

    def num_steps(self, num_clients: int) -> int:
        if self.steps is not None:
            return int(self.steps)
        per_step = self.protocol.arrivals_per_step(num_clients)
        return max(1, int(self.arrivals) // per_step)


def default_runs() -> list[RunConfig]:
    """The embedded default: FedBuff (Mc=20, M=10, boundary refill) against FedAsync (polynomial staleness, one
    arrival per step, immediate refill), 3,000 uploads each: both algorithms' usual runs
    (:mod:`asyncfl_jax.algorithms.defaults`)."""
    return [
        RunConfig(algorithm="fedbuff", hparams={"server_lr": 1.0}),
        RunConfig(algorithm="fedasync", options={"staleness": "polynomial"},
                  hparams={"alpha": 0.6, "staleness_a": 0.5}),
    ]


@dataclasses.dataclass
class ExperimentSections:
    """The experiment's own sections (the fields of :class:`ExperimentConfig` before the engine options).
    ``eval_points``: number of evaluations per run (``eval_every`` overrides it, in steps)."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    local: LocalTrainingConfig = dataclasses.field(default_factory=LocalTrainingConfig)
    delays: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"speed": "uniform", "speed_low": 0.5, "speed_high": 5.0, "noise": "half_normal"}
    )
    runs: list[RunConfig] = dataclasses.field(default_factory=default_runs)
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    eval_points: int = EVAL_POINTS
    eval_every: int | None = None


@dataclasses.dataclass
class ExperimentConfig(EngineOptions, ExperimentSections):
    """A whole experiment: its sections (:class:`ExperimentSections`: data, model, local training, delays, runs,
    seeds, evaluation points), then the engine options as top-level keys (:class:`~asyncfl_jax.engine.options.
    EngineOptions`, whose fields this class inherits: the placement switches, lookahead, replica grouping, job
    executor, precision, trajectory; each documented and checked there), then ``output``: the results folder;
    ``None`` (default): a new folder ``runs/<algorithms>-<YYYYmmdd-HHMMSS>`` for each run
    (:func:`asyncfl_jax.outputs.new_output_folder`), whose name ``config.json`` then records."""

    output: str | None = None

    def __post_init__(self) -> None:
        for run in self.runs if isinstance(self.runs, list) else ():  # "every client" (AREA's usual concurrency)
            if isinstance(run, RunConfig) and run.protocol.concurrency is None and isinstance(self.data, DataConfig):
                run.protocol.concurrency = self.data.num_clients

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ExperimentConfig":
        """Builds a config from nested dicts; unknown keys are rejected with the closest valid name."""
        return _build(cls, raw, "")

    @classmethod
    def from_json(cls, path: str) -> "ExperimentConfig":
        """Reads a configuration file: a JSON object in UTF-8 (UTF-16 and UTF-32 with their byte-order mark are read
        too, as :func:`json.loads` detects them). Any file that is not such an object (missing, a folder, unreadable,
        binary, not JSON, not an object) raises :class:`ConfigError` saying which."""
        if not isinstance(path, (str, os.PathLike)) or "\x00" in os.fspath(path):
            raise ConfigError(f"config file {path!r} is not a file name")
        if os.path.isdir(path):
            raise ConfigError(f"config file {path!r} is a folder; give the path of a JSON file")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ConfigError(f"config file {path!r} does not exist") from None
        except OSError as e:
            raise ConfigError(f"config file {path!r} cannot be read: {e.strerror or e}") from None
        try:
            raw = json.loads(data, object_pairs_hook=_unique_keys)
        except DuplicateKeyError as e:
            raise ConfigError(f"config file {path!r}: {e}; a JSON object keeps only the last value of a repeated key, "
                              "so the others would be dropped without a word: write each option once") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path!r} is not text (it cannot be decoded as UTF-8, UTF-16 or UTF-32): "
                              "give a JSON file, e.g. one written by `asyncfl run --print-config`") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"config file {path!r} is not valid JSON: {e}") from None
        except RecursionError:
            raise ConfigError(f"config file {path!r} nests its JSON too deeply") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path!r} must hold a JSON object")
        return cls.from_dict(raw)

    def delay_model(self) -> DelayModel:
        try:
            return DelayModel.from_dict(self.delays)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def eval_every_for(self, num_steps: int) -> int:
        """Evaluation interval (server steps) of a run of ``num_steps`` steps."""
        if self.eval_every is not None:
            return int(self.eval_every)
        return eval_every_for(num_steps, self.eval_points)


class DuplicateKeyError(ValueError):
    """A JSON object of a configuration file names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object, refusing a repeated key (:class:`DuplicateKeyError`)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


_NESTED = {
    ("ExperimentConfig", "data"): DataConfig,
    ("ExperimentConfig", "model"): ModelConfig,
    ("ExperimentConfig", "local"): LocalTrainingConfig,
    ("RunConfig", "protocol"): ProtocolConfig,
}


def _build(cls, raw: Any, prefix: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"option {prefix.rstrip('.') or 'config'} must be an object, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            if cls is LocalTrainingConfig and key in ("client_lr", "learning_rate", "local_lr"):
                hint = (f"; the client learning rate is '{prefix}lr' here (--lr on the command line; the "
                        "hyper-parameter client_lr in a run's hparams, where a list sweeps it)")
            raise ConfigError(f"unknown option '{prefix}{key}' (valid in this section: {sorted(fields)}){hint}")
        nested = _NESTED.get((cls.__name__, key))
        algorithm = raw.get("algorithm", RunConfig.algorithm)
        if cls is RunConfig and key == "protocol" and isinstance(value, dict) and isinstance(algorithm, str) \
                and algorithm in RUN_DEFAULTS:
            value = RUN_DEFAULTS[algorithm].protocol_with(value)  # the fields it omits: the algorithm's
        if nested is not None:
            value = _build(nested, value, f"{prefix}{key}.")
        elif cls is ExperimentConfig and key == "runs":
            if not isinstance(value, list) or not value:
                raise ConfigError(f"option runs must be a non-empty list of runs, got {value!r}")
            value = [_build(RunConfig, v, f"runs[{i}].") for i, v in enumerate(value)]
        kwargs[key] = value
    return cls(**kwargs)


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false, lists), else the text itself (``int8``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def set_option(raw: dict[str, Any], assignment: str) -> None:
    """Applies ``section.key=value`` (value parsed as JSON when it can be, else kept as a string) to nested dicts.

    ``runs.KEY=value`` sets KEY in every run (e.g. ``runs.arrivals=1000``, ``runs.protocol.concurrency=10``).
    """
    if "=" not in assignment:
        raise ConfigError(f"--set expects KEY=VALUE, got {assignment!r}")
    key, text = assignment.split("=", 1)
    value = parse_value(text)
    parts = key.strip().split(".")
    targets = [raw]
    if parts[0] == "runs" and len(parts) > 1:
        targets = raw.setdefault("runs", [])
        parts = parts[1:]
        if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
            raise ConfigError(f"--set {key}: option runs must be a list of runs (objects), got {targets!r}")
    for target in targets:
        node = target
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p!r} is not a section")
        node[parts[-1]] = value


# ---------------------------------------------------------------------------------------------------- validation
HPARAM_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    # name: (low, high, low inclusive, high inclusive)
    "client_lr": (0.0, math.inf, False, False),
    "server_lr": (0.0, math.inf, False, False),
    "momentum": (0.0, 1.0, True, False),
    "weight_decay": (0.0, math.inf, True, False),
    "prox_mu": (0.0, math.inf, True, False),
    "alpha": (0.0, 1.0, False, True),
    "staleness_a": (0.0, math.inf, True, False),
    "staleness_b": (0.0, math.inf, True, False),
    "tau_algo": (0.0, math.inf, True, False),
    "tau_c": (0.0, math.inf, False, False),
    "lr_c": (0.0, math.inf, False, False),
    "lr_d": (0.0, math.inf, False, False),
    "feded_lambda": (0.0, math.inf, False, False),
    "feded_epsilon": (0.0, math.inf, False, False),
    "target_staleness": (0.0, math.inf, True, False),
    "kappa": (0.0, math.inf, True, False),
    "server_opt_lr": (0.0, math.inf, False, False),
    "server_opt_beta1": (0.0, 1.0, True, False),
    "server_opt_beta2": (0.0, 1.0, True, False),
    "server_opt_eps": (0.0, math.inf, False, False),
    "server_opt_momentum": (0.0, 1.0, True, False),
}


def _check_int(option: str, value: Any, low: int, allowed: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(option, value, allowed or f"must be an integer >= {low}")


MAX_SEED = 2**32 - 1
"""The largest seed: JAX's ``PRNGKey`` and numpy's generators take 32-bit seeds here."""


def _check_seed(option: str, value: Any, allowed: str | None = None) -> None:
    allowed = allowed or f"must be an integer in [0, {MAX_SEED}] (2^32 - 1)"
    _check_int(option, value, 0, allowed)
    if value > MAX_SEED:
        _fail(option, value, allowed)


def _check_choice(option: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(str(value), list(choices), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _fail(option, value, f"must be one of {list(choices)}{hint}")


def _check_positive(option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        _fail(option, value, "must be a finite number > 0")


def check_hparam(option: str, name: str, value: Any) -> None:
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        _fail(option, value, "a sweep needs at least one value")
    low, high, low_in, high_in = HPARAM_RANGES.get(name, (-math.inf, math.inf, False, False))
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _fail(option, value, "must be a finite number or a list of finite numbers")
        ok = (v >= low if low_in else v > low) and (v <= high if high_in else v < high)
        if not ok:
            interval = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            _fail(option, value, f"must be in {interval}")


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """The same experiment with every default written out (what ``--print-config`` prints and ``config.json``
    holds): all delay-model fields, each run's algorithm options, and each run's algorithm hyper-parameters (the
    local-training ones, ``client_lr``, ``momentum``, ``weight_decay``, stay in the ``local`` section unless the run
    overrides them; delay-adaptive ASGD's ``tau_c`` defaults to the run's concurrency). Resolving a resolved
    configuration changes nothing. ``cfg`` must be valid (:func:`validate`)."""
    raw = cfg.to_dict()
    if is_trace_config(cfg.delays):  # device traces: the file names (and model_mb) are the whole description
        raw["delays"] = {**cfg.delays, "model_mb": cfg.delays.get("model_mb")}
    else:
        raw["delays"] = {**dataclasses.asdict(cfg.delay_model())}
        if raw["delays"]["dropout_time"] == math.inf:  # JSON has no inf: "never" is the default, written as null
            raw["delays"]["dropout_time"] = None
    for run, entry in zip(cfg.runs, raw["runs"]):
        algorithm = get_algorithm(run.algorithm, **run.options)
        entry["options"] = dict(algorithm.options)
        merged = resolve_hparams(algorithm, run.hparams, concurrency=run_concurrency(run, cfg.data.num_clients))
        written = [*(k for k in algorithm.hyperparams if k not in LOCAL_HPARAMS), *run.hparams]
        entry["hparams"] = {k: merged[k] for k in dict.fromkeys(written)}  # local training's stay in `local`
    return ExperimentConfig.from_dict(raw)


def run_concurrency(run: RunConfig, num_clients: int) -> int:
    """Clients training at once under the run's protocol (for synchronous rounds: the participants)."""
    p = run.protocol
    if p.name == "concurrent":
        return p.concurrency
    if p.name == "synchronous" and p.participants is not None:
        return p.participants
    return num_clients


def _check_device_trace(cfg: ExperimentConfig, check_files: bool) -> None:
    """A ``delays`` section naming device traces (:mod:`asyncfl_jax.timing.traces`): its keys, the files (read when
    ``check_files``), and the settings a trace cannot time (the event clock, epochs, full batch per example)."""
    try:
        check_trace_config(cfg.delays)
        trace = trace_from_config(cfg.delays) if check_files else None
    except ValueError as e:
        raise ConfigError(f"invalid device trace: {e}") from None
    if cfg.local.epochs is not None:
        _fail("local.epochs", cfg.local.epochs, "cannot be used with device traces (a job's local steps would differ "
              "per client); give local.steps")
    if trace is not None and trace.unit == "example" and cfg.local.batch_size is None:
        _fail("local.batch_size", None, "a device trace in seconds per example needs the examples per local step: "
              "give local.batch_size")
    if cfg.runs and all(isinstance(run, RunConfig) and run.schedule_files is not None for run in cfg.runs):
        key = next(k for k in ("device_trace", "fedscale_capacity", "fedscale_behavior") if k in cfg.delays)
        _fail(f"delays.{key}", cfg.delays[key], "would be ignored: every run replays its schedule_files (a recorded "
              "schedule already holds the trace's timing); remove the trace or the schedule files")
    for i, run in enumerate(cfg.runs):
        if isinstance(run.protocol, ProtocolConfig) and run.protocol.name == "event_clock":
            _fail(f"runs[{i}].protocol.name", "event_clock", "the in-scan event clock does not read device traces; "
                  "use all_active, concurrent or synchronous")


def _option_hint(error: ValueError, run: RunConfig) -> str:
    """`` (did you mean 'hinge'?)`` for a misspelt option value (the algorithms' errors say ``must be one of [...],
    got 'x'``) or option name (one the algorithm does not take), else ``""``."""
    import ast
    import re

    found = re.search(r"must be one of (\[[^\]]*\]), got '([^']*)'", str(error))
    if found:
        with contextlib.suppress(ValueError, SyntaxError):
            close = difflib.get_close_matches(found.group(2), [str(c) for c in ast.literal_eval(found.group(1))], n=1)
            return f" (did you mean {close[0]!r}?)" if close else ""
        return ""
    with contextlib.suppress(ValueError, TypeError):
        known = list(get_algorithm(run.algorithm).options) + ["server_optimizer"]
        unknown = [name for name in run.options if name not in known]
        close = difflib.get_close_matches(unknown[0], known, n=1) if unknown else []
        if close:
            return f" (did you mean the option {close[0]!r} instead of {unknown[0]!r}?)"
    return ""


def validate(cfg: ExperimentConfig, check_files: bool = True) -> None:
    """Checks every option; raises :class:`ConfigError` naming the option, the value and what is allowed.

    The sections are checked in the order of :data:`SECTION_RULES`. Also checks (unless ``check_files=False``) that
    dataset files exist, so nothing is compiled for a run that cannot load its data.
    """
    for rule in SECTION_RULES:
        rule(cfg, check_files)


def _validate_data(cfg: ExperimentConfig, check_files: bool) -> None:
    """The ``data`` section: dataset, partition, split fractions and seeds."""
    d = cfg.data
    _check_choice("data.name", d.name, DATASETS)
    if d.path is not None and (not isinstance(d.path, str) or not d.path.strip() or "\x00" in d.path):
        _fail("data.path", d.path, "must be null (the dataset's default folder) or the name of a folder")
    _check_int("data.num_clients", d.num_clients, 1)
    _check_choice("data.partition", d.partition, PARTITIONS)
    if d.partition == "natural" and d.name not in ("synthetic", *LEAF_DATASETS):
        _fail("data.partition", d.partition, f"'natural' needs data.name = 'synthetic', 'leaf/femnist' or "
              f"'leaf/shakespeare' (dataset {d.name!r} has no built-in clients); use iid, dirichlet, shards, "
              "power_law or dirichlet_sampled")
    if d.name in LEAF_DATASETS and d.partition != "natural":
        _fail("data.partition", d.partition, f"{d.name!r} keeps its natural clients (writers or speaking roles): "
              "use 'natural' (data.num_clients of them are drawn with data.seed)")
    _check_positive("data.dirichlet_alpha", d.dirichlet_alpha)
    _check_int("data.min_size", d.min_size, 1)
    _check_int("data.shards_per_client", d.shards_per_client, 1)
    _check_positive("data.power_law_exponent", d.power_law_exponent)
    _check_int("data.examples_per_client", d.examples_per_client, 1)
    for opt in ("synthetic_alpha", "synthetic_beta"):
        v = getattr(d, opt)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            _fail(f"data.{opt}", v, "must be a finite number >= 0")
    if d.synthetic_max_samples is not None:
        _check_int("data.synthetic_max_samples", d.synthetic_max_samples, 50,
                   "must be null or an integer >= 50 (the smallest client size of LEAF Synthetic)")
    _check_seed("data.seed", d.seed)
    for opt in ("client_test_fraction", "validation_fraction"):
        v = getattr(d, opt)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1:
            _fail(f"data.{opt}", v, "must be a finite number in [0, 1) (0: off)")
    if d.eval_clients is not None:
        _check_int("data.eval_clients", d.eval_clients, 1, "must be null (all clients) or an integer >= 1")
        if d.eval_clients > d.num_clients:
            _fail("data.eval_clients", d.eval_clients, f"must be <= data.num_clients ({d.num_clients})")
        if d.client_test_fraction == 0:
            _fail("data.eval_clients", d.eval_clients, "needs data.client_test_fraction > 0 (the per-client metrics "
                  "are measured on each client's own held-out test examples)")


def _validate_data_files(cfg: ExperimentConfig, check_files: bool) -> None:
    """The dataset's files (IDX, LEAF, TFDS) exist (when ``check_files``)."""
    d = cfg.data
    if d.name in ("fashion_mnist", "mnist") and check_files:
        from asyncfl_jax.data.idx import DatasetNotFoundError, find_idx_dir

        try:
            find_idx_dir(d.name, d.path)
        except DatasetNotFoundError as e:
            raise ConfigError(f"invalid option data.name = {d.name!r}: the dataset files are missing.\n{e}") from None
    if d.name in LEAF_DATASETS and check_files:
        _check_leaf_files(d.name, d.path)
    if d.name in TFDS_DATASETS and check_files:
        from asyncfl_jax.data.idx import DatasetNotFoundError
        from asyncfl_jax.data.tfds_data import find_tfds_dir

        try:
            find_tfds_dir(d.name.split("/", 1)[1], d.path)
        except ImportError as e:  # the package itself is missing, not the data
            raise ConfigError(f"invalid option data.name = {d.name!r}: {e}") from None
        except DatasetNotFoundError as e:
            raise ConfigError(f"invalid option data.name = {d.name!r}: the dataset is not prepared.\n{e}") from None


def _validate_model(cfg: ExperimentConfig, check_files: bool) -> None:
    """The ``model`` section, and that the model fits the data (images, character ids)."""
    d = cfg.data
    m = cfg.model
    _check_choice("model.name", m.name, MODELS)
    _check_seed("model.seed", m.seed)
    if not isinstance(m.hidden, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in m.hidden):
        _fail("model.hidden", m.hidden, "must be a list of integers >= 1")
    if m.name in IMAGE_MODELS and d.name in ("synthetic", "leaf/shakespeare"):
        _fail("model.name", m.name, f"{m.name!r} needs image data (e.g. fashion_mnist, leaf/femnist); use "
              f"{'logreg or mlp' if d.name == 'synthetic' else 'shakespeare_lstm'} for {d.name}")
    if m.name in TEXT_MODELS and d.name != "leaf/shakespeare":
        _fail("model.name", m.name, f"{m.name!r} reads character ids: it needs data.name = 'leaf/shakespeare' "
              f"(got {d.name!r})")
    if d.name == "leaf/shakespeare" and m.name not in TEXT_MODELS:
        _fail("model.name", m.name, f"leaf/shakespeare holds character ids (next-character prediction): use "
              f"{' or '.join(TEXT_MODELS)}")


def _validate_local(cfg: ExperimentConfig, check_files: bool) -> None:
    """The ``local`` section (local training)."""
    loc = cfg.local
    _check_int("local.steps", loc.steps, 1)
    if loc.batch_size is not None:
        _check_int("local.batch_size", loc.batch_size, 1, "must be an integer >= 1, or null for full batch")
    if loc.epochs is not None:
        _check_positive("local.epochs", loc.epochs)
        if loc.batch_size is None:
            _fail("local.epochs", loc.epochs, "needs local.batch_size (steps per epoch = ceil(n_i / batch_size))")
    check_hparam("local.lr", "client_lr", loc.lr)
    check_hparam("local.momentum", "momentum", loc.momentum)
    check_hparam("local.weight_decay", "weight_decay", loc.weight_decay)


def _validate_delays(cfg: ExperimentConfig, check_files: bool) -> None:
    """The ``delays`` section: a delay model or device traces (their files read when ``check_files``)."""
    if is_trace_config(cfg.delays):
        _check_device_trace(cfg, check_files)
    else:
        try:
            cfg.delay_model().validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _validate_seeds_and_output(cfg: ExperimentConfig, check_files: bool) -> None:
    """``seeds`` (distinct 32-bit integers) and the ``output`` folder's name."""
    if not isinstance(cfg.seeds, list) or not cfg.seeds:
        _fail("seeds", cfg.seeds, f"must be a non-empty list of integers in [0, {MAX_SEED}]")
    for s in cfg.seeds:
        _check_seed("seeds", s, f"must be a non-empty list of integers in [0, {MAX_SEED}]")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        _fail("seeds", cfg.seeds, "must not repeat a seed")
    if cfg.output is not None and (not isinstance(cfg.output, str) or not cfg.output.strip()):
        _fail("output", cfg.output, "must name a folder (an empty --out would write into the current folder), or "
              "be null for a new folder runs/<algorithms>-<time>")
    if cfg.output is not None and "\x00" in cfg.output:
        _fail("output", cfg.output, "must not contain a NUL character")


def _validate_engine(cfg: ExperimentConfig, check_files: bool) -> None:
    """``eval_points``, ``eval_every`` and the engine options (:class:`~asyncfl_jax.engine.options.EngineOptions`:
    each option's rule, written there once, worded as a configuration error)."""
    _check_int("eval_points", cfg.eval_points, 1)
    try:
        EngineOptions.from_config(cfg).check_config()
    except OptionError as e:
        raise ConfigError(e.config_message()) from None
    if cfg.eval_every is not None:
        _check_int("eval_every", cfg.eval_every, 1)


def _validate_runs(cfg: ExperimentConfig, check_files: bool) -> None:
    """The ``runs``: each run (:func:`_validate_run`), unique labels, and no option set that no run reads."""
    if not cfg.runs:
        _fail("runs", cfg.runs, "must hold at least one run")
    for i, run in enumerate(cfg.runs):
        _validate_run(f"runs[{i}]", run, cfg)
    labels = [r.name for r in cfg.runs]
    if len(set(labels)) != len(labels):
        _fail("runs", labels, "run labels must be unique (set runs[i].label)")
    try:
        check_config(cfg)  # an option set for runs that do not read it
    except UnreadOption as e:
        raise ConfigError(str(e)) from None


SECTION_RULES = (_validate_data, _validate_data_files, _validate_model, _validate_local, _validate_delays,
                 _validate_seeds_and_output, _validate_engine, _validate_runs)
"""The checks of :func:`validate`, one per section, in order (the first error found is the one reported)."""


def _check_leaf_files(name: str, path: str | None) -> None:
    """A ConfigError when the LEAF dataset's files are missing, or are parquet files and pyarrow is not installed."""
    from asyncfl_jax.data.idx import DatasetNotFoundError
    from asyncfl_jax.data.leaf import find_leaf_files, require_pyarrow

    try:
        files = find_leaf_files(name, path)
        if files.format == "parquet":
            require_pyarrow()
    except DatasetNotFoundError as e:
        raise ConfigError(f"invalid option data.name = {name!r}: the dataset files are missing.\n{e}") from None
    except ImportError as e:
        raise ConfigError(f"invalid option data.path = {path!r}: {e}") from None


def _validate_run(prefix: str, run: RunConfig, cfg: ExperimentConfig) -> None:
    """One run: its algorithm, options and hyper-parameters, its protocol (:func:`_validate_protocol`), its
    schedule files and its length."""
    n = cfg.data.num_clients
    _check_choice(f"{prefix}.algorithm", run.algorithm, sorted(REGISTRY))
    if run.label is not None and (not isinstance(run.label, str) or not run.label.strip()):
        _fail(f"{prefix}.label", run.label, "must be null (the algorithm's name) or a non-empty string")
    if not isinstance(run.options, dict):
        _fail(f"{prefix}.options", run.options, "must be an object of the algorithm's options")
    if not isinstance(run.hparams, dict):
        _fail(f"{prefix}.hparams", run.hparams, "must be an object NAME: value or NAME: [values...]")
    try:
        algorithm = get_algorithm(run.algorithm, **run.options)
    except ValueError as e:
        raise ConfigError(f"invalid option {prefix}.options = {run.options!r}: {e}{_option_hint(e, run)}") from None
    try:
        resolved = resolve_hparams(algorithm, run.hparams)
    except ValueError as e:
        raise ConfigError(f"invalid option {prefix}.hparams: {e}") from None
    for name, value in run.hparams.items():
        check_hparam(f"{prefix}.hparams.{name}", name, value)
    del resolved

    _validate_protocol(prefix, run, n)

    if run.schedule_files is not None:
        _validate_schedule_files(prefix, run, cfg)
        if run.steps is None and run.arrivals is None:
            return
    if (run.steps is None) == (run.arrivals is None):
        _fail(f"{prefix}.steps/arrivals", (run.steps, run.arrivals), "give exactly one of steps or arrivals")
    if run.steps is not None:
        _check_int(f"{prefix}.steps", run.steps, 1)
    else:
        _check_int(f"{prefix}.arrivals", run.arrivals, 1)
        per_step = run.protocol.arrivals_per_step(n)
        if run.arrivals < per_step:
            _fail(f"{prefix}.arrivals", run.arrivals, f"must be >= the arrivals of one step ({per_step})")


def _validate_protocol(prefix: str, run: RunConfig, n: int) -> None:
    """A run's protocol (``n`` clients): its name and fields, the server clock's period or rate, and what the
    protocol or the algorithm cannot be combined with."""
    p = run.protocol
    _check_choice(f"{prefix}.protocol.name", p.name, PROTOCOLS)
    if p.name == "concurrent":
        _check_int(f"{prefix}.protocol.concurrency", p.concurrency, 1)
        if p.concurrency > n:
            _fail(f"{prefix}.protocol.concurrency", p.concurrency, f"must be <= data.num_clients ({n})")
        if p.aggregation == "count":  # a server clock ignores buffer_size
            _check_int(f"{prefix}.protocol.buffer_size", p.buffer_size, 1)
            if p.buffer_size > p.concurrency:
                _fail(f"{prefix}.protocol.buffer_size", p.buffer_size,
                      f"must be <= protocol.concurrency ({p.concurrency}): the server cannot wait for more updates "
                      "than there are clients in flight")
        _check_choice(f"{prefix}.protocol.refill", p.refill, REFILLS)
    if p.name in ("all_active", "concurrent"):
        _check_choice(f"{prefix}.protocol.aggregation", p.aggregation, AGGREGATIONS)
    elif p.aggregation != "count":
        why = ("synchronous rounds have no server clock" if p.name == "synchronous" else
               "the event clock applies every arrival as it comes")
        _fail(f"{prefix}.protocol.aggregation", p.aggregation, f"{why}: use 'count'")
    if p.name == "event_clock" and run.schedule_files is not None:
        _fail(f"{prefix}.schedule_files", run.schedule_files, "the event clock decides the events during the run; "
              "to replay a recorded run use its schedule files with protocol 'all_active'")
    for opt, needed_by in (("period", "periodic"), ("rate", "poisson")):
        value = getattr(p, opt)
        if p.aggregation == needed_by:
            if value is None:
                _fail(f"{prefix}.protocol.{opt}", value,
                      f"aggregation '{needed_by}' needs a {opt} (a finite number > 0)")
            if not (opt == "period" and value == math.inf):  # period inf: wait for everyone (synchronous)
                _check_positive(f"{prefix}.protocol.{opt}", value)
        elif value is not None:
            _fail(f"{prefix}.protocol.{opt}", value, f"only used with protocol.aggregation = '{needed_by}' (got "
                  f"{p.aggregation!r}); leave it null")
    if p.aggregation != "count":
        if p.name == "concurrent" and p.refill != "immediate":
            _fail(f"{prefix}.protocol.refill", p.refill, f"a server clock (aggregation '{p.aggregation}') refills "
                  "immediately: set protocol.refill = 'immediate'")
        if run.schedule_files is None and run.arrivals is not None:
            _fail(f"{prefix}.arrivals", run.arrivals, f"with a server clock (aggregation '{p.aggregation}') the "
                  f"arrivals per step vary: give the run's length as {prefix}.steps")
    if p.name == "synchronous" and p.participants is not None:
        _check_int(f"{prefix}.protocol.participants", p.participants, 1)
        if p.participants > n:
            _fail(f"{prefix}.protocol.participants", p.participants, f"must be <= data.num_clients ({n})")
    if run.algorithm == "fedavg" and p.name != "synchronous":
        _fail(f"{prefix}.protocol.name", p.name, "fedavg is synchronous: use protocol 'synchronous'")


def _validate_schedule_files(prefix: str, run: RunConfig, cfg: ExperimentConfig) -> None:
    from asyncfl_jax.timing.schedule import Schedule

    files = run.schedule_files
    option = f"{prefix}.schedule_files"
    if not isinstance(files, list) or len(files) != len(cfg.seeds) or not all(isinstance(f, str) for f in files):
        _fail(option, files, f"must be a list of {len(cfg.seeds)} file name(s), one per seed {cfg.seeds}")
    for path in files:
        try:
            schedule = Schedule.load(path)
        except (OSError, ValueError, KeyError) as e:
            _fail(option, path, f"cannot be read as a schedule: {e}")
        if schedule.num_clients != cfg.data.num_clients:
            _fail(option, path, f"has {schedule.num_clients} clients but data.num_clients is {cfg.data.num_clients}")
        if run.steps is not None and run.steps > schedule.num_steps:
            _fail(option, path, f"has {schedule.num_steps} server steps, fewer than {prefix}.steps = {run.steps}")
