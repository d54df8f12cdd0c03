"""From a validated :class:`~asyncfl_jax.config.ExperimentConfig` to Histories: the path the CLI takes.

Each step is a public function so the same experiment is a few calls from Python::

    cfg = ExperimentConfig()                       # or ExperimentConfig.from_json(...)
    validate(cfg)
    task = build_task(cfg)
    for run in cfg.runs:
        schedules = build_schedules(cfg, run)      # one per seed (timing has its own RNG stream)
        history = run_experiment(cfg, run, task, schedules)
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ExperimentConfig, RunConfig, validate
from asyncfl_jax.data.partition import partition as split_clients
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.models.core import make_model
from asyncfl_jax.results import History, write_results
from asyncfl_jax.task import Task, make_task
from asyncfl_jax.timing.protocols import make_schedule
from asyncfl_jax.timing.schedule import Schedule


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
    from asyncfl_jax.data.idx import load_fashion_mnist, load_mnist

    return (load_fashion_mnist if d.name == "fashion_mnist" else load_mnist)(d.path)


def partition_dataset(cfg: ExperimentConfig, dataset: Dataset) -> list[np.ndarray]:
    d = cfg.data
    if d.partition == "natural":
        assert dataset.natural_partition is not None
        return list(dataset.natural_partition)
    options = {
        "iid": {},
        "dirichlet": {"alpha": d.dirichlet_alpha, "min_size": d.min_size},
        "shards": {"shards_per_client": d.shards_per_client},
        "power_law": {"exponent": d.power_law_exponent, "min_size": d.min_size},
    }[d.partition]
    return split_clients(d.partition, dataset.train_y, d.num_clients, d.seed, **options)


def build_task(cfg: ExperimentConfig) -> Task:
    """Loads the dataset, partitions it over the clients and initialises the model."""
    dataset = load_dataset(cfg)
    parts = partition_dataset(cfg, dataset)
    model = make_model(cfg.model.name, dataset.input_shape, dataset.num_classes, cfg.model.seed, cfg.model.hidden)
    return make_task(dataset, parts, model, seed=cfg.data.seed)


def build_schedules(cfg: ExperimentConfig, run: RunConfig) -> list[Schedule]:
    """One schedule per seed: the timing seed of replica seed ``s`` is ``s``; or the recorded ``schedule_files``."""
    p = run.protocol
    n = cfg.data.num_clients
    if run.schedule_files is not None:
        recorded = [Schedule.load(path) for path in run.schedule_files]
        if run.steps is None and run.arrivals is None:
            return _same_widths(recorded)
        steps = [run.steps if run.steps is not None else max(1, run.arrivals // s.buffer_width) for s in recorded]
        return _same_widths([s.truncate(min(k, s.num_steps)) for s, k in zip(recorded, steps)])
    delays = cfg.delay_model()
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


def concurrency(run: RunConfig, num_clients: int) -> int:
    """Clients training at once under the run's protocol (for synchronous rounds: the participants)."""
    p = run.protocol
    if p.name == "concurrent":
        return p.concurrency
    if p.name == "synchronous" and p.participants is not None:
        return p.participants
    return num_clients


def run_experiment(
    cfg: ExperimentConfig, run: RunConfig, task: Task, schedules: Sequence[Schedule], progress: bool = True
) -> History:
    """Simulates one run (all its seeds and swept hyper-parameters as one vmapped program)."""
    algorithm = get_algorithm(run.algorithm, **run.options)
    local = LocalConfig(
        steps=cfg.local.steps,
        batch_size=cfg.local.batch_size,
        epochs=cfg.local.epochs,
        use_momentum=cfg.local.momentum > 0,
    )
    hparams = {**cfg.local.hparams(), **run.hparams}
    if "tau_c" in algorithm.hyperparams and "tau_c" not in run.hparams:
        hparams["tau_c"] = float(concurrency(run, cfg.data.num_clients))  # delay-adaptive ASGD: tau_C = Mc
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
    )


def run_config(cfg: ExperimentConfig, progress: bool = True, write: bool = True, plot: bool = True) -> list[History]:
    """Validates, runs every run of the experiment and (optionally) writes the results to ``cfg.output``."""
    validate(cfg)
    task = build_task(cfg)
    histories = []
    for run in cfg.runs:
        schedules = build_schedules(cfg, run)
        histories.append(run_experiment(cfg, run, task, schedules, progress=progress))
        if write:  # the exact arrival schedules, so the run can be replayed (runs[i].schedule_files)
            for seed, schedule in zip(cfg.seeds, schedules):
                schedule.save(os.path.join(cfg.output, "schedules", f"{run.name}-seed{seed}.npz"))
    if write:
        write_results(cfg.output, cfg.to_dict(), histories, plot=plot)
    return histories
