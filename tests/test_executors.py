"""Job executors (asyncfl_jax.engine.executors): every layout of a step's jobs gives the vmapped program's results.

A tiny CNN (one 3x3 convolution) in float64, per store (train at dispatch, lookahead batching, train at arrival) and
per clock (a pre-sampled schedule, the event clock), with algorithms that exercise client memory, an n x d cache and
per-job step counts."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import prepare_run, simulate
from asyncfl_jax.engine.executors import (GroupedJobs, UnrolledJobs, VmapJobs, auto_executor, make_job_executor,
                                          model_kind, parse_job_executor)
from asyncfl_jax.models.conv import conv_general_dilated
from asyncfl_jax.models.core import make_model, model_from_apply, model_from_flax
from asyncfl_jax.task import make_task
from asyncfl_jax.timing import DelayModel, concurrent
from asyncfl_jax.timing.clock import EventClock

N = 6


class TinyCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(2, (3, 3), padding="SAME", conv_general_dilated=conv_general_dilated)(x))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


@pytest.fixture(scope="module")
def task():
    rng = np.random.default_rng(0)
    n = N * 5
    ds = Dataset("tiny", rng.random((n, 5, 5, 1)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32),
                 rng.random((4, 5, 5, 1)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32), 3)
    model = model_from_flax(TinyCNN(), jnp.zeros((1, 5, 5, 1)), name="tiny_cnn")
    return make_task(ds, [np.arange(i * 5, (i + 1) * 5) for i in range(N)], model)


CASES = [  # (algorithm, options, clock, lookahead, executors compared with vmap)
    ("area", {}, "schedule", 1, ("unrolled", "grouped:3")),  # TrainAtDispatch, client memory (dispatch order)
    ("ca2fl", {}, "schedule", 3, ("unrolled",)),  # Lookahead: jobs of several steps from their own models
    ("asyncfeded", {"initial_steps": 2, "max_steps": 3}, "event", 1, ("unrolled",)),  # TrainAtArrival, per-job K
]


@pytest.mark.parametrize("algorithm,options,clock,lookahead,executors", CASES)
def test_every_executor_gives_the_vmapped_results(task, algorithm, options, clock, lookahead, executors):
    alg = get_algorithm(algorithm, **options)
    if clock == "event":
        timing = EventClock(N, 6, DelayModel(), seed=1)
    else:
        timing = concurrent(N, 6, DelayModel(), seed=1, concurrency=4, buffer_size=2, refill="immediate")
    kw = dict(eval_every=6, progress=False, precision="float64", lookahead=lookahead)
    local = LocalConfig(steps=2, batch_size=3)
    runs = {ex: simulate(task, alg, timing, local, job_executor=ex, **kw) for ex in ("vmap", *executors)}
    base = runs["vmap"]
    assert np.max(np.abs(base.final_params[0] - np.asarray(task.model.flat_params))) > 1e-4  # the model moved
    for name, h in runs.items():
        np.testing.assert_allclose(h.final_params, base.final_params, rtol=1e-10, atol=1e-12, err_msg=name)
        for k in base.metrics:
            np.testing.assert_allclose(h.metrics[k], base.metrics[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_auto_chooses_by_backend_and_model(task):
    dense = make_model("mlp", (5, 5, 1), 3, hidden=(4,))
    x = jnp.zeros((1, 5, 5, 1))
    assert model_kind(task.model, x) == "convolutional" and model_kind(dense, x) == "dense"
    rnn = model_from_apply(lambda p, x: jax.lax.scan(lambda h, v: (jnp.tanh(h * p["w"] + v), h), jnp.zeros(3),
                                                     x.reshape(x.shape[0], -1).T)[0][None].repeat(x.shape[0], 0),
                           {"w": jnp.ones(3)})
    assert model_kind(rnn, x) == "recurrent"
    assert isinstance(auto_executor("cpu", "convolutional"), UnrolledJobs)
    assert isinstance(auto_executor("cpu", "recurrent"), UnrolledJobs)
    assert isinstance(auto_executor("cpu", "dense"), VmapJobs)
    assert isinstance(auto_executor("gpu", "convolutional"), VmapJobs)
    assert isinstance(make_job_executor("grouped:4", dense, x), GroupedJobs)
    cpu = jax.default_backend() == "cpu"
    alg = get_algorithm("fedbuff")
    timing = concurrent(N, 2, DelayModel(), seed=0, concurrency=2, buffer_size=1)
    assert prepare_run(task, alg, timing).job_executor == ("unrolled" if cpu else "vmap")
    assert prepare_run(task, alg, timing, job_executor="grouped:2").job_executor == "grouped:2"


@pytest.mark.parametrize("bad", ["grouped:0", "grouped:x", "loop", "", None, 3])
def test_a_bad_executor_is_refused_before_compiling(task, bad):
    with pytest.raises(ValueError, match="job_executor must be one of"):
        parse_job_executor(bad)
    with pytest.raises(ValueError, match="job_executor"):
        simulate(task, get_algorithm("fedbuff"), concurrent(N, 2, DelayModel(), seed=0, concurrency=2,
                                                            buffer_size=1), job_executor=bad, progress=False)


def test_unrolled_and_grouped_jobs_give_the_same_results():
    """The unrolled and grouped executors on 7 jobs (the last group shorter): the plain results. (The shard_jobs form
    of the unrolled executor, a shard_map over several devices, is checked in tests/test_sharding.py.)"""
    fn = lambda x, c, k: jnp.sin(x * c + k)  # noqa: E731
    x, c, k = jnp.arange(3.0), jnp.arange(7.0), jnp.arange(7.0) / 3
    want = VmapJobs().map(fn, (None, 0, 0), x, c, k)
    np.testing.assert_allclose(UnrolledJobs().map(fn, (None, 0, 0), x, c, k), want, rtol=1e-6)
    np.testing.assert_allclose(GroupedJobs(3).map(fn, (None, 0, 0), x, c, k), want, rtol=1e-6)


def test_unrolled_jobs_over_devices_without_a_mesh_is_refused():
    """The shard_jobs form needs the job mesh of as many devices (make_job_executor builds it); without one it is a
    clear error, not shard_map's."""
    with pytest.raises(ValueError, match="needs a mesh"):
        UnrolledJobs(shards=3).map(lambda x: x, (0,), jnp.arange(3.0))
