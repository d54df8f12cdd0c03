"""Step-by-step trajectories (``simulate(..., trajectory=...)`` -> ``History.trajectory``) against the independent
numpy reference, which records the model after every server step (tests/reference.py ``replay_steps``).

The runs are float64 on a tiny full-batch problem, so the engine's trajectory equals the reference's to ~1e-12 at
every step; the schedule has a client arriving twice in one step, and the chunks (``eval_every``) do not divide the
number of steps.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, toy_problem
from asyncfl_jax import cli, load_results
from asyncfl_jax.algorithms import ace, fedbuff
from asyncfl_jax.checkpoint import CheckpointMismatchError, SimulationInterrupted
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import loop as loop_module
from asyncfl_jax.engine import simulate
from asyncfl_jax.results import read_trajectory
from asyncfl_jax.timing import DelayModel, make_schedule

N, T, STEPS, LR = 5, 12, 3, 0.3
TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
SCHEDULE = make_schedule("concurrent", N, T, TOY_DELAYS, seed=0, concurrency=5, buffer_size=3, refill="immediate")
FEDBUFF_HP = {"client_lr": LR, "server_lr": 0.7}


def _fedbuff_reference() -> np.ndarray:
    """The reference's models ``[x_0, ..., x_T]`` of FedBuff (lr 0.7) on SCHEDULE."""
    step = ref.fedbuff_step(0.7)
    models = ref.replay_steps(SCHEDULE, X0, lambda c, start, v: ref.local_delta(MODEL, start, DATA[c], STEPS, LR),
                              lambda x, t, arrivals: step(x, [(a.client, a.staleness, a.message, a.start)
                                                               for a in arrivals]))
    return np.stack(models)


def _run(algorithm=None, **kw):
    kw = {"eval_every": 5, "progress": False, "hparams": FEDBUFF_HP, **kw}
    return simulate(TASK, algorithm or fedbuff(), SCHEDULE, LOCAL, **kw)


def test_the_schedule_has_a_client_arriving_twice_in_a_step():
    assert any(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in SCHEDULE.arrival_clients)


def test_float64_trajectory_equals_the_reference_at_every_step():
    expected = _fedbuff_reference()
    history = _run(trajectory=True, precision="float64")
    assert history.trajectory.shape == (1, T + 1, X0.size) and history.trajectory.dtype == np.float64
    moved = np.abs(expected[1:] - expected[:-1]).max(axis=1)
    assert (moved > 1e-4).sum() >= T // 2  # the model moves at most steps: the comparison is step by step
    np.testing.assert_allclose(history.trajectory[0], expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(history.trajectory[0, -1], history.final_params[0])


def test_the_first_record_is_the_model_after_the_initialization_round():
    """ACE starts from the model its initialization round made: that is the trajectory's x_0."""
    expected = np.stack(ref.replay_steps(SCHEDULE, X0, lambda c, start, v: ref.gradient(MODEL, start, DATA[c]),
                                         ref.ACEReference(N, X0.size, 0.5), init_round=True))
    history = _run(ace(), trajectory=True, precision="float64", hparams={"client_lr": LR, "server_lr": 0.5})
    assert np.abs(expected[0] - X0).max() > 1e-3
    np.testing.assert_allclose(history.trajectory[0], expected, rtol=0, atol=1e-12)


def test_float32_trajectory_and_lookahead_give_the_same_steps():
    expected = _fedbuff_reference()
    plain = _run(trajectory=True, eval_every=7)
    batched = _run(trajectory=True, lookahead=3, eval_every=4)
    assert plain.trajectory.dtype == np.float32
    np.testing.assert_allclose(plain.trajectory[0], expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(batched.trajectory, plain.trajectory, rtol=1e-5, atol=1e-6)


def test_a_function_of_the_model_gives_a_pytree_per_step_and_replica():
    def summary(x):
        return {"norm": jnp.linalg.norm(x), "head": x[:4]}

    history = _run(trajectory=summary, seeds=[0, 1], hparams={**FEDBUFF_HP, "server_lr": [0.5, 0.7]})
    full = _run(trajectory=True, seeds=[0, 1], hparams={**FEDBUFF_HP, "server_lr": [0.5, 0.7]})
    traj = history.trajectory
    assert set(traj) == {"norm", "head"} and traj["norm"].shape == (4, T + 1) and traj["head"].shape == (4, T + 1, 4)
    np.testing.assert_array_equal(traj["head"], full.trajectory[..., :4])
    np.testing.assert_allclose(traj["norm"], np.linalg.norm(full.trajectory, axis=-1), rtol=1e-6)
    assert not np.allclose(full.trajectory[0], full.trajectory[1])  # the replicas differ: the axis is not shared


def test_off_by_default_and_the_program_records_nothing():
    history = _run()
    assert history.trajectory is None
    run = loop_module.prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, hparams=FEDBUFF_HP)
    assert run.program.record is None and run.trajectory is None


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_resumed_run_has_the_uninterrupted_trajectory(tmp_path, precision):
    folder = str(tmp_path / "ckpt")
    whole = _run(trajectory=True, eval_every=4, precision=precision)

    def interrupt(update):
        if update.step == 8:
            raise KeyboardInterrupt

    with pytest.raises(SimulationInterrupted):
        _run(trajectory=True, eval_every=4, checkpoint_dir=folder, callbacks=[interrupt], precision=precision)
    with pytest.raises(CheckpointMismatchError, match="trajectory"):  # a run without a trajectory cannot use it
        _run(eval_every=4, checkpoint_dir=folder, resume=True, precision=precision)
    resumed = _run(trajectory=True, eval_every=4, checkpoint_dir=folder, resume=True, precision=precision)
    assert resumed.trajectory.dtype == np.dtype(precision)
    np.testing.assert_array_equal(resumed.trajectory, whole.trajectory)
    np.testing.assert_array_equal(resumed.final_params, whole.final_params)


def test_too_large_a_trajectory_is_refused_before_compiling(monkeypatch):
    monkeypatch.setattr(loop_module, "MAX_TRAJECTORY_BYTES", 900)
    with pytest.raises(ValueError, match=r"the trajectory would take .* \(1 replicas x 13 models x 72 bytes\), more "
                                         r"than the limit"):
        _run(trajectory=True)
    _run(trajectory=lambda x: x[:2])  # 1 x 13 x 8 bytes fits


@pytest.mark.parametrize("value,match", [("yes", "trajectory must be True"), (3, "trajectory must be True"),
                                         (lambda x: {}, "must return an array or a pytree of arrays"),
                                         (lambda x: "label", "not a valid JAX type"),
                                         (lambda x: x.reshape(7, -1), "cannot be traced on the flat model")])
def test_bad_trajectory_options_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        loop_module.prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, trajectory=value)


def test_cli_writes_the_trajectory_and_load_results_reads_it(tmp_path):
    out = tmp_path / "run"
    code = cli.main(["run", "--out", str(out), "--set", "data.num_clients=10", "--set", "runs.arrivals=30",
                     "--set", "local.steps=1", "--set", "eval_points=2", "--no-progress", "--no-plot",
                     "--algorithm", "fedbuff", "--concurrency", "5", "--buffer-size", "2", "--trajectory"])
    assert code == 0
    path = out / "trajectory" / "fedbuff.npz"
    trajectory = read_trajectory(str(path))
    (history,) = load_results(str(out))
    assert json.loads((out / "config.json").read_text())["trajectory"] is True
    assert trajectory.shape == (1, history.num_steps + 1, history.final_params.shape[-1])
    np.testing.assert_array_equal(history.trajectory, trajectory)
    np.testing.assert_array_equal(trajectory[:, -1], history.final_params)
    assert os.path.isfile(out / "checkpoints" / "fedbuff" / "history.npz")


def test_event_clock_run_with_a_diverged_replica():
    """Under the in-scan event clock the trajectory sits beside the clock's records (the realized schedules are
    those of the run without it), and a replica frozen after diverging repeats the model it keeps."""
    from asyncfl_jax.algorithms import asyncfeded
    from asyncfl_jax.timing.clock import EventClock

    clock = EventClock(N, 30, DelayModel(), seed=0)
    kw = {"hparams": {"client_lr": [0.3, 1e38], "feded_lambda": 1.0, "feded_epsilon": 1.0, "target_staleness": 3.0,
                      "kappa": 1.0}, "eval_every": 10, "progress": False}
    with pytest.warns(RuntimeWarning, match="diverged"):
        plain = simulate(TASK, asyncfeded(initial_steps=3, max_steps=6), clock, LOCAL, **kw)
    with pytest.warns(RuntimeWarning, match="diverged"):
        history = simulate(TASK, asyncfeded(initial_steps=3, max_steps=6), clock, LOCAL, trajectory=True, **kw)
    np.testing.assert_array_equal(history.final_params, plain.final_params)
    np.testing.assert_array_equal(history.job_steps, plain.job_steps)
    assert [s.num_steps for s in history.realized_schedules] == [s.num_steps for s in plain.realized_schedules]
    traj = history.trajectory
    assert traj.shape == (2, 31, X0.size)
    np.testing.assert_array_equal(traj[:, -1], history.final_params)
    assert history.diverged_at[0] == -1 and 0 <= history.diverged_at[1] < 20
    frozen_from = (history.diverged_at[1] // 10 + 1) * 10  # the first chunk after the one that diverged
    assert frozen_from < 30
    kept = np.broadcast_to(history.final_params[1], traj[1, frozen_from:].shape)
    np.testing.assert_array_equal(traj[1, frozen_from:], kept)  # NaN equal to NaN: the kept model, step after step


def test_a_frozen_replica_records_the_model_it_keeps():
    """The frozen chunk (used once a replica diverged) records the kept model for a frozen replica, not the steps
    it would have taken; the other replica's records are its steps."""
    from asyncfl_jax.engine import HostLoop

    run = loop_module.prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=[0, 1], hparams=FEDBUFF_HP, eval_every=4,
                                  trajectory=True)
    loop = HostLoop(run)
    carry = loop.initial_state().carry
    carry = carry._replace(diverged_at=jnp.asarray([-1, 0], jnp.int32))  # replica 1 marked diverged, model finite
    kept = np.asarray(carry.server.x[1])
    part = run.timeline.chunk_inputs(run.placed.inputs, 0, 4, carry)
    new, records = loop.chunk_fns[True](carry, part, run.placed.hp, run.placed.keys, run.placed.data)
    recorded = np.asarray(records["trajectory/000"])
    assert recorded.shape == (2, 4, X0.size)
    np.testing.assert_array_equal(recorded[1], np.broadcast_to(kept, (4, X0.size)))
    np.testing.assert_array_equal(recorded[0, -1], np.asarray(new.server.x[0]))
    assert np.abs(recorded[0, -1] - recorded[0, 0]).max() > 1e-3
