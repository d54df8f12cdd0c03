"""Spreading a step's jobs, the replicas, or the per-client state over several devices gives the single-device result
(4 CPU devices, in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    assert jax.device_count() == 4, jax.devices()
    from asyncfl_jax import LocalConfig, fedbuff, make_model, make_schedule, make_task, simulate
    from asyncfl_jax.data import synthetic_leaf
    from asyncfl_jax.timing import DelayModel

    data = synthetic_leaf(num_clients=12, seed=1, max_samples=120)
    task = make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[32]))
    schedule = make_schedule("concurrent", 12, 20, DelayModel(), seed=0, concurrency=8, buffer_size=6,
                             refill="immediate")
    kw = dict(local=LocalConfig(steps=3, batch_size=8), seeds=[0, 1], eval_every=10, progress=False)
    one = simulate(task, fedbuff(), schedule, **kw)
    spread = simulate(task, fedbuff(), schedule, shard_jobs=True, **kw)
    np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(spread.metrics["test_loss"], one.metrics["test_loss"], rtol=1e-5)
    print("sharded == single device")
    # shard_jobs places the data, hyper-parameters and keys on every device once, before the first chunk (left on
    # one device, each chunk call copied the whole dataset to the others)
    from asyncfl_jax.engine import prepare_run
    run = prepare_run(task, fedbuff(), schedule, kw["local"], seeds=[0, 1], eval_every=10, shard_jobs=True)
    for leaf in jax.tree_util.tree_leaves((run.placed.data, run.placed.hp, run.placed.keys, run.placed.inputs)):
        assert leaf.sharding.is_fully_replicated and len(leaf.sharding.device_set) == 4, leaf.sharding
    budget = run.budget()  # the state and the data are held by each of the 4 devices (on a CPU, in one memory)
    assert budget.devices == 4 and budget.per_device == budget.state + budget.data + budget.activations, budget

    # the replica axis over the 4 devices: 2 seeds x 2 learning rates, one per device
    sweep = dict(kw, hparams={"client_lr": [0.05, 0.2]})
    one = simulate(task, fedbuff(), schedule, **sweep)
    spread = simulate(task, fedbuff(), schedule, shard_replicas=True, **sweep)
    # (float rounding of batched vs single matmuls, grown over 20 steps of an MLP at client_lr 0.2: ~5e-5)
    np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-3, atol=2e-4)
    for k in one.metrics:
        np.testing.assert_allclose(spread.metrics[k], one.metrics[k], rtol=1e-4, atol=1e-4)
    # per-seed event clocks, replicas spread, resumable checkpoints included
    from asyncfl_jax import asyncfeded
    from asyncfl_jax.timing.clock import EventClock
    clocks = [EventClock(12, 20, DelayModel(suspension_prob=0.2), seed=s) for s in (0, 1)]
    one = simulate(task, asyncfeded(initial_steps=3, max_steps=6), clocks, **sweep)
    spread = simulate(task, asyncfeded(initial_steps=3, max_steps=6), clocks, shard_replicas=True, **sweep)
    np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-3, atol=2e-4)
    np.testing.assert_array_equal(spread.job_steps, one.job_steps)
    try:
        simulate(task, fedbuff(), schedule, shard_replicas=True, **kw)  # 2 replicas on 4 devices
    except ValueError as e:
        assert "multiple of the 4 devices" in str(e), e
    else:
        raise AssertionError("2 replicas on 4 devices should be refused")
    print("replicas sharded == single device")

    # the unrolled executor (a CNN on CPU) with shard_jobs: each device trains its part of the jobs one by one
    # (a shard_map); 7 jobs over 4 devices, one padded; then a whole run with a convolution equals one device
    import jax.numpy as jnp
    import flax.linen as nn
    from asyncfl_jax.engine.executors import UnrolledJobs, VmapJobs, make_job_executor
    from asyncfl_jax.models.conv import conv_general_dilated
    from asyncfl_jax.models.core import model_from_flax
    fn = lambda x, c, k: jnp.sin(x * c + k)
    x, c, k = jnp.arange(3.0), jnp.arange(7.0), jnp.arange(7.0) / 3
    split = make_job_executor("unrolled", None, None, shards=4)
    assert isinstance(split, UnrolledJobs) and split.shards == 4, split
    np.testing.assert_allclose(jax.jit(lambda *a: split.map(fn, (None, 0, 0), *a))(x, c, k),
                               VmapJobs().map(fn, (None, 0, 0), x, c, k), rtol=1e-6)

    class TinyCNN(nn.Module):  # the 60 features of each example as a 6 x 10 image
        @nn.compact
        def __call__(self, x):
            x = x.reshape((x.shape[0], 6, 10, 1))
            x = nn.relu(nn.Conv(2, (3, 3), padding="SAME", conv_general_dilated=conv_general_dilated)(x))
            return nn.Dense(data.num_classes)(x.reshape((x.shape[0], -1)))

    from asyncfl_jax.engine import prepare_run
    from asyncfl_jax.engine.placement import make_placement
    cnn = model_from_flax(TinyCNN(), jnp.zeros((1, *data.input_shape)), name="tiny_cnn")
    task = make_task(data, data.natural_partition, cnn)
    local = LocalConfig(steps=2, batch_size=8)
    run = prepare_run(task, fedbuff(), schedule, local, placement=make_placement(shard_jobs=True))
    assert run.job_executor == "unrolled" and run.program.trainer.executor.shards == 4, run.program.trainer.executor
    kw = dict(local=local, seeds=[0], eval_every=10, progress=False)
    one = simulate(task, fedbuff(), schedule, **kw)
    spread = simulate(task, fedbuff(), schedule, shard_jobs=True, **kw)
    np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-5, atol=1e-6)
    print("unrolled jobs sharded == single device")
    """
)


def test_jobs_or_replicas_sharded_over_four_cpu_devices_equal_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sharded == single device" in out.stdout
    assert "replicas sharded == single device" in out.stdout


CLIENTS_SCRIPT = textwrap.dedent(
    """
    import re, tempfile
    import jax, jax.numpy as jnp, numpy as np
    assert jax.device_count() == 4, jax.devices()
    from asyncfl_jax import LocalConfig, engine, make_model, make_schedule, make_task, simulate, task_arrays
    from asyncfl_jax import algorithms as A
    from asyncfl_jax.checkpoint import SimulationInterrupted
    from asyncfl_jax.data import synthetic_leaf
    from asyncfl_jax.timing import DelayModel

    n = 16
    data = synthetic_leaf(num_clients=n, seed=1, max_samples=80)
    task = make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[16]))
    all_active = make_schedule("concurrent", n, 24, DelayModel(), seed=0, concurrency=n, buffer_size=1,
                               refill="immediate")
    buffered = make_schedule("concurrent", n, 24, DelayModel(), seed=0, concurrency=8, buffer_size=3,
                             refill="immediate")
    kw = dict(local=LocalConfig(steps=2, batch_size=8), seeds=[0, 1], eval_every=8, progress=False)
    # server caches (float32, int8), client memory (error-feedback residuals), lookahead buffers
    cases = [("ace", A.ace(), all_active, 1), ("ace lookahead 4", A.ace(), all_active, 4),
             ("ca2fl int8", A.ca2fl(cache="int8"), buffered, 1), ("asynflc_ef", A.asynflc_ef(), buffered, 1)]
    for name, algorithm, schedule, lookahead in cases:
        one = simulate(task, algorithm, schedule, lookahead=lookahead, **kw)
        spread = simulate(task, algorithm, schedule, shard_clients=True, lookahead=lookahead, **kw)
        np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-5, atol=1e-6, err_msg=name)
        for k in one.metrics:
            np.testing.assert_allclose(spread.metrics[k], one.metrics[k], rtol=1e-5, atol=1e-6, err_msg=name)
        m = spread.memory
        state = m["server_bytes"] + m["clients_bytes"] + m["pending_bytes"]
        # ACE's n x d cache and n in-flight messages are split 4 ways; CA2FL's 10 slots do not split over 4 devices
        share = 0.5 if schedule is all_active else 0.9
        assert m["devices"] == 4 and m["device_state_bytes"] < share * state, (name, m)
    # under the in-scan event clock (AsyncFedED's per-client step sizes)
    from asyncfl_jax.timing.clock import EventClock
    clocks = [EventClock(n, 16, DelayModel(suspension_prob=0.2), seed=s) for s in (0, 1)]
    one = simulate(task, A.asyncfeded(initial_steps=2, max_steps=4), clocks, **kw)
    spread = simulate(task, A.asyncfeded(initial_steps=2, max_steps=4), clocks, shard_clients=True, **kw)
    np.testing.assert_allclose(spread.final_params, one.final_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(spread.job_steps, one.job_steps)
    print("clients sharded == single device")

    # The compiled server steps keep the cache spread: the gathers and scatters of arriving rows are partitioned
    # (an all-reduce of the rows read), never an all-gather of the n x d cache, and each device's outputs hold a
    # quarter of the cache and of the in-flight messages.
    algorithm, local = A.ace(), LocalConfig(steps=2, batch_size=8)
    program = engine.build_program(task, algorithm, local, all_active.num_slots)
    sched = engine.schedule_arrays(all_active)
    hp = engine.stack_hparams(engine.make_replicas(algorithm, [0]))
    keys, arrays = jax.random.PRNGKey(0)[None], task_arrays(task)
    init = jax.vmap(program.init, in_axes=(None, 0, 0, None))
    shape = jax.eval_shape(init, sched, hp, keys, arrays)
    flags = engine.per_client_leaves(algorithm, task.model.flat_params, n)
    assert flags[0].cache is True and flags[0].x is False, flags  # found from the shapes, not declared
    placement, everywhere = engine.client_shardings(shape, *flags, n)
    sched, hp, keys, arrays = jax.device_put((sched, hp, keys, arrays), everywhere)
    carry = jax.jit(init, out_shardings=placement)(sched, hp, keys, arrays)
    steps = engine.slice_steps(sched.steps._replace(plan=()), 0, 8, replica_axis=False)
    chunk = jax.jit(jax.vmap(program.advance, in_axes=(0, None, 0, 0, None)), out_shardings=(placement, everywhere))
    compiled = chunk.lower(carry, steps, hp, keys, arrays).compile()
    hlo = compiled.as_text()
    assert "all-reduce" in hlo and not re.search(r"all-gather|all-to-all", hlo)
    d = task.num_params
    assert carry.server.cache.sharding.shard_shape(carry.server.cache.shape) == (1, n // 4, d)
    out_bytes = compiled.memory_analysis().output_size_in_bytes
    assert out_bytes < 0.6 * (2 * n * d * 4), out_bytes  # cache and messages (2 n d floats), a quarter each
    print("no all-gather of the cache")

    # An interrupted sharded run resumes to the same numbers.
    class StopAt:
        def __init__(self, k):
            self.k, self.calls = k, 0
        def update(self, n):
            self.calls += 1
            if self.calls == self.k:
                raise KeyboardInterrupt
        def set_postfix(self, **kwargs):
            pass
        def close(self):
            pass
    for spread in ({"shard_clients": True}, {"shard_jobs": True}):  # (shard_jobs: a replicated state, restored so)
        ref = simulate(task, A.ca2fl(), buffered, **spread, **kw)
        folder = tempfile.mkdtemp()
        bar = engine.callbacks.progress_bar
        engine.callbacks.progress_bar = lambda *a, **k: StopAt(2)
        try:
            simulate(task, A.ca2fl(), buffered, checkpoint_dir=folder, **spread, **kw)
        except SimulationInterrupted as e:
            assert e.saved and e.step == 16, (e.saved, e.step)
        else:
            raise AssertionError("the run should have been interrupted")
        engine.callbacks.progress_bar = bar
        resumed = simulate(task, A.ca2fl(), buffered, checkpoint_dir=folder, resume=True, **spread, **kw)
        assert resumed.final_params.tobytes() == ref.final_params.tobytes(), spread
        for k in ref.metrics:
            assert resumed.metrics[k].tobytes() == ref.metrics[k].tobytes(), (spread, k)
    print("sharded clients resume")

    # n must split over the devices; one axis at a time
    small = make_task(data, data.natural_partition[:14], task.model)
    for bad, expected in [(dict(shard_clients=True), "multiple of the 4 devices, got 14"),
                          (dict(shard_clients=True, shard_replicas=True), "cannot be combined")]:
        try:
            simulate(small, A.ca2fl(), make_schedule("concurrent", 14, 4, DelayModel(), seed=0, concurrency=4,
                                                     buffer_size=2), **bad, **kw)
        except ValueError as e:
            assert expected in str(e), e
        else:
            raise AssertionError(f"{bad} should be refused")
    print("bad shard_clients refused")

    # from the command line
    import json, os
    from asyncfl_jax import cli
    out = tempfile.mkdtemp()
    assert cli.main(["run", "--algorithm", "ca2fl", "--num-clients", "16", "--concurrency", "8", "--buffer-size", "4",
                     "--set", "runs.arrivals=24",
                     "--set", "local.steps=2", "--set", "eval_points=2", "--shard-clients", "--no-progress",
                     "--no-plot", "--no-checkpoint", "--out", out]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["runs"][0]["memory"]["devices"] == 4
    print("cli --shard-clients")
    """
)


def test_per_client_state_sharded_over_four_cpu_devices_equals_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", CLIENTS_SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("clients sharded == single device", "no all-gather of the cache", "sharded clients resume",
                 "bad shard_clients refused", "cli --shard-clients"):
        assert line in out.stdout, out.stdout
