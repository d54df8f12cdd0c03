"""Bring your own optimizer, loss and model, and server optimizers (FedOpt), against plain references.

Full-batch local steps make every job deterministic, so the engine's final model must equal the plain loops written
here (float64 numpy) to float tolerance on the same schedule.
"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, toy_problem
from asyncfl_jax.algorithms import fedbuff, get_algorithm, with_server_optimizer
from asyncfl_jax.client import LocalConfig, dropout_key, make_local_update
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import simulate
from asyncfl_jax.losses import custom_loss, weighted_mean
from asyncfl_jax.models.core import model_from_apply, model_from_flax
from asyncfl_jax.task import make_evaluator, make_task, task_arrays
from asyncfl_jax.timing import make_schedule

NUM_CLIENTS = 4
DELAYS = TOY_DELAYS
TASK, CLIENT_DATA, X0 = toy_problem(NUM_CLIENTS)
REF_MODEL = ref.LogReg(FEATURES, CLASSES)


def _adam_delta(x0, data, steps, lr, b1=0.9, b2=0.999, eps=1e-8):
    """K full-batch steps of optax.adam (bias-corrected, eps outside the square root), in float64."""
    y, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for k in range(1, steps + 1):
        g = REF_MODEL.loss_grad(y, *data)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        y = y - lr * (m / (1 - b1 ** k)) / (np.sqrt(v / (1 - b2 ** k)) + eps)
    return y - x0


# ---------------------------------------------------------------------------------------------------- optimizer
@pytest.mark.parametrize("kind", ["transformation", "factory"])
def test_custom_client_optimizer_matches_plain_adam(kind):
    optimizer = optax.adam(0.05) if kind == "transformation" else (lambda hp: optax.adam(hp["client_lr"]))
    local = make_local_update(TASK.model, LocalConfig(steps=4, batch_size=None, optimizer=optimizer))
    hp = {"client_lr": jnp.float32(0.05), "momentum": jnp.float32(0.0), "weight_decay": jnp.float32(0.0),
          "prox_mu": jnp.float32(0.0)}
    for c in range(NUM_CLIENTS):
        delta = local(jnp.asarray(X0, jnp.float32), jnp.int32(c), jax.random.PRNGKey(0), hp, TASK.train)
        expected = _adam_delta(X0, CLIENT_DATA[c], 4, 0.05)
        np.testing.assert_allclose(np.asarray(delta), expected, rtol=1e-4, atol=1e-6)
        assert np.abs(expected).max() > 0.05


def test_custom_client_optimizer_keeps_the_fedprox_term():
    """With prox_mu the gradient fed to the custom optimizer is grad F + mu (y - x)."""
    local = make_local_update(TASK.model, LocalConfig(steps=3, batch_size=None,
                                                      optimizer=lambda hp: optax.sgd(hp["client_lr"])))
    hp = {"client_lr": jnp.float32(0.3), "momentum": jnp.float32(0.0), "weight_decay": jnp.float32(0.0),
          "prox_mu": jnp.float32(0.7)}
    delta = local(jnp.asarray(X0, jnp.float32), jnp.int32(1), jax.random.PRNGKey(0), hp, TASK.train)
    expected = ref.local_delta(REF_MODEL, X0, CLIENT_DATA[1], 3, 0.3, prox_mu=0.7)
    np.testing.assert_allclose(np.asarray(delta), expected, rtol=1e-4, atol=1e-6)


def test_swept_factory_learning_rate_is_one_program_equal_to_separate_runs():
    schedule = make_schedule("concurrent", NUM_CLIENTS, 6, DELAYS, seed=2, concurrency=3, buffer_size=2,
                             refill="immediate")
    local = LocalConfig(steps=2, batch_size=None, optimizer=lambda hp: optax.adam(hp["client_lr"]))
    run = lambda lr: simulate(TASK, fedbuff(), schedule, local=local, hparams={"client_lr": lr}, eval_every=3,
                              progress=False)
    swept = run([0.01, 0.08]).final_params
    for i, lr in enumerate([0.01, 0.08]):
        np.testing.assert_allclose(swept[i], run(lr).final_params[0], rtol=1e-6, atol=1e-7)
    assert np.abs(swept[0] - swept[1]).max() > 1e-3  # the two points differ


@pytest.mark.parametrize("optimizer,hparams,match", [
    (optax.adam(0.1), {"client_lr": 0.2}, "client_lr"),
    (lambda hp: optax.adam(hp["client_lr"]), {"momentum": [0.0, 0.5]}, "momentum"),
    (lambda hp: optax.adam(hp["client_lr"]), {"weight_decay": 1e-4}, "weight_decay"),
])
def test_custom_optimizer_refuses_hyperparameters_it_would_ignore(optimizer, hparams, match):
    schedule = make_schedule("all_active", NUM_CLIENTS, 2, DELAYS, seed=0)
    with pytest.raises(ValueError, match=match):
        simulate(TASK, fedbuff(), schedule, local=LocalConfig(optimizer=optimizer, batch_size=None),
                 hparams=hparams, progress=False)
    with pytest.raises(ValueError, match="use_momentum"):
        LocalConfig(optimizer=optax.sgd(0.1), use_momentum=True).validate()
    with pytest.raises(ValueError, match="local.optimizer"):
        LocalConfig(optimizer="adam").validate()


# ---------------------------------------------------------------------------------------------------- losses
def _regression_problem(k: int | None):
    """Linear-regression clients (targets [N] when k is None, else [N, k]) and a linear model with zero init."""
    rng = np.random.default_rng(3)
    outs = 1 if k is None else k
    true_w = rng.normal(size=(FEATURES, outs))
    sizes = [5, 8, 3]
    x = rng.normal(size=(sum(sizes), FEATURES)).astype(np.float32)
    y = (x @ true_w + 0.1 * rng.normal(size=(sum(sizes), outs))).astype(np.float32)
    y = y[:, 0] if k is None else y
    parts = np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1])
    data = Dataset("linreg", x, y, x[:6], y[:6], outs)
    params = {"W": jnp.full((FEATURES, outs), 0.1, jnp.float32), "b": jnp.zeros((outs,), jnp.float32)}
    model = model_from_apply(lambda p, xb: xb @ p["W"] + p["b"], params, "linear")
    return data, parts, model


def _mse_grad(flat, x, y, outs):
    w, b = flat[: FEATURES * outs].reshape(FEATURES, outs), flat[FEATURES * outs:]
    y2 = y.reshape(len(y), outs)
    r = (x @ w + b - y2) * 2.0 / (len(y) * outs)  # d/dout of mean over examples and outputs of the squared error
    return np.concatenate([(x.T @ r).ravel(), r.sum(axis=0)])


@pytest.mark.parametrize("k", [None, 2])
def test_regression_fedbuff_matches_a_plain_loop(k):
    data, parts, model = _regression_problem(k)
    task = make_task(data, parts, model)
    assert task.loss.name == "regression" and task.train.labels.dtype == jnp.float32
    outs = 1 if k is None else k
    schedule = make_schedule("concurrent", 3, 8, DELAYS, seed=4, concurrency=2, buffer_size=1, refill="immediate")
    history = simulate(task, fedbuff(), schedule, local=LocalConfig(steps=3, batch_size=None),
                       hparams={"client_lr": 0.1, "server_lr": 0.9}, eval_every=4, progress=k is None)
    x0 = np.asarray(model.flat_params, np.float64)
    xs = [x[p].astype(np.float64) for x, p in ((data.train_x, q) for q in parts)]
    ys = [data.train_y[p].astype(np.float64) for p in parts]

    def train(c, start):
        y = start.copy()
        for _ in range(3):
            y = y - 0.1 * _mse_grad(y, xs[c], ys[c], outs)
        return y - start

    final = ref.replay(schedule, x0, train, ref.fedbuff_step(0.9))
    np.testing.assert_allclose(history.final_params[0], final, rtol=1e-4, atol=1e-6)
    assert "test_accuracy" not in history.metrics  # never a fake accuracy
    w, b = final[: FEATURES * outs].reshape(FEATURES, outs), final[FEATURES * outs:]
    test_mse = np.mean((data.test_x.astype(np.float64) @ w + b - data.test_y.reshape(6, outs)) ** 2)
    np.testing.assert_allclose(history.metrics["test_loss"][0, -1], test_mse, rtol=1e-4)


def test_loss_and_labels_must_agree():
    data, parts, model = _regression_problem(None)
    with pytest.raises(ValueError, match="needs integer labels"):
        make_task(data, parts, model, loss="classification")
    with pytest.raises(ValueError, match="needs float targets"):
        make_task(Dataset("toy", data.train_x, np.zeros(16, np.int32), data.test_x, np.zeros(6, np.int32), 2),
                  parts, model, loss="regression")
    with pytest.raises(ValueError, match="loss must be one of"):
        make_task(data, parts, model, loss="hinge")


def test_custom_loss_trains_and_reports_its_metric():
    """A weighted squared hinge-like loss on logits with its own metric, against a plain loop."""
    apply = TASK.model.apply_fn

    def loss(params, batch):
        logits = apply(params, batch.x)
        margin = jnp.take_along_axis(logits, batch.y[:, None], axis=1)[:, 0] - jnp.max(logits, axis=1)
        return weighted_mean((margin - 1.0) ** 2, batch.weight)

    def metrics(params, batch):
        return {"mean_logit": weighted_mean(jnp.mean(apply(params, batch.x), axis=1), batch.weight)}

    dataset = Dataset("toy", np.concatenate([d[0] for d in CLIENT_DATA]).astype(np.float32),
                      np.concatenate([d[1] for d in CLIENT_DATA]), CLIENT_DATA[0][0].astype(np.float32),
                      CLIENT_DATA[0][1], CLASSES)
    sizes = [len(d[1]) for d in CLIENT_DATA]
    parts = np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1])
    task = make_task(dataset, parts, TASK.model, loss=custom_loss(loss, metrics, name="margin", targets="int"))
    local = make_local_update(task.model, LocalConfig(steps=2, batch_size=None), loss=task.loss)
    hp = {"client_lr": jnp.float32(0.2), "momentum": jnp.float32(0.0), "weight_decay": jnp.float32(0.0),
          "prox_mu": jnp.float32(0.0)}
    delta = np.asarray(local(jnp.asarray(X0, jnp.float32), jnp.int32(2), jax.random.PRNGKey(0), hp, task.train))
    x, y = CLIENT_DATA[2]

    def plain_loss(flat):
        w, b = flat[: FEATURES * CLASSES].reshape(FEATURES, CLASSES), flat[FEATURES * CLASSES:]
        z = x @ w + b
        return np.mean((z[np.arange(len(y)), y] - z.max(axis=1) - 1.0) ** 2)

    def num_grad(flat, h=1e-6):
        return np.array([(plain_loss(flat + h * e) - plain_loss(flat - h * e)) / (2 * h) for e in np.eye(len(flat))])

    yk = X0.copy()
    for _ in range(2):
        yk = yk - 0.2 * num_grad(yk)
    np.testing.assert_allclose(delta, yk - X0, rtol=1e-3, atol=1e-5)

    out = make_evaluator(task.model, loss=task.loss)(jnp.asarray(X0, jnp.float32), task_arrays(task))
    assert set(out) == {"test_mean_logit", "test_loss", "train_loss"}
    w, b = X0[: FEATURES * CLASSES].reshape(FEATURES, CLASSES), X0[FEATURES * CLASSES:]
    np.testing.assert_allclose(float(out["test_mean_logit"]), np.mean(CLIENT_DATA[0][0] @ w + b), rtol=1e-4,
                               atol=1e-6)


# ---------------------------------------------------------------------------------------------------- models
class DropoutNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Dropout(rate=0.5, deterministic=not train)(x)
        return nn.Dense(CLASSES)(x)


def test_dropout_uses_a_fresh_key_per_step_and_evaluation_is_deterministic():
    module = DropoutNet()
    model = model_from_flax(module, jnp.zeros((1, FEATURES)), seed=1)
    assert model.train_apply is not None
    dataset = Dataset("toy", TASK.train.features, TASK.train.labels, TASK.test_x, TASK.test_y, CLASSES)
    counts = np.asarray(TASK.train.counts)
    parts = np.split(np.arange(int(counts.sum())), np.cumsum(counts)[:-1])
    task = make_task(dataset, parts, model)
    local = make_local_update(model, LocalConfig(steps=3, batch_size=None), loss=task.loss)
    hp = {"client_lr": jnp.float32(0.5), "momentum": jnp.float32(0.0), "weight_decay": jnp.float32(0.0),
          "prox_mu": jnp.float32(0.0)}
    x0 = model.flat_params
    key = jax.random.PRNGKey(7)
    delta = local(x0, jnp.int32(1), key, hp, task.train)

    # Plain loop: step k applies the module with dropout key fold_in(fold_in(key, stream), k).
    xb, yb = (jnp.asarray(a) for a in task.train.client_arrays(1))
    y = x0
    keys = []
    for k in range(3):
        dk = dropout_key(key, jnp.int32(k))
        keys.append(np.asarray(jax.random.key_data(dk) if jnp.issubdtype(dk.dtype, jax.dtypes.prng_key) else dk))

        def loss(flat):
            logits = module.apply(model.unravel(flat), xb, train=True, rngs={"dropout": dk})
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, yb))

        y = y - 0.5 * jax.grad(loss)(y)
    np.testing.assert_allclose(np.asarray(delta), np.asarray(y - x0), rtol=1e-5, atol=1e-7)
    assert len({k.tobytes() for k in keys}) == 3  # a different key at every step
    other = local(x0, jnp.int32(1), jax.random.PRNGKey(8), hp, task.train)  # another job: other masks
    assert np.abs(np.asarray(other) - np.asarray(delta)).max() > 1e-6

    evaluate = jax.jit(make_evaluator(model, loss=task.loss))
    first, second = evaluate(x0, task_arrays(task)), evaluate(x0, task_arrays(task))
    assert float(first["test_loss"]) == float(second["test_loss"])
    logits = module.apply(model.init_params, task.test_x)  # train=False: no dropout
    np.testing.assert_allclose(float(first["test_accuracy"]),
                               np.mean(np.argmax(np.asarray(logits), 1) == np.asarray(task.test_y)), rtol=1e-6)


class BatchNormNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(CLASSES)(nn.BatchNorm(use_running_average=not train)(x))


def test_batchnorm_is_refused_with_its_collection_named():
    with pytest.raises(ValueError, match=r"\['batch_stats'\].*GroupNorm"):
        model_from_flax(BatchNormNet(), jnp.zeros((2, FEATURES)))


# ---------------------------------------------------------------------------------------------------- FedOpt
def _fedopt_reference(kind, lr, b1=0.9, b2=0.99, tau=1e-3, beta=0.9):
    """Reddi et al.'s server update on top of FedBuff's averaged delta, arrival list by arrival list."""
    inner = ref.fedbuff_step(1.0)
    state = {"m": np.zeros_like(X0), "v": np.zeros_like(X0)}

    def step(x, arrivals):
        if not arrivals:
            return x
        delta = inner(x, arrivals) - x
        if kind == "momentum":
            state["m"] = beta * state["m"] + delta
            return x + lr * state["m"]
        state["m"] = b1 * state["m"] + (1 - b1) * delta
        if kind == "adam":
            state["v"] = b2 * state["v"] + (1 - b2) * delta ** 2
        else:
            state["v"] = state["v"] - (1 - b2) * delta ** 2 * np.sign(state["v"] - delta ** 2)
        return x + lr * state["m"] / (np.sqrt(state["v"]) + tau)

    return step


@pytest.mark.parametrize("kind,lr", [("adam", 0.03), ("yogi", 0.03), ("momentum", 0.5)])
def test_fedbuff_with_server_optimizer_matches_reddi_et_al(kind, lr):
    schedule = make_schedule("concurrent", NUM_CLIENTS, 10, DELAYS, seed=5, concurrency=3, buffer_size=2,
                             refill="boundary")
    algorithm = get_algorithm("fedbuff", server_optimizer=kind)
    history = simulate(TASK, algorithm, schedule, local=LocalConfig(steps=2, batch_size=None),
                       hparams={"client_lr": 0.3, "server_opt_lr": lr}, eval_every=5, progress=False)
    train = lambda c, start: ref.local_delta(REF_MODEL, start, CLIENT_DATA[c], 2, 0.3)
    expected = ref.replay(schedule, X0, train, _fedopt_reference(kind, lr))
    np.testing.assert_allclose(history.final_params[0], expected, rtol=2e-4, atol=2e-5)
    plain = ref.replay(schedule, X0, train, ref.fedbuff_step(1.0))
    assert np.abs(expected - plain).max() > 1e-2  # the optimizer changed the run


def test_server_opt_lr_sweep_equals_separate_runs():
    schedule = make_schedule("concurrent", NUM_CLIENTS, 6, DELAYS, seed=6, concurrency=3, buffer_size=2,
                             refill="immediate")
    algorithm = with_server_optimizer(fedbuff(), "adam")
    # float64: in float32 the vmapped sweep and a lone run may round differently (XLA fuses the batched program
    # otherwise, and the CPU's vector width changes the order of sums), which Adam's division by sqrt(v) amplifies.
    run = lambda v: simulate(TASK, algorithm, schedule, local=LocalConfig(steps=2, batch_size=None),
                             hparams={"client_lr": 0.3, "server_opt_lr": v, "server_opt_beta1": 0.5},
                             eval_every=3, progress=False, precision="float64").final_params
    swept = run([0.01, 0.1])
    assert swept.dtype == np.float64
    for i, v in enumerate([0.01, 0.1]):
        np.testing.assert_allclose(swept[i], run(v)[0], rtol=1e-12, atol=1e-13)
    assert np.abs(swept[0] - swept[1]).max() > 1e-3


def test_server_optimizer_refusals():
    for name in ("fedasync", "area", "as_fedavg"):
        with pytest.raises(ValueError, match=f"cannot be used with {name}"):
            get_algorithm(name, server_optimizer="adam")
    with pytest.raises(ValueError, match="server_optimizer must be one of"):
        get_algorithm("fedbuff", server_optimizer="adagrad")
    with pytest.raises(ValueError, match="already has a server optimizer"):
        with_server_optimizer(with_server_optimizer(fedbuff(), "adam"), "yogi")


def test_configuration_reaches_the_server_optimizer_and_validates_it():
    from asyncfl_jax.config import ConfigError, ExperimentConfig, validate

    def cfg(algorithm="fedbuff", options=None, hparams=None):
        run = {"algorithm": algorithm, "options": options or {}, "hparams": hparams or {}, "steps": 5}
        return ExperimentConfig.from_dict({"data": {"num_clients": 30}, "runs": [run]})

    validate(cfg(options={"server_optimizer": "adam"}, hparams={"server_opt_lr": [0.01, 0.1]}))
    validate(cfg("ca2fl", {"server_optimizer": "momentum"}, {"server_opt_momentum": 0.5}))
    for config, match in [
        (cfg(options={"server_optimizer": "adagrad"}), "server_optimizer must be one of"),
        (cfg(options={"server_optimizer": "adam"}, hparams={"server_opt_beta1": 1.0}), "server_opt_beta1"),
        (cfg(hparams={"server_opt_lr": 0.1}), "not used by fedbuff"),
        (cfg("fedasync", {"server_optimizer": "yogi"}), "cannot be used with fedasync"),
    ]:
        with pytest.raises(ConfigError, match=match):
            validate(config)


def test_custom_optimizers_checkpoint_and_resume(tmp_path):
    """The run identity names a custom optimizer without a memory address, so a finished run resumes as itself."""
    schedule = make_schedule("concurrent", NUM_CLIENTS, 4, DELAYS, seed=3, concurrency=3, buffer_size=2)

    def adam_factory(hp):
        return optax.adam(hp["client_lr"])

    local = LocalConfig(steps=2, batch_size=None, optimizer=adam_factory)
    assert "0x" not in str(local.identity()) and "adam_factory" in local.identity()["optimizer"]
    algorithm = with_server_optimizer(fedbuff(), "yogi")
    kwargs = dict(local=local, hparams={"client_lr": 0.02}, eval_every=2, progress=False,
                  checkpoint_dir=str(tmp_path / "ckpt"))
    first = simulate(TASK, algorithm, schedule, **kwargs)
    again = simulate(TASK, algorithm, schedule, resume=True, **kwargs)
    np.testing.assert_array_equal(first.final_params, again.final_params)


def test_size_only_partitioners_take_regression_targets_and_label_partitioners_refuse_them():
    from asyncfl_jax.data.partition import dirichlet, iid, power_law

    targets = np.linspace(0.0, 1.0, 40, dtype=np.float32).reshape(20, 2)
    parts = iid(targets, 4, rng=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(20))
    assert sum(len(p) for p in power_law(targets[:, 0], 2, rng=0, min_size=3)) == 20
    with pytest.raises(ValueError, match="labels must be"):
        dirichlet(targets[:, 0], 2, alpha=0.5, rng=0)


@pytest.mark.parametrize("name", ["ace", "ca2fl", "asyncfeded"])
def test_identity_server_optimizer_leaves_any_algorithm_unchanged(name):
    """FedAvgM with beta = 0 and eta = 1 applies Delta_t itself: the wrapped algorithm's state, its initialization
    round (ACE's absorb) and its job policy (AsyncFedED's adaptive K, read from the wrapped state) carry through."""
    from asyncfl_jax.algorithms import asyncfeded
    from asyncfl_jax.timing.clock import EventClock

    if name == "asyncfeded":
        plain = asyncfeded(initial_steps=2, max_steps=4)
        schedule = EventClock(NUM_CLIENTS, 8, DELAYS, seed=1)
    else:
        plain = get_algorithm(name)
        schedule = make_schedule("all_active", NUM_CLIENTS, 8, DELAYS, seed=1)
    wrapped = with_server_optimizer(plain, "momentum")
    base = {"client_lr": 0.3, **({"server_lr": 0.1} if name == "ace" else {})}  # a step that visibly moves x
    run = lambda algorithm, extra: simulate(TASK, algorithm, schedule, local=LocalConfig(steps=2, batch_size=None),
                                            hparams={**base, **extra}, eval_every=4,
                                            progress=False).final_params[0]
    expected = run(plain, {})
    np.testing.assert_allclose(run(wrapped, {"server_opt_lr": 1.0, "server_opt_momentum": 0.0}), expected,
                               rtol=1e-5, atol=1e-6)
    assert np.abs(expected - X0).max() > 1e-2


def test_a_regression_run_with_every_evaluation_split_writes_and_reads_its_results(tmp_path):
    """Losses only (no accuracy anywhere), per-client and validation splits scored with the task's loss, and the
    results files, plot, printed lines and loader all keyed on the headline loss."""
    from asyncfl_jax.cli import result_lines
    from asyncfl_jax.results import load_results, write_results

    data, parts, model = _regression_problem(2)
    task = make_task(data, parts, model, client_test_fraction=0.3, validation_fraction=0.3)
    schedule = make_schedule("concurrent", 3, 8, DELAYS, seed=4, concurrency=2, buffer_size=1, refill="immediate")
    history = simulate(task, fedbuff(), schedule, local=LocalConfig(steps=2, batch_size=None), seeds=[0, 1],
                       hparams={"client_lr": 0.1, "server_lr": [0.5, 0.9]}, eval_every=4, progress=False)
    assert not any("accuracy" in name for name in history.metrics)
    assert {"test_loss", "train_loss", "val_loss", "client_loss_mean", "client_loss_worst10"} <= set(history.metrics)
    # per-client MSE of the final model on each client's own held-out examples, against numpy
    final = np.asarray(history.final_params[0], np.float64)
    w, b = final[: FEATURES * 2].reshape(FEATURES, 2), final[FEATURES * 2:]
    features, labels = np.asarray(task.train.features, np.float64), np.asarray(task.train.labels, np.float64)
    index, position = np.asarray(task.client_test.index), np.asarray(task.client_test.position)
    errors = np.mean((features[index] @ w + b - labels[index]) ** 2, axis=1)
    per_client = np.array([errors[position == c].mean() for c in range(task.client_test.num_clients)])
    np.testing.assert_allclose(history.metrics["client_loss_mean"][0, -1], per_client.mean(), rtol=1e-4)
    np.testing.assert_allclose(history.metrics["client_loss_max"][0, -1], per_client.max(), rtol=1e-4)
    write_results(str(tmp_path), {"config": "test"}, [history])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"][0]["metric"] == "test_loss" and len(summary["runs"][0]["points"]) == 2
    assert "accuracy" not in (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert any("test loss" in line for line in result_lines(history))
    (loaded,) = load_results(str(tmp_path))
    np.testing.assert_array_equal(loaded.metrics["test_loss"], history.metrics["test_loss"])
