"""The output folder of ``asyncfl run --out DIR`` (and :func:`~asyncfl_jax.experiment.run_config`): own files only.

Three guarantees, each a small piece of this module:

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

Temporary files of atomic writes (``.tmp-<8 characters><name>``, see :func:`asyncfl_jax.atomic.atomic_file`) left by
a killed write next to a listed file are removed at the next start (:func:`remove_orphan_temporaries`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import re
import socket
from typing import Any, Iterable, Mapping

from asyncfl_jax.config import ConfigError

logger = logging.getLogger(__name__)

LOCK_NAME = ".asyncfl.lock"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# the kinds of manifest entries: a file; a folder (removed only when empty); a checkpoint folder (its checkpoint
# files, see asyncfl_jax.checkpoint.OWNED, and its saved History are removed, then the folder when empty)
KINDS = ("file", "folder", "checkpoints")
LABEL_MAX_BYTES = 100  # "<label>-seed<s>-replica<r>.npz" stays well below the usual 255-byte name limit
_TEMPORARY = re.compile(r"\.tmp-[a-z0-9_]{8}(?P<name>.+)")  # tempfile.mkstemp(prefix=".tmp-", suffix=name)
_SCHEDULE_TEMPORARY = re.compile(r"tmp[a-z0-9_]{8}\.npz\.tmp")  # Schedule.save's, in the listed schedules/ folder


class OutputLockedError(ConfigError):
    """The output folder is locked by another run (or holds a lock file that cannot be proven stale)."""


# ---------------------------------------------------------------------------------------------------- paths
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


def _relative_parts(relative: str) -> list[str]:
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
    parts = _relative_parts(relative)
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        if i < len(parts) - 1 and os.path.islink(path):
            raise ConfigError(f"{path} is a symbolic link: asyncfl writes only inside the output folder {root}, so "
                              "it does not write through links there; remove the link or choose another --out")
    return path


# ---------------------------------------------------------------------------------------------------- lock
def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def read_lock(output: str) -> dict[str, Any] | None:
    """The content of ``output``'s lock file (pid, host, started), ``{}`` when unreadable, None without one."""
    try:
        with open(os.path.join(output, LOCK_NAME)) as f:
            content = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _holder_text(holder: Mapping[str, Any]) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
            f"{holder.get('started', 'at an unknown time')}")


def live_holder(holder: Mapping[str, Any] | None) -> bool:
    """Whether a lock file's content names a process that may still run: alive on this host, or of another host.
    An unreadable content counts as stale (it is only ever half-written by a process killed while creating it)."""
    if not holder or not isinstance(holder.get("pid"), int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    return holder["pid"] != os.getpid() and _pid_alive(holder["pid"])


def refuse_if_locked(output: str) -> None:
    """A read-only look at ``output``'s lock file: :class:`OutputLockedError` when it names a live process (the check
    :class:`OutputLock` makes for real, under the lock, before anything is written)."""
    holder = read_lock(output)
    if live_holder(holder):
        raise OutputLockedError(_locked_message(output, holder))


def _locked_message(output: str, holder: Mapping[str, Any]) -> str:
    return (f"{output} is in use by another asyncfl run ({_holder_text(holder)}): wait for it to end or choose another "
            f"--out; if no asyncfl process with that pid runs there, delete {os.path.join(output, LOCK_NAME)}")


class OutputLock:
    """Holds ``output``'s lock while a run writes there (a context manager; :meth:`release` on every exit path).

    Acquiring creates ``output`` (and its missing parents) when needed, opens ``output/.asyncfl.lock`` and locks it
    with ``fcntl.flock`` (non-blocking). The lock is refused (:class:`OutputLockedError`) when another process holds
    the flock, or when the file, though not locked, names a live process (see :func:`live_holder`). A file that nobody
    holds and that names a dead process of this host is stale: taken over, with an INFO log message. The file then
    holds this process's pid, host and start time. :meth:`release` deletes the file and the folders that acquiring
    created, when they are empty again (a refused or failed start leaves no trace).
    """

    def __init__(self, output: str) -> None:
        self.output = output
        self.path = os.path.join(output, LOCK_NAME)
        self.fd: int | None = None
        self.created: list[str] = []  # folders created to hold the lock, deepest first

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _make_folders(self) -> None:
        missing, path = [], os.path.abspath(self.output)
        while not os.path.lexists(path):
            missing.append(path)
            path = os.path.dirname(path)
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                continue
            self.created.insert(0, folder)
        if not os.path.isdir(self.output):
            raise ConfigError(f"invalid option --out = {self.output!r}: it exists and is not a folder")

    def acquire(self) -> None:
        self._make_folders()
        try:
            while True:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    os.close(fd)
                    if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                    raise OutputLockedError(_locked_message(self.output, read_lock(self.output) or {})) from None
                try:  # the file may have been deleted by its releasing holder between our open and flock
                    same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            holder = read_lock(self.output)
            if live_holder(holder):
                os.close(fd)
                raise OutputLockedError(_locked_message(self.output, holder))
            if holder is not None and holder != {} and holder.get("pid") != os.getpid():
                logger.info("%s: taking over a stale lock (%s: no such process any more)", self.output,
                            _holder_text(holder))
            content = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                                      timespec="seconds")}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, content, 0)
            self.fd = fd
        except BaseException:
            self._remove_created()
            raise

    def release(self) -> None:
        """Deletes the lock file (before unlocking it, so that no one locks a file about to vanish) and the folders
        that :meth:`acquire` created, if they are empty."""
        if self.fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self.fd)
            self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self.created:
            with contextlib.suppress(OSError):  # only when empty
                os.rmdir(folder)
        self.created = []


# ---------------------------------------------------------------------------------------------------- manifest
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
                _relative_parts(name)
            except ConfigError:
                raise ConfigError(f"the manifest {path} lists {name!r}, which is not a path inside {root}; it was "
                                  "edited, so asyncfl deletes nothing in the folder: choose another --out") from None
        return cls(root, entries, raw.get("config"))

    def write(self) -> None:
        """Replaces ``manifest.json`` atomically."""
        from asyncfl_jax.results import write_atomic

        body = {"format": MANIFEST_FORMAT, "written_by": "asyncfl_jax", "config": self.config,
                "entries": dict(sorted(self.entries.items()))}
        write_atomic(self.path, json.dumps(body, indent=1) + "\n")

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
    from asyncfl_jax.results import remove_history

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
