"""The local loop carries a job's iterate per layer (the built-in SGD chain) instead of as one flat vector.

The arithmetic is elementwise the same, so a job's delta equals the one of the flat form, which a custom optimizer
still gets (here the built-in chain passed as a custom factory): a multi-layer model with biases, momentum, weight
decay, the FedProx term and minibatches, vmapped over jobs as the engine runs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.client import LocalConfig, _Layers, client_optimizer, make_local_update
from asyncfl_jax.models.core import make_model
from asyncfl_jax.task import make_task, task_arrays

def _dataset():
    from asyncfl_jax.data.client_data import Dataset

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 5)).astype(np.float32)
    y = rng.integers(0, 3, 60).astype(np.int32)
    return Dataset("toy", x, y, x[:10], y[:10], 3)


def _parts():
    return [np.arange(10 * i, 10 * i + 10) for i in range(6)]


def test_per_layer_local_training_equals_the_flat_form():
    use_momentum = True
    task = make_task(_dataset(), _parts(), make_model("mlp", (5,), 3, seed=1, hidden=(7, 4)))
    layers, flat_x0 = _Layers.of(task.model), task.model.flat_params  # the per-layer form round-trips
    assert np.array_equal(layers.to_flat(layers.to_layers(flat_x0)), flat_x0)
    jax.tree_util.tree_map(np.testing.assert_array_equal, layers.params(layers.to_layers(flat_x0)),
                           task.model.unravel(flat_x0))
    data = task_arrays(task)
    per_layer = make_local_update(task.model, LocalConfig(steps=3, batch_size=4, use_momentum=use_momentum))
    flat = make_local_update(task.model, LocalConfig(steps=3, batch_size=4,
                                                     optimizer=lambda hp: client_optimizer(hp, use_momentum)))
    hp = {"client_lr": jnp.float32(0.1), "momentum": jnp.float32(0.5 if use_momentum else 0.0),
          "weight_decay": jnp.float32(0.01), "prox_mu": jnp.float32(0.2)}
    clients = jnp.arange(6, dtype=jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(3), 6)
    run = lambda fn: jax.jit(jax.vmap(fn, in_axes=(None, 0, 0, None, None)))(data.x0, clients, keys, hp, data.train)
    got, expected = run(per_layer), run(flat)
    assert float(jnp.abs(expected).max()) > 1e-3  # the jobs trained
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-7)
