"""The host loop's callbacks: user functions, metric writers, an early stop, and the loop reused from outside."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from asyncfl_jax import LocalConfig, fedbuff, make_model, make_schedule, make_task, simulate
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.engine import CSVLogger, HostLoop, JSONLinesLogger, make_history, prepare_run
from asyncfl_jax.timing import DelayModel

N, T, E = 10, 30, 10
LOCAL = LocalConfig(steps=2, batch_size=8)


@pytest.fixture(scope="module")
def task():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=100)
    return make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("concurrent", N, T, DelayModel(), seed=0, concurrency=5, buffer_size=2, refill="boundary")


def test_a_function_callback_sees_every_evaluation_of_every_replica(task, schedule):
    seen = []
    history = simulate(task, fedbuff(), schedule, LOCAL, seeds=[0, 1], hparams={"client_lr": [0.05, 0.1]},
                       eval_every=E, progress=False, callbacks=[seen.append])
    assert [u.step for u in seen] == [10, 20, 30]
    assert all(u.num_steps == T and u.steps_done == E and u.seconds > 0 for u in seen)
    for i, update in enumerate(seen):  # the update's metrics are the History's row of that evaluation
        for name, values in update.metrics.items():
            assert values.shape == (4,)
            np.testing.assert_array_equal(values, history.metrics[name][:, i + 1])
    assert [(r.seed, r.hparams["client_lr"]) for r in seen[0].replicas] == [(0, 0.05), (0, 0.1), (1, 0.05), (1, 0.1)]


def test_the_history_so_far_from_a_callback(task, schedule):
    partial = []
    final = simulate(task, fedbuff(), schedule, LOCAL, eval_every=E, progress=False,
                     callbacks=[lambda u: partial.append(u.history())])
    assert [list(h.steps) for h in partial] == [[0, 10], [0, 10, 20], [0, 10, 20, 30]]
    np.testing.assert_array_equal(partial[-1].metrics["test_loss"], final.metrics["test_loss"])
    np.testing.assert_array_equal(partial[0].times[:, -1], final.times[:, 1])


def test_csv_and_json_lines_writers(schedule, tmp_path):
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=100)
    mlp = make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[16]))
    csv_path, jsonl_path = tmp_path / "m" / "metrics.csv", tmp_path / "metrics.jsonl"
    with pytest.warns(RuntimeWarning, match="diverged"):
        history = simulate(mlp, fedbuff(), schedule, LOCAL, seeds=[0, 1], hparams={"client_lr": [0.05, 1e20]},
                           eval_every=E, progress=False,
                           callbacks=[CSVLogger(str(csv_path)), JSONLinesLogger(str(jsonl_path))])
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 3 * 4  # 3 evaluations after chunks x 4 replicas
    assert set(rows[0]) >= {"run", "step", "replica", "seed", "client_lr", "test_accuracy", "test_loss", "diverged",
                            "time", "uploads", "local_steps"}
    last = [r for r in rows if r["step"] == "30"]
    # the axes that compare runs of different uploads per step, as in the History (local steps: K = 2 per upload)
    np.testing.assert_allclose([float(r["time"]) for r in last], history.times[:, -1], rtol=1e-9)
    assert [int(r["uploads"]) for r in last] == list(history.uploads[:, -1])
    assert [float(r["local_steps"]) for r in last] == list(2.0 * history.uploads[:, -1])
    np.testing.assert_allclose([float(r["test_loss"]) for r in last], history.metrics["test_loss"][:, -1], rtol=1e-6)
    assert (history.diverged_at[[1, 3]] >= 0).all() and (history.diverged_at[[0, 2]] < 0).all()
    assert [int(r["seed"]) for r in last] == [0, 0, 1, 1]
    records = [json.loads(line) for line in open(jsonl_path)]  # strict JSON: non-finite values are null
    assert len(records) == 12
    diverged = [r for r in records if r["client_lr"] == 1e20 and r["step"] == 30]
    assert len(diverged) == 2 and all(r["diverged"] and r["test_loss"] is None for r in diverged), diverged


def test_a_callback_can_stop_the_run(task, schedule):
    class StopAt20:
        def on_chunk(self, loop, update):
            if update.step >= 20:
                loop.stop()

    history = simulate(task, fedbuff(), schedule, LOCAL, eval_every=E, progress=False, callbacks=[StopAt20()])
    assert history.stopped_early and list(history.steps) == [0, 10, 20]


def test_the_host_loop_is_reusable_outside_simulate(task, schedule):
    """prepare_run + HostLoop + make_history is what simulate runs: the same History."""
    run = prepare_run(task, fedbuff(), schedule, LOCAL, seeds=[2], eval_every=E)
    history = make_history(run, HostLoop(run).run())
    reference = simulate(task, fedbuff(), schedule, LOCAL, seeds=[2], eval_every=E, progress=False)
    np.testing.assert_array_equal(history.final_params, reference.final_params)
    for k in reference.metrics:
        np.testing.assert_array_equal(history.metrics[k], reference.metrics[k])
