"""Writing a run's output folder: starting it (:func:`start_writing`: the manifest, with the earlier results deleted
on ``--overwrite``), the schedule files, cleaning it (:func:`clean_output`), and a new folder for a run that names
none (:func:`new_output`)."""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from asyncfl_jax import checkpoint, distributed
from asyncfl_jax.config import ConfigError, ExperimentConfig, RunConfig
from asyncfl_jax.outputs.manifest import (MANIFEST_NAME, Manifest, remove_listed, remove_orphan_temporaries,
                                          remove_orphans_of)
from asyncfl_jax.outputs.paths import check_label, new_output_folder, path_inside
from asyncfl_jax.outputs.status import OUTPUT_FILES, comparable, run_targets
from asyncfl_jax.results.history import History
from asyncfl_jax.timing.schedule import Schedule

logger = logging.getLogger(__name__)


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
    manifest = Manifest.load(output)
    if manifest is None:
        return []
    kept = remove_listed(manifest)
    if kept:
        logger.info("%s: kept %s (they hold files asyncfl did not write, or lie behind a symbolic link)", output,
                    ", ".join(kept))
    return kept


def start_writing(cfg: ExperimentConfig, decision: str, config: dict[str, Any]) -> Manifest:
    """The manifest of a run about to write to ``cfg.output`` (after its data were loaded): with "overwrite" the
    listed earlier results are deleted first; orphaned temporary files of a killed write are deleted; with
    "continue" the results already there (of this same configuration) are adopted into the manifest."""
    out = cfg.output
    previous = Manifest.load(out)
    if decision == "overwrite":
        logger.info("--overwrite: deleting the earlier results listed in %s", os.path.join(out, MANIFEST_NAME))
        _clean_output(out)
        previous = None
    if previous is not None:
        remove_orphans_of(previous)
    remove_orphan_temporaries(out, (*OUTPUT_FILES, MANIFEST_NAME))
    manifest = Manifest(out, previous.entries if decision == "continue" and previous else {},
                                comparable(config))
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
    folder = new_output_folder([run.name for run in cfg.runs])
    logger.info("writing to the new folder %s", folder)
    return folder


def holds_results(manifest: Manifest) -> bool:
    """Whether the output folder of ``manifest`` holds something worth keeping after a failure: a checkpoint or the
    History of a finished run in one of the listed checkpoint folders (what ``--resume`` continues from)."""
    for name, kind in manifest.entries.items():
        if kind == "checkpoints":
            folder = os.path.join(manifest.root, *name.split("/"))
            if any(os.path.lexists(os.path.join(folder, f)) for f in (checkpoint.RECORD, "history.json")):
                return True
    return False


def save_schedules(cfg: ExperimentConfig, run: RunConfig, schedules: Sequence[Schedule],
                   manifest: Manifest | None = None) -> None:
    """Writes one schedule per seed to ``<output>/schedules/<run>-seed<s>.npz`` (listed first in ``manifest``, when
    given; the paths are checked to stay inside the output folder)."""
    for seed, schedule in zip(cfg.seeds, schedules):
        _save_schedule(cfg, f"{run.name}-seed{seed}.npz", schedule, manifest)


def _save_schedule(cfg: ExperimentConfig, name: str, schedule: Schedule, manifest: Manifest | None) -> None:
    relative = f"schedules/{check_label(name, 'a schedule file name')}"
    path = (manifest.add(relative)[0] if manifest is not None
            else path_inside(cfg.output, relative))
    schedule.save(path)


def save_realized_schedules(cfg: ExperimentConfig, run: RunConfig, history: History,
                            manifest: Manifest | None = None) -> None:
    """The schedules a clocked run went through: one per seed, or with a hyper-parameter sweep (whose points go
    through different events) one per replica, ``<run>-seed<s>-replica<r>.npz``."""
    schedules = history.realized_schedules
    if len(schedules) == len(cfg.seeds):
        save_schedules(cfg, run, schedules, manifest)
        return
    for r, (seed, schedule) in enumerate(zip(history.seeds, schedules)):
        _save_schedule(cfg, f"{run.name}-seed{seed}-replica{r}.npz", schedule, manifest)
