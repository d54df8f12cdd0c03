"""Ctrl-C and SIGTERM at any moment of `asyncfl run` (imports, data, compile, the loop) end the process with 130 or
143 (or 0 when it had finished), promptly, without a traceback or a crash, leaving a folder that is untouched or
resumable."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("delay", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_any_moment_ends_cleanly(tmp_path, delay, signum):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "asyncfl_jax.cli", "run", *TINY, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signum)
    sent = time.perf_counter()
    _, err = proc.communicate(timeout=120)
    assert time.perf_counter() - sent < 30, "the signal was not acted on promptly"
    assert proc.returncode in (0, 128 + signum), (proc.returncode, err)
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
        with pytest.raises(_signals.Interrupted) as caught:  # outside a held block: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert caught.value.exit_code == 130 and _signals.pending() is None
    finally:
        _signals.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
