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
import glob
import json
import logging
import os
import re
from typing import Any, Sequence

import numpy as np

from asyncfl_jax import _signals, checkpoint, distributed, outputs
from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ConfigError, ExperimentConfig, RunConfig, algorithm_defaults, resolve, validate
from asyncfl_jax.data.partition import partition as split_clients
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.engine.options import EngineOptions
from asyncfl_jax.models.core import make_model
from asyncfl_jax.option_rules import check_config
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
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every if checkpoint_dir is not None else None,
        checkpoint_interval=checkpoint_interval if checkpoint_dir is not None else None,
        final_checkpoint=final_checkpoint,
        resume=resume,
        callbacks=callbacks,
        **EngineOptions.from_config(cfg).for_run(run.protocol.name == "event_clock").as_keywords(),
    )


def save_schedules(cfg: ExperimentConfig, run: RunConfig, schedules: Sequence[Schedule],
                   manifest: outputs.Manifest | None = None) -> None:
    """Writes one schedule per seed to ``<output>/schedules/<run>-seed<s>.npz`` (listed first in ``manifest``, when
    given; the paths are checked to stay inside the output folder)."""
    for seed, schedule in zip(cfg.seeds, schedules):
        _save_schedule(cfg, f"{run.name}-seed{seed}.npz", schedule, manifest)


def _save_schedule(cfg: ExperimentConfig, name: str, schedule: Schedule, manifest: outputs.Manifest | None) -> None:
    relative = f"schedules/{outputs.check_label(name, 'a schedule file name')}"
    path = (manifest.add(relative)[0] if manifest is not None
            else outputs.path_inside(cfg.output, relative))
    schedule.save(path)


def save_realized_schedules(cfg: ExperimentConfig, run: RunConfig, history: History,
                            manifest: outputs.Manifest | None = None) -> None:
    """The schedules a clocked run went through: one per seed, or with a hyper-parameter sweep (whose points go
    through different events) one per replica, ``<run>-seed<s>-replica<r>.npz``."""
    schedules = history.realized_schedules
    if len(schedules) == len(cfg.seeds):
        save_schedules(cfg, run, schedules, manifest)
        return
    for r, (seed, schedule) in enumerate(zip(history.seeds, schedules)):
        _save_schedule(cfg, f"{run.name}-seed{seed}-replica{r}.npz", schedule, manifest)


def checkpoint_dir_for(output: str, run: RunConfig) -> str:
    """Where a run of an experiment written to ``output`` keeps its checkpoint and, once finished, its History."""
    return outputs.path_inside(output, f"checkpoints/{outputs.check_label(run.name, 'run label')}")


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved configuration without its output folder, as plain JSON values."""
    return {k: v for k, v in json.loads(json.dumps(config)).items() if k != "output"}


def config_differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """The options in which two configurations (nested dicts) differ, as ``name: saved -> current`` lines, one per
    differing leaf (lists of runs are compared entry by entry, with a line for a different number of entries); long
    values are shortened (:func:`_short`)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in saved or key not in current:
                out.append(f"{name}: {_short(saved.get(key))} -> {_short(current.get(key))}")
            else:
                out.extend(config_differences(saved[key], current[key], name))
        return out
    if isinstance(saved, list) and isinstance(current, list) and saved and current and \
            all(isinstance(v, dict) for v in (*saved, *current)):
        out = [d for i, (a, b) in enumerate(zip(saved, current)) for d in config_differences(a, b, f"{prefix}[{i}]")]
        if len(saved) != len(current):
            out.insert(0, f"{prefix}: {len(saved)} entries -> {len(current)}")
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in config_differences(a, b, f"{prefix}[{i}]")]
    return [] if saved == current else [f"{prefix}: {_short(saved)} -> {_short(current)}"]


def _short(value: Any, limit: int = 60) -> str:
    """``value`` as JSON, cut to ``limit`` characters (``...`` marks the cut)."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


SHOWN_DIFFERENCES = 3
"""How many differing options a refusal names (then how many more there are)."""


def describe_differences(differences: Sequence[str]) -> str:
    """The first :data:`SHOWN_DIFFERENCES` differences joined by ``; ``, then ``... and N more``."""
    shown = "; ".join(differences[:SHOWN_DIFFERENCES])
    more = len(differences) - SHOWN_DIFFERENCES
    return shown + (f"; ... and {more} more" if more > 0 else "")


@dataclasses.dataclass(frozen=True)
class OutputStatus:
    """What an output folder holds, as seen by ``asyncfl run --out``.

    ``kind``: "new" (missing, empty, or holding only this package's bookkeeping), "unfinished" (an unfinished run of
    the same configuration: it can be continued), "finished" (the finished results of the same configuration),
    "different" (results of another configuration; ``differences`` lists the options), "foreign" (not empty and not
    an asyncfl output folder) or "not_a_folder".
    """

    kind: str
    differences: tuple[str, ...] = ()


def output_status(cfg: ExperimentConfig) -> OutputStatus:
    """Classifies ``cfg.output`` (see :class:`OutputStatus`); the configurations are compared without ``output``.
    The lock file, the manifest and orphaned temporary files alone make no results: such a folder is "new"."""
    out = cfg.output
    if not os.path.exists(out):
        return OutputStatus("new")
    if not os.path.isdir(out):
        return OutputStatus("not_a_folder")
    if outputs.bookkeeping_only(out):  # empty, or what a run killed during its first write leaves
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


def check_output_paths(cfg: ExperimentConfig) -> None:
    """Refuses (``ConfigError``) an output folder name or a run label that would put a file outside ``cfg.output``
    (see :func:`asyncfl_jax.outputs.check_label`); nothing is read or written."""
    outputs.check_output_name(cfg.output)
    outputs.check_labels([run.name for run in cfg.runs])


def run_targets(cfg: ExperimentConfig) -> list[str]:
    """The paths (relative to ``cfg.output``) that running ``cfg`` writes: the result files, each run's schedule
    files and checkpoint folder, its per-client metrics, and the realized schedules of a sweep already there."""
    targets = list(OUTPUT_FILES)
    for run in cfg.runs:
        targets += [f"schedules/{run.name}-seed{seed}.npz" for seed in cfg.seeds]
        pattern = os.path.join(glob.escape(os.path.join(cfg.output, "schedules")), f"{glob.escape(run.name)}-seed*.npz")
        targets += [f"schedules/{os.path.basename(p)}" for p in sorted(glob.glob(pattern))]
        targets += [f"client_metrics/{run.name}.npz", f"trajectory/{run.name}.npz", f"checkpoints/{run.name}"]
    return list(dict.fromkeys(targets))


def saved_configurations(output: str) -> list[tuple[str, Any]]:
    """The configurations that the results in ``output`` were computed with, by the file that records each: the
    manifest, ``summary.json`` and each saved History (``checkpoints/<run>/history.json``); unreadable ones are
    skipped (they are not reused either)."""
    found: list[tuple[str, Any]] = []
    with contextlib.suppress(ConfigError):
        manifest = outputs.Manifest.load(output)
        if manifest is not None and manifest.config is not None:
            found.append((outputs.MANIFEST_NAME, manifest.config))
    paths = [("summary.json", os.path.join(output, "summary.json"), ("config",))]
    for folder in sorted(glob.glob(os.path.join(glob.escape(output), "checkpoints", "*"))):
        if os.path.isdir(folder) and not os.path.islink(folder):
            name = f"checkpoints/{os.path.basename(folder)}/history.json"
            paths.append((name, os.path.join(folder, "history.json"), ("meta", "config")))
    for name, path, keys in paths:
        try:
            with open(path, encoding="utf-8") as f:
                value: Any = json.load(f)
            for key in keys:
                value = value[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, dict):
            found.append((name, value))
    return found


def check_unchanged(cfg: ExperimentConfig) -> None:
    """Refuses (``ConfigError``) to continue in ``cfg.output`` when a result there was computed with another
    configuration than ``cfg`` (e.g. ``config.json`` was edited after the run): checked before anything is
    recomputed or replaced. ``cfg`` is resolved."""
    current = _comparable(cfg.to_dict())
    for source, saved in saved_configurations(cfg.output):
        differences = config_differences(_comparable(_resolved_dict(saved)), current)
        if differences:
            raise ConfigError(
                f"cannot continue in {cfg.output}: its results were computed with another configuration than its "
                f"config.json (was config.json edited?); {source} records (saved -> config.json): "
                + describe_differences(differences)
                + ". Nothing was changed: restore config.json, or start over with --overwrite or another --out")


def check_saved_runs(cfg: ExperimentConfig) -> None:
    """Refuses (``ConfigError``) to continue in ``cfg.output`` when a run's saved state cannot be used by this
    version of the package: a History it cannot read (another format, or incomplete) without a checkpoint to continue
    from, or a checkpoint of another format (format 1: ``state-<chunk>.npz`` files of a version before orbax) or an
    unreadable record. Every run is checked before anything is recomputed, replaced or written (read-only); ``cfg``
    is resolved."""
    meta_config = _comparable(cfg.to_dict())
    problems = []
    for run in cfg.runs:
        folder = checkpoint_dir_for(cfg.output, run)
        if not os.path.isdir(folder):
            continue
        has_history = os.path.lexists(os.path.join(folder, "history.json"))
        if has_history and load_history(folder, {"config": meta_config, "run": run.name}) is not None:
            continue
        try:
            record = checkpoint.read_record(folder)
        except checkpoint.CheckpointError as e:
            problems.append(f"run {run.name}: {e}")
            continue
        old_states = sorted(name for name in os.listdir(folder) if re.fullmatch(r"state-\d+\.npz", name))
        if record is None and old_states:
            problems.append(f"run {run.name}: {folder} holds {old_states[0]}, a checkpoint of format 1 (asyncfl_jax "
                            "before orbax), which this version cannot read")
        elif record is None and has_history:
            problems.append(f"run {run.name}: its saved History {os.path.join(folder, 'history.json')} cannot be read "
                            "by this version (another format, or incomplete) and there is no checkpoint to continue "
                            "from")
    if problems:
        raise ConfigError(
            f"cannot resume in {cfg.output}: it was written by another version of asyncfl_jax ("
            + "; ".join(problems) + "). Nothing was changed. To keep its results, finish it with the version that "
            "wrote it (environment.json names it); or run it again with another --out (or with --overwrite, which "
            "deletes what the folder's manifest.json lists, where it has one)")


def decide_output(cfg: ExperimentConfig, overwrite: bool = False, resume: bool = False, check_lock: bool = True) -> str:
    """What writing ``cfg`` to ``cfg.output`` does, or a ``ConfigError`` saying why it cannot (read-only):

    * "new": the folder is missing, empty, or holds only this package's bookkeeping (the lock file, the manifest,
      temporary files of a run killed during its first write);
    * "continue" (``resume``): the folder holds results of this very configuration, checked against
      ``config.json`` and against every saved record (:func:`check_unchanged`);
    * "overwrite" (``overwrite``): what the folder's manifest lists will be deleted, once the new run's data are
      loaded; refused when a file the run would write exists without being listed (a file of someone else).

    A folder locked by a live run is refused (:class:`~asyncfl_jax.outputs.OutputLockedError`), as is one that holds
    an unfinished run (unless ``resume``), finished or different results, or files of someone else (unless
    ``overwrite``)."""
    out = cfg.output
    check_output_paths(cfg)
    status = output_status(cfg)
    if status.kind == "not_a_folder":
        raise ConfigError(f"invalid option --out = {out!r}: it exists and is not a folder")
    if check_lock:  # (the processes of a multi-process run other than process 0, which holds the lock, do not)
        outputs.refuse_if_locked(out)
    if status.kind == "new":
        return "new"
    manifest = outputs.Manifest.load(out)  # an unreadable or edited manifest is refused, whatever comes next
    if resume and not overwrite:
        if status.kind == "different":
            raise ConfigError(f"cannot resume in {out}: it holds a different configuration ("
                              + describe_differences(status.differences) + ")")
        if status.kind == "foreign":
            raise ConfigError(f"cannot resume in {out}: it holds no asyncfl results (no readable config.json)")
        check_unchanged(cfg)
        check_saved_runs(cfg)
        return "continue"
    if overwrite:
        clash = outputs.unlisted_targets(out, manifest, run_targets(cfg))
        if clash:
            raise ConfigError(
                f"--overwrite deletes only what asyncfl listed in {os.path.join(out, outputs.MANIFEST_NAME)}, and "
                f"{out} holds {', '.join(clash[:6])}{' ...' if len(clash) > 6 else ''} where this run would write, "
                "listed in no manifest (files of yours, or results of an asyncfl_jax version before manifests); "
                "nothing was deleted: move them away yourself or choose another --out")
        return "overwrite"
    if status.kind == "unfinished":
        raise ConfigError(f"{out} holds an unfinished run of this configuration: continue it with resume=True "
                          f"(`asyncfl run --resume {out}`) or start over with overwrite=True (--overwrite)")
    if status.kind == "finished":
        raise ConfigError(f"{out} already holds the finished results of this configuration; pass --overwrite to run "
                          f"it again, `asyncfl run --resume {out}` to rewrite the results from the saved runs, or "
                          "choose another --out")
    if status.kind == "different":
        raise ConfigError(f"{out} holds the results of a different configuration (saved -> this one: "
                          + describe_differences(status.differences) + "); leave out --out for a new folder, "
                          "choose another --out, or pass --overwrite to replace them")
    raise ConfigError(f"{out} is not empty and holds no asyncfl results (no readable config.json); choose another "
                      "--out or pass --overwrite to write into it (your files there are kept)")


def clean_output(output: str) -> list[str]:
    """Deletes what ``asyncfl run`` wrote to ``output`` as listed in its manifest (result files, schedules,
    checkpoints, saved Histories) and nothing else, never following a symbolic link (see
    :func:`asyncfl_jax.outputs.remove_listed`); returns the listed paths that were kept (e.g. a folder that also
    holds files of others). Without a manifest nothing is deleted. In a run over several processes every process
    calls it and process 0 deletes, between two barriers."""
    distributed.sync("clean_output:before")
    kept = _clean_output(output) if distributed.is_primary() else []
    distributed.sync("clean_output:after")
    return kept


def _clean_output(output: str) -> list[str]:
    manifest = outputs.Manifest.load(output)
    if manifest is None:
        return []
    kept = outputs.remove_listed(manifest)
    if kept:
        logger.info("%s: kept %s (they hold files asyncfl did not write, or lie behind a symbolic link)", output,
                    ", ".join(kept))
    return kept


def _start_writing(cfg: ExperimentConfig, decision: str, config: dict[str, Any]) -> outputs.Manifest:
    """The manifest of a run about to write to ``cfg.output`` (after its data were loaded): with "overwrite" the
    listed earlier results are deleted first; orphaned temporary files of a killed write are deleted; with
    "continue" the results already there (of this same configuration) are adopted into the manifest."""
    out = cfg.output
    previous = outputs.Manifest.load(out)
    if decision == "overwrite":
        logger.info("--overwrite: deleting the earlier results listed in %s", os.path.join(out, outputs.MANIFEST_NAME))
        _clean_output(out)
        previous = None
    if previous is not None:
        outputs.remove_orphans_of(previous)
    outputs.remove_orphan_temporaries(out, (*OUTPUT_FILES, outputs.MANIFEST_NAME))
    manifest = outputs.Manifest(out, previous.entries if decision == "continue" and previous else {},
                                _comparable(config))
    if decision == "continue":
        for target in run_targets(cfg):
            path = os.path.join(out, *target.split("/"))
            if os.path.lexists(path):
                manifest.entries.setdefault(target, "checkpoints" if target.startswith("checkpoints/") else "file")
                if "/" in target:
                    manifest.entries.setdefault(target.split("/")[0], "folder")
    manifest.write()
    return manifest


def new_output(cfg: ExperimentConfig) -> str:
    """A new results folder ``runs/<algorithms>-<YYYYmmdd-HHMMSS>`` for ``cfg`` (which names none), made now and
    logged; a run over several processes must name its folder (each process would pick its own)."""
    if distributed.process_count() > 1:
        raise ConfigError("a run over several processes needs an output folder (--out DIR, the same in every "
                          "process): each process would otherwise make its own runs/<algorithm>-<time>")
    folder = outputs.new_output_folder([run.name for run in cfg.runs])
    logger.info("writing to the new folder %s", folder)
    return folder


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
    finishes, saves its History there (and deletes its checkpoint). ``resume=True``
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
    if not write:
        return _run_all(cfg, None, False, progress, plot, None, False, callbacks)
    if cfg.output is None:
        cfg = dataclasses.replace(cfg, output=new_output(cfg))
    check_output_paths(cfg)
    with outputs.OutputLock(cfg.output) if files else contextlib.nullcontext():  # process 0 holds the lock
        decision = distributed.from_primary(  # process 0 decides (it holds the lock); the others follow it
            lambda: decide_output(cfg, overwrite=overwrite, resume=resume, check_lock=files),
            ("new", "continue", "overwrite"))
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
        manifest = _start_writing(cfg, decision, config)
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
        if manifest is not None and decision != "continue" and not histories and not _holds_results(manifest):
            with contextlib.suppress(OSError):  # the error that stopped the run is the one to report
                outputs.remove_listed(manifest)  # a failed start: the folder goes back to holding no run
            logger.info("%s: the run did not start; the files it had written there were removed", cfg.output)
        raise


def _holds_results(manifest: outputs.Manifest) -> bool:
    """Whether the output folder of ``manifest`` holds something worth keeping after a failure: a checkpoint or the
    History of a finished run in one of the listed checkpoint folders (what ``--resume`` continues from)."""
    for name, kind in manifest.entries.items():
        if kind == "checkpoints":
            folder = os.path.join(manifest.root, *name.split("/"))
            if any(os.path.lexists(os.path.join(folder, f)) for f in (checkpoint.RECORD, "history.json")):
                return True
    return False


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
        meta = {"config": _comparable(config), "run": run.name}
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
