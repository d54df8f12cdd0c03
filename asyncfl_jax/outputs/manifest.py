"""The manifest of an output folder (:class:`Manifest`, ``manifest.json``): every file and folder this package writes
there, listed before it is written; deleting what it lists (:func:`remove_listed`) and nothing else; temporary files
of killed writes (:func:`remove_orphan_temporaries`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Iterable, Mapping

from asyncfl_jax.errors import ConfigError
from asyncfl_jax.outputs import atomic
from asyncfl_jax.outputs.lock import LOCK_NAME
from asyncfl_jax.outputs.paths import relative_parts, path_inside

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# the kinds of manifest entries: a file; a folder (removed only when empty); a checkpoint folder (its checkpoint
# files, see asyncfl_jax.checkpoint.OWNED, and its saved History are removed, then the folder when empty)
KINDS = ("file", "folder", "checkpoints")
_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]{8}(?P<name>.+)")  # tempfile.mkstemp(prefix=".tmp-", suffix=name)
_SCHEDULE_TEMPORARY = re.compile(r"tmp[a-z0-9_]{8}\.npz\.tmp")  # Schedule.save's, in the listed schedules/ folder


class Manifest:
    """The list of what this package wrote in an output folder (``manifest.json``): ``entries`` maps a
    ``/``-separated path relative to the folder to its kind (:data:`KINDS`); ``config`` is the configuration the
    folder's results belong to (without ``output``), which a resumed run must still match."""

    def __init__(self, root: str, entries: Mapping[str, str] | None = None, config: Any = None) -> None:
        self.root = root
        self.entries: dict[str, str] = dict(entries or {})
        self.config = config

    @property
    def path(self) -> str:
        return os.path.join(self.root, MANIFEST_NAME)

    @classmethod
    def load(cls, root: str) -> "Manifest | None":
        """The manifest of ``root``; None without one; ``ConfigError`` when it is unreadable or lists a path that
        leaves the folder or an unknown kind (an edited manifest is never trusted to delete anything)."""
        path = os.path.join(root, MANIFEST_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ConfigError(f"the manifest {path} cannot be read ({e}); asyncfl deletes nothing in {root} without "
                              "it: move the folder's files yourself or choose another --out") from None
        entries = raw.get("entries") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT or not isinstance(entries, dict):
            raise ConfigError(f"{path} is not a manifest of format {MANIFEST_FORMAT} written by asyncfl_jax; "
                              "asyncfl deletes nothing in the folder without one: choose another --out")
        for name, kind in entries.items():
            if kind not in KINDS:
                raise ConfigError(f"the manifest {path} lists {name!r} with an unknown kind {kind!r}")
            try:
                relative_parts(name)
            except ConfigError:
                raise ConfigError(f"the manifest {path} lists {name!r}, which is not a path inside {root}; it was "
                                  "edited, so asyncfl deletes nothing in the folder: choose another --out") from None
        return cls(root, entries, raw.get("config"))

    def write(self) -> None:
        """Replaces ``manifest.json`` atomically."""
        body = {"format": MANIFEST_FORMAT, "written_by": "asyncfl_jax", "config": self.config,
                "entries": dict(sorted(self.entries.items()))}
        atomic.write_atomic(self.path, json.dumps(body, indent=1) + "\n")

    def add(self, *relatives: str, kind: str = "file") -> list[str]:
        """Lists ``relatives`` (and their parent folders) before they are written, rewriting the manifest when
        something is new; returns their absolute paths (checked with :func:`path_inside`)."""
        if kind not in KINDS:
            raise ValueError(f"unknown manifest kind {kind!r}")
        paths, changed = [], False
        for relative in relatives:
            paths.append(path_inside(self.root, relative))
            parts = relative.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) not in self.entries:
                    self.entries["/".join(parts[:i])] = "folder"
                    changed = True
            if self.entries.get(relative) != kind:
                self.entries[relative] = kind
                changed = True
        if changed:
            self.write()
        return paths


def _real_parents(root: str, relative: str) -> bool:
    """Whether every folder between ``root`` and ``relative`` is a real folder (no symbolic link)."""
    path = root
    for part in relative.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            if os.path.islink(path) or not os.path.isdir(path):
                return False
        except OSError:
            return False
    return True


def remove_orphan_temporaries(folder: str, names: Iterable[str]) -> list[str]:
    """Deletes the temporary files of atomic writes (``.tmp-XXXXXXXX<name>``) of the given file ``names`` left in
    ``folder`` by a killed write (never a link's target, never another file); returns their names."""
    wanted, removed = set(names), []
    try:
        listing = os.listdir(folder)
    except OSError:
        return removed
    for entry in listing:
        match = _TEMPORARY.fullmatch(entry)
        if match and match["name"] in wanted:
            path = os.path.join(folder, entry)
            if os.path.islink(path) or os.path.isfile(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                removed.append(entry)
    return removed


def remove_orphans_of(manifest: Manifest) -> list[str]:
    """:func:`remove_orphan_temporaries` next to every file the manifest lists (and of the manifest itself)."""
    by_folder: dict[str, set[str]] = {"": {MANIFEST_NAME}}
    for name, kind in manifest.entries.items():
        if kind == "file":
            folder, _, base = name.rpartition("/")
            by_folder.setdefault(folder, set()).add(base)
    removed = []
    schedules = os.path.join(manifest.root, "schedules")
    if manifest.entries.get("schedules") == "folder" and _real_parents(manifest.root, "schedules/x"):
        for entry in (os.listdir(schedules) if os.path.isdir(schedules) else []):
            path = os.path.join(schedules, entry)
            if _SCHEDULE_TEMPORARY.fullmatch(entry) and (os.path.islink(path) or os.path.isfile(path)):
                os.unlink(path)
                removed.append(f"schedules/{entry}")
    for folder, names in by_folder.items():
        if folder and not _real_parents(manifest.root, folder + "/x"):
            continue
        removed += remove_orphan_temporaries(os.path.join(manifest.root, *folder.split("/")) if folder
                                             else manifest.root, names)
    return removed


def remove_listed(manifest: Manifest) -> list[str]:
    """Deletes what ``manifest`` lists, deepest first, and then the manifest itself; returns the listed paths that
    were kept (a folder that still holds files of others, a path below a symbolic link).

    Never follows a link: a listed path that is a link is unlinked itself (its target is untouched); nothing below a
    link is entered; folders are removed only when empty (never ``rmtree``). A checkpoint folder loses its checkpoint
    and History files only (:func:`asyncfl_jax.checkpoint.clear`)."""
    from asyncfl_jax import checkpoint
    from asyncfl_jax.results.history_files import remove_history

    kept = []
    remove_orphans_of(manifest)
    for name in sorted(manifest.entries, key=lambda n: (-n.count("/"), n)):
        kind = manifest.entries[name]
        path = os.path.join(manifest.root, *name.split("/"))
        if not os.path.lexists(path):
            continue
        if not _real_parents(manifest.root, name):
            kept.append(name)
            continue
        if os.path.islink(path) or (kind == "file" and not os.path.isdir(path)):
            os.unlink(path)
            continue
        if not os.path.isdir(path):  # a folder entry replaced by a file of someone else
            kept.append(name)
            continue
        if kind == "checkpoints":
            checkpoint.clear(path)
            remove_history(path)
            remove_orphan_temporaries(path, ("history.json", "history.npz"))
        try:
            os.rmdir(path)
        except OSError:
            kept.append(name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(manifest.path)
    return kept


def unlisted_targets(root: str, manifest: Manifest | None, targets: Iterable[str]) -> list[str]:
    """The ``targets`` (paths relative to ``root`` that a run would write) that exist in ``root`` but that no
    manifest lists: files of someone else, which writing would replace."""
    listed = manifest.entries if manifest is not None else {}
    return [t for t in targets if t not in listed and os.path.lexists(os.path.join(root, *t.split("/")))]


def bookkeeping_only(root: str) -> bool:
    """Whether ``root`` holds nothing but this package's bookkeeping: the lock file, the manifest and temporary files
    of atomic writes (what a run killed during its first write leaves)."""
    for entry in os.listdir(root):
        if entry in (LOCK_NAME, MANIFEST_NAME):
            continue
        match = _TEMPORARY.fullmatch(entry)
        if match and not os.path.isdir(os.path.join(root, entry)):
            continue
        return False
    return True
