"""The output folder of ``asyncfl run --out DIR`` (and :func:`~asyncfl_jax.experiment.run_config`), all in this
package: deciding once whether a run may write there (:mod:`~asyncfl_jax.outputs.status`: :func:`output_decision`,
confirmed under the lock by :meth:`OutputDecision.confirm`),
writing it (:mod:`~asyncfl_jax.outputs.writing`, and the result files of :mod:`asyncfl_jax.results.writing`), its
manifest (:mod:`~asyncfl_jax.outputs.manifest`), its lock (:mod:`~asyncfl_jax.outputs.lock`), the paths inside it
(:mod:`~asyncfl_jax.outputs.paths`) and atomic files (:mod:`~asyncfl_jax.outputs.atomic`). Own files only.

Three guarantees:

* **A lock** (:class:`OutputLock`): while a run writes ``DIR`` it holds ``DIR/.asyncfl.lock``, a file naming its pid,
  host and start time, locked with ``fcntl.flock`` (the kernel releases the lock when the process dies, however it
  dies). A second process on the same folder is refused (:class:`OutputLockedError`, a ``ConfigError``: exit code 2)
  with the pid holding it. A lock file that nobody holds (its process was killed) is stale: it is taken over with a
  log message, unless it names another process that is still alive on this host, or a process of another host (whose
  life cannot be checked from here); those are refused too, and the message says which file to delete if that process
  is not an asyncfl run. The lock file is deleted when the run ends, on every exit path.
* **A manifest** (:class:`Manifest`, ``DIR/manifest.json``): every file and folder this package writes in ``DIR``,
  listed *before* it is written (a write-ahead list: a path listed but never written is harmless, a written path is
  always listed), replaced atomically at each addition. ``--overwrite`` deletes only what the manifest lists
  (:func:`remove_listed`), never follows a symbolic link (a listed path that is a link is unlinked itself, a folder
  behind a link is never entered), and never deletes a file that no manifest lists, even one named ``config.json``:
  when such a file stands where the run would write (:func:`unlisted_targets`), the run is refused instead.
* **Paths inside DIR**: run labels (which name files and folders) are checked (:func:`check_label`) and every path
  is built with :func:`path_inside`, which refuses a path that leaves ``DIR`` or passes through a symbolic link
  below it.

Temporary files of atomic writes (``.tmp-<8 characters><name>``, see :func:`~asyncfl_jax.outputs.atomic.atomic_file`)
left by a killed write next to a listed file are removed at the next start (:func:`remove_orphan_temporaries`).
"""


from typing import Any

from asyncfl_jax.outputs import atomic
from asyncfl_jax.outputs.atomic import atomic_file, save_figure, write_atomic
from asyncfl_jax.outputs.lock import (LOCK_NAME, OutputLock, OutputLockedError, live_holder, read_lock,
                                      refuse_if_locked)
from asyncfl_jax.outputs.manifest import (KINDS, MANIFEST_FORMAT, MANIFEST_NAME, Manifest, bookkeeping_only,
                                          remove_listed, remove_orphan_temporaries, remove_orphans_of,
                                          unlisted_targets)
from asyncfl_jax.outputs.paths import (LABEL_MAX_BYTES, RUNS_FOLDER, check_label, check_labels, check_output_name,
                                       checkpoint_dir_for, new_output_folder, path_inside, relative_parts)
# status and writing read the configuration (asyncfl_jax.config), which imports the engine, which imports this
# package: they are imported on first use (PEP 562), so that importing the output folder's package never needs them.
_LAZY = {
    "status": ("DECISIONS", "OUTPUT_FILES", "SHOWN_DIFFERENCES", "OutputDecision", "OutputStatus",
               "check_output_paths", "check_saved_runs", "check_unchanged", "comparable", "config_differences",
               "decide_output", "describe_differences", "folder_state", "output_decision", "output_status",
               "resolved_dict", "run_targets", "saved_configurations"),
    "writing": ("clean_output", "holds_results", "new_output", "save_realized_schedules", "save_schedules",
                "start_writing"),
}


def __getattr__(name: str) -> Any:
    import importlib

    for module, names in _LAZY.items():
        if name in names or name == module:
            loaded = importlib.import_module(f"asyncfl_jax.outputs.{module}")
            return loaded if name == module else getattr(loaded, name)
    raise AttributeError(f"module 'asyncfl_jax.outputs' has no attribute {name!r}")


__all__ = [
    "DECISIONS", "KINDS", "LABEL_MAX_BYTES", "LOCK_NAME", "MANIFEST_FORMAT", "MANIFEST_NAME", "OUTPUT_FILES",
    "RUNS_FOLDER", "SHOWN_DIFFERENCES", "Manifest", "OutputDecision", "OutputLock", "OutputLockedError",
    "OutputStatus", "atomic", "atomic_file", "bookkeeping_only", "check_label", "check_labels", "check_output_name",
    "check_output_paths", "check_saved_runs", "check_unchanged", "checkpoint_dir_for", "clean_output", "comparable",
    "config_differences", "decide_output", "describe_differences", "folder_state", "holds_results", "live_holder",
    "new_output", "new_output_folder", "output_decision", "output_status", "path_inside", "read_lock",
    "refuse_if_locked", "relative_parts", "remove_listed", "remove_orphan_temporaries", "remove_orphans_of",
    "resolved_dict", "run_targets", "save_figure", "save_realized_schedules", "save_schedules",
    "saved_configurations", "start_writing", "unlisted_targets", "write_atomic",
]
