"""From a validated :class:`~asyncfl_jax.config.ExperimentConfig` to Histories: the path the CLI takes.

Each step is a public function so the same experiment is a few calls from Python::

    cfg = ExperimentConfig()                       # or ExperimentConfig.from_json(...)
    validate(cfg)
    task = build_task(cfg)
    for run in cfg.runs:
        schedules = build_schedules(cfg, run)      # one per seed (timing has its own RNG stream)
        history = run_experiment(cfg, run, task, schedules)

:func:`run_config` does all of it and writes the results; with ``write=True`` it checkpoints every run into
``<output>/checkpoints/<run>/`` and ``resume=True`` continues an interrupted experiment (see the "Checkpoints and
resume" section of docs/simulator.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
from typing import Any, Sequence

import numpy as np

from asyncfl_jax import checkpoint, distributed
from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ConfigError, ExperimentConfig, RunConfig, algorithm_defaults, resolve, validate
from asyncfl_jax.data.partition import partition as split_clients
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.models.core import make_model
from asyncfl_jax.preflight import check_memory
from asyncfl_jax.results import (
    History,
    environment_info,
    environment_json,
    invocation_info,
    load_history,
    remove_history,
    save_history,
    write_atomic,
    write_client_metrics,
    write_results,
    write_trajectory,
)
from asyncfl_jax.task import Task, make_task
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.protocols import make_schedule
from asyncfl_jax.timing.schedule import Schedule

logger = logging.getLogger(__name__)

def load_dataset(cfg: ExperimentConfig) -> Dataset:
    d = cfg.data
    if d.name == "synthetic":
        from asyncfl_jax.data.synthetic import synthetic_leaf

        return synthetic_leaf(
            num_clients=d.num_clients,
            alpha=d.synthetic_alpha,
            beta=d.synthetic_beta,
            seed=d.seed,
            max_samples=d.synthetic_max_samples,
        )
    if d.name.startswith("leaf/"):
        from asyncfl_jax.data.leaf import LeafFormatError, load_leaf

        try:
            return load_leaf(d.name, d.path, num_clients=d.num_clients, seed=d.seed)
        except (LeafFormatError, ValueError, ImportError) as e:  # too many clients, malformed files: known on reading
            raise ConfigError(f"invalid data (data.name = {d.name!r}, data.path = {d.path!r}): {e}") from None
    if d.name.startswith("tfds/"):
        from asyncfl_jax.data.tfds_data import load_tfds

        return load_tfds(d.name.split("/", 1)[1], d.path)
    from asyncfl_jax.data.idx import load_fashion_mnist, load_mnist

    return (load_fashion_mnist if d.name == "fashion_mnist" else load_mnist)(d.path)


def partition_dataset(cfg: ExperimentConfig, dataset: Dataset) -> list[np.ndarray]:
    d = cfg.data
    if d.partition == "natural":
        if dataset.natural_partition is None:
            raise ConfigError(f"invalid option data.partition = 'natural': dataset {d.name!r} has no natural clients")
        return list(dataset.natural_partition)
    options = {
        "iid": {},
        "dirichlet": {"alpha": d.dirichlet_alpha, "min_size": d.min_size},
        "shards": {"shards_per_client": d.shards_per_client},
        "power_law": {"exponent": d.power_law_exponent, "min_size": d.min_size},
        "dirichlet_sampled": {"alpha": d.dirichlet_alpha, "examples_per_client": d.examples_per_client},
    }[d.partition]
    return split_clients(d.partition, dataset.train_y, d.num_clients, d.seed, **options)


def build_task(cfg: ExperimentConfig) -> Task:
    """Loads the dataset, partitions it over the clients and initialises the model."""
    dataset = load_dataset(cfg)
    parts = partition_dataset(cfg, dataset)
    model = make_model(cfg.model.name, dataset.input_shape, dataset.num_classes, cfg.model.seed, cfg.model.hidden)
    d = cfg.data
    try:
        return make_task(dataset, parts, model, seed=d.seed, client_test_fraction=d.client_test_fraction,
                         validation_fraction=d.validation_fraction, eval_clients=d.eval_clients)
    except ValueError as e:  # a client too small to split: known only once the data are partitioned
        raise ConfigError(f"invalid data options (client_test_fraction = {d.client_test_fraction}, "
                          f"validation_fraction = {d.validation_fraction}, eval_clients = {d.eval_clients}): {e}"
                          ) from None


def build_schedules(cfg: ExperimentConfig, run: RunConfig) -> list[Schedule] | list[EventClock]:
    """One schedule per seed: the timing seed of replica seed ``s`` is ``s``; or the recorded ``schedule_files``; or,
    for the protocol "event_clock", one :class:`~asyncfl_jax.timing.clock.EventClock` per seed."""
    p = run.protocol
    n = cfg.data.num_clients
    if run.schedule_files is not None:
        recorded = [Schedule.load(path) for path in run.schedule_files]
        if run.steps is None and run.arrivals is None:
            return _same_widths(recorded)
        steps = [run.steps if run.steps is not None else max(1, run.arrivals // s.buffer_width) for s in recorded]
        return _same_widths([s.truncate(min(k, s.num_steps)) for s, k in zip(recorded, steps)])
    delays = cfg.delay_model()
    if p.name == "event_clock":  # the events are decided during the run
        return [EventClock(n, run.num_steps(n), delays, seed) for seed in cfg.seeds]
    options = p.schedule_options()
    return _same_widths([make_schedule(p.name, n, run.num_steps(n), delays, seed, **options) for seed in cfg.seeds])


def _same_widths(schedules: list[Schedule]) -> list[Schedule]:
    """Pads the schedules of the seeds to one arrival and one dispatch width (they differ with a server clock,
    dropouts or suspensions), so that the seeds run as one vectorized program."""
    if len(schedules) < 2:
        return schedules
    m = max(s.buffer_width for s in schedules)
    d = max(s.dispatch_width for s in schedules)
    return [s.pad(buffer_width=m, dispatch_width=d) for s in schedules]


def run_experiment(
    cfg: ExperimentConfig,
    run: RunConfig,
    task: Task,
    schedules: Sequence[Schedule],
    progress: bool = True,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    callbacks: Sequence[Any] = (),
) -> History:
    """Simulates one run (all its seeds and swept hyper-parameters as one vmapped program); the checkpoint arguments
    and ``callbacks`` are those of :func:`~asyncfl_jax.engine.simulate`."""
    algorithm = get_algorithm(run.algorithm, **run.options)
    local = LocalConfig(
        steps=cfg.local.steps,
        batch_size=cfg.local.batch_size,
        epochs=cfg.local.epochs,
        use_momentum=cfg.local.momentum > 0,
    )
    hparams = {**cfg.local.hparams(), **algorithm_defaults(run, algorithm.hyperparams, cfg.data.num_clients),
               **run.hparams}
    return simulate(
        task,
        algorithm,
        schedules,
        local=local,
        seeds=cfg.seeds,
        hparams=hparams,
        eval_every=cfg.eval_every_for(schedules[0].num_steps),
        progress=progress,
        label=run.name,
        shard_jobs=cfg.shard_jobs,
        shard_replicas=cfg.shard_replicas,
        shard_clients=cfg.shard_clients,
        lookahead=1 if run.protocol.name == "event_clock" else cfg.lookahead,  # the clock trains at arrival anyway
        replica_batch=cfg.replica_batch,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        callbacks=callbacks,
        precision=cfg.precision,
        trajectory=cfg.trajectory,
    )


def save_schedules(cfg: ExperimentConfig, run: RunConfig, schedules: Sequence[Schedule]) -> None:
    """Writes one schedule per seed to ``<output>/schedules/<run>-seed<s>.npz``."""
    for seed, schedule in zip(cfg.seeds, schedules):
        schedule.save(os.path.join(cfg.output, "schedules", f"{run.name}-seed{seed}.npz"))


def save_realized_schedules(cfg: ExperimentConfig, run: RunConfig, history: History) -> None:
    """The schedules a clocked run went through: one per seed, or with a hyper-parameter sweep (whose points go
    through different events) one per replica, ``<run>-seed<s>-replica<r>.npz``."""
    schedules = history.realized_schedules
    if len(schedules) == len(cfg.seeds):
        save_schedules(cfg, run, schedules)
        return
    for r, (seed, schedule) in enumerate(zip(history.seeds, schedules)):
        schedule.save(os.path.join(cfg.output, "schedules", f"{run.name}-seed{seed}-replica{r}.npz"))


def checkpoint_dir_for(output: str, run: RunConfig) -> str:
    """Where a run of an experiment written to ``output`` keeps its checkpoint and, once finished, its History."""
    return os.path.join(output, "checkpoints", run.name)


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved configuration without its output folder, as plain JSON values."""
    return {k: v for k, v in json.loads(json.dumps(config)).items() if k != "output"}


def config_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The options in which two configurations (nested dicts) differ, as ``name: saved -> current`` lines."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in current:
                out.append(f"{name}: {json.dumps(saved.get(key))} -> {json.dumps(current.get(key))}")
            else:
                out.extend(config_differences(saved[key], current[key], name))
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in config_differences(a, b, f"{prefix}[{i}]")]
    return [] if saved == current else [f"{prefix}: {json.dumps(saved)} -> {json.dumps(current)}"]


@dataclasses.dataclass(frozen=True)
class OutputStatus:
    """What an output folder holds, as seen by ``asyncfl run --out``.

    ``kind``: "new" (missing or empty), "unfinished" (an unfinished run of the same configuration: it can be
    continued), "finished" (the finished results of the same configuration), "different" (results of another
    configuration; ``differences`` lists the options), "foreign" (not empty and not an asyncfl output folder) or
    "not_a_folder".
    """

    kind: str
    differences: tuple[str, ...] = ()


def output_status(cfg: ExperimentConfig) -> OutputStatus:
    """Classifies ``cfg.output`` (see :class:`OutputStatus`); the configurations are compared without ``output``."""
    out = cfg.output
    if not os.path.exists(out):
        return OutputStatus("new")
    if not os.path.isdir(out):
        return OutputStatus("not_a_folder")
    if not os.listdir(out):
        return OutputStatus("new")
    try:
        with open(os.path.join(out, "config.json")) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError):
        return OutputStatus("foreign")
    if not isinstance(saved, dict):
        return OutputStatus("foreign")
    differences = config_differences(_comparable(_resolved_dict(saved)), _comparable(_resolved_dict(cfg.to_dict())))
    if differences:
        return OutputStatus("different", tuple(differences))
    return OutputStatus("finished" if os.path.exists(os.path.join(out, "summary.json")) else "unfinished")


def _resolved_dict(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with every default written out (:func:`~asyncfl_jax.config.resolve`), so that two ways of writing
    one experiment compare equal; a configuration that is not valid is compared as written."""
    try:
        cfg = ExperimentConfig.from_dict(config)
        validate(cfg, check_files=False)
        return resolve(cfg).to_dict()
    except (ConfigError, TypeError, ValueError):
        return config


OUTPUT_FILES = ("config.json", "environment.json", "metrics.csv", "summary.json", "accuracy.png")


def clean_output(output: str) -> None:
    """Deletes what ``asyncfl run`` writes to ``output`` (result files, schedules, checkpoints, saved Histories) and
    nothing else, so that a run can start over there. In a run over several processes every process calls it and
    process 0 deletes, between two barriers (every process has looked at the folder before, and sees it clean after).
    """
    distributed.sync("clean_output:before")
    if distributed.is_primary():
        _clean_output(output)
    distributed.sync("clean_output:after")


def _clean_output(output: str) -> None:
    for name in OUTPUT_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(output, name))
    for path in (*glob.glob(os.path.join(output, "schedules", "*-seed*.npz")),
                 *glob.glob(os.path.join(output, "client_metrics", "*.npz"))):
        os.remove(path)
    for folder in glob.glob(os.path.join(output, "checkpoints", "*")):
        if os.path.isdir(folder):
            checkpoint.clear(folder)
            remove_history(folder)
            for tmp in glob.glob(os.path.join(folder, ".tmp-*")):
                os.remove(tmp)
    for folder in (*glob.glob(os.path.join(output, "checkpoints", "*")), os.path.join(output, "checkpoints"),
                   os.path.join(output, "schedules"), os.path.join(output, "client_metrics")):
        with contextlib.suppress(OSError):  # only when empty
            os.rmdir(folder)


def run_config(
    cfg: ExperimentConfig,
    progress: bool = True,
    write: bool = True,
    plot: bool = True,
    checkpoint_every: int | None = 1,
    resume: bool = False,
    callbacks: Sequence[Any] = (),
) -> list[History]:
    """Validates, runs every run of the experiment and (optionally) writes the results to ``cfg.output``.

    With ``write``, ``config.json`` and ``environment.json`` are written first (so that a killed run can be
    resumed), then each run saves its schedules, checkpoints every ``checkpoint_every`` evaluation chunks into
    ``<output>/checkpoints/<run>/`` (None: no checkpoints) and, when it finishes, saves its History there (and
    deletes its checkpoint). ``resume=True`` continues an interrupted experiment: the saved Histories of finished
    runs are reused, the unfinished run continues from its checkpoint, and the results equal those of an
    uninterrupted run (timings aside). It refuses (``ConfigError``) an output folder whose ``config.json`` holds
    another configuration. ``callbacks`` are passed to every run's :func:`~asyncfl_jax.engine.simulate` (the same
    objects for each run, one run after the other; e.g. a
    :class:`~asyncfl_jax.engine.callbacks.TensorBoardLogger`). Messages (memory budgets, reused runs) go to the
    ``asyncfl_jax`` logger at INFO.
    """
    validate(cfg)
    cfg = resolve(cfg)  # config.json holds every default
    processes = distributed.process_count()
    if processes > 1 and not (cfg.shard_replicas or cfg.shard_clients):
        raise ConfigError(f"this run spans {processes} processes (jax.distributed): set shard_replicas or "
                          "shard_clients (--shard-replicas, --shard-clients) to split it between them")
    check_memory(cfg)  # what cannot fit is refused before any data or schedule is built
    environment = {**environment_info(), **invocation_info()} if write else None
    config = cfg.to_dict()
    checkpointing = write and checkpoint_every is not None
    files = write and distributed.is_primary()  # checkpoints: every process (its shards); other files: process 0
    if checkpointing and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                          or checkpoint_every < 1):
        raise ConfigError(f"invalid option checkpoint_every = {checkpoint_every!r}: must be an integer >= 1")
    if write:
        if resume:
            status = output_status(cfg)
            if status.kind == "different":
                raise ConfigError(f"cannot resume in {cfg.output}: it holds a different configuration ("
                                  + "; ".join(status.differences) + ")")
    if write:
        distributed.sync("run_config:checked")  # every process looked at the output folder before anything is written
    if files:
        write_atomic(os.path.join(cfg.output, "config.json"), json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_atomic(os.path.join(cfg.output, "environment.json"), environment_json(environment, config))
    task = build_task(cfg)
    histories = []
    for run in cfg.runs:
        schedules = build_schedules(cfg, run)
        if files and run.protocol.name != "event_clock":  # the exact schedules, to replay the run (schedule_files)
            save_schedules(cfg, run, schedules)
        folder = checkpoint_dir_for(cfg.output, run) if checkpointing else None
        meta = {"config": _comparable(config), "run": run.name}
        history = load_history(folder, meta) if folder is not None and resume else None
        if history is not None:
            logger.info("%s: finished earlier; its History is loaded from %s", run.name, folder)
        else:
            if folder is not None and distributed.is_primary():
                remove_history(folder)  # never reuse a History of an earlier configuration
            history = run_experiment(cfg, run, task, schedules, progress=progress, checkpoint_dir=folder,
                                     checkpoint_every=checkpoint_every or 1, resume=resume, callbacks=callbacks)
            if files and history.realized_schedules is not None:  # the events the clocked run went through
                save_realized_schedules(cfg, run, history)
            if files:  # now, not with the results: a finished run's History is reloaded without its trajectory
                write_trajectory(cfg.output, history)
            if folder is not None and distributed.is_primary():
                save_history(history, folder, meta)
                checkpoint.clear(folder)  # the History holds all that is left to know
            if folder is not None:
                distributed.sync(f"run_config:{run.name}")  # every process sees the run finished
        histories.append(history)
    if files:
        write_results(cfg.output, config, histories, plot=plot, environment=environment)
        for history in histories:
            write_client_metrics(cfg.output, history)
    return histories
