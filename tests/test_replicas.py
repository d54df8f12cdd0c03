"""Explicit replicas (``simulate(..., replicas=[ReplicaSpec(...)])``): any grid of settings as one program.

A grid of two timing settings (two delay models and two protocols, so schedules of different widths that the engine
pads) x 2 seeds, with a hyper-parameter that differs by setting, runs as one program; in float64 every replica's
trajectory equals the same replica run alone, and the labels reach the History, ``to_dataframe()``, ``metrics.csv``,
``summary.json`` and the point statistics. The seeds x hyper-parameters shorthand gives the same History bit for bit
as the same replicas written out.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import TOY_DELAYS, toy_problem
from asyncfl_jax import ReplicaSpec, simulate
from asyncfl_jax.algorithms import fedbuff
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.results import load_results, metrics_csv, write_results
from asyncfl_jax.timing import DelayModel, make_schedule
from asyncfl_jax.timing.clock import EventClock

N, T = 5, 8
TASK, _, _ = toy_problem(N)
LOCAL = LocalConfig(steps=2, batch_size=None)
SLOW_TAIL = DelayModel(speed="lognormal", noise="exponential")
SETTINGS = {  # label -> (schedule of a seed, server_lr)
    "uniform/M=2": (lambda s: make_schedule("concurrent", N, T, TOY_DELAYS, seed=s, concurrency=4, buffer_size=2),
                    0.5),
    "lognormal/M=3": (lambda s: make_schedule("concurrent", N, T, SLOW_TAIL, seed=s, concurrency=5, buffer_size=3),
                      1.0),
}
SEEDS = (0, 1)


def _alone(schedule, seed, server_lr):
    return simulate(TASK, fedbuff(), schedule, LOCAL, seeds=[seed], hparams={"client_lr": 0.3, "server_lr": server_lr},
                    eval_every=4, progress=False, precision="float64", trajectory=True)


def _grid_specs():
    return [ReplicaSpec(build(s), seed=s, hparams={"client_lr": 0.3, "server_lr": lr},
                        label={"timing": name, "buffer": int(name[-1])})
            for name, (build, lr) in SETTINGS.items() for s in SEEDS]


def test_a_grid_of_settings_in_one_program_equals_each_replica_alone(tmp_path):
    specs = _grid_specs()
    assert len({s.schedule.buffer_width for s in specs}) == 2  # the engine pads the widths
    grid = simulate(TASK, fedbuff(), replicas=specs, local=LOCAL, eval_every=4, progress=False, precision="float64",
                    trajectory=True)
    assert grid.seeds == [0, 1, 0, 1]
    for r in (1, 2):  # one replica of each setting (each alone compiles a program of its own)
        spec = specs[r]
        alone = _alone(spec.schedule, spec.seed, spec.hparams["server_lr"])
        np.testing.assert_allclose(grid.trajectory[r], alone.trajectory[0], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(grid.times[r], alone.times[0])
        np.testing.assert_array_equal(grid.uploads[r], alone.uploads[0])
    # the labels: History, rows / to_dataframe / metrics.csv, points and their statistics, summary.json
    assert grid.labels[2] == {"timing": "lognormal/M=3", "buffer": 3}
    frame = grid.to_dataframe()
    assert list(frame.columns[:6]) == ["run", "algorithm", "replica", "seed", "timing", "buffer"]
    assert set(frame[frame.replica == 3].timing) == {"lognormal/M=3"}
    assert "timing,buffer" in metrics_csv([grid]).splitlines()[0]
    points = grid.points()
    assert [p.seeds for p in points] == [(0, 1), (0, 1)]
    assert points[1].name == "timing=lognormal/M=3, buffer=3, server_lr=1"
    assert len(grid.point_stats()) == 2
    assert grid.summary()["replicas"][1]["label"] == {"timing": "uniform/M=2", "buffer": 2}
    write_results(str(tmp_path), {}, [grid], plot=False)
    (loaded,) = load_results(str(tmp_path))
    assert loaded.labels == grid.labels and list(loaded.metrics) == list(grid.metrics)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"][0]["points"][0]["label"] == {"timing": "uniform/M=2", "buffer": 2}


def test_the_seeds_by_points_shorthand_equals_its_replicas_written_out():
    schedules = [make_schedule("concurrent", N, T, TOY_DELAYS, seed=s, concurrency=4, buffer_size=2) for s in SEEDS]
    hp = {"client_lr": 0.3, "server_lr": [0.5, 1.0]}
    short = simulate(TASK, fedbuff(), schedules, LOCAL, seeds=SEEDS, hparams=hp, eval_every=4, progress=False)
    specs = [ReplicaSpec(schedules[i], seed=s, hparams={"client_lr": 0.3, "server_lr": lr})
             for i, s in enumerate(SEEDS) for lr in hp["server_lr"]]
    explicit = simulate(TASK, fedbuff(), replicas=specs, local=LOCAL, eval_every=4, progress=False)
    assert explicit.seeds == short.seeds and explicit.hparams == short.hparams and explicit.labels is None
    np.testing.assert_array_equal(explicit.final_params, short.final_params)
    for k in short.metrics:
        np.testing.assert_array_equal(explicit.metrics[k], short.metrics[k])
    assert list(explicit.to_dataframe().columns) == list(short.to_dataframe().columns)


def test_event_clocks_of_different_delay_models_with_string_labels():
    clocks = {name: EventClock(N, 6, delays, seed=0) for name, delays in (("fast", TOY_DELAYS), ("slow", SLOW_TAIL))}
    specs = [ReplicaSpec(c, seed=3, label=name) for name, c in clocks.items()]
    grid = simulate(TASK, fedbuff(), replicas=specs, local=LOCAL, eval_every=3, progress=False)
    alone = simulate(TASK, fedbuff(), clocks["slow"], LOCAL, seeds=[3], eval_every=3, progress=False)
    np.testing.assert_allclose(grid.final_params[1], alone.final_params[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(grid.times[1], alone.times[0])
    assert grid.labels == [{"setting": "fast"}, {"setting": "slow"}]
    assert [p.name for p in grid.points()] == ["fast", "slow"]
    assert list(grid.to_dataframe().setting.unique()) == ["fast", "slow"]


SCHEDULE = make_schedule("concurrent", N, T, TOY_DELAYS, seed=0, concurrency=4, buffer_size=2)


@pytest.mark.parametrize("replicas, kwargs, message", [
    ([ReplicaSpec(SCHEDULE), ReplicaSpec(SCHEDULE.truncate(5))], {}, r"replicas\[1\].schedule has num_steps = 5"),
    ([ReplicaSpec(SCHEDULE), ReplicaSpec(EventClock(N, T, TOY_DELAYS, 0))], {},
     r"replicas\[1\].schedule is a EventClock"),
    ([ReplicaSpec(SCHEDULE, label="a"), ReplicaSpec(SCHEDULE, label={"b": 1})], {},
     r"replicas\[1\].label has the keys \['b'\]"),
    ([ReplicaSpec(SCHEDULE, label={"seed": 1})], {}, r"replicas\[0\].label key 'seed' is a column"),
    ([ReplicaSpec(SCHEDULE, label={"server_lr": 1})], {}, r"replicas\[0\].label key 'server_lr' is also a hyper"),
    ([ReplicaSpec(SCHEDULE, label={"a": [1]})], {}, r"replicas\[0\].label\['a'\] must be"),
    ([ReplicaSpec(SCHEDULE, seed=-1)], {}, r"replicas\[0\].seed must be"),
    ([ReplicaSpec(SCHEDULE, hparams={"server_lr": [0.1, 1.0]})], {}, r"replicas\[0\].hparams\['server_lr'\] is a list"),
    ([ReplicaSpec(SCHEDULE, hparams={"server_lrr": 1.0})], {}, "did you mean 'server_lr'"),
    ([ReplicaSpec("schedule")], {}, r"replicas\[0\].schedule must be a Schedule"),
    ([], {}, "replicas must not be empty"),
    ([ReplicaSpec(SCHEDULE)], {"seeds": [0, 1]}, "seeds would be ignored"),
    ([ReplicaSpec(SCHEDULE)], {"schedules": SCHEDULE}, "schedules would be ignored"),
])
def test_replicas_that_cannot_share_a_program_are_refused_by_replica_and_field(replicas, kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(TASK, fedbuff(), replicas=replicas, local=LOCAL, progress=False, **kwargs)
