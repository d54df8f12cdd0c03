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


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_a_peer_killed_mid_run_without_the_launcher_ends_the_other_with_exit_2(tmp_path):
    """Two `asyncfl run` processes started by hand; the running process of process 0 (the coordinator) is killed
    with SIGKILL in the middle of the run. Process 1 ends within the coordinator timeout with exit code 2 and a
    message naming it and the coordinator, not with JAX's abort and its C++ stack trace (the runtime's fatal error
    when the coordinator goes; a failed collective, the other way round, is tested on the error boundary below)."""
    killed = 0
    port = _free_port()
    procs, logs = [], []
    for me in range(2):
        logs.append(open(tmp_path / f"log{me}", "w+"))
        command = [sys.executable, "-m", "asyncfl_jax.cli", "run", "--no-progress", "--no-plot", "--model", "logreg",
                   "--algorithm", "fedbuff", "--set", "data.num_clients=6", "--set", "data.synthetic_max_samples=60",
                   "--set", "runs.protocol.concurrency=4", "--set", "runs.protocol.buffer_size=1", "--arrivals",
                   "400000", "--set", "eval_points=800", "--set", "local.steps=1", "--no-checkpoint", "--seeds", "0,1",
                   "--shard-replicas", "--coordinator", f"localhost:{port}", "--num-processes", "2", "--process-id",
                   str(me), "--coordinator-timeout", "6", "--out", str(tmp_path / "out")]
        procs.append(subprocess.Popen(command, env={**ENV, "JAX_PLATFORMS": "cpu"}, stdout=logs[me],
                                      stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.monotonic() + 120
        while not all("memory budget" in (tmp_path / f"log{me}").read_text() for me in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [(tmp_path / f"log{me}").read_text()[-2000:] for me in range(2)]
            time.sleep(0.2)
        time.sleep(2)  # the chunks are running
        workers = [_children(p.pid) for p in procs]  # each command runs the simulation in a supervised child
        assert all(len(w) == 1 for w in workers), workers
        os.kill(workers[killed][0], signal.SIGKILL)
        t0 = time.monotonic()
        other = procs[1 - killed]
        other.wait(timeout=90)
        elapsed = time.monotonic() - t0
        procs[killed].wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = (tmp_path / f"log{1 - killed}").read_text()
    assert other.returncode == 2, text[-3000:]
    assert f"asyncfl: error: process {1 - killed} of 2 (coordinator localhost:{port}) stopped: another process of " \
           "the run ended or was killed, or the coordinator (process 0) is gone" in text, text[-3000:]
    assert "Check failure" not in text and "Terminating process" not in text and "Traceback" not in text, text
    assert elapsed < 6 + 30, elapsed  # the coordinator timeout, and the slack of a loaded machine
    assert procs[killed].returncode == 128 + signal.SIGKILL
    assert not any(_alive(pid) for w in workers for pid in w), "a process was left behind"


def test_the_supervisor_turns_the_runtimes_fatal_report_into_exit_2_and_one_message(tmp_path, capfd):
    """The supervised child (a stand-in printing the XLA runtime's fatal report, then aborting) ends the command with
    exit code 2 and the message; the report's log lines and stack trace are not shown, the child's own lines are."""
    from asyncfl_jax import supervise

    fake = tmp_path / "fake.py"
    fake.write_text(
        "import os, sys\n"
        "print('asyncfl: writing to out', file=sys.stderr, flush=True)\n"
        "sys.stderr.write('E1128 08:21:04.454474   14694 coordination_service_agent.cc:289] Polled an error\\n')\n"
        "sys.stderr.write('1\\nThe tasks have crashed. Check the task logs\\n')\n"
        "sys.stderr.write('F1128 08:21:04.454 14694 client.h:80] " + supervise.FATAL_MARK + ". absl::Status: "
        "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\\n1\\n"
        "*** Check failure stack trace: ***\\n    @     0x7fab46640634  absl::LogMessage::SendToLog()\\n')\n"
        "sys.stderr.flush()\n"
        "os.abort()\n")
    code = supervise.run_supervised([], "process 1 of 2 (coordinator localhost:1)", 6, None,
                                    command=[sys.executable, str(fake)])
    err = capfd.readouterr().err
    assert code == 2, err
    assert "asyncfl: writing to out" in err
    assert ("asyncfl: error: process 1 of 2 (coordinator localhost:1) stopped: another process of the run ended or "
            "was killed, or the coordinator (process 0) is gone (UNAVAILABLE: The following tasks are unhealthy "
            "(stopped sending heartbeats): 1)") in err, err
    assert "Check failure" not in err and "client.h" not in err and "coordination_service_agent" not in err, err
    assert "The tasks have crashed" not in err, err  # the continued lines of a held log line are held too


@pytest.mark.parametrize("code", [0, 3, -signal.SIGTERM])
def test_the_supervisor_passes_the_childs_exit_status_and_output_through(tmp_path, capfd, code):
    from asyncfl_jax import supervise

    body = f"os.kill(os.getpid(), {-code})" if code < 0 else f"sys.exit({code})"
    command = [sys.executable, "-c", "import os, sys\nprint('a line', file=sys.stderr)\n"
               "print('E1128 08:00:00.1 1 coordination_service.cc:1] kept', file=sys.stderr)\n"
               "print('its second line', file=sys.stderr)\n" + body]
    assert supervise.run_supervised([], "process 0 of 2", 6, None, command=command) == (128 - code if code < 0
                                                                                          else code)
    err = capfd.readouterr().err
    assert "a line" in err and "coordination_service.cc:1] kept\nits second line" in err and "asyncfl: error" not in err


def test_a_collective_that_fails_for_a_lost_peer_is_exit_2_naming_the_process(monkeypatch, capsys):
    """Process 0 in a collective when process 1 is killed: gloo's error (a JaxRuntimeError) is reported by the
    command's error boundary as the loss of a peer, exit code 2, not as an internal error."""
    import argparse

    import jax

    from asyncfl_jax import cli

    class JaxRuntimeError(RuntimeError):
        pass

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(cli, "_lost_peer", [])
    args = argparse.Namespace(command="run", coordinator="localhost:4", num_processes=2, process_id=0,
                              coordinator_timeout=6.0, out=None, resume=None)
    error = JaxRuntimeError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read "
                            "error [127.0.0.1]:55187: Connection reset by peer")
    assert cli._report(error, args, debug=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("asyncfl: error: process 0 of 2 (coordinator localhost:4) stopped: another process of the "
                          "run ended or was killed"), err
    assert "Connection reset by peer" in err and "This is a bug" not in err
    assert cli._lost_peer  # the command then leaves without JAX's shutdown barrier (which would abort)
    monkeypatch.setattr(jax, "process_count", lambda: 1)  # one process: no peer to lose, the usual internal error
    assert cli._report(error, args, debug=False) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_supervised_child_whose_supervisor_is_gone_ends_at_once():
    """The child asks the kernel to be killed with its supervisor; one whose supervisor died before it asked (its
    parent is another process) ends at once instead of running on as an orphan."""
    script = "from asyncfl_jax.supervise import die_with_supervisor\ndie_with_supervisor()\nprint('ran on')"
    orphan = subprocess.run([sys.executable, "-c", script], env={**ENV, "ASYNCFL_SUPERVISED": "1"},
                            capture_output=True, text=True, timeout=60)
    assert orphan.returncode == 128 + signal.SIGKILL and "ran on" not in orphan.stdout
    adopted = subprocess.run([sys.executable, "-c", script], env={**ENV, "ASYNCFL_SUPERVISED": str(os.getpid())},
                             capture_output=True, text=True, timeout=60)
    assert adopted.returncode == 0 and "ran on" in adopted.stdout
