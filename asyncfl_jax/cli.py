"""The ``asyncfl`` command line.

    asyncfl run                                  # the embedded default: FedBuff vs FedAsync on LEAF Synthetic(1,1)
    asyncfl run --config exp.json --out runs/x   # a configuration file (see --print-config for its shape)
    asyncfl run --algorithm fedasync --staleness hinge --hparam alpha=0.3,0.6 --seeds 0,1,2
    asyncfl run --set data.name=fashion_mnist --set data.partition=dirichlet --set model.name=logreg
    asyncfl run --resume runs/x                  # continue an interrupted run from its checkpoints
    asyncfl run --preset asyncfeded/synthetic/asyncfeded   # a paper's selected setting (see `asyncfl presets`)
    asyncfl algorithms                           # algorithms, their options and hyper-parameters
    asyncfl presets                              # the papers' selected settings

Every option is checked before anything is compiled; an invalid one stops the command with exit code 2 and a message
naming the option, the value and what is allowed.

Exit codes (one message on stderr, no traceback unless ``--debug``; see docs/simulator.md, "Errors, exit codes and
signals"):

====  ==================================================================================================
0     success
2     bad input or an environment the user can fix: an invalid option, file or dataset, a memory refusal, disk
      full (continue with ``--resume`` after freeing space), permission denied, any other I/O error
1     an internal error (a bug in asyncfl_jax): rerun with ``--debug`` for the traceback and report it
130   interrupted by Ctrl-C (SIGINT)
143   interrupted by SIGTERM
====  ==================================================================================================

Checkpoints: ``asyncfl run --out DIR`` saves each run's state into ``DIR/checkpoints/<run>/`` every
``--checkpoint-interval`` seconds (default 60, written in the background while the run goes on) or every
``--checkpoint-every`` evaluation chunks, and at the end (``--no-checkpoint`` turns them off), and the History of each
finished run there. Ctrl-C or SIGTERM lets the current chunk finish, saves, and exits (codes 130 and 143);
``asyncfl run --resume DIR`` then continues from ``DIR/config.json``: finished runs are reused, the unfinished one
continues from its checkpoint, and the results equal an uninterrupted run's. ``--out DIR`` refuses (exit code 2) a
non-empty DIR unless it holds an unfinished run of the same configuration (which is then continued) or
``--overwrite`` is given (which deletes only the files listed in DIR/manifest.json; a run locks DIR, so a second
process there is refused).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import traceback
from typing import Any, Sequence

from asyncfl_jax import _signals
from asyncfl_jax.algorithms import REGISTRY
from asyncfl_jax.compile_cache import enable_compile_cache
from asyncfl_jax.errors import InputError, PartitionError
from asyncfl_jax.presets import get_preset, unavailable
from asyncfl_jax.config import ConfigError, ExperimentConfig, parse_value, resolve, set_option, validate
from asyncfl_jax.engine.options import add_flags as add_engine_flags, from_flags as engine_flags_given

from asyncfl_jax.algorithms.defaults import AREA_DEFAULT_ARRIVALS, DEFAULT_ARRIVALS  # noqa: F401 (re-exported)


def _parse_list(text: str, cast=float) -> list:
    """``"1,2"`` -> ``[1.0, 2.0]``; an empty item (``"1,,2"``, ``"1,"``) is a ``ValueError``: it would be dropped
    without a word. Surrounding spaces are fine."""
    items = text.split(",")
    if any(not v.strip() for v in items):
        raise ValueError(f"an empty item in {text!r}")
    return [cast(v) for v in items]


def _version() -> str:
    from asyncfl_jax import __version__

    return __version__


class _OtherSpelling(argparse.Action):
    """An option spelled as another entry point spells it: refused with the command line's name."""

    def __init__(self, option_strings: Sequence[str], dest: str, canonical: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.canonical = canonical

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string}: on the command line this is {self.canonical}")


def _build_parser() -> argparse.ArgumentParser:
    """The ``asyncfl`` parser: ``run`` (its flags in groups, :func:`_add_run_parser`), ``plot``, ``algorithms`` and
    ``presets``."""
    parser = argparse.ArgumentParser(prog="asyncfl", description="Asynchronous federated learning simulator (JAX).")
    parser.add_argument("--version", action="version", version=f"asyncfl_jax {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    _add_plot_parser(sub)
    sub.add_parser("algorithms", help="list the algorithms with their options and hyper-parameters")
    sub.add_parser("presets", help="list the papers' selected settings usable with `asyncfl run --preset`")
    return parser


def _add_run_parser(sub: Any) -> None:
    """``asyncfl run`` and its flag groups."""
    run = sub.add_parser("run", help="run an experiment and write config, metrics and plots to an output folder")
    _add_output_flags(run)
    _add_process_flags(run)
    _add_data_flags(run.add_argument_group("data and model"))
    _add_algorithm_flags(run.add_argument_group("algorithm (replaces the default runs with a single run)"))
    timing = run.add_argument_group("timing and replicas")
    _add_timing_flags(timing)
    add_engine_flags(timing)  # one flag per engine option (engine/options.py)


def _add_output_flags(run: Any) -> None:
    """The configuration, the output folder, checkpoints and what is shown or written."""
    run.add_argument("--config", help="JSON configuration file (defaults fill what it omits)")
    run.add_argument("--out", help="output folder (default: a new folder runs/<algorithm>-<YYYYmmdd-HHMMSS> for each "
                                   "run, printed at the start); it must be new or empty, or hold an unfinished run of "
                                   "the same configuration (which is continued), unless --overwrite")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in a non-empty --out folder (deletes the earlier results and checkpoints "
                          "listed in its manifest.json, nothing else)")
    run.add_argument("--resume", metavar="DIR",
                     help="continue the interrupted run in DIR (its config.json and checkpoints); finished runs are "
                          "reused, the results equal an uninterrupted run's")
    run.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                     help="save a checkpoint into OUT/checkpoints/<run>/ every N evaluation chunks (instead of "
                          "--checkpoint-interval)")
    run.add_argument("--checkpoint-interval", type=float, default=None, metavar="SECONDS",
                     help="save a checkpoint every SECONDS of wall time, checked after each evaluation chunk and "
                          "written in the background (default: 60)")
    run.add_argument("--no-checkpoint", action="store_true", help="save no checkpoints")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="set any option, e.g. data.num_clients=50, local.lr=0.1, runs.arrivals=2000 (all runs)")
    run.add_argument("--print-config", action="store_true",
                     help="print the configuration with every default written out (delay fields, algorithm options "
                          "and hyper-parameters) as JSON, a template for --config, and exit")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--debug", action="store_true",
                     help="on an error, also print the Python traceback (for a bug report)")
    run.add_argument("--no-plot", action="store_true", help="do not write accuracy.png")
    run.add_argument("--no-compile-cache", action="store_true",
                     help="do not use JAX's persistent compilation cache (default: on, in $ASYNCFL_COMPILE_CACHE or "
                          "~/.cache/asyncfl_jax/jax; ASYNCFL_COMPILE_CACHE=off also turns it off)")
    run.add_argument("--tensorboard", metavar="DIR",
                     help="also write every replica's metrics as TensorBoard scalars under DIR/<run>/<point>/seed<s> "
                          "(needs tensorboardX: pip install -e '.[tensorboard]' from a clone)")


def _add_process_flags(run: Any) -> None:
    """Many processes (``jax.distributed``)."""
    multi = run.add_argument_group("many processes (jax.distributed; see docs/simulator.md, \"Many processes\")")
    multi.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (env ASYNCFL_COORDINATOR)")
    multi.add_argument("--num-processes", type=int, metavar="N", help="processes of the run (env ASYNCFL_NUM_PROCESSES)")
    multi.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1 (env ASYNCFL_PROCESS_ID)")
    multi.add_argument("--coordinator-timeout", type=float, metavar="SECONDS",
                       help="end with exit code 2 when the coordinator or a process does not show up within this "
                            "time; also the heartbeat timeout after which a silent process is declared dead (default "
                            "120; env ASYNCFL_COORDINATOR_TIMEOUT)")
    multi.add_argument("--cluster", action="store_true",
                       help="let jax.distributed.initialize() read the cluster's environment (SLURM, Open MPI)")


def _add_data_flags(g: Any) -> None:
    """The dataset, its partition, the model and local training."""
    g.add_argument("--dataset", help="synthetic | fashion_mnist | mnist (IDX files) | tfds/mnist | tfds/fashion_mnist | "
                   "tfds/emnist | tfds/cifar10 | tfds/cifar100 (prepared with TensorFlow Datasets) | leaf/femnist | "
                   "leaf/shakespeare (LEAF JSON or Flower parquet files; natural clients)")
    g.add_argument("--data-dir", help="folder holding the dataset's IDX .gz files (tfds/...: the TFDS data folder; "
                   "leaf/...: LEAF's data/ folder with train/ and test/, or a folder of parquet files)")
    g.add_argument("--num-clients", type=int, help="number of clients n")
    g.add_argument("--partition", help="natural (synthetic and leaf/... only) | iid | dirichlet | shards | power_law | "
                   "dirichlet_sampled (any n: data.examples_per_client examples per client, drawn with replacement)")
    g.add_argument("--dirichlet-alpha", type=float, help="concentration of the Dirichlet label partition")
    g.add_argument("--model", help="logreg | mlp | cnn | ca2fl_cnn | resnet18_gn | alexnet_cifar | femnist_cnn | "
                   "area_logreg | shakespeare_lstm (leaf/shakespeare; see docs/simulator.md, Models)")
    g.add_argument("--client-test-fraction", type=float, metavar="F",
                   help="hold out this fraction of each client's examples as its own test examples and report "
                   "per-client accuracy (mean, worst 10%%, std, min); default 0: off")
    g.add_argument("--validation-fraction", type=float, metavar="F",
                   help="hold out this fraction of each client's training examples into a pooled validation set "
                   "(val_accuracy, val_loss); default 0: off")
    g.add_argument("--eval-clients", type=int, metavar="N",
                   help="per-client metrics on a fixed random subset of N clients (default: all)")
    g.add_argument("--local-steps", type=int, help="local steps K")
    g.add_argument("--batch-size", type=int, help="local minibatch size B (0 = full batch)")
    g.add_argument("--lr", type=float, help="client learning rate (the hyper-parameter client_lr: --hparam "
                   "client_lr=0.02,0.05 sweeps it)")
    g.add_argument("--client-lr", "--learning-rate", action=_OtherSpelling, help=argparse.SUPPRESS,
                   canonical="--lr (or --hparam client_lr=V[,V...] to sweep it)")


def _add_algorithm_flags(g: Any) -> None:
    """The algorithm, its options and hyper-parameters, the protocol and the run's length."""
    g.add_argument("--algorithm", help=" | ".join(sorted(REGISTRY)) + " (see `asyncfl algorithms`): one run of "
                   f"{DEFAULT_ARRIVALS:,} uploads (area, as_fedavg: {AREA_DEFAULT_ARRIVALS:,}) with the "
                   "algorithm's usual protocol")
    g.add_argument("--preset", help="a paper's selected setting, e.g. asyncfeded/femnist/fedasync_hinge: algorithm, "
                   "options, hyper-parameters, protocol and local training (see `asyncfl presets`); other options "
                   "override it")
    g.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="an algorithm option, e.g. --option cache=int8 --option rule=direct (repeatable)")
    g.add_argument("--staleness", help="staleness function: constant | polynomial | hinge | inverse_sqrt")
    g.add_argument("--normalization", help="fedbuff normalization: buffer | weights | none")
    g.add_argument("--hparam", action="append", default=[], metavar="NAME=V[,V...]",
                   help="hyper-parameter; several values sweep it (e.g. server_lr=0.5,1.0)")
    g.add_argument("--protocol", help="all_active | concurrent | synchronous | event_clock")
    g.add_argument("--concurrency", type=int, help="clients in flight Mc (concurrent protocol)")
    g.add_argument("--buffer-size", type=int, help="arrivals per server step M (concurrent protocol)")
    g.add_argument("--refill", help="immediate | boundary (concurrent protocol)")
    g.add_argument("--participants", type=int, help="clients per synchronous round (fedavg's usual run: 20, as many "
                   "as FedBuff keeps in flight; another algorithm's synchronous rounds: all clients)")
    g.add_argument("--steps", type=int, help="server steps T")
    g.add_argument("--arrivals", type=int, help="client uploads (T = arrivals / M)")


def _add_timing_flags(g: Any) -> None:
    """The delay model or device traces, the seeds and the evaluation interval."""
    g.add_argument("--speed", help="per-client speed distribution: constant | uniform | lognormal | exponential | normal")
    g.add_argument("--noise", help="per-job noise: none | exponential | half_normal | lognormal | uniform")
    g.add_argument("--device-trace", metavar="FILE",
                   help="time the jobs with per-device traces (.csv or .json: compute seconds per step or per "
                        "example, upload/download MB/s, availability windows) instead of --speed/--noise; see "
                        "docs/simulator.md, \"Device traces\"")
    g.add_argument("--device-capacity", metavar="FILE",
                   help="FedScale's client_device_capacity pickle (compute and bandwidth per device), downloaded by "
                        "you; read without running code")
    g.add_argument("--device-behavior", metavar="FILE",
                   help="FedScale's client_behave_trace pickle (on/off availability); needs --device-capacity")
    g.add_argument("--seeds", help="comma-separated seeds, e.g. 0,1,2")
    g.add_argument("--eval-every", type=int, help="evaluate every this many server steps")


def _add_plot_parser(sub: Any) -> None:
    """``asyncfl plot``."""
    plot = sub.add_parser("plot", help="draw the runs of one or more results folders in one figure (PNG and PDF)")
    plot.add_argument("folders", nargs="+", metavar="RUN_DIR", help="results folders written by asyncfl run")
    plot.add_argument("--out", required=True, metavar="FIG",
                      help="figure file: FIG.png or FIG.pdf, or both when FIG has no suffix")
    plot.add_argument("--metric", help="metric to draw (default: test_accuracy, else the first loss)")
    plot.add_argument("--band", choices=["minmax", "std"], default="minmax",
                      help="band over seeds: min-max (default) or mean ± std")
    plot.add_argument("--axes", default="uploads,time,local_steps",
                      help="x axes, one panel each: uploads, time, local_steps, step (default: uploads,time,local_steps)")
    plot.add_argument("--title", help="title (default: the setting read from the folders' config.json)")
    plot.add_argument("--debug", action="store_true", help="on an error, also print the Python traceback")


def _config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The configuration the ``asyncfl run`` flags describe: the embedded default or ``--config``, then
    ``--preset``, the data, model and local-training flags, the seeds and engine options, the delays, the runs'
    flags, ``--set`` (last: it overrides any flag) and ``--out``."""
    raw: dict[str, Any] = ExperimentConfig().to_dict()
    if args.config:
        raw = ExperimentConfig.from_json(args.config).to_dict()
    if args.preset is not None:
        _apply_preset(raw, args)
    _apply_data_flags(raw, args)
    _apply_experiment_flags(raw, args)
    if args.algorithm is not None:  # its usual protocol and uploads fill what is omitted (algorithms/defaults.py)
        raw["runs"] = [{"algorithm": args.algorithm, "options": {}, "hparams": {}}]
    for run in raw["runs"]:
        _apply_run_flags(run, args)
    for item in args.set:
        set_option(raw, item)
    runs = raw.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(run, dict) for run in runs):
        raise ConfigError(f"invalid option runs = {runs!r}: must be a non-empty list of runs (objects)")
    _put(raw, "output", args.out)
    _absolute_paths(raw)
    return ExperimentConfig.from_dict(raw)


def _put(raw: dict[str, Any], key: str, value: Any) -> None:
    """``key = value`` in the raw configuration when the flag was given (``value`` not None)."""
    if value is not None:
        set_option(raw, f"{key}={json.dumps(value)}")


def _apply_preset(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """``--preset``: a paper's setting (its task, local training and one run) replaces the configuration's."""
    if args.algorithm is not None:
        raise ConfigError("--preset and --algorithm cannot be combined: the preset names the algorithm")
    try:
        chosen = get_preset(args.preset)
    except ValueError as e:
        raise ConfigError(f"invalid option --preset = {args.preset!r}: {e}") from None
    problem = unavailable(chosen)
    if problem is not None:
        raise ConfigError(f"--preset {args.preset} cannot run here: {problem}")
    raw["local"].update(chosen.pop("local"))
    raw["data"].update(chosen.pop("data"))
    raw["model"].update(chosen.pop("model"))
    arrivals = chosen.pop("arrivals", DEFAULT_ARRIVALS)
    raw["runs"] = [{**chosen, "arrivals": arrivals}]


def _apply_data_flags(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """The data, model and local-training flags (a dataset without natural clients is split iid unless
    ``--partition`` says otherwise; ``--batch-size 0`` is a full batch)."""
    for key, value in (("data.name", args.dataset), ("data.path", args.data_dir),
                       ("data.num_clients", args.num_clients), ("data.partition", args.partition)):
        _put(raw, key, value)
    if (args.dataset and args.dataset != "synthetic" and not args.dataset.startswith("leaf/") and args.partition is None
            and raw["data"]["partition"] == "natural"):
        _put(raw, "data.partition", "iid")
    for key, value in (("data.dirichlet_alpha", args.dirichlet_alpha),
                       ("data.client_test_fraction", args.client_test_fraction),
                       ("data.validation_fraction", args.validation_fraction),
                       ("data.eval_clients", args.eval_clients), ("model.name", args.model),
                       ("local.steps", args.local_steps)):
        _put(raw, key, value)
    if args.batch_size is not None:
        if args.batch_size < 0:
            raise ConfigError(f"invalid option --batch-size = {args.batch_size}: must be an integer >= 1, or 0 for "
                              "full-batch local steps")
        raw["local"]["batch_size"] = args.batch_size if args.batch_size > 0 else None  # 0: full batch
    _put(raw, "local.lr", args.lr)


def _apply_experiment_flags(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """``--seeds``, ``--eval-every``, the engine options' flags (:mod:`asyncfl_jax.engine.options`) and the delays
    (``--device-trace``..., ``--speed``, ``--noise``)."""
    if args.seeds is not None:
        try:
            raw["seeds"] = _parse_list(args.seeds, int)
        except ValueError:
            raise ConfigError(f"invalid option --seeds = {args.seeds!r}: must be comma-separated integers, without "
                              "an empty item") from None
    _put(raw, "eval_every", args.eval_every)
    for key, value in engine_flags_given(args).items():
        _put(raw, key, value)
    _put_device_trace(raw, args)
    if args.speed is not None:
        raw["delays"] = {"speed": args.speed, **{k: v for k, v in raw["delays"].items() if not k.startswith("speed")}}
    if args.noise is not None:
        raw["delays"] = {"noise": args.noise, **{k: v for k, v in raw["delays"].items() if not k.startswith("noise")}}


def _apply_run_flags(run: dict[str, Any], args: argparse.Namespace) -> None:
    """The flags that set every run: algorithm options, hyper-parameters, protocol and length."""
    if args.staleness is not None:
        run.setdefault("options", {})["staleness"] = args.staleness
    if args.normalization is not None:
        run.setdefault("options", {})["normalization"] = args.normalization
    for item in args.option:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"invalid option --option = {item!r}: expected NAME=VALUE")
        name, text = (part.strip() for part in item.split("=", 1))
        run.setdefault("options", {})[name] = parse_value(text)
    _refuse_repeated_names("--option", args.option)
    _refuse_repeated_names("--hparam", args.hparam)
    for item in args.hparam:
        name, value = _parse_hparam(item)
        run.setdefault("hparams", {})[name] = value
    _apply_protocol_flags(run.setdefault("protocol", {}), args)
    if args.steps is not None and args.arrivals is not None:  # as a config file with both is refused
        raise ConfigError(f"--steps {args.steps} and --arrivals {args.arrivals} cannot be combined: a run is "
                          "as long as one of them says (T = arrivals / M); give one")
    if args.steps is not None:
        run["steps"], run["arrivals"] = args.steps, None
    if args.arrivals is not None:
        run["arrivals"], run["steps"] = args.arrivals, None


def _parse_hparam(item: str) -> tuple[str, Any]:
    """``--hparam NAME=V[,V...]``: the name and its value (a list of several values sweeps it)."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise ConfigError(f"invalid option --hparam = {item!r}: expected NAME=VALUE[,VALUE...]")
    name, text = item.split("=", 1)
    try:
        values = _parse_list(text, float)
    except ValueError:
        raise ConfigError(f"invalid option --hparam {name} = {text!r}: values must be numbers separated by "
                          "commas, without an empty item") from None
    return name.strip(), values[0] if len(values) == 1 else values


def _apply_protocol_flags(proto: dict[str, Any], args: argparse.Namespace) -> None:
    """The protocol flags; with ``--protocol`` the fields the new protocol does not read go back to their
    defaults (unless given)."""
    for key, value in (("name", args.protocol), ("concurrency", args.concurrency),
                       ("buffer_size", args.buffer_size), ("refill", args.refill),
                       ("participants", args.participants)):
        if value is not None:
            proto[key] = value
    if args.protocol is not None:
        from asyncfl_jax.option_rules import PROTOCOL_READS

        for key in ("concurrency", "buffer_size", "refill", "participants"):
            if key not in PROTOCOL_READS.get(args.protocol, ()) and getattr(args, key) is None:
                proto.pop(key, None)


def _put_device_trace(raw: dict[str, Any], args: argparse.Namespace) -> None:
    """``--device-trace`` / ``--device-capacity`` [``--device-behavior``]: the ``delays`` section names the files;
    options the trace would ignore are refused."""
    chosen = {flag: value for flag, value in (("--device-trace", args.device_trace),
                                              ("--device-capacity", args.device_capacity),
                                              ("--device-behavior", args.device_behavior)) if value is not None}
    if not chosen:
        return
    if args.device_trace is not None and len(chosen) > 1:
        other = next(f for f in chosen if f != "--device-trace")
        raise ConfigError(f"--device-trace cannot be combined with {other}: give your own trace file or FedScale's "
                          "files, not both")
    if args.device_behavior is not None and args.device_capacity is None:
        raise ConfigError("--device-behavior needs --device-capacity (FedScale's device speeds)")
    for flag, value in (("--speed", args.speed), ("--noise", args.noise)):
        if value is not None:
            raise ConfigError(f"{flag} cannot be combined with {next(iter(chosen))}: the trace gives every job's "
                              "duration, so it would be ignored")
    from asyncfl_jax.timing.traces import is_trace_config

    delays = raw.get("delays")
    if args.config and isinstance(delays, dict) and not is_trace_config(delays) \
            and delays != ExperimentConfig().delays:
        raise ConfigError(f"{next(iter(chosen))} would ignore the delays section of {args.config}; remove it from "
                          "the file or leave out the flag")
    kept = {"model_mb": delays["model_mb"]} if isinstance(delays, dict) and "model_mb" in delays else {}
    if args.device_trace is not None:
        raw["delays"] = {"device_trace": args.device_trace, **kept}
    else:
        raw["delays"] = {"fedscale_capacity": args.device_capacity, **kept}
        if args.device_behavior is not None:
            raw["delays"]["fedscale_behavior"] = args.device_behavior
def _absolute_paths(raw: dict[str, Any]) -> None:
    """Makes the input paths of a configuration absolute (relative ones are relative to the current folder):
    ``data.path``, every run's ``schedule_files`` and the device-trace files of ``delays``. ``config.json`` then names the same files whatever folder
    ``asyncfl run --resume`` is started from. Values of other types are left for the validation to refuse."""
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"].strip():
        data["path"] = os.path.abspath(data["path"])
    for run in raw.get("runs") or []:
        files = run.get("schedule_files") if isinstance(run, dict) else None
        if isinstance(files, list):
            run["schedule_files"] = [os.path.abspath(f) if isinstance(f, str) and f.strip() else f for f in files]
    delays = raw.get("delays")
    for key in ("device_trace", "fedscale_capacity", "fedscale_behavior"):  # device-trace files (timing.traces)
        if isinstance(delays, dict) and isinstance(delays.get(key), str) and delays[key].strip():
            delays[key] = os.path.abspath(delays[key])


def _refuse_repeated_names(flag: str, items: Sequence[str]) -> None:
    """Refuses (ConfigError) a ``NAME=VALUE`` flag given twice for one name: only one value would be kept (a sweep is
    ``NAME=V1,V2`` in one flag)."""
    seen: dict[str, str] = {}
    for item in items:
        name = item.split("=", 1)[0].strip()
        if name in seen:
            hint = f"; to sweep it write {flag} {name}=V1,V2" if flag == "--hparam" else ""
            raise ConfigError(f"invalid option {flag}: {name!r} is given twice ({seen[name]!r} and {item!r}) and only "
                              f"one value would be kept: give it once{hint}")
        seen[name] = item


def config_from_argv(argv: Sequence[str]) -> ExperimentConfig:
    """The configuration ``asyncfl run ARGV...`` would run (not validated), e.g.
    ``config_from_argv(["--algorithm", "ace", "--hparam", "server_lr=0.002,0.005"])``."""
    args = _build_parser().parse_args(["run", *argv])
    return _config_from_args(args)


def _print_algorithms() -> None:
    from asyncfl_jax.algorithms import REGISTRY, SERVER_OPT_HPARAMS
    from asyncfl_jax.engine import default_hparams

    for name, make in sorted(REGISTRY.items()):
        alg = make()
        doc = (make.__doc__ or "").strip().splitlines()[0]
        print(f"{name}: {doc}")
        if alg.options:
            print(f"    options (defaults): {dict(alg.options)}")
        print(f"    hyper-parameters (defaults): {default_hparams(alg)}")
    print("every algorithm but fedasync, as_fedavg and area also takes --option server_optimizer=adam|yogi|momentum "
          f"(FedOpt; hyper-parameters {SERVER_OPT_HPARAMS})")


# Options that define the experiment: with --resume the configuration comes from DIR/config.json instead.
_CONFIG_OPTIONS = ("config", "set", "dataset", "data_dir", "num_clients", "partition", "dirichlet_alpha", "model",
                   "local_steps", "batch_size", "lr", "algorithm", "option", "staleness", "normalization", "hparam",
                   "protocol", "concurrency", "buffer_size", "refill", "participants", "steps", "arrivals", "speed",
                   "noise", "seeds", "eval_every", "preset", "device_trace", "device_capacity", "device_behavior")


def _resumed_config(args: argparse.Namespace) -> ExperimentConfig:
    """The configuration saved in ``--resume DIR``, writing to DIR."""
    given = [f"--{name.replace('_', '-')}" for name in (*_CONFIG_OPTIONS, *engine_flags_given(args))
             if getattr(args, name) not in (None, [], False)]
    if given:
        raise ConfigError(f"--resume {args.resume} continues the configuration saved in {args.resume}/config.json; "
                          f"it cannot be combined with {', '.join(given)}")
    for flag, value in (("--overwrite", args.overwrite), ("--no-checkpoint", args.no_checkpoint)):
        if value:
            raise ConfigError(f"--resume cannot be combined with {flag}")
    if args.out is not None and os.path.normpath(args.out) != os.path.normpath(args.resume):
        raise ConfigError(f"--resume {args.resume} writes to {args.resume}; it cannot be combined with "
                          f"--out {args.out}")
    path = os.path.join(args.resume, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"--resume {args.resume}: {path} does not exist, so there is no run to resume there")
    cfg = ExperimentConfig.from_json(path)
    cfg.output = args.resume
    return cfg


def _check_output(cfg: ExperimentConfig, overwrite: bool, resume: bool) -> Any:
    """Output safety before anything is loaded or compiled: the one decision of what writing to ``cfg.output`` does
    (:func:`asyncfl_jax.outputs.output_decision`, read-only; a folder holding an unfinished run of this configuration
    is continued), which ``run_config`` only confirms under the folder's lock (what ``--overwrite`` deletes is deleted
    there, once the data are loaded)."""
    from asyncfl_jax import distributed, outputs

    decided = []

    def decide() -> str:
        decided.append(outputs.output_decision(cfg, overwrite=overwrite, resume=resume, continue_unfinished=True))
        return decided[0].kind

    # process 0 decides (it holds the folder's lock); in a multi-process run the others follow its decision
    kind = distributed.from_primary(decide, outputs.DECISIONS)
    if not distributed.is_primary():
        return outputs.OutputDecision(cfg.output, kind, outputs.comparable(cfg.to_dict()), None)
    if kind == "overwrite":
        print(f"asyncfl: --overwrite: the earlier results in {cfg.output} (those its manifest.json lists, nothing "
              "else) are deleted once the data are loaded")
    if kind == "continue" and not resume:
        print(f"asyncfl: {cfg.output} holds an unfinished run of this configuration: continuing it (finished runs are "
              "reused; --overwrite starts over)")
    return decided[0]


def _check_out_path(out: str) -> None:
    """``--out`` must be a path a folder can be made at: no part of it longer than the file system allows, its
    nearest existing parent a folder this user can write into (checked before anything is built or written)."""
    path = os.path.abspath(out)
    if os.path.islink(path) and not os.path.exists(path):
        raise ConfigError(f"invalid option --out = {out!r}: it is a symbolic link to {os.readlink(path)!r}, which does "
                          "not exist (a dangling link); remove the link, make its target, or choose another --out")
    name_max = 255
    with contextlib.suppress(OSError, ValueError, AttributeError):
        name_max = os.pathconf(_existing_parent(path), "PC_NAME_MAX")
    for part in path.split(os.sep):
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"invalid option --out = {out!r}: the name {part[:40]!r}... is {len(os.fsencode(part))} "
                              f"bytes long, more than the file system allows ({name_max}); choose a shorter name")
    parent = _existing_parent(path)
    if parent != path and not os.path.isdir(parent):
        raise ConfigError(f"invalid option --out = {out!r}: {parent} is a file, not a folder, so no folder can be "
                          "made under it; choose another --out")
    target = path if os.path.isdir(path) else parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConfigError(f"invalid option --out = {out!r}: permission denied, {target} is not writable by this user; "
                          "choose another --out or change the folder's permissions")


def _existing_parent(path: str) -> str:
    """``path`` itself when it exists, else its nearest existing parent."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


EXIT_CODES = {0: "success", 1: "internal error (a bug in asyncfl_jax; rerun with --debug for the traceback)",
              2: "bad input or environment the user can fix (invalid option or file, missing or corrupt data, not "
                 "enough memory, disk full, permission denied)",
              130: "interrupted by Ctrl-C (SIGINT)", 143: "interrupted by SIGTERM"}
"""The exit codes of ``asyncfl`` (also in the module docstring and docs/simulator.md)."""


def main(argv: Sequence[str] | None = None) -> int:
    """The ``asyncfl`` command: returns its exit code (:data:`EXIT_CODES`). Every error ends here as one message on
    stderr (``asyncfl: error: ...``), without a traceback unless ``--debug``."""
    _signals.release_imports()
    parser = _build_parser()
    args = parser.parse_args(argv)  # a usage error exits with code 2 and argparse's message
    debug = bool(getattr(args, "debug", False))
    supervised = _supervised_run(args, argv)
    if supervised is not None:  # a multi-process run: this process only watches its child (asyncfl_jax.supervise)
        if argv is None and _signals.is_cli_process():
            _signals.exit_now(supervised)  # it holds nothing to tear down; a late signal cannot change its status
        return supervised
    installed = args.command == "run" and _signals.install()
    own_process = argv is None and _signals.is_cli_process()
    try:
        _signals.check()  # a signal received while the package imported
        code = _command(args)
        if code == 0:
            _signals.check()  # a signal recorded after the last check (the handlers only set a flag): never lost
    except SystemExit:
        if installed:
            _signals.uninstall()
        raise
    except BaseException as e:  # noqa: BLE001 - the one error boundary of the command
        code = _report(e, args, debug)
    if code in (130, 143) and own_process:
        _signals.exit_now(code)  # an interrupt may have cut an XLA call short: no finalization (see _signals)
    if code == 2 and own_process and _lost_peer:
        _signals.exit_now(code)  # JAX's shutdown barrier would wait for the lost process, then abort
    if installed and own_process:
        _signals.finish(code)  # a signal while the interpreter tears down ends it with this code (see _signals)
    elif installed:
        _signals.uninstall()
    return code


def _report(error: BaseException, args: argparse.Namespace, debug: bool) -> int:
    """Prints the one-paragraph message of ``error`` (and its traceback with ``--debug``); returns the exit code."""
    if debug:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    out = getattr(args, "resume", None) or getattr(args, "out", None) or "the output folder"
    if isinstance(error, KeyboardInterrupt):
        code = error.exit_code if isinstance(error, _signals.Interrupted) else 130
        by = " by SIGTERM" if code == 143 else ""
        if getattr(args, "command", None) == "run" and os.path.isfile(os.path.join(out, "config.json")):
            print(f"asyncfl: interrupted{by}; finished runs are saved, continue with: asyncfl run --resume {out}",
                  file=sys.stderr)
        else:
            print(f"asyncfl: interrupted{by} before the run started; nothing was written to {out}", file=sys.stderr)
        return code
    from asyncfl_jax.supervise import lost_peer_message, peer_failure, who

    if peer_failure(error):  # a collective failed because another process (or the coordinator) is gone
        _lost_peer.append(True)
        coordinator, num_processes, process_id = _launch(args)
        where = who(process_id, num_processes, coordinator)
        print(f"asyncfl: error: {lost_peer_message(where, str(error).splitlines()[0], _timeout(args), out)}",
              file=sys.stderr)
        return 2
    message, code = _describe(error, out)
    print(f"asyncfl: error: {message}", file=sys.stderr)
    return code


_lost_peer: list[bool] = []


def _launch(args: argparse.Namespace) -> tuple[str | None, int | None, int | None]:
    """(coordinator, number of processes, process id) of a ``run`` from its options, else the environment."""
    from asyncfl_jax.distributed import launch_from_env

    try:
        env = launch_from_env()
    except ValueError:
        env = (None, None, None)
    given = (getattr(args, "coordinator", None), getattr(args, "num_processes", None),
             getattr(args, "process_id", None))
    return tuple(g if g is not None else e for g, e in zip(given, env))  # type: ignore[return-value]


def _timeout(args: argparse.Namespace) -> float:
    """The run's ``--coordinator-timeout`` (else ``ASYNCFL_COORDINATOR_TIMEOUT``, else the default)."""
    from asyncfl_jax.distributed import DEFAULT_TIMEOUT, ENV_TIMEOUT

    if getattr(args, "coordinator_timeout", None) is not None:
        return float(args.coordinator_timeout)
    try:
        return float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT)
    except ValueError:
        return DEFAULT_TIMEOUT


def _supervised_run(args: argparse.Namespace, argv: Sequence[str] | None) -> int | None:
    """Runs a multi-process ``asyncfl run`` as a supervised child (:mod:`asyncfl_jax.supervise`) and returns its exit
    code; None when this process runs the command itself (one process, or already the supervised child)."""
    from asyncfl_jax.supervise import ENV_SUPERVISED, die_with_supervisor, run_supervised, who

    if os.environ.get(ENV_SUPERVISED):  # the supervised child: it dies with its supervisor
        die_with_supervisor()
        return None
    if args.command != "run" or getattr(args, "print_config", False):
        return None
    coordinator, num_processes, process_id = _launch(args)
    if not (getattr(args, "cluster", False) or (coordinator is not None and (num_processes or 0) > 1)):
        return None
    argv = list(sys.argv[1:] if argv is None else argv)
    out = getattr(args, "resume", None) or getattr(args, "out", None)
    return run_supervised(argv, who(process_id, num_processes, coordinator), _timeout(args), out)


def _describe(error: BaseException, out: str) -> tuple[str, int]:
    """The message and exit code of an error that reached the boundary."""
    from asyncfl_jax.checkpoint import CheckpointError
    from asyncfl_jax.engine.budget import MemoryRefusal

    if isinstance(error, PartitionError):
        return (f"the data cannot be split over the clients as configured: {error} (options data.num_clients, "
                "data.min_size, data.shards_per_client, data.partition)"), 2
    if isinstance(error, CheckpointError) and _no_space(error):  # a save that failed for a full disk
        if os.path.isfile(os.path.join(out, "config.json")):
            return (f"no space left on the device: {error}; free some space, then continue with: asyncfl run "
                    f"--resume {out} (the previous checkpoint is kept)"), 2
        return f"no space left on the device: {error}; free some space, then run the command again", 2
    if isinstance(error, (InputError, CheckpointError)):
        return str(error), 2
    if isinstance(error, MemoryRefusal):  # the budget's own message names the sizes and the option to lower
        return str(error), 2
    if isinstance(error, MemoryError):
        text = str(error) or "the process ran out of memory"
        return (f"{text}. Lower the option that grows the run (data.num_clients, runs.steps or runs.arrivals, the "
                "seeds or swept hyper-parameters, the model), or run on a machine with more memory"), 2
    if isinstance(error, OSError):
        return _describe_os_error(error, out), 2
    if _out_of_memory(error):  # an XLA allocation failed (jaxlib's XlaRuntimeError)
        first = str(error).strip().splitlines()[0][:300]
        return (f"the accelerator ran out of memory ({first}); lower data.num_clients, the seeds or swept "
                "hyper-parameters, local.batch_size or --lookahead, or use a larger device"), 2
    return (f"internal error ({type(error).__name__}: {str(error)[:300]}). This is a bug in asyncfl_jax, not in your "
            "input: please report it with the command line; rerun with --debug to see the traceback"), 1


OUT_OF_MEMORY_MARKS = ("resource_exhausted", "out of memory", "failed to allocate", "allocation failure",
                       "cannot allocate memory")
"""How the XLA runtime words a failed allocation (on a GPU, TPU or CPU)."""


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a failed allocation of the XLA runtime (its message; it has no type of its own)."""
    text = str(error).lower()
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and any(
        mark in text for mark in OUT_OF_MEMORY_MARKS) or "resource_exhausted" in text


NO_SPACE_MARKS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), f"os_error_code='{errno.ENOSPC}'",
                  f"os_error_code='{errno.EDQUOT}'")
"""How a full disk reads in the message of an error that is no ``OSError`` (tensorstore's, raised by orbax)."""


def _no_space(error: BaseException) -> bool:
    """Whether ``error`` or one of its causes is a full disk (ENOSPC, EDQUOT), also as tensorstore words it inside
    orbax (a ``ValueError`` "... No space left on device [os_error_code='28']")."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(mark in str(error) for mark in NO_SPACE_MARKS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def _describe_os_error(error: OSError, out: str) -> str:
    """An I/O error as a message naming the path, the system's reason and what to do."""
    where = error.filename if error.filename is not None else "a file"
    reason = error.strerror or str(error)
    resumable = os.path.isfile(os.path.join(out, "config.json"))
    if _no_space(error):
        return (f"no space left on the device writing {where} ({reason}): free some space, then "
                + (f"continue with: asyncfl run --resume {out}" if resumable else "run the command again"))
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write or read {where}: {reason}; choose another --out or change the permissions"
    if error.errno == errno.ENAMETOOLONG:
        return f"the path {where} is too long ({reason}); choose a shorter --out or file name"
    if error.errno == errno.ENOTDIR:
        return f"a part of the path {where} is a file, not a folder ({reason}); choose another --out or path"
    return f"{where}: {reason}"


def _command(args: argparse.Namespace) -> int:
    """Runs the parsed command; errors go up to :func:`main`'s boundary."""
    if args.command == "presets":
        from asyncfl_jax.presets import PRESETS

        from asyncfl_jax.presets import unavailable as why_not

        for name, p in PRESETS.items():
            state = "" if why_not(p) is None else " [not runnable here: no loader for its dataset]"
            if p["data"]["name"].startswith("leaf/"):
                state += " [needs its dataset files: --set data.path=<folder>, see docs/simulator.md]"
            print(f"{name}: {p['algorithm']} {p['options']} {p['hparams']} protocol={p['protocol']['name']} "
                  f"local={p['local']} data={p['data']['name']} ({p['data']['num_clients']} clients) "
                  f"model={p['model']['name']}{state}")
        return 0
    if args.command == "algorithms":
        _print_algorithms()
        return 0
    if args.command == "plot":
        from asyncfl_jax.plotting import plot_folders

        for path in plot_folders(args.folders, args.out, metric=args.metric, band=args.band,
                                 axes=[a.strip() for a in args.axes.split(",") if a.strip()], title=args.title):
            print(f"asyncfl: wrote {path}")
        return 0
    try:  # before anything touches a JAX device
        from asyncfl_jax.distributed import initialize_from_options

        initialize_from_options(args.coordinator, args.num_processes, args.process_id, cluster=args.cluster,
                                timeout=args.coordinator_timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not args.print_config:  # compiled programs are reused by the next identical run (compile_cache.py)
        enable_compile_cache("off" if args.no_compile_cache else None)
    cfg = _resumed_config(args) if args.resume is not None else _config_from_args(args)
    from asyncfl_jax.option_rules import check_config, explicit_from_cli

    if args.print_config:  # every option, defaults written out; dataset files need not exist yet
        validate(cfg, check_files=False)
        check_config(cfg, explicit_from_cli(args))  # a flag given for runs that do not read it
        print(json.dumps(resolve(cfg).to_dict(), indent=2))
        return 0
    from asyncfl_jax.experiment import prepare_experiment

    _check_checkpoint_options(args)
    cfg = prepare_experiment(cfg, explicit_from_cli(args))  # the checks run_config makes, before any folder is made
    if cfg.output is not None:
        _check_out_path(cfg.output)
    if cfg.output is None:  # a new folder for this run (made now, so that it is this run's alone)
        from asyncfl_jax.experiment import new_output

        cfg.output = args.out = new_output(cfg)
    _signals.check()
    decision = _check_output(cfg, args.overwrite, resume=args.resume is not None)

    from asyncfl_jax.checkpoint import SimulationInterrupted
    from asyncfl_jax.experiment import run_config

    callbacks = []
    if args.tensorboard is not None and not args.tensorboard.strip():
        raise ConfigError("invalid option --tensorboard = '': give a folder for the event files (e.g. "
                          f"{os.path.join(cfg.output, 'tensorboard')})")
    if args.tensorboard is not None:
        from asyncfl_jax.engine.callbacks import TensorBoardLogger

        try:
            callbacks.append(TensorBoardLogger(args.tensorboard))
        except ImportError as e:
            raise ConfigError(f"invalid option --tensorboard = {args.tensorboard!r}: {e}") from None
    print(f"asyncfl: {len(cfg.runs)} run(s), seeds {cfg.seeds}, dataset {cfg.data.name} ({cfg.data.num_clients} "
          f"clients), model {cfg.model.name}; writing to {cfg.output}")
    try:
        with log_to_stderr():  # SIGINT/SIGTERM outside the simulation loop: _signals' handlers (main)
            histories = run_config(cfg, progress=not args.no_progress, plot=not args.no_plot,
                                   checkpoints=not args.no_checkpoint, checkpoint_every=args.checkpoint_every,
                                   checkpoint_interval=args.checkpoint_interval, callbacks=callbacks,
                                   output_decision=decision)
    except SimulationInterrupted as e:
        print(f"asyncfl: {e}", file=sys.stderr)
        if e.checkpoint_dir is not None:
            print(f"asyncfl: continue with: asyncfl run --resume {cfg.output}", file=sys.stderr)
        return 143 if e.reason == "SIGTERM" else 130
    for h in histories:
        for line in result_lines(h):
            print(line)
    print(f"asyncfl: results in {cfg.output}/ (config.json, environment.json, metrics.csv, summary.json, schedules/"
          f"{'' if args.no_plot else ', accuracy.png'}{'' if args.no_checkpoint else ', checkpoints/'})")
    return 0


def _check_checkpoint_options(args: argparse.Namespace) -> None:
    """Refuses invalid ``--checkpoint-every`` / ``--checkpoint-interval`` values, both together, and either with
    ``--no-checkpoint`` (it would be ignored)."""
    from asyncfl_jax.checkpoint import cadence

    try:
        cadence(args.checkpoint_every, args.checkpoint_interval, every_name="--checkpoint-every",
                interval_name="--checkpoint-interval")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for flag, value in (("--checkpoint-every", args.checkpoint_every),
                        ("--checkpoint-interval", args.checkpoint_interval)):
        if args.no_checkpoint and value is not None:
            raise ConfigError(f"{flag} cannot be combined with --no-checkpoint (it would be ignored)")


@contextlib.contextmanager
def log_to_stderr(level: int = logging.INFO):
    """While the block runs, the ``asyncfl_jax`` logger's messages at ``level`` and above are printed to stderr as
    ``asyncfl: <message>`` lines, once each: they do not also go up to the root logger, where an imported library
    may have put a handler of its own (importing orbax does), which would print every line a second time. The handler
    and the logger's level and propagation are restored afterwards; library users see nothing unless they configure
    logging themselves."""
    package = logging.getLogger("asyncfl_jax")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("asyncfl: %(message)s"))
    handler.setLevel(level)
    previous, propagated = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(level)
    package.propagate = False
    try:
        yield handler
    finally:
        package.removeHandler(handler)
        package.setLevel(previous)
        package.propagate = propagated


def result_lines(h: Any) -> list[str]:
    """The printed result of one run: a line with its steps, uploads, virtual time, staleness and timings, then one
    line per hyper-parameter point with the final and best headline metric as mean ± std over its non-diverged
    seeds, and a line naming the point's diverged seeds with their steps (never averaged in)."""
    metric = h.headline
    name = metric.replace("_", " ")
    stats = h.schedule_stats[0]
    lines = [f"  {h.label}: {int(h.steps[-1])} steps ({int(h.uploads[0, -1])} uploads, virtual time "
             f"{h.times[0, -1]:.1f}); staleness mean {stats['staleness_mean']:.2f} max {stats['staleness_max']}; "
             f"compile {h.compile_seconds:.1f}s, run {h.run_seconds:.1f}s"
             + (f" (checkpoints {h.checkpoint_seconds:.1f}s)" if h.checkpoint_seconds else "")]
    for point, final, best in zip(h.points(), h.point_stats(metric, "final"), h.point_stats(metric, "best")):
        title = f"{h.label} {point.name}" if point.name else h.label
        line = f"  {title}: final {name} {final.describe()}"
        if best.n:
            line += f", best {best.mean:.4f}"
        lines.append(line)
        if final.diverged:
            seeds = ", ".join(f"seed {s} at server step {d}" for s, d in final.diverged)
            lines.append(f"  {title}: DIVERGED (NaN/inf or |x| > 1e10), left out of the mean: {seeds}")
        if final.non_finite:
            lines.append(f"  {title}: non-finite {name}, left out of the mean: seeds {list(final.non_finite)}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
