"""What an output folder holds and whether a run may write there (:func:`decide_output`): a new start, the
continuation of the same configuration (``--resume``), or starting over (``--overwrite``); read-only."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import stat
from typing import Any, Sequence

from asyncfl_jax import checkpoint
from asyncfl_jax.config import ConfigError, ExperimentConfig, resolve, validate
from asyncfl_jax.outputs.lock import LOCK_NAME, refuse_if_locked
from asyncfl_jax.outputs.manifest import MANIFEST_NAME, Manifest, bookkeeping_only, unlisted_targets
from asyncfl_jax.outputs.paths import check_labels, check_output_name, checkpoint_dir_for
from asyncfl_jax.results.history_files import load_history


def comparable(config: dict[str, Any]) -> dict[str, Any]:
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
    if bookkeeping_only(out):  # empty, or what a run killed during its first write leaves
        return OutputStatus("new")
    try:
        with open(os.path.join(out, "config.json")) as f:
            saved = json.load(f)
    except (OSError, json.JSONDecodeError):
        return OutputStatus("foreign")
    if not isinstance(saved, dict):
        return OutputStatus("foreign")
    differences = config_differences(comparable(resolved_dict(saved)), comparable(resolved_dict(cfg.to_dict())))
    if differences:
        return OutputStatus("different", tuple(differences))
    return OutputStatus("finished" if os.path.exists(os.path.join(out, "summary.json")) else "unfinished")


def resolved_dict(config: dict[str, Any]) -> dict[str, Any]:
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
    check_output_name(cfg.output)
    check_labels([run.name for run in cfg.runs])


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
        manifest = Manifest.load(output)
        if manifest is not None and manifest.config is not None:
            found.append((MANIFEST_NAME, manifest.config))
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
    current = comparable(cfg.to_dict())
    for source, saved in saved_configurations(cfg.output):
        differences = config_differences(comparable(resolved_dict(saved)), current)
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
    meta_config = comparable(cfg.to_dict())
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


DECISIONS = ("new", "continue", "overwrite")
"""What writing a configuration to its output folder may do (:attr:`OutputDecision.kind`)."""

WRITTEN_FOLDERS = ("schedules", "checkpoints", "client_metrics", "trajectory")
"""The folders a run writes inside its output folder, whose content a decision reads (:func:`folder_state`)."""


def folder_state(out: str) -> tuple | None:
    """What :func:`output_decision` reads of the folder ``out``, to tell later whether it changed: the type, size,
    inode and modification time of each entry at its top level and inside :data:`WRITTEN_FOLDERS` (symbolic links
    below it not followed), the lock file apart (taking the lock writes it). Another file at the top level counts by
    its name and type alone (its content is not the decision's: a log the command itself writes there, ``asyncfl run
    ... > DIR/log.txt``, changes nothing). A missing folder and an empty one read alike (taking the lock makes the
    folder); a path that is not a folder is ``None``."""
    if not os.path.lexists(out):
        return ()
    if not os.path.isdir(out):
        return None
    entries = []
    for folder, names, files in os.walk(out):
        relative = os.path.relpath(folder, out)
        for name in (*names, *files):
            if relative == "." and name == LOCK_NAME:
                continue
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(folder, name))
                if relative == "." and name not in (*OUTPUT_FILES, MANIFEST_NAME, *WRITTEN_FOLDERS):
                    entries.append((name, stat.S_IFMT(st.st_mode)))  # someone else's: its name and type
                    continue
                entries.append((os.path.normpath(os.path.join(relative, name)), st.st_mode, st.st_size, st.st_ino,
                                st.st_mtime_ns))
        if relative == ".":  # a folder of someone else: only its own entry counts
            names[:] = [name for name in names if name in WRITTEN_FOLDERS]
    return tuple(sorted(entries))


@dataclasses.dataclass(frozen=True)
class OutputDecision:
    """What writing a configuration to its output folder does, decided once by :func:`output_decision` before anything
    is loaded or compiled: ``kind`` (one of :data:`DECISIONS`) for the folder ``output`` as it was then (``seen``,
    :func:`folder_state`; ``None`` in the processes of a multi-process run other than process 0, which follow its
    decision and never judge the folder) and the resolved configuration ``config`` (:func:`comparable`).

    Under the folder's lock, :meth:`confirm` does not decide again: it checks that the folder and the configuration
    are still those decided for."""

    output: str
    kind: str
    config: dict[str, Any]
    seen: tuple | None

    def confirm(self, cfg: ExperimentConfig) -> str:
        """:attr:`kind`, once the folder is found as it was when decided; a ``ConfigError`` when it changed since (a
        file added, removed or rewritten by someone else), a ``ValueError`` for a decision taken for another
        configuration or folder."""
        if cfg.output is None or os.path.normpath(cfg.output) != os.path.normpath(self.output):
            raise ValueError(f"this output decision was taken for {self.output!r}, not for {cfg.output!r}")
        if comparable(cfg.to_dict()) != self.config:
            raise ValueError(f"this output decision for {self.output!r} was taken for another configuration: "
                             + describe_differences(config_differences(self.config, comparable(cfg.to_dict()))))
        if self.seen is None:
            raise ValueError("a decision followed from process 0 is confirmed by process 0 alone")
        if folder_state(self.output) != self.seen:
            raise ConfigError(f"{self.output} changed after asyncfl checked it (a file there was added, removed or "
                              "rewritten by another program): nothing was written; run the command again, which "
                              "looks at the folder anew")
        return self.kind


def output_decision(cfg: ExperimentConfig, overwrite: bool = False, resume: bool = False, check_lock: bool = True,
                    continue_unfinished: bool = False) -> OutputDecision:
    """The one decision of what writing ``cfg`` (resolved) to ``cfg.output`` does (read-only), taken before anything
    is loaded (:func:`decide_output` says the rules); ``continue_unfinished`` (``asyncfl run`` without ``--resume``):
    a folder holding an unfinished run of this configuration is continued as with ``resume``. The folder's state is
    read first, so that a change while it is judged is caught by :meth:`OutputDecision.confirm` too."""
    check_output_paths(cfg)
    seen = folder_state(cfg.output)
    status = output_status(cfg)
    if continue_unfinished and not overwrite and not resume:
        resume = status.kind == "unfinished"
    kind = _decide(cfg, status, overwrite, resume, check_lock)
    return OutputDecision(cfg.output, kind, comparable(cfg.to_dict()), seen)


def decide_output(cfg: ExperimentConfig, overwrite: bool = False, resume: bool = False, check_lock: bool = True) -> str:
    """The kind of :func:`output_decision`, whose rules are these: what writing ``cfg`` to ``cfg.output`` does, or a
    ``ConfigError`` saying why it cannot (read-only):

    * "new": the folder is missing, empty, or holds only this package's bookkeeping (the lock file, the manifest,
      temporary files of a run killed during its first write);
    * "continue" (``resume``): the folder holds results of this very configuration, checked against
      ``config.json`` and against every saved record (:func:`check_unchanged`);
    * "overwrite" (``overwrite``): what the folder's manifest lists will be deleted, once the new run's data are
      loaded; refused when a file the run would write exists without being listed (a file of someone else).

    A folder locked by a live run is refused (:class:`~asyncfl_jax.outputs.OutputLockedError`), as is one that holds
    an unfinished run (unless ``resume``), finished or different results, or files of someone else (unless
    ``overwrite``)."""
    return output_decision(cfg, overwrite=overwrite, resume=resume, check_lock=check_lock).kind


def _decide(cfg: ExperimentConfig, status: OutputStatus, overwrite: bool, resume: bool, check_lock: bool) -> str:
    """The rules of :func:`decide_output` (``cfg``'s paths checked; ``status``: what its folder holds, read once)."""
    out = cfg.output
    if status.kind == "not_a_folder":
        raise ConfigError(f"invalid option --out = {out!r}: it exists and is not a folder")
    if check_lock:  # (the processes of a multi-process run other than process 0, which holds the lock, do not)
        refuse_if_locked(out)
    if status.kind == "new":
        return "new"
    manifest = Manifest.load(out)  # an unreadable or edited manifest is refused, whatever comes next
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
        clash = unlisted_targets(out, manifest, run_targets(cfg))
        if clash:
            raise ConfigError(
                f"--overwrite deletes only what asyncfl listed in {os.path.join(out, MANIFEST_NAME)}, and "
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
