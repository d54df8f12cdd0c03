"""Ctrl-C and SIGTERM in the ``asyncfl`` command outside the simulation loop (start-up: imports, data, compile).

Inside the loop the :class:`~asyncfl_jax.engine.callbacks.Checkpoints` callback owns the signals (the current chunk
finishes and is saved). Outside it, the command installs :func:`handlers`: a signal is recorded and, unless it arrives
inside a :func:`held` block, raised at once in the main thread as :class:`Interrupted` (a ``KeyboardInterrupt``) so
that a long phase of Python code (data generation, schedules) stops within a moment. Inside :func:`held` it is only
recorded and raised when the block ends: the package's own imports are held, because an interrupt raised while a
C extension initialises leaves it half loaded (an ``ImportError`` traceback, or an interrupt that its import
machinery swallows so that the run goes on).

The command ends an interrupted process with :func:`exit_now`, which flushes the standard streams and leaves without
the interpreter's finalization: an interrupt that cut a call of the XLA runtime short can otherwise crash the
interpreter's teardown (a segmentation fault, exit 139, after the "interrupted" message).

Only the standard library is used here, so that the package can install the handlers before it imports JAX.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM received by the ``asyncfl`` command outside the simulation loop.

    ``exit_code``: the conventional ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_pending: list[int] = []
_depth = 0
_previous: dict[int, Any] = {}


def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
    if not _pending:
        _pending.append(int(signum))
    if _depth == 0:
        raise Interrupted(_pending.pop())


def handlers_installed() -> bool:
    return signal.getsignal(signal.SIGINT) is _on_signal


def install() -> bool:
    """Installs the recording handlers for SIGINT and SIGTERM (main thread only; returns whether it did). A signal
    that the process inherited as ignored (``SIG_IGN``, e.g. SIGINT of a background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN and current is not _on_signal:
            _previous[signum] = current
            signal.signal(signum, _on_signal)
    return True


def uninstall() -> None:
    """Gives SIGINT and SIGTERM back the handlers they had before :func:`install` (by default ``KeyboardInterrupt``
    and termination) and forgets a recorded signal."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) is _on_signal:
            previous = _previous.pop(signum, default)
            signal.signal(signum, default if previous is None else previous)
    _pending.clear()


def hold() -> None:
    """Starts a held section (see :func:`held`); :func:`release` ends it."""
    global _depth
    _depth += 1


def release(check_now: bool = True) -> None:
    """Ends a held section; with ``check_now`` a signal recorded during it is raised (:func:`check`)."""
    global _depth
    _depth = max(0, _depth - 1)
    if check_now and _depth == 0:
        check()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Signals received inside the block are raised when it ends (as :class:`Interrupted`), not inside it."""
    hold()
    try:
        yield
    finally:
        release(check_now=False)
    check()


def check() -> None:
    """Raises :class:`Interrupted` when a signal was recorded and not raised yet."""
    if _pending and _depth == 0:
        raise Interrupted(_pending.pop())


def pending() -> int | None:
    """The recorded signal not raised yet, or None."""
    return _pending[0] if _pending else None


_import_hold = False


def hold_imports() -> None:
    """In the ``asyncfl`` process only: installs the handlers and holds signals while the package imports, until the
    command starts (:func:`release_imports`)."""
    global _import_hold
    if not _import_hold and is_cli_process() and install():
        _import_hold = True
        hold()


def release_imports() -> None:
    """Ends the hold of :func:`hold_imports` (without raising: the command calls :func:`check` itself)."""
    global _import_hold
    if _import_hold:
        _import_hold = False
        release(check_now=False)


def is_cli_process() -> bool:
    """Whether this interpreter was started as the ``asyncfl`` command (the console script, or
    ``python -m asyncfl_jax.cli``), so that the package may own its signals while it imports."""
    argv = list(getattr(sys, "orig_argv", []) or [])
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] == "asyncfl_jax.cli"
    script = sys.argv[0] if sys.argv else ""
    return os.path.basename(script) in ("asyncfl", "asyncfl.exe")


def exit_now(code: int) -> None:
    """Flushes stdout and stderr and ends the process with ``code`` without the interpreter's finalization."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
