"""Ctrl-C and SIGTERM in the ``asyncfl`` command: a signal sets a flag, the command acts on it at safe points.

The handlers that :func:`install` puts in place never raise: a signal is only recorded (:func:`pending`). Python runs a
handler between two bytecodes of whatever the main thread executes, possibly a garbage-collection callback of JAX
(``_xla_gc_callback``) or a ``__del__`` method, where an exception is printed as "Exception ignored in ..." and dropped:
an exception raised by the handler could be lost and the run go on to its end. Instead the command checks the flag
(:func:`check`, which raises :class:`Interrupted`) at points where an exception is safe: between the phases of the
start-up (configuration, data, schedules, each run's preparation and compilation), before and after every chunk of
server steps (:class:`~asyncfl_jax.engine.loop.HostLoop`), before and after every checkpoint save
(:class:`~asyncfl_jax.engine.callbacks.Checkpoints`, which then saves and stops), between runs, and once the command
is done. A recorded signal stays recorded until :func:`uninstall`, so that no later check misses it. A second Ctrl-C
while the first is pending stops the process at once (:func:`exit_now`; the last checkpoint written stays).

Inside a :func:`held` block :func:`check` does nothing, so that the package's own imports are never cut short: an
interrupt raised while a C extension initialises leaves it half loaded.

The command ends an interrupted process with :func:`exit_now`, which flushes the standard streams and leaves without
the interpreter's finalization: an interrupt that cut a call of the XLA runtime short can otherwise crash the
interpreter's teardown (a segmentation fault, exit 139, after the "interrupted" message).

Only the standard library is used here, so that the package can install the handlers before it imports JAX.
"""

from __future__ import annotations

import atexit
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
_finished: list[int] = []  # the exit code of the finished command (see finish)


def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
    """Records the signal and returns (never raises; see the module docstring). A second SIGINT while one is
    pending ends the process at once with code 130. Once the command has finished (:func:`finish`), any signal ends
    the process at once with the command's exit code."""
    if _finished:
        exit_now(_finished[0])
    if _pending and signum == signal.SIGINT and _pending[0] == signal.SIGINT:
        if not is_cli_process():  # main() called from Python: the usual KeyboardInterrupt
            raise KeyboardInterrupt
        with contextlib.suppress(Exception):
            os.write(2, b"asyncfl: interrupted again: stopping at once (the last checkpoint written is kept)\n")
        exit_now(128 + int(signum))
    if not _pending:
        _pending.append(int(signum))


def handlers_installed() -> bool:
    return signal.getsignal(signal.SIGINT) is _on_signal


def install() -> bool:
    """Installs the recording (flag-setting) handlers for SIGINT and SIGTERM (main thread only; returns whether it did). A signal
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
    _agreement.clear()


def finish(code: int) -> None:
    """The ``asyncfl`` process's command is done with exit ``code`` (its results are written): the handlers stay in
    place until the process ends, and a signal received from now on ends the process at once with ``code``.

    Giving the signals back their default handlers here instead would let a SIGTERM that arrives while the
    interpreter tears down (JAX's runtime takes a moment) kill a run that had finished and saved everything, with
    the status of a killed process."""
    _finished[:] = [int(code)]


def _ignore_once_finished() -> None:
    """At exit, after the other ``atexit`` functions (this one is registered before JAX is imported, and they run
    last registered first): a finished command's SIGINT and SIGTERM are ignored from here to the end of the
    process. The interpreter's finalization gives every signal with a Python handler back its default action
    (``_PySignal_Fini``) before the XLA runtime has torn down, and a SIGTERM in that window would kill the finished
    run with the status of a killed process (-15)."""
    if _finished:
        for signum in SIGNALS:
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, signal.SIG_IGN)


atexit.register(_ignore_once_finished)


def hold() -> None:
    """Starts a held section (see :func:`held`); :func:`release` ends it."""
    global _depth
    _depth += 1


def release(check_now: bool = True) -> None:
    """Ends a held section; with ``check_now`` a recorded signal is raised (:func:`check`)."""
    global _depth
    _depth = max(0, _depth - 1)
    if check_now and _depth == 0:
        check()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """:func:`check` does nothing inside the block; a signal received in it is raised when it ends."""
    hold()
    try:
        yield
    finally:
        release(check_now=False)
    check()


def check() -> None:
    """Raises :class:`Interrupted` when a signal was recorded (outside a :func:`held` block; while the processes of a
    run must agree, only the signal they agreed on, :func:`agree`). The signal stays recorded: every later check
    raises again, so an exception that something swallowed never loses it."""
    signum = stop_signal()
    if signum is not None and _depth == 0:
        raise Interrupted(signum)


_agreement: list[int | None] = []  # while the processes of a run must agree: [the signal agreed on, or None]


def start_agreement() -> None:
    """From now on :func:`check` and :func:`stop_signal` act only on the signal the processes of a multi-process run
    agreed on (:func:`agree`), so that every process stops after the same chunk (a process that stopped alone would
    leave the others waiting in a collective forever)."""
    _agreement[:] = [None]


def end_agreement() -> None:
    """Back to acting on this process's own recorded signal."""
    _agreement.clear()


def agree(signum: int | None) -> None:
    """Records the signal the processes agreed on (the largest any of them recorded, gathered by the caller in one
    collective at the same point of every process), also in this process when it received none itself."""
    if signum:
        if not _pending:
            _pending.append(int(signum))
        if _agreement:
            _agreement[0] = int(signum)


def stop_signal() -> int | None:
    """The signal to act on: the recorded one, or, while the processes must agree, the one they agreed on."""
    if _agreement:
        return _agreement[0]
    return pending()


def pending() -> int | None:
    """The recorded signal, or None."""
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
