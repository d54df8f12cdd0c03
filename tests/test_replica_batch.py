"""Replicas computed in groups (``simulate(..., replica_batch=g)``): every replica gets the result it gets alone.

A sweep of 4 replicas (2 seeds x 2 server learning rates) is run with the replicas all together (the plain vmap), in
groups of 3 (two groups, the second short) and one at a time. In float64 each replica's trajectory equals the
independent numpy reference (tests/reference.py) at every step to ~1e-12 whatever the grouping; in float32 the
groupings agree with each other up to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, toy_problem
from asyncfl_jax import cli
from asyncfl_jax.algorithms import fedbuff
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import simulate
from asyncfl_jax.engine.callbacks import Checkpoints
from asyncfl_jax.engine.loop import prepare_run
from asyncfl_jax.engine.replica_groups import GroupedChunk, whole_carry
from asyncfl_jax.engine.placement import make_placement
from asyncfl_jax.timing import make_schedule

N, T, STEPS, LR = 5, 10, 2, 0.3
TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
SCHEDULE = make_schedule("concurrent", N, T, TOY_DELAYS, seed=1, concurrency=4, buffer_size=2, refill="immediate")
SEEDS = (0, 1)
HP = {"client_lr": LR, "server_lr": [0.5, 1.0]}


def _reference(server_lr: float) -> np.ndarray:
    step = ref.fedbuff_step(server_lr)
    models = ref.replay_steps(SCHEDULE, X0, lambda c, start, v: ref.local_delta(MODEL, start, DATA[c], STEPS, LR),
                              lambda x, t, arrivals: step(x, [(a.client, a.staleness, a.message, a.start)
                                                               for a in arrivals]))
    return np.stack(models)


def _run(**kw):
    return simulate(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP, eval_every=4, progress=False, **kw)


@pytest.mark.parametrize("replica_batch", [None, 3, 1])
def test_every_replica_equals_the_reference_whatever_the_grouping(replica_batch):
    history = _run(trajectory=True, precision="float64", replica_batch=replica_batch)
    assert len(history.seeds) == 4
    expected = {lr: _reference(lr) for lr in HP["server_lr"]}
    for r, hp in enumerate(history.hparams):
        np.testing.assert_allclose(history.trajectory[r], expected[hp["server_lr"]], rtol=0, atol=1e-12)


def test_groupings_agree_in_float32():
    plain = _run()
    for g in (1, 2, 3):
        grouped = _run(replica_batch=g)
        np.testing.assert_allclose(grouped.final_params, plain.final_params, rtol=1e-5, atol=1e-6)
        for m in plain.metrics:
            np.testing.assert_allclose(grouped.metrics[m], plain.metrics[m], rtol=1e-5, atol=1e-6)


def test_grouped_chunks_with_shared_and_nested_arguments():
    import jax
    import jax.numpy as jnp

    def fn(carry, tree, shared):  # a chunk: (new carry, records)
        return {"a": carry["a"] + tree["x"] * shared, "b": carry["b"] * 2}, {"y": tree["y"][0]}

    def args():  # fresh arrays each time: the first argument (the carry) is donated
        return ({"a": jnp.arange(5.0), "b": jnp.ones((5, 3))},
                {"x": jnp.arange(5.0) * 10, "y": (jnp.arange(10.0).reshape(5, 2), jnp.zeros(3))}, jnp.float32(2.0))

    axes = (0, {"x": 0, "y": (0, None)}, None)
    expected = jax.vmap(fn, in_axes=axes)(*args())
    for g in (1, 2, 4, 5):
        carry, records = GroupedChunk(fn, axes, g, 5).lower(*args()).compile()(*args())
        got = (whole_carry(carry), records)
        jax.tree_util.tree_map(np.testing.assert_array_equal, got, expected)


def test_a_grouped_carry_stays_in_its_groups_from_chunk_to_chunk():
    import jax
    import jax.numpy as jnp

    from typing import NamedTuple

    from asyncfl_jax.engine.replica_groups import GroupedCarry

    class Carry(NamedTuple):
        a: jax.Array
        b: jax.Array

    def fn(carry, x):
        return Carry(carry.a * 2 + x, carry.b - x[:, None]), {"y": x}

    axes = (0, 0)
    x = jnp.arange(5.0)[:, None] * jnp.ones((5, 2))
    start = Carry(jnp.arange(10.0).reshape(5, 2), jnp.ones((5, 2, 3)))
    vmapped = jax.vmap(fn, in_axes=axes)
    expected = vmapped(vmapped(start, x)[0], x)
    compiled = GroupedChunk(fn, axes, 2, 5).lower(start, x).compile()
    whole = Carry(*(a + 0 for a in start))
    first, _ = compiled(whole, x)
    assert all(leaf.is_deleted() for leaf in whole)  # a whole carry is consumed when split (no second copy kept)
    assert isinstance(first, GroupedCarry) and first.sizes == (2, 2, 1)
    donated = jax.tree_util.tree_leaves(first)
    second, records = compiled(first, x)  # each group's own buffers, donated: no whole carry in between
    assert all(leaf.is_deleted() for leaf in donated)
    jax.tree_util.tree_map(np.testing.assert_array_equal, (whole_carry(second), records), expected)
    np.testing.assert_array_equal(second.a, expected[0].a)  # a field of every replica, joined
    other = GroupedChunk(fn, axes, 3, 5).lower(start, x).compile()
    with pytest.raises(ValueError, match="groups"):
        other(second, x)
    # the memory check counts the carries of the groups that wait beside the one that runs
    one_replica = 2 * 4 + 2 * 3 * 4
    alone = GroupedChunk(fn, axes, 2, 2).lower(start, x).compile().memory_analysis()
    analysis = compiled.memory_analysis()
    if alone is not None:
        assert analysis.argument_size_in_bytes == alone.argument_size_in_bytes + 3 * one_replica


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_replica_batch_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="replica_batch"):
        prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP, replica_batch=bad)


def test_replica_batch_with_a_placement_is_refused():
    with pytest.raises(ValueError, match="replica_batch cannot be combined with shard_replicas"):
        prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP, replica_batch=2,
                    placement=make_placement(False, True, False))


def test_a_checkpoint_knows_its_grouping(tmp_path):
    runs = {g: prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP, replica_batch=g)
            for g in (None, 2, 4)}
    assert runs[4].replica_batch is None  # a group of every replica is the plain vmap
    ids = {g: Checkpoints(str(tmp_path), run).identity for g, run in runs.items()}
    assert ids[None] == ids[4] and ids[None] != ids[2] and ids[2]["replica_batch"] == 2
    assert "replica_batch" not in ids[None]  # runs without it keep their identity


@pytest.mark.parametrize("argv, message", [
    (["--replica-batch", "0"], "replica_batch"),
    (["--replica-batch", "2", "--shard-replicas"], "cannot be combined"),
])
def test_cli_refuses_bad_replica_batch(tmp_path, capsys, argv, message):
    code = cli.main(["run", "--out", str(tmp_path / "out"), "--steps", "4", *argv])
    assert code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- automatic grouping
def test_the_automatic_grouping_follows_the_backend_and_the_work_of_a_step():
    from asyncfl_jax.engine.replica_groups import CPU_GROUP_FLOPS, auto_replica_batch, group_bounds

    assert auto_replica_batch(8, "gpu", 1e12) is None and auto_replica_batch(8, "tpu", 1e12) is None
    assert auto_replica_batch(1, "cpu", 1e12) is None
    assert auto_replica_batch(8, "cpu", 1e12) == 1  # a heavy step: one replica at a time
    assert auto_replica_batch(8, "cpu", CPU_GROUP_FLOPS / 3) == 3
    assert auto_replica_batch(8, "cpu", CPU_GROUP_FLOPS / 100) is None  # a light step: all together
    assert group_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]


def test_the_default_grouping_on_a_cpu_equals_the_reference_and_the_vmap(monkeypatch):
    from asyncfl_jax.engine import replica_groups

    monkeypatch.setattr(replica_groups, "CPU_GROUP_FLOPS", 1.0)  # this toy's step counts as heavy: groups of one
    assert prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP).replica_batch == 1
    assert prepare_run(TASK, fedbuff(), SCHEDULE, LOCAL, seeds=SEEDS, hparams=HP, replica_batch=4).replica_batch is None
    history = _run(trajectory=True, precision="float64")
    expected = {lr: _reference(lr) for lr in HP["server_lr"]}
    for r, hp in enumerate(history.hparams):
        np.testing.assert_allclose(history.trajectory[r], expected[hp["server_lr"]], rtol=0, atol=1e-12)
    grouped, plain = _run(), _run(replica_batch=4)
    np.testing.assert_allclose(grouped.final_params, plain.final_params, rtol=1e-5, atol=1e-6)


def test_a_grouped_run_resumes_bit_for_bit(tmp_path):
    class FailAt:
        def __init__(self, k):
            self.calls, self.k = 0, k

        def on_chunk(self, loop, update):
            self.calls += 1
            if self.calls == self.k:
                raise RuntimeError("stop here")

    reference = _run(replica_batch=3)
    with pytest.raises(RuntimeError, match="stop here"):
        _run(replica_batch=3, checkpoint_dir=str(tmp_path), checkpoint_every=1, callbacks=[FailAt(2)])
    resumed = _run(replica_batch=3, checkpoint_dir=str(tmp_path), resume=True)
    assert resumed.final_params.tobytes() == reference.final_params.tobytes()
    for m in reference.metrics:
        assert resumed.metrics[m].tobytes() == reference.metrics[m].tobytes(), m


def test_an_event_clock_run_in_groups_equals_the_vmap():
    """The in-scan clock reads every replica's counters between chunks (a field of the groups' carries, joined)."""
    from asyncfl_jax.timing.clock import EventClock

    clock = EventClock(N, T, TOY_DELAYS, seed=2)
    runs = {g: simulate(TASK, fedbuff(), clock, LOCAL, seeds=SEEDS, hparams=HP, eval_every=4, progress=False,
                        replica_batch=g) for g in (None, 1)}
    np.testing.assert_allclose(runs[1].final_params, runs[None].final_params, rtol=1e-5, atol=1e-6)
    for m in runs[None].metrics:
        np.testing.assert_allclose(runs[1].metrics[m], runs[None].metrics[m], rtol=1e-5, atol=1e-6)
