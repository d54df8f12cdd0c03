"""Replica-aware results: grouping by hyper-parameter point, per-point statistics over seeds with diverged replicas
reported apart, the files, the loader, the data frame, the CLI lines, the progress text, TensorBoard and logging."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import struct

import numpy as np
import pytest

from asyncfl_jax import LocalConfig, fedbuff, load_results, make_model, make_schedule, make_task, simulate
from asyncfl_jax.cli import result_lines
from asyncfl_jax.config import ExperimentConfig
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.engine import TensorBoardLogger, point_progress
from asyncfl_jax.engine.hparams import Replica
from asyncfl_jax.experiment import run_config
from asyncfl_jax.results import History, point_curves
from asyncfl_jax.timing import DelayModel

SEEDS = [0, 1, 2]


def _hand_history(metrics=None, diverged=(-1, -1, -1, 10, -1, -1)) -> History:
    """2 points (alpha 0.3 / 0.6) x 3 seeds in the engine's order (seed-major); replica 3 (seed 1, alpha 0.6)
    diverged at step 10: its later values are NaN."""
    rng = np.random.default_rng(0)
    steps = np.array([0, 5, 10])
    acc = rng.uniform(0.1, 0.9, size=(6, 3))
    loss = rng.uniform(0.5, 2.0, size=(6, 3))
    acc[3, 2] = loss[3, 2] = np.nan
    metrics = {"test_accuracy": acc, "test_loss": loss} if metrics is None else metrics
    return History(label="fedasync", algorithm="fedasync", algorithm_options={}, steps=steps,
                   times=np.tile(steps * 0.5, (6, 1)) + np.arange(6)[:, None], uploads=np.tile(steps, (6, 1)),
                   metrics=metrics, seeds=[0, 0, 1, 1, 2, 2],
                   hparams=[{"alpha": a, "client_lr": 0.1} for a in (0.3, 0.6) * 3],
                   diverged_at=np.array(diverged), schedule_stats=[{"staleness_mean": 1.5, "staleness_max": 4}],
                   num_steps=10)


def _plain_stats(values, diverged_at):
    """Mean, population std and count of the finite values of the non-diverged entries, by a plain loop."""
    kept = [v for v, d in zip(values, diverged_at) if d < 0 and np.isfinite(v)]
    if not kept:
        return None, None, 0
    mean = sum(kept) / len(kept)
    return mean, (sum((v - mean) ** 2 for v in kept) / len(kept)) ** 0.5, len(kept)


def test_points_group_replicas_by_hyper_parameters_and_leave_diverged_seeds_out():
    h = _hand_history()
    points = h.points()
    assert [(p.name, p.replicas, p.seeds) for p in points] == [("alpha=0.3", (0, 2, 4), (0, 1, 2)),
                                                               ("alpha=0.6", (1, 3, 5), (0, 1, 2))]
    assert points[1].hparams == {"alpha": 0.6, "client_lr": 0.1} and points[1].swept == {"alpha": 0.6}
    np.testing.assert_array_equal(h.point_index(), [0, 1, 0, 1, 0, 1])
    acc = h.metrics["test_accuracy"]
    for which, per_replica in (("final", acc[:, -1]), ("best", [max(v for v in row if np.isfinite(v)) for row in acc])):
        stats = h.point_stats("test_accuracy", which)
        for p, s in zip(points, stats):
            mean, std, n = _plain_stats([per_replica[r] for r in p.replicas], [h.diverged_at[r] for r in p.replicas])
            assert (s.n, s.mean, s.std) == (n, pytest.approx(mean, rel=1e-12), pytest.approx(std, rel=1e-12))
        assert stats[0].diverged == () and stats[1].diverged == ((1, 10),) and stats[1].n == 2
    # the seed that diverged is left out even where its value is finite (the best value before it diverged)
    assert np.isfinite(h.best()[3])
    # losses: the best value is the smallest
    loss = h.metrics["test_loss"]
    np.testing.assert_array_equal(h.best("test_loss"), [min(v for v in row if np.isfinite(v)) for row in loss])


def test_a_point_whose_every_seed_diverged_has_no_mean():
    h = _hand_history(diverged=(-1, 3, -1, 10, -1, 7))
    stats = h.point_stats()[1]
    assert stats.mean is None and stats.std is None and stats.n == 0
    assert stats.diverged == ((0, 3), (1, 10), (2, 7))
    assert stats.describe() == "no value (every seed diverged)"
    lines = result_lines(h)
    assert "  fedasync alpha=0.6: final test accuracy no value (every seed diverged)" in lines
    assert ("  fedasync alpha=0.6: DIVERGED (NaN/inf or |x| > 1e10), left out of the mean: seed 0 at server step 3, "
            "seed 1 at server step 10, seed 2 at server step 7") in lines
    assert not any("nan" in line.replace("(NaN/inf or |x| > 1e10)", "").lower() for line in lines)  # no NaN printed as a number
    summary = h.summary()["points"][1]
    assert summary["final"] == {"mean": None, "std": None, "n": 0}
    assert summary["diverged"] == [{"seed": 0, "step": 3}, {"seed": 1, "step": 10}, {"seed": 2, "step": 7}]
    json.dumps(h.summary(), allow_nan=False)  # strict JSON


def test_cli_lines_one_per_point_with_mean_std_over_seeds():
    h = _hand_history()
    acc = h.metrics["test_accuracy"]
    lines = result_lines(h)
    assert lines[0].startswith("  fedasync: 10 steps (10 uploads, virtual time 5.0); staleness mean 1.50 max 4")
    m0, s0, _ = _plain_stats(acc[[0, 2, 4], -1], [-1] * 3)
    b0 = np.mean([max(acc[r]) for r in (0, 2, 4)])
    assert lines[1] == f"  fedasync alpha=0.3: final test accuracy {m0:.4f} ± {s0:.4f} (n=3 seeds), best {b0:.4f}"
    m1, s1, _ = _plain_stats(acc[[1, 5], -1], [-1] * 2)
    assert lines[2].startswith(f"  fedasync alpha=0.6: final test accuracy {m1:.4f} ± {s1:.4f} (n=2 seeds)")
    assert lines[3] == "  fedasync alpha=0.6: DIVERGED (NaN/inf or |x| > 1e10), left out of the mean: seed 1 at server step 10"
    assert len(lines) == 4


def test_a_task_without_accuracy_is_summarised_by_its_test_loss():
    h = _hand_history()
    h = _hand_history(metrics={"test_loss": h.metrics["test_loss"], "train_loss": h.metrics["test_loss"] * 2})
    assert h.headline == "test_loss"
    summary = h.summary()
    assert summary["metric"] == "test_loss" and "best_test_loss" in summary and "final_train_loss" in summary
    assert "final test loss" in result_lines(h)[1]
    loss = h.metrics["test_loss"]
    assert summary["points"][0]["best"]["mean"] == pytest.approx(np.mean([min(loss[r]) for r in (0, 2, 4)]))
    text = point_progress([Replica(s, hp) for s, hp in zip(h.seeds, h.hparams)],
                          {k: v[:, 1] for k, v in h.metrics.items()}, np.array([-1, -1, -1, 3, -1, -1]))
    means = [np.mean(loss[[0, 2, 4], 1]), np.mean(loss[[1, 5], 1])]
    best, worst = (0, 1) if means[0] <= means[1] else (1, 0)
    names = ["alpha=0.3", "alpha=0.6"]
    assert text == (f"test_loss best={means[best]:.3f} ({names[best]}) worst={means[worst]:.3f} ({names[worst]}) "
                    "diverged=1/6")


def test_dataframe_and_point_curves():
    pandas = pytest.importorskip("pandas")
    h = _hand_history()
    frame = h.to_dataframe()
    assert isinstance(frame, pandas.DataFrame) and frame.shape == (6 * 3, 12)
    assert list(frame.columns) == ["run", "algorithm", "replica", "seed", "alpha", "point", "step", "time", "uploads",
                                   "test_accuracy", "test_loss", "diverged_at"]
    assert frame.groupby("point").seed.nunique().to_dict() == {0: 3, 1: 3}
    assert frame.loc[(frame.replica == 3) & (frame.step == 10), "diverged_at"].item() == 10
    np.testing.assert_array_equal(frame.test_accuracy.to_numpy().reshape(6, 3), h.metrics["test_accuracy"])
    curves = point_curves(h)
    acc = h.metrics["test_accuracy"]
    np.testing.assert_allclose(curves[1]["mean"], (acc[1] + acc[5]) / 2, rtol=1e-12)  # replica 3 left out
    np.testing.assert_array_equal(curves[1]["lo"], np.minimum(acc[1], acc[5]))
    assert curves[1]["diverged"] == [(1, 10)] and curves[0]["n"] == 3 and curves[1]["n"] == 2


# ---------------------------------------------------------------------------------------------------- a real sweep
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """fedasync, client_lr 0.05 (finite) and 1e20 (every seed diverges) x 3 seeds, through run_config."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    cfg = ExperimentConfig.from_dict({
        "data": {"num_clients": 6, "synthetic_max_samples": 60},
        "model": {"name": "mlp", "hidden": [8]},
        "local": {"steps": 2, "batch_size": None},
        "runs": [{"algorithm": "fedasync", "protocol": {"name": "concurrent", "concurrency": 3, "buffer_size": 1},
                  "steps": 8, "hparams": {"client_lr": [0.05, 1e20]}}],
        "seeds": SEEDS, "eval_every": 4, "output": str(out)})
    with pytest.warns(RuntimeWarning, match="diverged"):
        histories = run_config(cfg, progress=False)
    return out, histories


def test_sweep_files_hold_the_points_with_diverged_seeds_apart(sweep):
    out, (h,) = sweep
    assert [p.name for p in h.points()] == ["client_lr=0.05", "client_lr=1e+20"]
    assert (h.diverged_at[[1, 3, 5]] >= 0).all() and (h.diverged_at[[0, 2, 4]] < 0).all()
    summary = json.loads((out / "summary.json").read_text())
    points = summary["runs"][0]["points"]
    acc = h.metrics["test_accuracy"]
    mean, std, n = _plain_stats(acc[[0, 2, 4], -1], [-1] * 3)
    assert points[0]["seeds"] == SEEDS and points[0]["swept"] == {"client_lr": 0.05}
    assert points[0]["final"] == {"mean": pytest.approx(mean, rel=1e-12), "std": pytest.approx(std, rel=1e-12), "n": 3}
    assert points[0]["best"]["mean"] == pytest.approx(np.mean([np.max(acc[r]) for r in (0, 2, 4)]), rel=1e-12)
    assert points[1]["final"] == {"mean": None, "std": None, "n": 0}
    assert points[1]["diverged"] == [{"seed": s, "step": int(h.diverged_at[r])} for s, r in zip(SEEDS, (1, 3, 5))]
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:9] == ["run", "algorithm", "replica", "seed", "client_lr", "point", "step", "time",
                                 "uploads"]
    assert list(rows[0])[-1] == "diverged_at" and len(rows) == 6 * 3
    assert {(r["replica"], r["point"], r["diverged_at"]) for r in rows} == {
        (str(r), str(r % 2), str(int(h.diverged_at[r]))) for r in range(6)}
    environment = json.loads((out / "environment.json").read_text())
    assert {"command", "started_utc"} <= set(environment)
    assert not {"command", "started_utc"} & set(summary["environment"])  # per invocation: environment.json only
    assert summary["environment"].get("git") == environment.get("git")


def _assert_same_history(loaded, returned, exact_extras):
    assert (loaded.label, loaded.algorithm, loaded.seeds, loaded.hparams) == (
        returned.label, returned.algorithm, returned.seeds, returned.hparams)
    for name in ("steps", "times", "uploads", "diverged_at"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(returned, name))
    assert set(loaded.metrics) == set(returned.metrics)
    for k in returned.metrics:
        np.testing.assert_array_equal(loaded.metrics[k], returned.metrics[k])
    assert loaded.schedule_stats == json.loads(json.dumps(returned.schedule_stats))
    assert (loaded.num_steps, loaded.stopped_early, loaded.message_bits) == (
        returned.num_steps, returned.stopped_early, returned.message_bits)
    if exact_extras:
        np.testing.assert_array_equal(loaded.final_params, returned.final_params)
    else:
        assert loaded.final_params is None
        assert loaded.compile_seconds == round(returned.compile_seconds, 3)


def test_load_results_gives_back_the_returned_histories(sweep, tmp_path):
    out, histories = sweep
    loaded = load_results(str(out))  # with the saved Histories of checkpoints/
    assert len(loaded) == 1
    _assert_same_history(loaded[0], histories[0], exact_extras=True)
    copy = tmp_path / "copy"  # as written with --no-checkpoint: metrics.csv and summary.json only
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "checkpoints")
    rebuilt = load_results(str(copy))
    _assert_same_history(rebuilt[0], histories[0], exact_extras=False)
    assert rebuilt[0].summary()["points"] == json.loads((out / "summary.json").read_text())["runs"][0]["points"]
    os.remove(copy / "summary.json")
    with pytest.raises(FileNotFoundError, match="summary.json"):
        load_results(str(copy))


# ---------------------------------------------------------------------------------------------------- callbacks
N, T, E = 6, 6, 3


@pytest.fixture(scope="module")
def small():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=60)
    task = make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))
    schedule = make_schedule("concurrent", N, T, DelayModel(), seed=0, concurrency=3, buffer_size=1,
                             refill="boundary")
    return task, schedule


def _read_scalars(folder):
    """tag -> [(step, value)] of the TFRecord event files in ``folder``, parsed by hand (length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list] = {}
    for name in sorted(os.listdir(folder)):
        blob = open(os.path.join(folder, name), "rb").read()
        pos = 0
        while pos < len(blob):
            (length,) = struct.unpack("<Q", blob[pos:pos + 8])
            event = event_pb2.Event.FromString(blob[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_tensorboard_logger_writes_every_replica_by_point_and_seed(small, tmp_path):
    pytest.importorskip("tensorboardX")
    task, schedule = small
    logdir = tmp_path / "tb"
    history = simulate(task, fedbuff(), schedule, LocalConfig(steps=1, batch_size=None), seeds=[0, 1],
                       hparams={"client_lr": [0.05, 0.1]}, eval_every=E, progress=False, label="fb",
                       callbacks=[TensorBoardLogger(str(logdir))])
    for r, (seed, hp) in enumerate(zip(history.seeds, history.hparams)):
        scalars = _read_scalars(logdir / "fb" / f"client_lr={hp['client_lr']:g}" / f"seed{seed}")
        assert {tag for tag in scalars if "/" not in tag} == set(history.metrics)
        for name, values in history.metrics.items():
            assert [s for s, _ in scalars[name]] == [3, 6]
            np.testing.assert_array_equal([v for _, v in scalars[name]], values[r, 1:].astype(np.float32))
            # the same values against uploads, local steps and virtual time (x 1000), so that runs with different
            # uploads per step share an axis
            assert [s for s, _ in scalars[f"vs_uploads/{name}"]] == list(history.uploads[r, 1:])
            assert [s for s, _ in scalars[f"vs_local_steps/{name}"]] == list(history.local_steps[r, 1:].astype(int))
            assert [s for s, _ in scalars[f"vs_virtual_time_x1000/{name}"]] == [
                int(round(1000 * t)) for t in history.times[r, 1:]]
            np.testing.assert_array_equal([v for _, v in scalars[f"vs_uploads/{name}"]],
                                          values[r, 1:].astype(np.float32))
        np.testing.assert_allclose([v for _, v in scalars["progress/virtual_time"]], history.times[r, 1:], rtol=1e-6)


def test_library_logs_only_to_the_logger_and_no_bar_without_a_terminal(small, capsys, caplog):
    task, schedule = small
    with caplog.at_level(logging.INFO, logger="asyncfl_jax"):
        simulate(task, fedbuff(), schedule, LocalConfig(steps=1, batch_size=None), eval_every=1, progress=True)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""  # no tqdm frames, no prints: stderr is not a terminal here
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("asyncfl_jax")]
    assert any("fedbuff: " in m and "memory" in m.lower() for m in messages), messages
    progress = [m for m in messages if m.startswith("fedbuff: step ")]
    assert progress and len(progress) <= 10 and progress[-1].startswith(f"fedbuff: step {T}/{T}, acc=")
