"""A process of a multi-process ``asyncfl run`` that loses its peers or its coordinator ends with exit code 2 and a
message, not with JAX's abort.

When a process of a ``jax.distributed`` run dies (killed, crashed, its machine gone) the others learn it in one of
two ways, and neither can be caught in Python:

* a collective they are in fails at once (gloo: "Connection reset by peer"): a ``JaxRuntimeError`` that the command's
  error boundary reports (:func:`peer_failure`), after which the process must leave without JAX's shutdown barrier
  (the barrier fails in turn and aborts the process);
* JAX's coordination service notices it (a process silent for longer than the heartbeat timeout, the
  ``--coordinator-timeout``; or the coordinator, process 0, gone: its other processes notice at once) and every
  remaining process is terminated by the runtime's own fatal error: ``SIGABRT`` and a C++ stack trace printed from a
  thread of the XLA runtime (``client.h: Terminating process because the JAX distributed service detected fatal
  errors``). The Python bindings offer no way to replace that handler (a Python ``missed_heartbeat_callback`` cannot
  receive the ``absl::Status`` and ends in ``std::terminate``).

So the ``asyncfl`` command of a multi-process run runs itself as a child process under a small supervisor
(:func:`run_supervised`): the supervisor passes the child's output through, holds back the runtime's fatal report
and its stack trace, and when the child ends by that abort prints one message naming this process, the coordinator,
the runtime's reason and what to do, and exits with code 2. Signals (SIGINT, SIGTERM) sent to the supervisor are
passed on to the child once (it runs in a session of its own, so a terminal's Ctrl-C reaches it only through the
supervisor); the kernel kills the child (SIGKILL) if the supervisor dies (``PR_SET_PDEATHSIG``, requested by the
child itself first thing: :func:`die_with_supervisor`), so no process is left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import IO, Sequence

ENV_SUPERVISED = "ASYNCFL_SUPERVISED"
"""Set to the supervisor's pid in the supervised child (which then runs the command itself)."""

FATAL_MARK = "Terminating process because the JAX distributed service detected fatal errors"
"""The first line of the XLA runtime's fatal report (``xla/pjrt/distributed/client.h``)."""

PEER_MARKS = ("gloo", "connection reset by peer", "connection refused", "broken pipe", "socket closed",
              "heartbeat", "unavailable:", "deadline_exceeded", "coordination service")
"""How a failed cross-process collective or a lost coordinator reads in a ``JaxRuntimeError``."""


def peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is the XLA runtime's report of a collective or a coordination call that failed because
    another process of the run (or the coordinator) is gone; only in a run over several processes."""
    if type(error).__name__ not in ("XlaRuntimeError", "JaxRuntimeError"):
        return False
    if "jax" not in sys.modules:
        return False
    import jax

    try:
        if jax.process_count() < 2:
            return False
    except Exception:  # noqa: BLE001 - a runtime that cannot say: not a multi-process run we know of
        return False
    text = str(error).lower()
    return any(mark in text for mark in PEER_MARKS)


def who(process_id: int | None, num_processes: int | None, coordinator: str | None) -> str:
    """"process 1 of 2 (coordinator localhost:12355)" for the messages."""
    me = f"process {process_id} of {num_processes}" if process_id is not None else "this process"
    return f"{me} (coordinator {coordinator or 'from the cluster'})"


def lost_peer_message(where: str, reason: str, timeout: float, out: str | None) -> str:
    """The message of a process whose run lost another process or its coordinator."""
    reason = " ".join(reason.split())[:400]
    again = (f"start every process again with `asyncfl run --resume {out}` (finished runs and the last checkpoint "
             "are kept)") if out and os.path.isfile(os.path.join(out, "config.json")) else \
        "start every process again"
    return (f"{where} stopped: another process of the run ended or was killed, or the coordinator (process 0) is "
            f"gone ({reason}); a process silent for {timeout:g} s (--coordinator-timeout) is declared dead. Check "
            f"the other processes' output, then {again}")


def _reason(lines: list[str]) -> str:
    """The runtime's reason from its fatal report (the ``absl::Status`` text and the failed RPC), without the log
    prefixes and the stack trace."""
    text = " ".join(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("@")
                    and "Check failure stack trace" not in line)
    status = text.split("absl::Status:", 1)[1] if "absl::Status:" in text else text.split(FATAL_MARK, 1)[-1]
    status = re.sub(r"\[type\.googleapis\.com/[^\]]*\]", "", status)
    first = re.split(r"(?<=[.:])\s+(?=[A-Z])", status.strip(), maxsplit=2)  # the status code and its first sentence
    return " ".join(first[:2]).strip(" .")[:300] or "no reason given"


RUNTIME_LOG = re.compile(r"^[EW]\d{4} [\d:.]+\s+\d+ coordination_service\S*\.cc:\d+\]")
"""An error or warning line of JAX's coordination service (glog format), the prelude of its fatal report."""


def _relay(stream: IO[str], out: IO[str], report: list[str]) -> None:
    """Copies the child's stderr to ``out`` line by line until the runtime's fatal report starts; the report and
    what follows (the C++ stack trace) go to ``report`` instead. The coordination service's own error lines (and the
    lines that continue them) are held back until the next line of the command (``asyncfl...``): dropped when the
    fatal report follows them, printed otherwise."""
    held: list[str] = []
    for line in stream:
        if report or FATAL_MARK in line:
            report.append(line)
            continue
        if RUNTIME_LOG.match(line) or (held and not line.startswith("asyncfl")):
            held.append(line)
            continue
        out.write("".join(held) + line)
        held.clear()
        out.flush()
    if held and not report:
        out.write("".join(held))
        out.flush()


def die_with_supervisor() -> None:
    """In the supervised child (``ASYNCFL_SUPERVISED`` holds the supervisor's pid): asks the kernel to kill this
    process when the supervisor dies (``PR_SET_PDEATHSIG``, Linux), and ends at once if it died already. Called
    first thing by the command, so that nothing runs between ``fork`` and ``exec`` in the supervisor (which has
    imported JAX)."""
    supervisor = os.environ.pop(ENV_SUPERVISED, "")  # not inherited by the processes this one may start
    if not supervisor.isdigit():
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the supervisor still passes its signals on
        return
    if os.getppid() != int(supervisor):  # the supervisor died before the request took effect
        os._exit(128 + int(signal.SIGKILL))


def run_supervised(argv: Sequence[str], where: str, timeout: float, out: str | None,
                   command: Sequence[str] | None = None) -> int:
    """Runs ``python -m asyncfl_jax.cli argv`` (or ``command``) as a child (see the module docstring); returns the
    exit code: the child's, ``128 + N`` for a child ended by signal N, or 2 (with a message naming ``where``) for the
    runtime's fatal error."""
    env = dict(os.environ, **{ENV_SUPERVISED: str(os.getpid())})
    command = [sys.executable, "-m", "asyncfl_jax.cli", *argv] if command is None else list(command)
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                             start_new_session=True)  # its own process group: a terminal's Ctrl-C comes through here
    report: list[str] = []
    relay = threading.Thread(target=_relay, args=(child.stderr, sys.stderr, report), daemon=True)
    relay.start()
    forwarded: list[int] = []

    def forward(signum: int, frame: object) -> None:  # noqa: ARG001
        if child.poll() is None and (not forwarded or signum == signal.SIGINT):
            forwarded.append(signum)
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - wait() retries on EINTR itself since Python 3.5
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    relay.join(timeout=10)
    if report:
        sys.stderr.write(f"asyncfl: error: {lost_peer_message(where, _reason(report), timeout, out)}\n")
        sys.stderr.flush()
        return 2
    return 128 - code if code < 0 else code
