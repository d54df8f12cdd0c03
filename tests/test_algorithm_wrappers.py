"""asyncfl_jax.algorithms.wrappers: an algorithm whose server skips the steps without arrivals."""

import jax.numpy as jnp
import numpy as np

from asyncfl_jax.algorithms import ServerMeta, get_algorithm, skip_empty_steps


def test_empty_steps_leave_the_server_state_unchanged():
    mifa = get_algorithm("mifa")  # re-applies its memory at every step, arrivals or not
    wrapped = skip_empty_steps(mifa)
    state = mifa.init(jnp.ones(5), 3)
    state = mifa.server(state, jnp.ones((1, 5)), ServerMeta(clients=jnp.array([0]), mask=jnp.array([True]),
                                                               staleness=jnp.array([0]), step=jnp.int32(0),
                                                               time=jnp.float32(0.0)), {"server_lr": 1.0})
    empty = ServerMeta(clients=jnp.array([-1]), mask=jnp.array([False]), staleness=jnp.array([0]),
                       step=jnp.int32(1), time=jnp.float32(1.0))
    moved = mifa.server(state, jnp.zeros((1, 5)), empty, {"server_lr": 1.0})
    assert not np.allclose(moved.x, state.x)
    kept = wrapped.server(state, jnp.zeros((1, 5)), empty, {"server_lr": 1.0})
    np.testing.assert_array_equal(kept.x, state.x)
    full = ServerMeta(clients=jnp.array([1]), mask=jnp.array([True]), staleness=jnp.array([2]), step=jnp.int32(1),
                      time=jnp.float32(1.0))
    np.testing.assert_array_equal(wrapped.server(state, jnp.ones((1, 5)), full, {"server_lr": 1.0}).x,
                                  mifa.server(state, jnp.ones((1, 5)), full, {"server_lr": 1.0}).x)
