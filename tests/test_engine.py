"""Engine behaviour: determinism, replicas, sweeps, divergence, the pure functional API, History and results."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncfl_jax import (
    LocalConfig,
    fedasync,
    fedbuff,
    make_model,
    make_schedule,
    make_simulation,
    make_task,
    schedule_arrays,
    simulate,
    task_arrays,
)
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.engine import build_program, default_hparams, make_replicas, stack_hparams
from asyncfl_jax.results import read_metrics_csv, write_results
from asyncfl_jax.timing import DelayModel

N = 12
DELAYS = DelayModel(speed="uniform", speed_low=1.0, speed_high=5.0, noise="exponential")
LOCAL = LocalConfig(steps=3, batch_size=8)


@pytest.fixture(scope="module")
def task():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=120)
    return make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))


@pytest.fixture(scope="module")
def mlp_task():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=120)
    return make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[16]))


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("concurrent", N, 40, DELAYS, seed=0, concurrency=6, buffer_size=3, refill="boundary")


def test_same_seed_same_history(task, schedule):
    a = simulate(task, fedbuff(), schedule, LOCAL, seeds=[3], eval_every=10, progress=False)
    b = simulate(task, fedbuff(), schedule, LOCAL, seeds=[3], eval_every=10, progress=False)
    c = simulate(task, fedbuff(), schedule, LOCAL, seeds=[4], eval_every=10, progress=False)
    np.testing.assert_array_equal(a.final_params, b.final_params)
    for k in a.metrics:
        np.testing.assert_array_equal(a.metrics[k], b.metrics[k])
    assert not np.array_equal(a.final_params, c.final_params)  # the seed drives the minibatches


def test_history_does_not_depend_on_eval_cadence(task, schedule):
    """Bit for bit: the chunk length changes where the scan stops to evaluate, not what a step computes."""
    a = simulate(task, fedbuff(), schedule, LOCAL, seeds=[0], eval_every=7, progress=False)
    b = simulate(task, fedbuff(), schedule, LOCAL, seeds=[0], eval_every=40, progress=False)
    assert a.final_params.tobytes() == b.final_params.tobytes()
    assert list(a.steps) == [0, 7, 14, 21, 28, 35, 40] and list(b.steps) == [0, 40]
    for k in a.metrics:
        assert a.metrics[k][:, [0, -1]].tobytes() == b.metrics[k].tobytes(), k


def test_vmapped_replicas_equal_runs_one_by_one(task, schedule):
    """A sweep (2 seeds x 2 client learning rates) as one program equals the four runs done separately, up to float
    rounding: XLA may compile a matmul batched over replicas with another summation order than a single one (in this
    small setting they happen to agree bit for bit on the CPU, but an MLP with 32 hidden units already differs in the
    last bits). A replica's evaluation does not depend on the others (it runs replica after replica)."""
    together = simulate(task, fedbuff(), schedule, LOCAL, seeds=[0, 1], hparams={"client_lr": [0.05, 0.2]},
                        eval_every=20, progress=False)
    assert together.num_replicas == 4 and together.swept == ["client_lr"]
    for r, (seed, hp) in enumerate(zip(together.seeds, together.hparams)):
        alone = simulate(task, fedbuff(), schedule, LOCAL, seeds=[seed], hparams={"client_lr": hp["client_lr"]},
                         eval_every=20, progress=False)
        np.testing.assert_allclose(together.final_params[r], alone.final_params[0], rtol=1e-5, atol=1e-6)
        for k in together.metrics:
            np.testing.assert_allclose(together.metrics[k][r], alone.metrics[k][0], rtol=1e-5, atol=1e-6)


def test_per_seed_schedules(task):
    """One schedule per seed: replicas differ in timing as well as in training randomness."""
    seeds = [0, 1]
    schedules = [make_schedule("concurrent", N, 20, DELAYS, seed=s, concurrency=6, buffer_size=3,
                               refill="immediate") for s in seeds]
    h = simulate(task, fedbuff(), schedules, LOCAL, seeds=seeds, hparams={"server_lr": [0.5, 1.0]}, eval_every=10,
                 progress=False)
    assert h.num_replicas == 4 and len(h.schedule_stats) == 4
    assert not np.array_equal(h.times[0], h.times[2])  # seed 0 and seed 1 have different virtual clocks
    alone = simulate(task, fedbuff(), schedules[1], LOCAL, seeds=[1], hparams={"server_lr": 1.0}, eval_every=10,
                     progress=False)
    np.testing.assert_allclose(h.final_params[3], alone.final_params[0], rtol=1e-5, atol=1e-6)


def test_divergence_is_detected_with_its_step(mlp_task, schedule):
    with pytest.warns(RuntimeWarning, match=r"replica 1 .*client_lr=1e\+20.*diverged.*server step \d+"):
        h = simulate(mlp_task, fedbuff(), schedule, LOCAL, seeds=[0], hparams={"client_lr": [0.05, 1e20]},
                     eval_every=10, progress=False)
    assert h.diverged_at[0] == -1 and 0 <= h.diverged_at[1] < 40
    assert np.isfinite(h.final_params[0]).all() and not np.isfinite(h.final_params[1]).all()
    assert not h.stopped_early  # the healthy replica finished


def test_a_diverged_replica_is_frozen_while_the_others_go_on(mlp_task, schedule):
    """Program.frozen_chunk (which simulate uses once a replica diverged) leaves the whole carry of a replica marked
    diverged unchanged (bitwise), under vmap, while the others go on."""
    program = build_program(mlp_task, fedbuff(), LOCAL, schedule.num_slots)
    sched = schedule_arrays(schedule)
    hp = stack_hparams(make_replicas(fedbuff(), [0, 1]))
    keys = jnp.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)])
    data = task_arrays(mlp_task)
    carry = jax.vmap(program.init, in_axes=(None, 0, 0, None))(sched, hp, keys, data)
    carry = carry._replace(diverged_at=jnp.asarray([-1, 3], jnp.int32))  # replica 1 diverged earlier
    steps = jax.tree_util.tree_map(lambda a: a[:10], sched.steps)
    after, _ = jax.vmap(program.frozen_chunk, in_axes=(0, None, 0, 0, None))(carry, steps, hp, keys, data)
    for old, new in zip(jax.tree_util.tree_leaves(carry), jax.tree_util.tree_leaves(after)):
        np.testing.assert_array_equal(np.asarray(new)[1], np.asarray(old)[1])
    assert not np.array_equal(np.asarray(after.server.x)[0], np.asarray(carry.server.x)[0])  # replica 0 moved


def test_run_stops_when_every_replica_diverged(mlp_task, schedule):
    with pytest.warns(RuntimeWarning, match="diverged"):
        h = simulate(mlp_task, fedbuff(), schedule, LOCAL, seeds=[0], hparams={"client_lr": 1e20}, eval_every=5,
                     progress=False)
    assert h.stopped_early and h.steps[-1] < 40
    assert h.summary()["diverged_at"][0] == int(h.diverged_at[0])


def test_unknown_hyperparameter_suggests_the_closest_name():
    with pytest.raises(ValueError, match=r"'alpah' is not used by fedasync.*did you mean 'alpha'"):
        make_replicas(fedasync(), [0], {"alpah": 0.1})


def test_functional_api_jit_and_vmap_over_user_hyperparameters(task, schedule):
    """A user jits and vmaps the pure simulation over their own learning rates and keys, with no package helpers
    beyond make_simulation, schedule_arrays and task_arrays, and gets what simulate() reports."""
    run = make_simulation(task, fedbuff(), LOCAL, num_steps=schedule.num_steps, num_slots=schedule.num_slots,
                          eval_every=10)
    lrs = jnp.array([0.02, 0.1, 0.3])
    defaults = default_hparams(fedbuff())
    hp = {k: jnp.full((3,), v, jnp.float32) for k, v in defaults.items()} | {"client_lr": lrs}
    keys = jnp.stack([jax.random.PRNGKey(7)] * 3)
    out = jax.jit(jax.vmap(run, in_axes=(None, 0, 0, None)))(schedule_arrays(schedule), hp, keys, task_arrays(task))
    assert out.params.shape == (3, task.num_params)
    assert out.metrics["test_accuracy"].shape == (3, 5)  # after steps 0, 10, 20, 30, 40
    for i, lr in enumerate([0.02, 0.1, 0.3]):
        ref = simulate(task, fedbuff(), schedule, LOCAL, seeds=[7], hparams={"client_lr": lr}, eval_every=10,
                       progress=False)
        np.testing.assert_allclose(out.params[i], ref.final_params[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.metrics["test_accuracy"][i], ref.metrics["test_accuracy"][0], atol=1e-6)


def test_server_update_callable_on_a_users_own_state():
    """One algorithm's server rule is a pure function on the user's own arrays."""
    from asyncfl_jax.algorithms import ServerMeta, ServerState

    alg = fedbuff(staleness="inverse_sqrt")
    state = alg.init(jnp.zeros(4), 10)
    deltas = jnp.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0], [9.0, 9, 9, 9]])
    meta = ServerMeta(clients=jnp.array([3, 5, -1]), mask=jnp.array([True, True, False]),
                      staleness=jnp.array([0, 3, 0]), step=jnp.int32(4), time=jnp.float32(1.0))
    new = jax.jit(alg.server)(state, deltas, meta, {"server_lr": 1.0})
    assert isinstance(new, ServerState)
    np.testing.assert_allclose(new.x, [0.5, 2.0 / np.sqrt(4.0) / 2, 0, 0], rtol=1e-6)


def test_history_rows_and_results_files(task, schedule, tmp_path):
    h = simulate(task, fedbuff(), schedule, LOCAL, seeds=[0, 1], eval_every=20, progress=False)
    paths = write_results(str(tmp_path / "out"), {"note": "test"}, [h])
    assert sorted(os.path.basename(p) for p in paths) == ["accuracy.png", "config.json", "environment.json",
                                                          "metrics.csv", "summary.json"]
    rows = read_metrics_csv(str(tmp_path / "out" / "metrics.csv"))
    assert len(rows) == 2 * 3  # 2 replicas x evaluations after 0, 20, 40 steps
    assert {"run", "replica", "seed", "step", "time", "uploads", "test_accuracy", "test_loss", "train_loss"} <= set(rows[0])
    assert [int(r["uploads"]) for r in rows[:3]] == [0, 60, 120]  # M = 3 arrivals per step
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"][0]
    assert summary["schedule"][0]["staleness_mean"] >= 0
    assert len(summary["final_test_accuracy"]) == 2
    assert not any(f.startswith(".tmp") for f in os.listdir(tmp_path / "out"))  # atomic writes left no temp files


@pytest.mark.parametrize("name", ["ca2fl", "area"])  # a server cache; a client memory
@pytest.mark.parametrize("protocol,options", [("all_active", {}),
                                              ("concurrent", {"concurrency": 6, "buffer_size": 3,
                                                              "refill": "boundary"})])
def test_compiled_step_copies_no_per_client_buffer(task, name, protocol, options):
    """The pending buffer, CA2FL's n x d cache and AREA's n x d client memory are updated in place: no copy of an
    [R, n, d] array per step (the schedule is shared by the replicas, so the client indices are not batched)."""
    import re

    from asyncfl_jax.algorithms import get_algorithm
    from asyncfl_jax.engine import build_program, stack_hparams

    schedule = make_schedule(protocol, N, 10, DELAYS, seed=0, **options)
    algorithm = get_algorithm(name)
    program = build_program(task, algorithm, LOCAL, schedule.num_slots)
    hp = stack_hparams(make_replicas(algorithm, [0]))
    keys = jnp.stack([jax.random.PRNGKey(0)])
    sched, data = schedule_arrays(schedule), task_arrays(task)
    carry = jax.jit(jax.vmap(program.init, in_axes=(None, 0, 0, None)))(sched, hp, keys, data)
    chunk = jax.jit(jax.vmap(program.chunk, in_axes=(0, None, 0, 0, None)), donate_argnums=(0,))
    hlo = chunk.lower(carry, sched.steps, hp, keys, data).compile().as_text()
    d = task.num_params
    shapes = {f"f32[1,{N},{d}]", f"f32[1,{schedule.num_slots},{d}]"}
    copies = [line for line in hlo.splitlines()
              if " copy(" in line and any(re.search(re.escape(s) + r"\S* copy\(", line) for s in shapes)]
    assert not copies, copies


@pytest.mark.parametrize("name", ["ace", "aced", "asynflc_ef"])  # initialization rounds; client memory
def test_initial_jobs_in_groups_equal_one_group(task, name, monkeypatch):
    """The initialization round and the initial jobs are scanned in groups of ``INIT_BATCH`` (padded at the end);
    the group size changes nothing (up to float rounding: ACE's groups fill the cache one after the other and the
    last one steps), also for algorithms with client memory (error feedback)."""
    from asyncfl_jax import engine
    from asyncfl_jax.algorithms import get_algorithm

    sched = make_schedule("all_active", N, 15, DELAYS, seed=2)
    assert sched.init_clients.shape[0] == N
    alg = get_algorithm(name)
    one = simulate(task, alg, sched, LOCAL, seeds=[0, 1], eval_every=5, progress=False)
    monkeypatch.setattr(engine.jobs, "INIT_BATCH", 5)  # 12 clients -> 3 groups, the last one padded with 3 empty rows
    assert engine.prepare_run(task, alg, sched, LOCAL).program.init_batch == 5  # the engine reads the new size
    grouped = simulate(task, alg, sched, LOCAL, seeds=[0, 1], eval_every=5, progress=False)
    np.testing.assert_allclose(grouped.final_params, one.final_params, rtol=1e-5, atol=1e-6)
    for k in one.metrics:
        np.testing.assert_allclose(grouped.metrics[k], one.metrics[k], rtol=1e-5, atol=1e-6)
