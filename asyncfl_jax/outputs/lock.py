"""The lock of an output folder (:class:`OutputLock`): one run writes a folder at a time."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from typing import Any, Mapping

from asyncfl_jax.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_NAME = ".asyncfl.lock"


class OutputLockedError(ConfigError):
    """The output folder is locked by another run (or holds a lock file that cannot be proven stale)."""


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
