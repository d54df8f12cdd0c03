"""From a validated :class:`~asyncfl_jax.config.ExperimentConfig` to Histories: the path the CLI takes.

Each step is a public function so the same experiment is a few calls from Python::

    cfg = ExperimentConfig()                       # or ExperimentConfig.from_json(...)
    validate(cfg)
    task = build_task(cfg)
    for run in cfg.runs:
        schedules = build_schedules(cfg, run, task)  # one per seed (timing has its own RNG stream)
        history = run_experiment(cfg, run, task, schedules)

:func:`run_config` does all of it and writes the results; with ``write=True`` it checkpoints every run into
``<output>/checkpoints/<run>/`` and ``resume=True`` continues an interrupted experiment (see the "Checkpoints and
resume" section of docs/simulator.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import Any, Sequence

import numpy as np

from asyncfl_jax import _signals, checkpoint, distributed, outputs
from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ConfigError, ExperimentConfig, RunConfig, resolve, run_concurrency, validate
from asyncfl_jax.data.partition import partition as split_clients
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.engine.hparams import resolve_hparams
from asyncfl_jax.engine.options import EngineOptions
from asyncfl_jax.models.core import make_model
from asyncfl_jax.option_rules import check_config
from asyncfl_jax.preflight import check_memory
from asyncfl_jax.outputs import (  # noqa: F401 (moved from here: the output folder; the names stay importable here)
    OUTPUT_FILES,
    SHOWN_DIFFERENCES,
    OutputStatus,
    check_output_paths,
    check_saved_runs,
    check_unchanged,
    checkpoint_dir_for,
    clean_output,
    comparable,
    config_differences,
    decide_output,
    describe_differences,
    holds_results,
    new_output,
    output_status,
    run_targets,
    save_realized_schedules,
    save_schedules,
    saved_configurations,
    start_writing,
    write_atomic,
)
from asyncfl_jax.results import (
    History,
    environment_info,
    environment_json,
    invocation_info,
    load_history,
    remove_history,
    save_history,
    write_client_metrics,
    write_results,
    write_trajectory,
)
from asyncfl_jax.task import Task, make_task
from asyncfl_jax.timing.clock import EventClock
from asyncfl_jax.timing.protocols import make_schedule
from asyncfl_jax.timing.schedule import Schedule
from asyncfl_jax.timing.traces import TraceDelays, config_model_mb, is_trace_config, trace_from_config

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


def build_schedules(cfg: ExperimentConfig, run: RunConfig,
                    task: Task | None = None) -> list[Schedule] | list[EventClock]:
    """One schedule per seed: the timing seed of replica seed ``s`` is ``s``; or the recorded ``schedule_files``; or,
    for the protocol "event_clock", one :class:`~asyncfl_jax.timing.clock.EventClock` per seed. With device traces
    (``delays.device_trace`` or ``delays.fedscale_capacity``) the model's size defaults to ``task``'s float32 size."""
    p = run.protocol
    n = cfg.data.num_clients
    if run.schedule_files is not None:
        recorded = [Schedule.load(path) for path in run.schedule_files]
        if run.steps is None and run.arrivals is None:
            return _same_widths(recorded)
        steps = [run.steps if run.steps is not None else max(1, run.arrivals // s.buffer_width) for s in recorded]
        return _same_widths([s.truncate(min(k, s.num_steps)) for s, k in zip(recorded, steps)])
    delays = trace_delays(cfg, task) if is_trace_config(cfg.delays) else cfg.delay_model()
    if p.name == "event_clock":  # the events are decided during the run
        return [EventClock(n, run.num_steps(n), delays, seed) for seed in cfg.seeds]
    options = p.schedule_options()
    return _same_widths([make_schedule(p.name, n, run.num_steps(n), delays, seed, **options) for seed in cfg.seeds])


def trace_delays(cfg: ExperimentConfig, task: Task | None) -> TraceDelays:
    """The :class:`~asyncfl_jax.timing.traces.TraceDelays` of a configuration naming device traces: jobs of
    ``local.steps`` steps of ``local.batch_size`` examples, a model of ``delays.model_mb`` MB (default: the task's
    float32 size, ``4 * num_params / 10^6``)."""
    if cfg.delays.get("model_mb") is None and task is None:
        raise ConfigError("device traces need the model's size: give delays.model_mb, or pass the task to "
                          "build_schedules(cfg, run, task)")
    try:
        trace = trace_from_config(cfg.delays)
        model_mb = config_model_mb(cfg.delays, 0 if task is None else task.num_params)
        return TraceDelays(trace, cfg.local.steps, model_mb,
                           cfg.local.batch_size if trace.unit == "example" else None)
    except ValueError as e:
        raise ConfigError(f"invalid device trace: {e}") from None


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
    checkpoint_every: int | None = None,
    resume: bool = False,
    callbacks: Sequence[Any] = (),
    checkpoint_interval: float | None = None,
    final_checkpoint: bool = True,
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
    hparams = resolve_hparams(algorithm, run.hparams, local=cfg.local.hparams(),
                              concurrency=run_concurrency(run, cfg.data.num_clients))
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
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every if checkpoint_dir is not None else None,
        checkpoint_interval=checkpoint_interval if checkpoint_dir is not None else None,
        final_checkpoint=final_checkpoint,
        resume=resume,
        callbacks=callbacks,
        **EngineOptions.from_config(cfg).for_run(run.protocol.name == "event_clock").as_keywords(),
    )


def prepare_experiment(cfg: ExperimentConfig, explicit: Sequence[str] = ()) -> ExperimentConfig:
    """The checks every experiment passes before anything is built, written once for ``asyncfl run`` and
    :func:`run_config`: every option (:func:`~asyncfl_jax.config.validate`, dataset files included; ``explicit``:
    the option keys the command line gave, refused when no run reads them), a run over several processes spread
    over them, and the memory preflight (:func:`~asyncfl_jax.preflight.check_memory`). Returns the configuration
    with every default written out (:func:`~asyncfl_jax.config.resolve`), as ``config.json`` holds it; a resolved
    configuration passes unchanged."""
    validate(cfg)
    if explicit:
        check_config(cfg, explicit)  # a flag given for runs that do not read it
    cfg = resolve(cfg)
    processes = distributed.process_count()
    if processes > 1 and not EngineOptions.from_config(cfg).placement.splits_state:
        raise ConfigError(f"this run spans {processes} processes (jax.distributed): set shard_replicas or "
                          "shard_clients (--shard-replicas, --shard-clients) to split it between them")
    check_memory(cfg)  # what cannot fit is refused before any data or schedule is built
    return cfg


def run_config(
    cfg: ExperimentConfig,
    progress: bool = True,
    write: bool = True,
    plot: bool = True,
    checkpoint_every: int | None = None,
    resume: bool = False,
    callbacks: Sequence[Any] = (),
    overwrite: bool = False,
    checkpoint_interval: float | None = None,
    checkpoints: bool = True,
    output_decision: outputs.OutputDecision | None = None,
) -> list[History]:
    """Validates, runs every run of the experiment and (optionally) writes the results to ``cfg.output`` (``None``: a
    new folder ``runs/<algorithms>-<YYYYmmdd-HHMMSS>``, :func:`new_output`).

    With ``write``, the folder is locked for the whole call (:class:`~asyncfl_jax.outputs.OutputLock`: another
    process is refused), checked (:func:`decide_output`: a folder holding anything but a new start is refused unless
    ``resume`` continues the same configuration or ``overwrite`` starts over), and every file written is first
    listed in ``manifest.json``. Once the data are loaded and the first run's schedules built (a failure before that
    leaves the folder as it was), the earlier results are deleted (``overwrite``), then ``config.json`` and
    ``environment.json`` are written (so that a killed run can be resumed); each run saves its schedules,
    checkpoints into ``<output>/checkpoints/<run>/`` (unless ``checkpoints=False``) every ``checkpoint_interval``
    seconds (default 60) or every ``checkpoint_every`` evaluation chunks (at most one of the two) and, when it
    finishes, saves its History there (and deletes its checkpoint). ``output_decision``: the decision taken
    before (:func:`~asyncfl_jax.outputs.output_decision`, as ``asyncfl run`` takes it before loading anything, in
    place of ``resume`` and ``overwrite``): under the lock it is only confirmed, refused if the folder changed since
    (:meth:`~asyncfl_jax.outputs.OutputDecision.confirm`). ``resume=True``
    continues an interrupted experiment: the saved Histories of finished runs are reused, the unfinished run continues
    from its checkpoint, and the results equal those of an uninterrupted run (timings aside). It refuses
    (``ConfigError``), before anything is recomputed or replaced, an output folder whose ``config.json`` holds another
    configuration or whose saved results were computed with another one than ``config.json`` says. ``callbacks`` are
    passed to every run's :func:`~asyncfl_jax.engine.simulate` (the same objects for each run, one run after the
    other; e.g. a :class:`~asyncfl_jax.engine.callbacks.TensorBoardLogger`). Messages (memory budgets, reused runs)
    go to the ``asyncfl_jax`` logger at INFO.
    """
    cfg = prepare_experiment(cfg)  # config.json holds every default
    checkpointing = write and checkpoints
    files = write and distributed.is_primary()  # checkpoints: every process (its shards); other files: process 0
    try:
        cadence = checkpoint.cadence(checkpoint_every, checkpoint_interval)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not checkpointing and (checkpoint_every, checkpoint_interval) != (None, None):
        raise ConfigError("checkpoint_every and checkpoint_interval need checkpoints (write=True, checkpoints=True): "
                          "they would be ignored")
    if output_decision is not None and (not write or resume or overwrite):
        raise ValueError("output_decision says what writing does: give it with write=True and without resume or "
                         "overwrite")
    if not write:
        return _run_all(cfg, None, False, progress, plot, None, False, callbacks)
    if cfg.output is None:
        cfg = dataclasses.replace(cfg, output=new_output(cfg) if output_decision is None else output_decision.output)
    check_output_paths(cfg)

    def decide() -> str:  # the decision taken before is confirmed, or taken now (the rules live in outputs.status)
        if output_decision is not None:
            return output_decision.confirm(cfg)
        return outputs.output_decision(cfg, overwrite=overwrite, resume=resume, check_lock=files).kind

    with outputs.OutputLock(cfg.output) if files else contextlib.nullcontext():  # process 0 holds the lock
        decision = distributed.from_primary(decide, outputs.DECISIONS)  # process 0 decides; the others follow it
        distributed.sync("run_config:checked")  # every process looked at the output folder before anything is written
        return _run_all(cfg, decision, files, progress, plot, cadence if checkpointing else None,
                        decision == "continue", callbacks)


def _run_all(cfg: ExperimentConfig, decision: str | None, files: bool, progress: bool, plot: bool,
             cadence: Any, resume: bool, callbacks: Sequence[Any]) -> list[History]:
    """The runs of ``cfg`` (resolved). With a ``decision`` (:func:`decide_output`) the runs are checkpointed when
    a ``cadence`` (:class:`~asyncfl_jax.checkpoint.Cadence`) is given, and with ``files`` (process 0, the folder
    locked) the result files are written, each listed in the manifest first; without a decision nothing is written."""
    config = cfg.to_dict()
    environment = {**environment_info(), **invocation_info()} if files else None
    task = build_task(cfg)
    _signals.check()  # the command's signals are acted on between phases (see asyncfl_jax._signals)
    schedules_of = {0: build_schedules(cfg, cfg.runs[0], task)}  # the first run's schedule files are read before writing
    _signals.check()
    manifest = None
    if files:
        manifest = start_writing(cfg, decision, config)
        try:
            paths = manifest.add("config.json", "environment.json")
            write_atomic(paths[0], json.dumps(config, indent=2, sort_keys=True) + "\n")
            write_atomic(paths[1], environment_json(environment, config))
        except BaseException:
            if decision != "continue":  # a failed first write: the folder goes back to holding no run
                outputs.remove_listed(manifest)
            raise
    histories: list[History] = []  # filled as the runs finish
    try:
        return _run_each(cfg, decision, files, progress, plot, cadence, resume, callbacks, task,
                         schedules_of, manifest, config, environment, histories)
    except BaseException:
        if manifest is not None and decision != "continue" and not histories and not holds_results(manifest):
            with contextlib.suppress(OSError):  # the error that stopped the run is the one to report
                outputs.remove_listed(manifest)  # a failed start: the folder goes back to holding no run
            logger.info("%s: the run stopped before it saved any result or checkpoint; the files it had written "
                        "there were removed", cfg.output)
        raise


def _run_each(cfg: ExperimentConfig, decision: str | None, files: bool, progress: bool, plot: bool,
              cadence: Any, resume: bool, callbacks: Sequence[Any], task: Task,
              schedules_of: dict[int, Any], manifest: outputs.Manifest | None, config: dict[str, Any],
              environment: Any, histories: list[History]) -> list[History]:
    """The loop of :func:`_run_all` over the runs (its arguments), writing as it goes; appends each finished run's
    History to ``histories``."""
    write = decision is not None
    for i, run in enumerate(cfg.runs):
        schedules = schedules_of.pop(i) if i in schedules_of else build_schedules(cfg, run, task)
        _signals.check()
        if files and run.protocol.name != "event_clock":  # the exact schedules, to replay the run (schedule_files)
            save_schedules(cfg, run, schedules, manifest)
        folder = None
        if write and cadence is not None:
            if files:
                (folder,) = manifest.add(f"checkpoints/{run.name}", kind="checkpoints")
                outputs.remove_orphan_temporaries(folder, ("history.json", "history.npz"))
            else:
                folder = checkpoint_dir_for(cfg.output, run)
        meta = {"config": comparable(config), "run": run.name}
        history = load_history(folder, meta) if folder is not None and resume else None
        if history is not None:
            logger.info("%s: finished earlier; its History is loaded from %s", run.name, folder)
        else:
            if folder is not None and distributed.is_primary():
                remove_history(folder)  # never reuse a History of an earlier configuration
            history = run_experiment(cfg, run, task, schedules, progress=progress, checkpoint_dir=folder,
                                     checkpoint_every=None if cadence is None else cadence.every,
                                     checkpoint_interval=None if cadence is None else cadence.interval,
                                     final_checkpoint=False,  # the History saved below replaces it
                                     resume=resume, callbacks=callbacks)
            if files and history.realized_schedules is not None:  # the events the clocked run went through
                save_realized_schedules(cfg, run, history, manifest)
            if files:  # now, not with the results: a finished run's History is reloaded without its trajectory
                if history.trajectory is not None:
                    manifest.add(f"trajectory/{history.label}.npz")
                write_trajectory(cfg.output, history)
            if folder is not None and distributed.is_primary():
                save_history(history, folder, meta)
                checkpoint.clear(folder)  # the History holds all that is left to know
            if folder is not None:
                distributed.sync(f"run_config:{run.name}")  # every process sees the run finished
        histories.append(history)
    if files:
        manifest.add(*OUTPUT_FILES[:4], *OUTPUT_FILES[4:] * plot)
        write_results(cfg.output, config, histories, plot=plot, environment=environment)
        for history in histories:
            if history.client_metrics:
                manifest.add(f"client_metrics/{history.label}.npz")
            write_client_metrics(cfg.output, history)
    return histories
