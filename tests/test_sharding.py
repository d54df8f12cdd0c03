"""Spreading a step's jobs, or the replicas, over several devices gives the single-device result (4 CPU devices, in a
subprocess)."""

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
    """
)


def test_jobs_or_replicas_sharded_over_four_cpu_devices_equal_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sharded == single device" in out.stdout
    assert "replicas sharded == single device" in out.stdout
