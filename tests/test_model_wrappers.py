"""Model wrappers never train what is not a parameter: BatchNorm statistics and other Flax collections are refused in
every entry point (model_from_apply, model_from_flax, a Model built by hand given to make_task), and Flax NNX modules
are accepted through nnx.split."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import asyncfl_jax as afl
from asyncfl_jax.models import Model, model_from_nnx


class LinenBatchNorm(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dense(4)(x.reshape((x.shape[0], -1)))
        return nn.BatchNorm(use_running_average=not train)(x)


class NnxMLP(nnx.Module):
    def __init__(self, d_in: int, num_classes: int, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(d_in, 16, rngs=rngs)
        self.out = nnx.Linear(16, num_classes, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x.reshape((x.shape[0], -1)))))


class NnxBatchNorm(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(60, 4, rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x))


def _small_data():
    data = afl.data.synthetic_leaf(num_clients=4, alpha=1.0, beta=1.0, max_samples=60)
    return data


def test_model_from_apply_refuses_batchnorm_statistics_with_a_hint():
    module = LinenBatchNorm()
    variables = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 60)))
    assert set(variables) == {"params", "batch_stats"}
    with pytest.raises(ValueError, match=r"\['batch_stats'\] besides 'params'.*GroupNorm"):
        afl.model_from_apply(lambda v, x: module.apply(v, x), variables)
    with pytest.raises(ValueError, match="batch_stats"):
        afl.model_from_flax(module, jnp.zeros((1, 60)))
    # the hint's way out: only the parameters, the statistics kept fixed inside apply_fn
    stats = variables["batch_stats"]
    model = afl.model_from_apply(lambda p, x: module.apply({**p, "batch_stats": stats}, x),
                                 {"params": variables["params"]})
    assert model.num_params == sum(a.size for a in jax.tree_util.tree_leaves(variables["params"]))


def test_a_model_built_by_hand_with_batchnorm_statistics_is_refused_by_make_task():
    module = LinenBatchNorm()
    variables = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 60)))
    data = _small_data()
    with pytest.raises(ValueError, match="make_task: the model.*batch_stats"):
        afl.make_task(data, data.natural_partition, Model(lambda v, x: module.apply(v, x), variables))


def test_an_nnx_module_runs_and_equals_its_own_forward_pass():
    data = _small_data()
    module = NnxMLP(60, data.num_classes, nnx.Rngs(0))
    model = afl.model_from_flax(module, None)  # an NNX module is already initialised: no example input needed
    x = jnp.asarray(data.test_x[:5])
    np.testing.assert_allclose(model.flat_apply(model.flat_params, x), module(x), rtol=1e-6)
    assert model.num_params == 60 * 16 + 16 + 16 * data.num_classes + data.num_classes
    task = afl.make_task(data, data.natural_partition, model)
    schedule = afl.make_schedule("concurrent", 4, 4, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1)
    history = afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=2, batch_size=8), progress=False)
    assert np.isfinite(history.metrics["test_loss"]).all()
    assert history.metrics["train_loss"][0, -1] < history.metrics["train_loss"][0, 0]  # it trains


def test_an_nnx_module_with_batchnorm_statistics_is_refused_with_their_paths():
    with pytest.raises(ValueError, match=r"other than nnx.Param at .*norm.*LayerNorm"):
        model_from_nnx(NnxBatchNorm(nnx.Rngs(0)))
    with pytest.raises(ValueError, match="model_from_flax"):
        afl.model_from_apply(lambda p, x: x, NnxMLP(60, 10, nnx.Rngs(0)))
    with pytest.raises(ValueError, match="other than nnx.Param"):
        afl.model_from_apply(lambda p, x: x, nnx.state(NnxBatchNorm(nnx.Rngs(0))))
