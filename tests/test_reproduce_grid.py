"""The reproductions' shared runner (asyncfl_jax.reproduce.grid): one program of explicit replicas as a DataFrame,
per-replica columns, records and arrays read back from it, a program over the memory budget run in halves and the
command skeleton's exit codes."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from support import TOY_DELAYS, toy_problem
from asyncfl_jax import ReplicaSpec
from asyncfl_jax.algorithms import fedbuff
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.reproduce import grid
from asyncfl_jax.reproduce.data import DataUnavailable
from asyncfl_jax.timing import DelayModel, make_schedule

N, T = 4, 6
TASK, _, _ = toy_problem(N)
LOCAL = LocalConfig(steps=1, batch_size=None)


def _replicas():
    schedules = {"M=1": make_schedule("concurrent", N, T, TOY_DELAYS, seed=0, concurrency=3, buffer_size=1),
                 "M=2": make_schedule("concurrent", N, T, DelayModel(), seed=0, concurrency=3, buffer_size=2)}
    return [ReplicaSpec(schedules[name], seed=grid.setting_seed(j, s), hparams={"server_lr": lr},
                        label={"protocol": name, "timing_seed": s})
            for j, name in enumerate(schedules) for s in (0, 1) for lr in (0.5,)]


def test_run_grid_returns_the_frame_with_labels_and_per_replica_columns(monkeypatch, capsys):
    replicas = _replicas()
    frame = grid.run_grid(TASK, fedbuff(), replicas, local=LOCAL, name="toy", eval_every=3,
                          per_replica=lambda h: {"final": list(h.metrics["test_accuracy"][:, -1])})
    assert sorted(frame.seed.unique()) == [0, 1, 1000, 1001]
    assert {"protocol", "timing_seed", "final", "test_accuracy"} <= set(frame.columns)
    assert frame.attrs["run"]["algorithm"] == "fedbuff" and frame.attrs["run"]["num_steps"] == T
    runs = grid.replica_runs(frame, ("protocol", "timing_seed", "final"), {"acc": "test_accuracy", "steps": "step"})
    assert [(r["protocol"], r["timing_seed"]) for r in runs] == [("M=1", 0), ("M=1", 1), ("M=2", 0), ("M=2", 1)]
    assert all(r["steps"] == [0, 3, 6] and r["acc"][-1] == r["final"] for r in runs)
    arrays = grid.replica_arrays(frame, {"acc": "test_accuracy"}, {"acc": grid.metric_dtype(frame)})
    assert arrays["acc"].shape == (4, 3) and arrays["acc"].dtype == np.float32
    assert "toy" in capsys.readouterr().err  # one line per program

    # Over the memory budget: halves, joined along the replicas; every replica keeps its result.
    real, calls = grid.simulate, []

    def budgeted(task, algorithm, schedules=None, **kwargs):
        calls.append(len(kwargs["replicas"]))
        if len(kwargs["replicas"]) > 2:
            raise MemoryError("the simulation state needs more than 90% of the device memory")
        return real(task, algorithm, schedules, **kwargs)

    monkeypatch.setattr(grid, "simulate", budgeted)
    split = grid.run_grid(TASK, fedbuff(), replicas, local=LOCAL, name="toy", eval_every=3)
    assert calls == [4, 2, 2] and "4 replicas do not fit" in capsys.readouterr().err
    assert list(split.replica.unique()) == [0, 1, 2, 3] and list(split.protocol) == list(frame.protocol)
    np.testing.assert_allclose(split.test_accuracy, frame.test_accuracy, rtol=1e-6)


def test_command_main_runs_loads_and_reports(tmp_path, capsys):
    def parse(argv):
        return argparse.Namespace(out=str(tmp_path / argv[0]), missing=argv[0] == "missing")

    def load(args):
        if args.missing:
            raise DataUnavailable("no data here")
        return 2

    def report(args, results, seconds):
        assert seconds >= 0
        return f"table {results}"

    assert grid.command_main(["missing"], parse, lambda a, x: x * 21, report, load=load) == 2
    assert "error: no data here" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    assert grid.command_main(["ok"], parse, lambda a, x: x * 21, report, load=load) == 0
    assert "table 42" in capsys.readouterr().out and (tmp_path / "ok").is_dir()
    assert grid.command_main(["ok"], parse, None, report, early=lambda a: 0) == 0


def test_join_refuses_programs_evaluated_at_other_steps():
    a = grid.run_in_parts(TASK, fedbuff(), _replicas()[:1], local=LOCAL, label="a", eval_every=3)
    joined = grid.join_replicas([a, a])
    assert joined.seeds == [0, 0] and joined.labels == a.labels * 2 and joined.times.shape == (2, 3)
    with pytest.raises(ValueError, match="different steps"):
        grid.join_replicas([a, dataclasses.replace(a, steps=a.steps + 1)])
