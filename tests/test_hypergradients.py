"""Hyper-gradients through a whole run (asyncfl_jax.hypergrad): the exact gradient equals a central finite
difference in float64, reverse and forward mode agree, AsyncFedED differentiates in both modes, what has no meaningful
gradient is refused or flagged, and a user-defined staleness function is a public, differentiable argument."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import asyncfl_jax as afl
from asyncfl_jax.algorithms import ace, asyncfeded, ca2fl, compressed, fedasync, fedbuff, mf_ca2fl
from asyncfl_jax.algorithms.asyncfeded import safe_norm
from asyncfl_jax.client import LocalConfig, make_local_update
from asyncfl_jax.hypergrad import UnreliableGradientError, hypergradient, kink_notes, make_objective
from asyncfl_jax.timing import make_schedule
from support import TOY_DELAYS, toy_problem

NUM_CLIENTS = 5
TASK, _, _ = toy_problem(NUM_CLIENTS, seed=3)
LOCAL = LocalConfig(steps=3, batch_size=None)
SCHEDULE = make_schedule("concurrent", NUM_CLIENTS, 9, TOY_DELAYS, seed=2, concurrency=4, buffer_size=2,
                         refill="boundary")
STEP = 1e-5  # relative step of the central differences (float64)


def central_differences(objective, step: float = STEP) -> np.ndarray:
    """``(J(theta + h_i e_i) - J(theta - h_i e_i)) / (2 h_i)`` for every coordinate, as one vmapped program."""
    point = objective.point
    h = step * np.maximum(np.abs(point), 1e-3)
    offsets = np.diag(h)
    values = objective.grid(np.concatenate([point + offsets, point - offsets]))
    k = point.size
    return (values[:k] - values[k:]) / (2 * h)


@pytest.mark.parametrize("algorithm,hparams,wrt", [
    (fedbuff(), {"client_lr": 0.1, "server_lr": 0.8}, ("server_lr", "client_lr")),
    (fedasync("polynomial"), {"client_lr": 0.1, "staleness_a": 0.7}, ("alpha", "staleness_a")),
    (ca2fl(), {"client_lr": 0.1, "server_lr": 0.9}, ("server_lr", "client_lr")),
    (ace(), {"client_lr": 0.1, "server_lr": 0.5}, ("server_lr",)),  # ACE's clients upload gradients: no client_lr
], ids=["fedbuff", "fedasync_polynomial", "ca2fl", "ace"])
def test_reverse_mode_gradient_equals_central_finite_differences(algorithm, hparams, wrt):
    result = hypergradient(TASK, algorithm, SCHEDULE, LOCAL, hparams, wrt=wrt, check="off")
    objective = make_objective(TASK, algorithm, SCHEDULE, LOCAL, hparams, wrt=wrt)
    grad = np.array([result.grad[name] for name in wrt])
    assert np.all(np.abs(grad) > 1e-4)  # a test of something: the objective depends on every hyper-parameter
    np.testing.assert_allclose(grad, central_differences(objective), rtol=1e-6)


def test_asyncfeded_differentiates_and_forward_and_reverse_mode_agree():
    """AsyncFedED's adaptive K ran as a loop with a traced trip count (no reverse mode) and its Euclidean staleness
    took a norm at 0 (NaN tangents): reverse mode now gives the finite-difference slope, and forward mode the same
    gradient."""
    algorithm, hparams = asyncfeded(initial_steps=3, max_steps=5), {"client_lr": 0.1}
    wrt = ("feded_lambda", "client_lr")
    reverse = hypergradient(TASK, algorithm, SCHEDULE, LOCAL, hparams, wrt=wrt, mode="reverse", check_rtol=1e-6)
    forward = hypergradient(TASK, algorithm, SCHEDULE, LOCAL, hparams, wrt=wrt, mode="forward", check="off")
    assert reverse.check.agrees
    assert any("integers" in note for note in reverse.notes)  # what the gradient means for the integer K_i
    assert forward.value == pytest.approx(reverse.value, rel=1e-13)
    for name in wrt:
        assert np.isfinite(forward.grad[name])
        assert forward.grad[name] == pytest.approx(reverse.grad[name], rel=1e-10)


def test_safe_norm_has_the_same_values_and_a_derivative_at_zero():
    rng = np.random.default_rng(0)
    for size in (1, 7, 1000):
        v = jnp.asarray(rng.normal(size=size), jnp.float32)
        assert np.asarray(safe_norm(v)).tobytes() == np.asarray(jnp.linalg.norm(v)).tobytes()
    zero = jnp.zeros(3)
    assert np.isnan(jax.jvp(jnp.linalg.norm, (zero,), (jnp.ones(3),))[1])  # what the fix is for
    assert jax.jvp(safe_norm, (zero,), (jnp.ones(3),))[1] == 0.0
    np.testing.assert_array_equal(jax.grad(safe_norm)(zero), 0.0)


def test_hinge_staleness_has_a_finite_derivative_with_the_same_values():
    """With b = 0.5 and a = 2 the unused branch 1 / (a (tau - b) + 1) divides by 0 at tau = 0: its inf made the
    derivative NaN. The values are those of the formula."""
    from asyncfl_jax.algorithms.staleness import hinge

    tau = jnp.arange(10)
    def total(a, b):
        return jnp.sum(hinge(tau, {"staleness_a": a, "staleness_b": b}))

    da, db = jax.grad(total, argnums=(0, 1))(jnp.float32(2.0), jnp.float32(0.5))
    expected_da = -sum((t - 0.5) / (2.0 * (t - 0.5) + 1) ** 2 for t in range(1, 10))
    assert da == pytest.approx(expected_da, rel=1e-5) and np.isfinite(db)
    for a, b in ((10.0, 4.0), (2.0, 0.5), (0.3, 7.2)):
        t = np.arange(10, dtype=np.float32)
        formula = np.where(t <= b, 1.0, 1.0 / (np.float32(a) * (t - np.float32(b)) + 1.0))
        np.testing.assert_array_equal(hinge(tau, {"staleness_a": jnp.float32(a), "staleness_b": jnp.float32(b)}),
                                      formula.astype(np.float32))


def test_masked_local_steps_give_the_loop_results_exactly():
    """The per-job step count as a masked loop of max_steps steps (reverse-differentiable) equals the loop with a
    traced trip count bit for bit."""
    data = TASK.train
    hp = {**afl.default_hparams(fedbuff()), "client_lr": 0.1}
    loop = make_local_update(TASK.model, LOCAL, max_steps=6)
    masked = make_local_update(TASK.model, LOCAL, max_steps=6, differentiable_steps=True)
    x, key = TASK.model.flat_params, jax.random.PRNGKey(0)
    for steps in (1, 4, 6):
        a = jax.jit(loop)(x, jnp.int32(2), key, hp, data, jnp.int32(steps))
        b = jax.jit(masked)(x, jnp.int32(2), key, hp, data, jnp.int32(steps))
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_piecewise_constant_objective_is_flagged_not_returned():
    """The exact gradient of a staircase is 0 almost everywhere; the finite-difference check says it is no slope."""

    def staircase(metrics):  # the final train loss rounded to 1e-4 (a quantized metric)
        return jnp.floor(metrics["train_loss"][-1] * 1e4) / 1e4

    with pytest.raises(UnreliableGradientError, match="not a useful slope.*mode='smoothed'"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, {"client_lr": 0.1}, objective=staircase, wrt="server_lr")
    # the smoothed alternative sees the staircase's overall slope (the loss falls as server_lr grows here)
    smooth = hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, {"client_lr": 0.1}, objective=staircase,
                           wrt="server_lr", mode="smoothed", smoothing=0.1, samples=64)
    assert smooth.grad["server_lr"] < -3 * smooth.stderr["server_lr"] < 0


@pytest.mark.parametrize("algorithm,match", [
    (compressed(fedbuff(), "top_k", fraction=0.5), "compressed uploads"),
    (compressed(fedbuff(), "qsgd"), "compressed uploads"),
    (ca2fl(cache="int8"), "int8 cache rounds"),
    (ca2fl(cache="bfloat16"), "bfloat16 cache rounds"),
    (mf_ca2fl(bits=4), "int4 cache rounds"),
])
def test_no_meaningful_gradient_is_refused_before_compiling(algorithm, match):
    with pytest.raises(ValueError, match=match):
        hypergradient(TASK, algorithm, SCHEDULE, LOCAL, wrt="server_lr")


def test_the_result_says_what_the_gradient_means_at_kinks():
    assert any("kink at tau = b" in note for note in kink_notes(fedasync("hinge")))
    assert kink_notes(fedasync("polynomial")) == () and kink_notes(fedbuff()) == ()
    assert len(kink_notes(asyncfeded(discard_above=5.0))) == 2


def test_bad_arguments_are_refused_before_compiling():
    clock = afl.EventClock(NUM_CLIENTS, 5, TOY_DELAYS, seed=0)
    with pytest.raises(ValueError, match="pre-sampled Schedule"):
        hypergradient(TASK, fedbuff(), clock, LOCAL)
    with pytest.raises(ValueError, match="'server_lrr' is not a hyper-parameter"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, wrt="server_lrr")
    with pytest.raises(ValueError, match="one value per hyper-parameter"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, {"client_lr": [0.1, 0.2]})
    with pytest.raises(ValueError, match="mode must be one of"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, mode="backward")
    with pytest.raises(ValueError, match="needs a validation set"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, objective="val_loss")
    with pytest.raises(ValueError, match="check must be one of"):
        hypergradient(TASK, fedbuff(), SCHEDULE, LOCAL, check="yes")


def test_a_diverging_run_is_refused():
    with pytest.raises(ValueError, match="diverges at server step"):
        hypergradient(TASK, fedasync(), SCHEDULE, LOCAL, {"alpha": 1e200}, wrt="alpha", check="off")


def decay(tau, params):
    """A user's staleness function: exp(-rate tau)."""
    return jnp.exp(-params["rate"] * tau)


def test_a_user_staleness_function_is_an_argument_and_its_parameter_has_a_gradient():
    algorithm = fedasync(decay, {"rate": 0.4})
    assert algorithm.hyperparams == {"alpha": 0.5, "rate": 0.4}
    assert algorithm.options["staleness"] == "custom:decay"
    meta = afl.ServerMeta(clients=jnp.array([0, 1]), mask=jnp.array([True, True]), staleness=jnp.array([0, 3]),
                          step=jnp.int32(3), time=jnp.float32(0.0))
    state = algorithm.init(jnp.zeros(2), 2)
    new = algorithm.server(state, jnp.array([[1.0, 0.0], [0.0, 1.0]]), meta, {"alpha": 0.5, "rate": 0.4})
    alpha_2 = 0.5 * np.exp(-0.4 * 3)
    np.testing.assert_allclose(new.x, [0.5 * (1 - alpha_2), alpha_2], rtol=1e-6)
    result = hypergradient(TASK, algorithm, SCHEDULE, LOCAL, {"client_lr": 0.1}, wrt="rate", check_rtol=1e-6)
    assert result.check.agrees and abs(result.grad["rate"]) > 1e-5


def test_a_gradient_that_is_not_finite_is_refused():
    """sqrt(c tau) has no derivative in c at tau = 0 (a fresh arrival): NaN is refused with what it means."""
    algorithm = fedasync(lambda tau, p: 1.0 / (1.0 + jnp.sqrt(p["c"] * tau)), {"c": 1.0})
    with pytest.raises(UnreliableGradientError, match="not finite"):
        hypergradient(TASK, algorithm, SCHEDULE, LOCAL, {"client_lr": 0.1}, wrt="c", check="off")


def test_a_user_staleness_function_is_checked_when_the_algorithm_is_built():
    with pytest.raises(ValueError, match="reads the hyper-parameter 'rate' that is not in staleness_params"):
        fedbuff(decay)
    with pytest.raises(ValueError, match="'server_lr' is already a hyper-parameter"):
        fedbuff(decay, staleness_params={"server_lr": 1.0, "rate": 0.1})
    with pytest.raises(ValueError, match="finite and >= 0"):
        fedasync(lambda tau, p: 1.0 - tau, {})
    with pytest.raises(ValueError, match="one float weight per staleness value"):
        fedasync(lambda tau, p: jnp.sum(tau), {})
    with pytest.raises(ValueError, match="staleness_params is for a user-defined"):
        fedasync("polynomial", {"staleness_a": 1.0})
