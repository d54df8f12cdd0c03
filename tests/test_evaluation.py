"""Evaluation splits: per-client held-out test examples (per-client accuracy, its mean, worst 10%, spread), a pooled
validation set, and per-client metrics on a fixed subset of clients. Every metric is checked against a plain numpy
reference computed here from the model's parameters and the split."""

from __future__ import annotations

import json
import math
import os

import jax
import numpy as np
import pytest

from asyncfl_jax import LocalConfig, cli, fedbuff, make_model, make_schedule, make_task, simulate
from asyncfl_jax.checkpoint import CheckpointMismatchError, SimulationInterrupted
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.results import load_history, save_history, write_client_metrics
from asyncfl_jax.task import (
    choose_eval_clients,
    held_out_sizes,
    make_evaluator,
    split_clients_held_out,
    task_arrays,
)
from asyncfl_jax.timing import DelayModel

N = 10
FT, FV, SEED = 0.25, 0.2, 3
LOCAL = LocalConfig(steps=2, batch_size=None)  # full batch: the run is a deterministic function of the schedule
RUN = dict(seeds=[0, 1], eval_every=5, progress=False)


@pytest.fixture(scope="module")
def data():
    return synthetic_leaf(num_clients=N, seed=1, max_samples=80)


@pytest.fixture(scope="module")
def model(data):
    return make_model("logreg", data.input_shape, data.num_classes)


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("concurrent", N, 12, DelayModel(), seed=0, concurrency=4, buffer_size=2, refill="boundary")


# ---------------------------------------------------------------------------------------------------- references
def ref_scores(flat, model, x, y):
    """Per-example cross-entropy and correctness of a logistic regression, in float64 numpy."""
    p = model.unravel(np.asarray(flat))["params"]["Dense_0"]
    logits = np.asarray(x, np.float64).reshape(len(x), -1) @ np.asarray(p["kernel"], np.float64) + np.asarray(
        p["bias"], np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    loss = log_z - logits[np.arange(len(y)), y]
    return loss, (logits.argmax(axis=1) == y).astype(np.float64)


def ref_client_metrics(flat, model, data, test_parts, ids):
    acc, loss = [], []
    for i in ids:
        idx = test_parts[i]
        l, c = ref_scores(flat, model, data.train_x[idx], data.train_y[idx])
        acc.append(c.mean())
        loss.append(l.mean())
    return np.array(acc), np.array(loss)


def worst_mean(values, lowest):
    k = math.ceil(len(values) / 10)
    ordered = np.sort(values)
    return ordered[:k].mean() if lowest else ordered[-k:].mean()


# ---------------------------------------------------------------------------------------------------- the split
def round_half_up(v):
    return int(np.floor(v + 0.5))


@pytest.mark.parametrize("ft, fv", [(0.25, 0.2), (0.1, 0.0), (0.0, 0.3), (0.9, 0.9)])
def test_the_split_is_disjoint_covers_each_client_and_follows_the_size_rule(data, ft, fv):
    split = split_clients_held_out(data.natural_partition, ft, fv, seed=SEED)
    for i, part in enumerate(data.natural_partition):
        tr, te, va = split.train[i], split.test[i], split.validation[i]
        assert not (set(tr) & set(te) or set(tr) & set(va) or set(te) & set(va)), i
        assert sorted([*tr, *te, *va]) == sorted(part.tolist()), i
        m = len(part)
        n_test = min(max(1, round_half_up(ft * m)), m - 1) if ft > 0 else 0
        n_val = min(round_half_up(fv * (m - n_test)), m - n_test - 1) if fv > 0 else 0
        assert (len(te), len(va), len(tr)) == (n_test, n_val, m - n_test - n_val), i
        assert held_out_sizes(m, ft, fv) == (n_test, n_val)
        assert list(tr) == [j for j in part if j in set(tr)]  # the training order is kept
    again = split_clients_held_out(data.natural_partition, ft, fv, seed=SEED)
    assert all(np.array_equal(a, b) for a, b in zip(split.test + split.validation, again.test + again.validation))


def test_test_examples_do_not_depend_on_the_validation_split_and_follow_the_seed(data):
    a = split_clients_held_out(data.natural_partition, FT, 0.0, seed=SEED)
    b = split_clients_held_out(data.natural_partition, FT, FV, seed=SEED)
    c = split_clients_held_out(data.natural_partition, FT, FV, seed=SEED + 1)
    assert all(np.array_equal(x, y) for x, y in zip(a.test, b.test))
    assert not all(np.array_equal(x, y) for x, y in zip(b.test, c.test))


def test_a_partition_with_repeated_examples_never_trains_on_a_held_out_one():
    parts = [np.array([3, 3, 5, 7, 7, 7, 9, 11]), np.array([0, 1, 1, 2])]
    split = split_clients_held_out(parts, 0.5, 0.5, seed=0)
    for part, tr, te, va in zip(parts, split.train, split.test, split.validation):
        distinct = np.unique(part)
        n_test, n_val = held_out_sizes(len(distinct), 0.5, 0.5)
        assert (len(te), len(va)) == (n_test, n_val) and not set(tr) & (set(te) | set(va))
        assert set(tr) | set(te) | set(va) == set(part)
        assert len(tr) == sum(int(j not in set(te) | set(va)) for j in part)  # every repeat of a kept one stays


def test_too_small_clients_and_bad_fractions_are_refused(data, model):
    with pytest.raises(ValueError, match=r"client 1 holds 1"):
        split_clients_held_out([np.array([0, 1]), np.array([2, 2])], 0.1, 0.0)
    for bad in (1.0, -0.1, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match=r"client_test_fraction must be a finite number in \[0, 1\)"):
            make_task(data, data.natural_partition, model, client_test_fraction=bad)
        with pytest.raises(ValueError, match=r"validation_fraction must be a finite number in \[0, 1\)"):
            make_task(data, data.natural_partition, model, validation_fraction=bad)
    with pytest.raises(ValueError, match=r"eval_clients = 3 needs client_test_fraction > 0"):
        make_task(data, data.natural_partition, model, eval_clients=3)
    with pytest.raises(ValueError, match=r"eval_clients must be null .* in \[1, 10\]"):
        make_task(data, data.natural_partition, model, client_test_fraction=FT, eval_clients=11)
    with pytest.raises(ValueError, match=r"validation_fraction = 0.1 holds out no example"):
        make_task(data, [np.array([0, 1]), np.array([2, 3])], model, validation_fraction=0.1)


def test_the_evaluated_subset_is_fixed_by_the_data_seed(data, model):
    ids = choose_eval_clients(N, 4, seed=SEED)
    assert len(ids) == 4 and len(set(ids)) == 4 and list(ids) == sorted(ids) and 0 <= ids.min() and ids.max() < N
    assert np.array_equal(ids, choose_eval_clients(N, 4, seed=SEED))
    assert any(not np.array_equal(ids, choose_eval_clients(N, 4, seed=s)) for s in range(SEED + 1, SEED + 5))
    assert np.array_equal(choose_eval_clients(N, None), np.arange(N))
    assert np.array_equal(choose_eval_clients(N, N), np.arange(N))
    task = make_task(data, data.natural_partition, model, seed=SEED, client_test_fraction=FT, eval_clients=4)
    assert np.array_equal(task.eval_client_ids, ids)


def test_defaults_leave_the_task_and_its_metrics_as_they_were(data, model):
    task = make_task(data, data.natural_partition, model)
    arrays = task_arrays(task)
    assert task.val_x is None and task.client_test is None and task.eval_client_ids is None
    assert task.evaluation_options() == {}
    assert len(jax.tree_util.tree_leaves(arrays)) == 9  # train (4), x0, test (2), train sample (2): nothing new
    np.testing.assert_array_equal(np.asarray(task.train.counts), [len(p) for p in data.natural_partition])
    metrics = make_evaluator(model)(task.model.flat_params, arrays)
    assert list(metrics) == ["test_accuracy", "test_loss", "train_loss"]


# ---------------------------------------------------------------------------------------------------- metrics
@pytest.fixture(scope="module")
def split_task(data, model):
    return make_task(data, data.natural_partition, model, seed=SEED, client_test_fraction=FT, validation_fraction=FV)


def test_the_clients_train_only_on_their_training_examples(data, split_task):
    split = split_clients_held_out(data.natural_partition, FT, FV, seed=SEED)
    for i in range(N):
        idx = np.asarray(split_task.train.indices[i, : int(split_task.train.counts[i])])
        np.testing.assert_array_equal(idx, split.train[i])
    val = np.concatenate(split.validation)
    np.testing.assert_array_equal(np.asarray(split_task.val_x), data.train_x[val])
    np.testing.assert_array_equal(np.asarray(split_task.val_y), data.train_y[val])
    sample = np.asarray(split_task.train_eval_x)  # the train-loss sample holds no held-out example
    held = np.concatenate([*split.test, val])
    assert not {tuple(r) for r in sample} & {tuple(r) for r in data.train_x[held]}


@pytest.mark.parametrize("batch_size", [16, 2000])  # several batches (segment sums across them), or one
def test_the_evaluator_matches_a_plain_reference(data, model, split_task, batch_size):
    flat = np.asarray(model.flat_params) + 0.5 * np.random.default_rng(0).standard_normal(model.num_params)
    flat = flat.astype(np.float32)
    metrics = jax.jit(make_evaluator(model, batch_size))(flat, task_arrays(split_task))
    split = split_clients_held_out(data.natural_partition, FT, FV, seed=SEED)
    acc, loss = ref_client_metrics(flat, model, data, split.test, np.arange(N))
    assert len(set(acc.tolist())) > 2  # the clients differ, so the summaries are not trivially equal
    np.testing.assert_allclose(metrics["client_accuracy"], acc, atol=1e-6)
    np.testing.assert_allclose(metrics["client_loss"], loss, rtol=1e-5)
    expected = {"client_accuracy_mean": acc.mean(), "client_accuracy_worst10": worst_mean(acc, lowest=True),
                "client_accuracy_std": acc.std(), "client_accuracy_min": acc.min(), "client_loss_mean": loss.mean(),
                "client_loss_worst10": worst_mean(loss, lowest=False), "client_loss_std": loss.std(),
                "client_loss_max": loss.max()}
    val = np.concatenate(split.validation)
    val_loss, val_correct = ref_scores(flat, model, data.train_x[val], data.train_y[val])
    test_loss, test_correct = ref_scores(flat, model, data.test_x, data.test_y)
    expected.update(val_accuracy=val_correct.mean(), val_loss=val_loss.mean(), test_accuracy=test_correct.mean(),
                    test_loss=test_loss.mean())
    for k, v in expected.items():
        np.testing.assert_allclose(metrics[k], v, rtol=2e-5, atol=1e-6, err_msg=k)
    assert set(metrics) == {*expected, "train_loss", "client_accuracy", "client_loss"}


def test_worst10_is_the_mean_of_the_worst_ceil_tenth():
    from asyncfl_jax.task import client_summaries

    values = np.linspace(0.0, 1.0, 21).astype(np.float32)[::-1]  # 21 clients: the worst ceil(2.1) = 3
    out = client_summaries("accuracy", values)
    np.testing.assert_allclose(out["client_accuracy_worst10"], np.mean([0.0, 0.05, 0.1]), atol=1e-7)
    out = client_summaries("loss", values)
    np.testing.assert_allclose(out["client_loss_worst10"], np.mean([1.0, 0.95, 0.9]), atol=1e-7)


@pytest.fixture(scope="module")
def runs(data, model, split_task, schedule):
    """The same run with all clients evaluated and with a subset of 4 (the split, hence the training, is the same)."""
    subset = make_task(data, data.natural_partition, model, seed=SEED, client_test_fraction=FT,
                       validation_fraction=FV, eval_clients=4)
    return (simulate(split_task, fedbuff(), schedule, LOCAL, **RUN),
            simulate(subset, fedbuff(), schedule, LOCAL, **RUN), subset)


def test_the_history_holds_the_per_client_and_validation_metrics_of_its_models(data, model, split_task, runs):
    full, _, _ = runs
    split = split_clients_held_out(data.natural_partition, FT, FV, seed=SEED)
    val = np.concatenate(split.validation)
    np.testing.assert_array_equal(full.client_ids, np.arange(N))
    assert full.client_metrics["client_accuracy"].shape == (2, len(full.steps), N)
    for r in range(2):
        for e, flat in ((0, model.flat_params), (-1, full.final_params[r])):
            acc, loss = ref_client_metrics(flat, model, data, split.test, np.arange(N))
            np.testing.assert_allclose(full.client_metrics["client_accuracy"][r, e], acc, atol=1e-6)
            np.testing.assert_allclose(full.client_metrics["client_loss"][r, e], loss, rtol=1e-5)
            np.testing.assert_allclose(full.metrics["client_accuracy_mean"][r, e], acc.mean(), atol=1e-6)
            np.testing.assert_allclose(full.metrics["client_accuracy_worst10"][r, e], worst_mean(acc, True), atol=1e-6)
            np.testing.assert_allclose(full.metrics["client_accuracy_std"][r, e], acc.std(), atol=1e-6)
            val_loss, val_correct = ref_scores(flat, model, data.train_x[val], data.train_y[val])
            np.testing.assert_allclose(full.metrics["val_accuracy"][r, e], val_correct.mean(), atol=1e-6)
            np.testing.assert_allclose(full.metrics["val_loss"][r, e], val_loss.mean(), rtol=1e-5)
    assert not np.array_equal(full.metrics["client_accuracy_mean"][:, 0], full.metrics["client_accuracy_mean"][:, -1])
    rows = full.rows()
    assert {"val_accuracy", "val_loss", "client_accuracy_mean", "client_accuracy_worst10"} <= set(rows[0])


def test_a_subset_of_clients_reports_their_entries_of_the_full_evaluation(runs):
    full, sub, subset_task = runs
    ids = subset_task.eval_client_ids
    np.testing.assert_array_equal(sub.client_ids, ids)
    np.testing.assert_array_equal(sub.final_params, full.final_params)  # the subset does not change the training
    for k in ("client_accuracy", "client_loss"):
        np.testing.assert_allclose(sub.client_metrics[k], full.client_metrics[k][:, :, ids], rtol=1e-6, atol=1e-7)
    acc = full.client_metrics["client_accuracy"][:, :, ids]
    np.testing.assert_allclose(sub.metrics["client_accuracy_mean"], acc.mean(axis=2), atol=1e-6)
    np.testing.assert_allclose(sub.metrics["client_accuracy_worst10"], acc.min(axis=2), atol=1e-6)  # ceil(0.4) = 1


def test_the_client_metrics_file_holds_the_history_arrays(runs, tmp_path):
    full, _, _ = runs
    path = write_client_metrics(str(tmp_path), full)
    assert path == os.path.join(str(tmp_path), "client_metrics", "fedbuff.npz")
    with np.load(path) as z:
        np.testing.assert_array_equal(z["client_ids"], full.client_ids)
        np.testing.assert_array_equal(z["steps"], full.steps)
        np.testing.assert_array_equal(z["seeds"], full.seeds)
        for k, v in full.client_metrics.items():
            assert z[k].tobytes() == v.tobytes()
    assert write_client_metrics(str(tmp_path / "none"), dataclass_without_clients(full)) is None
    assert not os.path.exists(tmp_path / "none")
    save_history(full, str(tmp_path / "saved"))  # the History file (what a resumed experiment reloads)
    loaded = load_history(str(tmp_path / "saved"))
    np.testing.assert_array_equal(loaded.client_ids, full.client_ids)
    assert list(loaded.metrics) == list(full.metrics)
    for k, v in full.client_metrics.items():
        assert loaded.client_metrics[k].tobytes() == v.tobytes()


def dataclass_without_clients(history):
    import dataclasses

    return dataclasses.replace(history, client_metrics=None, client_ids=None)


def test_an_interrupted_run_resumes_with_the_same_per_client_metrics(runs, data, model, split_task, schedule,
                                                                     tmp_path):
    full, _, _ = runs
    folder = str(tmp_path / "ckpt")
    calls = []

    def stop_after_two(update):
        calls.append(update.step)
        assert set(update.client_metrics) == {"client_accuracy", "client_loss"}
        assert update.client_metrics["client_accuracy"].shape == (2, N)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(SimulationInterrupted):
        simulate(split_task, fedbuff(), schedule, LOCAL, checkpoint_dir=folder, callbacks=[stop_after_two], **RUN)
    resumed = simulate(split_task, fedbuff(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    for k in full.metrics:
        assert resumed.metrics[k].tobytes() == full.metrics[k].tobytes(), k
    for k in full.client_metrics:
        assert resumed.client_metrics[k].tobytes() == full.client_metrics[k].tobytes(), k
    other = make_task(data, data.natural_partition, model, seed=SEED, client_test_fraction=FT, validation_fraction=FV,
                      eval_clients=4)  # the same arrays' shapes but for the client test set: the identity says so
    with pytest.raises(CheckpointMismatchError, match="differs in: task"):
        simulate(other, fedbuff(), schedule, LOCAL, checkpoint_dir=folder, resume=True, **RUN)
    assert other.evaluation_options()["eval_client_ids"] == [int(i) for i in other.eval_client_ids]


# ---------------------------------------------------------------------------------------------------- config and CLI
@pytest.mark.parametrize("change, message", [
    ({"client_test_fraction": 1.0}, r"data.client_test_fraction = 1.0: must be a finite number in \[0, 1\)"),
    ({"validation_fraction": -0.5}, r"data.validation_fraction = -0.5: must be a finite number in \[0, 1\)"),
    ({"validation_fraction": "x"}, r"data.validation_fraction = 'x'"),
    ({"client_test_fraction": 0.2, "eval_clients": 0}, r"data.eval_clients = 0: must be null \(all clients\)"),
    ({"client_test_fraction": 0.2, "eval_clients": 101}, r"data.eval_clients = 101: must be <= data.num_clients"),
    ({"eval_clients": 5}, r"data.eval_clients = 5: needs data.client_test_fraction > 0"),
])
def test_config_refuses_bad_evaluation_options(change, message):
    cfg = ExperimentConfig.from_dict({"data": change})
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_cli_flags_set_the_evaluation_options(capsys):
    assert cli.main(["run", "--client-test-fraction", "0.2", "--validation-fraction", "0.1", "--eval-clients", "7",
                     "--print-config"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert (data["client_test_fraction"], data["validation_fraction"], data["eval_clients"]) == (0.2, 0.1, 7)
    defaults = ExperimentConfig().data
    assert (defaults.client_test_fraction, defaults.validation_fraction, defaults.eval_clients) == (0.0, 0.0, None)
    assert cli.main(["run", "--eval-clients", "7", "--no-progress"]) == 2
    assert "data.eval_clients = 7: needs data.client_test_fraction > 0" in capsys.readouterr().err


def test_the_experiment_writes_per_client_results(tmp_path):
    from asyncfl_jax.experiment import run_config

    cfg = ExperimentConfig.from_dict({
        "data": {"num_clients": 6, "synthetic_max_samples": 60, "client_test_fraction": 0.2,
                 "validation_fraction": 0.1, "eval_clients": 4},
        "model": {"name": "logreg"}, "local": {"steps": 1, "batch_size": None},
        "runs": [{"algorithm": "fedbuff", "steps": 4, "protocol": {"concurrency": 2, "buffer_size": 2}}],
        "eval_every": 2, "output": str(tmp_path / "out")})
    (history,) = run_config(cfg, progress=False, plot=False, checkpoint_every=None)
    with np.load(tmp_path / "out" / "client_metrics" / "fedbuff.npz") as z:
        assert z["client_accuracy"].shape == (1, 3, 4)
        np.testing.assert_array_equal(z["client_ids"], history.client_ids)
    with open(tmp_path / "out" / "metrics.csv") as f:
        header = f.readline().strip().split(",")
    assert {"val_accuracy", "val_loss", "client_accuracy_mean", "client_accuracy_worst10",
            "client_accuracy_std"} <= set(header)
