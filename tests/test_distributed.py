"""Runs over two processes (``jax.distributed`` on one machine, gloo collectives on CPU) equal the single-process run:
replicas split across the processes, per-client state split across them, the event clock, and checkpoints written
by two processes then resumed by two new ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from asyncfl_jax import distributed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The run every process builds (and the test process, as the single-process reference): softmax regression on 4
# clients, 40 server steps, 2 seeds x 2 client learning rates = 4 replicas.
SETUP = textwrap.dedent(
    """
    import numpy as np
    from support import toy_problem
    from asyncfl_jax import LocalConfig, fedbuff, make_schedule
    from asyncfl_jax import algorithms as A
    from asyncfl_jax.timing import DelayModel
    from asyncfl_jax.timing.clock import EventClock

    task, _, _ = toy_problem(4)
    schedule = make_schedule("concurrent", 4, 40, DelayModel(), seed=0, concurrency=4, buffer_size=2,
                             refill="immediate")
    clocks = [EventClock(4, 24, DelayModel(suspension_prob=0.2), seed=s) for s in (0, 1)]
    kw = dict(local=LocalConfig(steps=2, batch_size=None), seeds=[0, 1], hparams={"client_lr": [0.05, 0.2]},
              eval_every=10, progress=False)
    CASES = {
        "replicas": (fedbuff, schedule, dict(shard_replicas=True)),
        "clients": (A.ca2fl, schedule, dict(shard_clients=True)),
        "clock": (lambda: A.asyncfeded(initial_steps=2, max_steps=4), clocks, dict(shard_replicas=True)),
    }
    """
)

# One process of a 2-process run: argv = process id, coordinator port, output folder, phase.
# phase "run": every case, then the checkpointed run interrupted after server step 20 (KeyboardInterrupt raised on
# every process by a callback); phase "resume": the checkpointed run resumed.
PROCESS = textwrap.dedent(
    """
    import sys
    pid, port, folder, phase = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    from asyncfl_jax import distributed, simulate
    from asyncfl_jax.checkpoint import SimulationInterrupted
    assert distributed.initialize(f"localhost:{port}", 2, pid)  # before anything touches a device
    import jax
    assert jax.process_count() == 2 and len(jax.local_devices()) == 1 and jax.device_count() == 2, jax.devices()
    """
) + SETUP + textwrap.dedent(
    """

    def save(name, h):  # every process writes what it holds: both must hold the whole History
        np.savez(f"{folder}/{name}-{pid}.npz", final_params=h.final_params, diverged_at=h.diverged_at,
                 times=h.times, job_steps=h.job_steps if h.job_steps is not None else np.zeros(0),
                 **{f"metric_{k}": v for k, v in h.metrics.items()})

    fedbuff_ckpt = dict(kw, shard_replicas=True, checkpoint_dir=f"{folder}/ckpt")
    if phase == "run":
        for name, (make, timing, placement) in CASES.items():
            save(name, simulate(task, make(), timing, **placement, **kw))

        def interrupt(update):
            if update.step == 20:
                raise KeyboardInterrupt
        try:
            simulate(task, fedbuff(), schedule, callbacks=[interrupt], **fedbuff_ckpt)
        except SimulationInterrupted as e:
            assert e.saved and e.step == 20, (e.saved, e.step)
        else:
            raise AssertionError("the run should have been interrupted")
        try:  # no placement: every process would run the whole program
            simulate(task, fedbuff(), schedule, **kw)
        except ValueError as e:
            assert "spans 2 processes" in str(e) and "shard_replicas" in str(e), e
        else:
            raise AssertionError("a run over 2 processes without a placement should be refused")
        try:  # processes started with different runs
            simulate(task, fedbuff(), schedule, shard_replicas=True, **dict(kw, seeds=[0, 1 + pid]))
        except ValueError as e:
            assert "differ from those of process 0" in str(e), e
        else:
            raise AssertionError("different inputs on the processes should be refused")
    else:
        save("resumed", simulate(task, fedbuff(), schedule, resume=True, **fedbuff_ckpt))
    print(f"process {pid}: ok", flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(folder: str, phase: str) -> None:
    """Two processes of one run on this machine (one CPU device each)."""
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS, str(i), str(port), folder, phase], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, (out, err)) in enumerate(zip(procs, outputs)):
        if p.returncode != 0 and "gloo" in err.lower() and "not" in err.lower() and "available" in err.lower():
            pytest.skip(f"this jaxlib has no gloo CPU collectives: {err.strip().splitlines()[-1]}")
        assert p.returncode == 0 and f"process {i}: ok" in out, f"process {i}:\n{err[-4000:]}"


def _load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return dict(f)


def _reference() -> dict[str, dict[str, np.ndarray]]:
    """The single-process results of every case (this process, one device, no placement)."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    scope: dict = {}
    exec(SETUP, scope)  # noqa: S102  (the same setup the processes run)
    from asyncfl_jax import simulate

    out = {}
    for name, (make, timing, _) in scope["CASES"].items():
        h = simulate(scope["task"], make(), timing, **scope["kw"])
        out[name] = {"final_params": h.final_params, "diverged_at": h.diverged_at, "times": h.times,
                     "job_steps": h.job_steps if h.job_steps is not None else np.zeros(0),
                     **{f"metric_{k}": v for k, v in h.metrics.items()}}
    return out


def test_two_processes_equal_one_process_and_resume_their_checkpoints(tmp_path):
    folder = str(tmp_path)
    _launch(folder, "run")
    _launch(folder, "resume")
    reference = _reference()
    for name, ref in reference.items():
        got = [_load(os.path.join(folder, f"{name}-{pid}.npz")) for pid in range(2)]
        for key, value in ref.items():
            # both processes hold the same, whole History
            np.testing.assert_array_equal(got[0][key], got[1][key], err_msg=f"{name} {key}")
            if value.dtype.kind in "iub" or key == "times":  # steps, clock decisions, virtual times: exact
                np.testing.assert_array_equal(got[0][key], value, err_msg=f"{name} {key}")
            else:  # float rounding of sums split across devices (messages and cache rows of other processes)
                np.testing.assert_allclose(got[0][key], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} {key}")
    # the 2-process run interrupted after step 20 and resumed by 2 new processes equals the uninterrupted one
    # bit for bit (same programs on the same devices)
    for pid in range(2):
        resumed, whole = _load(os.path.join(folder, f"resumed-{pid}.npz")), _load(os.path.join(folder, f"replicas-{pid}.npz"))
        for key in whole:
            assert resumed[key].tobytes() == whole[key].tobytes(), key


def test_launch_options_are_checked_before_the_runtime_starts():
    with pytest.raises(ValueError, match="missing: num_processes, process_id"):
        distributed.initialize("localhost:1234")
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        distributed.initialize("localhost", 2, 0)
    with pytest.raises(ValueError, match=r"process id 2: must be an integer in \[0, 1\]"):
        distributed.initialize("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="number of processes 0"):
        distributed.initialize("localhost:1234", 0, 0)
    assert distributed.initialize() is False  # nothing asked: one process
    assert distributed.initialize("localhost:1234", 1, 0) is False  # one process needs no runtime
    env = {distributed.ENV_COORDINATOR: "h:1", distributed.ENV_NUM_PROCESSES: "2", distributed.ENV_PROCESS_ID: "1"}
    assert distributed.launch_from_env(env) == ("h:1", 2, 1)
    assert distributed.launch_from_env({}) == (None, None, None)
    with pytest.raises(ValueError, match="ASYNCFL_PROCESS_ID = 'x'"):
        distributed.launch_from_env({**env, distributed.ENV_PROCESS_ID: "x"})
