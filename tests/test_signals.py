"""Ctrl-C and SIGTERM at any moment of `asyncfl run` (imports, data, compile, the loop) end the process with 130 or
143 (or 0 when it had finished), promptly, without a traceback or a crash, leaving a folder that is untouched or
resumable."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from asyncfl_jax import _signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--no-progress", "--no-plot", "--model", "logreg", "--set", "data.num_clients=6",
        "--set", "data.synthetic_max_samples=60", "--set", "runs.protocol.concurrency=4",
        "--set", "runs.protocol.buffer_size=1", "--set", "runs.arrivals=40", "--set", "local.steps=1",
        "--set", "eval_points=4"]


# A background shell may hand the child SIGINT ignored (a terminal would not): this launcher gives it back its default
# and then becomes the command (exec keeps the default), without a preexec_fn (fork of a threaded JAX process).
LAUNCH = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, sys.argv[1:])"


RANDOM = None
"""A parameter asking for a random moment in the first 3 seconds and a random signal, different on every test
session (the ids stay fixed for pytest-xdist; the drawn values are in the failure message)."""


def _wait_until_it_catches_sigterm(pid: int, timeout: float = 60.0) -> None:
    """Waits until process ``pid`` has a handler for SIGTERM (Linux: the ``SigCgt`` mask of /proc/PID/status), i.e.
    until the package's first lines ran. Before that the interpreter itself is starting, where no Python program
    can act on a signal; the delays of the test count from this moment (the package's imports follow it). Elsewhere
    it waits a fixed 0.3 s."""
    status = f"/proc/{pid}/status"
    if not os.path.exists(status):
        time.sleep(0.3)
        return
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        with open(status) as f:
            caught = next((line.split()[1] for line in f if line.startswith("SigCgt:")), "0")
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)
    raise AssertionError("the command never installed its SIGTERM handler")


@pytest.mark.parametrize("delay, signum", [(0.0, signal.SIGTERM), (0.5, signal.SIGINT), (1.0, signal.SIGTERM),
                                           (2.0, signal.SIGINT), (4.0, signal.SIGTERM), (1.0, signal.SIGINT),
                                           (2.0, signal.SIGTERM), (RANDOM, 1), (RANDOM, 2)])
def test_a_signal_at_any_moment_ends_cleanly(tmp_path, delay, signum):
    if delay is RANDOM:
        rng = random.Random(f"{time.time_ns()}-{signum}")
        delay, signum = round(rng.uniform(0.0, 3.0), 2), rng.choice([signal.SIGINT, signal.SIGTERM])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "asyncfl_jax.cli", "run", *TINY, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_until_it_catches_sigterm(proc.pid)
    time.sleep(delay)
    proc.send_signal(signum)
    sent = time.perf_counter()
    _, err = proc.communicate(timeout=120)
    assert time.perf_counter() - sent < 30, "the signal was not acted on promptly"
    assert proc.returncode in (0, 128 + signum), (delay, signum, proc.returncode, err)
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    if proc.returncode != 0:
        assert "interrupted" in err, err
        # untouched (nothing or an empty folder) or resumable (its config.json is there)
        assert not out.exists() or not os.listdir(out) or (out / "config.json").is_file(), sorted(os.listdir(out))


def test_a_held_signal_is_raised_when_the_block_ends():
    assert _signals.install()
    try:
        with pytest.raises(_signals.Interrupted) as caught:
            with _signals.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run (it only records inside the block)
                assert _signals.pending() == signal.SIGTERM
        assert caught.value.exit_code == 143
        with pytest.raises(_signals.Interrupted):  # still recorded: every later check raises it again
            _signals.check()
    finally:
        _signals.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and _signals.pending() is None


def test_the_handler_only_records_and_the_next_check_raises():
    assert _signals.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler has run, outside any held block, and raised nothing
        assert _signals.pending() == signal.SIGINT
        with pytest.raises(_signals.Interrupted) as caught:
            _signals.check()
        assert caught.value.exit_code == 130
    finally:
        _signals.uninstall()


def test_a_signal_inside_a_garbage_collection_callback_is_not_lost():
    """A handler that raised would raise inside the callback (as inside JAX's ``_xla_gc_callback``), where Python
    prints "Exception ignored" and drops the exception: the run went on to its end and exited 0."""
    sent = []

    def callback(phase, info):  # noqa: ARG001
        if phase == "start" and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the Python handler runs here, inside the callback
                pass

    assert _signals.install()
    gc.callbacks.append(callback)
    try:
        gc.collect()
        assert sent and _signals.pending() == signal.SIGTERM
        with pytest.raises(_signals.Interrupted) as caught:
            _signals.check()
        assert caught.value.exit_code == 143
    finally:
        gc.callbacks.remove(callback)
        _signals.uninstall()


def test_the_processes_of_a_run_act_on_the_signal_they_agreed_on():
    """In a multi-process run a process acts on a signal only once the processes agreed on it (after the same
    chunk), also one that only another process received; a process stopping alone would leave the others waiting."""
    assert _signals.install()
    try:
        _signals.start_agreement()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert _signals.pending() == signal.SIGTERM and _signals.stop_signal() is None
        _signals.check()  # not agreed yet: nothing happens
        _signals.agree(0)  # no process had one when they compared
        _signals.check()
        _signals.agree(signal.SIGTERM)
        with pytest.raises(_signals.Interrupted) as caught:
            _signals.check()
        assert caught.value.exit_code == 143
        _signals.end_agreement()
        _signals.uninstall()
        assert _signals.install()
        _signals.start_agreement()
        _signals.agree(signal.SIGINT)  # received by another process only
        assert _signals.pending() == signal.SIGINT and _signals.stop_signal() == signal.SIGINT
    finally:
        _signals.end_agreement()
        _signals.uninstall()


FINISHED = """
import os, signal, sys, time
from asyncfl_jax import _signals
assert _signals.install()
_signals.finish(int(sys.argv[1]))
os.kill(os.getpid(), int(sys.argv[2]))
time.sleep(10)
sys.exit(99)  # not reached: the signal ended the process with the command's code
"""


@pytest.mark.parametrize("code, signum", [(0, signal.SIGTERM), (2, signal.SIGINT)])
def test_a_signal_after_the_command_finished_ends_the_process_with_its_code(code, signum):
    """A SIGTERM while the interpreter tears down after a finished run (its results written) once killed the process
    with the status of a killed process (-15); the handlers now stay and end it at once with the command's code."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", FINISHED, str(code), str(int(signum))], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert time.perf_counter() - started < 9, "the signal did not end the process at once"


LATE = """
import os, signal, sys, time
from asyncfl_jax import _signals
assert _signals.install()
_signals.finish(int(sys.argv[1]))


class Late:  # deleted with the module's globals, after the interpreter gave the signals their default actions
    def __del__(self, kill=os.kill, pid=os.getpid(), sleep=time.sleep, term=signal.SIGTERM):
        kill(pid, term)
        sleep(0.5)


late = Late()
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 2])
def test_a_signal_in_the_last_moments_of_the_teardown_does_not_kill_a_finished_command(code):
    """The interpreter's finalization gives the signals with Python handlers their default actions before the XLA
    runtime has torn down; a SIGTERM in that window killed a finished run with -15 (seen 0.2-0.4 s after its last
    line). A finished command's signals are ignored from the end of the atexit functions on."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", LATE, str(code)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
