"""Faults of multi-process runs, each bounded in time: a missing coordinator ends with exit code 2 and a message
naming the process and the coordinator within --coordinator-timeout; scripts/launch_local.py forwards SIGTERM to its
processes and leaves none behind, and says which process failed or was killed; a two-process `asyncfl run` is not
refused by process 0's own lock."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "scripts", "launch_local.py")
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


# A process of the launched "run": writes its pid, then sleeps; process ASYNCFL_PROCESS_ID == KILLED kills itself.
WORKER = """
import os, signal, sys, time
folder, killed, ignore_term = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
me = int(os.environ["ASYNCFL_PROCESS_ID"])
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(folder, f"pid{me}"), "w") as f:
    f.write(str(os.getpid()))
if me == killed:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def _launch(tmp_path, killed=-1, ignore_term=False, grace=10):
    proc = subprocess.Popen([sys.executable, LAUNCHER, "-n", "2", "--grace", str(grace), "--",
                             sys.executable, "-c", WORKER, str(tmp_path), str(killed), "1" if ignore_term else "0"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"pid{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int((tmp_path / f"pid{i}").read_text()) for i in range(2)]
    return proc, pids


@pytest.mark.parametrize("ignore_term", [False, True])
def test_sigterm_to_the_launcher_reaches_every_process_and_leaves_none(tmp_path, ignore_term):
    proc, pids = _launch(tmp_path, ignore_term=ignore_term, grace=1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert not any(_alive(pid) for pid in pids), "a process was left behind"


@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_process_is_named_and_the_others_are_stopped(tmp_path, killed):
    proc, pids = _launch(tmp_path, killed=killed)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert (f"launch_local: process {killed} was killed by SIGKILL; stopping the other processes (coordinator "
            "localhost:") in err
    assert not any(_alive(pid) for pid in pids)


def test_a_missing_coordinator_ends_with_exit_2_within_the_timeout(tmp_path):
    port = _free_port()
    command = [sys.executable, "-m", "asyncfl_jax.cli", "run", "--no-progress", "--no-plot", "--model", "logreg",
               "--set", "data.num_clients=6", "--set", "data.synthetic_max_samples=60", "--seeds", "0,1",
               "--shard-replicas", "--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id", "1",
               "--coordinator-timeout", "3", "--out", str(tmp_path / "out")]
    t0 = time.monotonic()
    done = subprocess.run(command, env={**ENV, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (f"asyncfl: error: process 1 of 2 could not start the run with the coordinator localhost:{port} within "
            "3 s (--coordinator-timeout)") in done.stderr, done.stderr[-3000:]
    assert "Check failure" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("me", [0, 1])
def test_only_process_0_judges_the_output_folder_and_the_others_follow(monkeypatch, me):
    """Process 1 neither looks at the folder (where process 0 holds the lock and may be writing already) nor
    decides otherwise than process 0; a refusal of process 0 stops the others with a message saying so."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from asyncfl_jax import distributed
    from asyncfl_jax.errors import InputError

    sent = []
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: me)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all",
                        lambda x: sent.append(int(x)) or (np.int32(1) if me else x))  # process 0 said "continue"

    def decide():
        assert me == 0, "a process other than 0 judged the folder"
        return "continue"

    assert distributed.from_primary(decide, ("new", "continue", "overwrite")) == "continue"

    def refuse():
        raise InputError("out is in use by another asyncfl run")

    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda x: np.int32(-1))
    with pytest.raises(InputError, match="in use" if me == 0 else "process 0 refused the run"):
        distributed.from_primary(refuse if me == 0 else decide, ("new", "continue", "overwrite"))


def test_a_two_process_run_of_the_command_is_not_refused_by_its_own_lock(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, LAUNCHER, "-n", "2", "--", sys.executable, "-m", "asyncfl_jax.cli", "run",
               "--no-progress", "--no-plot", "--model", "logreg", "--algorithm", "fedbuff", "--set",
               "data.num_clients=6", "--set", "data.synthetic_max_samples=60", "--set", "runs.protocol.concurrency=4",
               "--set", "runs.protocol.buffer_size=1", "--arrivals", "8", "--set", "local.steps=1", "--set",
               "eval_points=1", "--seeds", "0,1", "--shard-replicas", "--coordinator-timeout", "60", "--out", str(out)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=240)
    if done.returncode != 0 and "gloo" in done.stderr.lower() and "available" in done.stderr.lower():
        pytest.skip("this jaxlib has no gloo CPU collectives")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "in use by another asyncfl run" not in done.stdout + done.stderr
    assert (out / "metrics.csv").is_file() and not (out / ".asyncfl.lock").exists()
