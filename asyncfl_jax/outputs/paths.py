"""Paths inside the output folder: run labels that can name files (:func:`check_label`), paths that stay inside
the folder and never pass through a symbolic link (:func:`path_inside`), and new folders for runs that name none
(:func:`new_output_folder`)."""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any, Iterable

from asyncfl_jax.errors import ConfigError

if TYPE_CHECKING:
    from asyncfl_jax.config import RunConfig

LABEL_MAX_BYTES = 100  # "<label>-seed<s>-replica<r>.npz" stays well below the usual 255-byte name limit


def check_label(label: Any, option: str) -> str:
    """``label`` if it can name a file or folder inside the output folder, else a ``ConfigError`` naming ``option``.

    Allowed: a non-empty string of at most :data:`LABEL_MAX_BYTES` UTF-8 bytes, without a path separator (``/`` or
    ``\\``), a NUL or another control character, that does not start with a dot (which also rules out ``.`` and
    ``..``, hidden files and this package's temporary ``.tmp-`` files)."""
    if not isinstance(label, str) or not label:
        raise ConfigError(f"invalid option {option} = {label!r}: a run label must be a non-empty string")
    bad = sorted({c for c in label if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ConfigError(f"invalid option {option} = {label!r}: a run label names files and folders inside --out, so "
                          f"it cannot hold {shown} (no path separators or control characters)")
    if label.startswith("."):
        raise ConfigError(f"invalid option {option} = {label!r}: a run label cannot start with '.'")
    if len(label.encode("utf-8", "surrogatepass")) > LABEL_MAX_BYTES:
        raise ConfigError(f"invalid option {option} = {label!r}: at most {LABEL_MAX_BYTES} bytes (it names files)")
    return label


def check_labels(labels: Iterable[str], option: str = "runs[{i}].label") -> None:
    """Every run label passes :func:`check_label` and no two differ only in case (a case-insensitive file system
    would give them the same files)."""
    seen: dict[str, str] = {}
    for i, label in enumerate(labels):
        check_label(label, option.format(i=i))
        other = seen.setdefault(label.casefold(), label)
        if other != label:
            raise ConfigError(f"invalid option {option.format(i=i)} = {label!r}: it differs from the label {other!r} "
                              "only in case, and they would share files on a case-insensitive file system")


def check_output_name(output: Any) -> str:
    """``output`` if it can name the output folder: a non-empty string without NUL characters."""
    if not isinstance(output, str) or not output.strip():
        raise ConfigError(f"invalid option output = {output!r}: must name a folder (an empty --out would write into "
                          "the current folder)")
    if "\0" in output:
        raise ConfigError(f"invalid option output = {output!r}: a folder name cannot hold a NUL character")
    return output


def relative_parts(relative: str) -> list[str]:
    """The components of a ``/``-separated path relative to the output folder; ``ConfigError`` for an absolute
    path, an empty one, or one with ``.``, ``..``, ``\\`` or NUL components."""
    parts = relative.split("/") if isinstance(relative, str) else []
    if (not parts or relative.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts)):
        raise ConfigError(f"the path {relative!r} does not stay inside the output folder")
    return parts


def path_inside(root: str, relative: str) -> str:
    """``root/relative`` after checking that ``relative`` (``/``-separated) stays inside ``root``: no absolute path,
    no ``..``, and no symbolic link among the existing components below ``root`` (writing through one would write
    outside the folder)."""
    parts = relative_parts(relative)
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        if i < len(parts) - 1 and os.path.islink(path):
            raise ConfigError(f"{path} is a symbolic link: asyncfl writes only inside the output folder {root}, so "
                              "it does not write through links there; remove the link or choose another --out")
    return path


RUNS_FOLDER = "runs"
"""Where a run without an output folder (``asyncfl run`` without ``--out``, ``output: null``) writes:
``runs/<algorithms>-<YYYYmmdd-HHMMSS>``, a new folder each time (:func:`new_output_folder`)."""


def new_output_folder(names: Iterable[str], parent: str = RUNS_FOLDER, now: datetime.datetime | None = None) -> str:
    """Creates and returns a new folder ``parent/<names>-<YYYYmmdd-HHMMSS>`` for one run of an experiment whose runs
    are ``names`` (at most three named, then ``etc``), local time. Two runs started within the same second get
    ``...-2``, ``...-3``: the folder is made with ``exist_ok=False``, so even two processes never share one."""
    names = list(dict.fromkeys(names))
    stem = "-".join(names[:3] + (["etc"] if len(names) > 3 else [])) or "run"
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    os.makedirs(parent, exist_ok=True)
    for attempt in range(1, 10_000):
        path = os.path.join(parent, f"{stem}-{stamp}" + (f"-{attempt}" if attempt > 1 else ""))
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise ConfigError(f"cannot make a new output folder in {parent} for {stem}-{stamp}: give one with --out")


def checkpoint_dir_for(output: str, run: RunConfig) -> str:
    """Where a run of an experiment written to ``output`` keeps its checkpoint and, once finished, its History."""
    return path_inside(output, f"checkpoints/{check_label(run.name, 'run label')}")
