"""Lookahead batching: the jobs dispatched over several server steps trained in one vmapped call.

The plan (computed on the host from the schedule) must train every job before the step that reads it, and the
results must equal those of training each step's jobs at once, for every kind of algorithm state (none, server
caches, client memory, an initialization round, per-job step counts) and schedule (immediate and boundary refill,
all clients active, per-seed schedules, dropouts and suspensions, a server clock).
"""

from __future__ import annotations

import numpy as np
import pytest

from support import common_widths, toy_problem

from asyncfl_jax.algorithms import get_algorithm
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import job_arrivals, lookahead_plan, lookahead_windows, simulate
from asyncfl_jax.timing import DelayModel, all_active, concurrent

N = 12
LOCAL = LocalConfig(steps=2, batch_size=3)
SCHEDULES = {
    "all_active": lambda seed: all_active(N, 60, DelayModel(), seed),
    "immediate": lambda seed: concurrent(N, 40, DelayModel(), seed, concurrency=8, buffer_size=3,
                                         refill="immediate"),
    "boundary": lambda seed: concurrent(N, 40, DelayModel(), seed, concurrency=8, buffer_size=2, refill="boundary"),
    "availability": lambda seed: all_active(N, 60, DelayModel(suspension_prob=0.3, dropout_fraction=0.25,
                                                              dropout_time=4.0), seed),
    "clock": lambda seed: all_active(N, 30, DelayModel(), seed, aggregation="periodic", period=0.3),
}


@pytest.fixture(scope="module")
def task():
    return toy_problem(N, seed=1)[0]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_plan_trains_every_job_before_it_is_read(name):
    schedules = [SCHEDULES[name](seed) for seed in (0, 1)]
    for L in (2, 5, 16):
        position, flush = lookahead_plan(schedules, L)
        windows = lookahead_windows(flush)
        assert windows.max() <= L and (position < L).all()
        assert position[0] == 0 and all(position[t] == (0 if flush[t - 1] else position[t - 1] + 1)
                                        for t in range(1, len(flush)))
        flush_steps = np.flatnonzero(flush)
        for schedule in schedules:
            for dispatched, arrival in job_arrivals(schedule):
                first_flush = flush_steps[np.searchsorted(flush_steps, dispatched)]
                assert first_flush <= arrival, (dispatched, arrival)
    if name == "all_active":  # with 12 clients always active a window often spans several steps
        assert lookahead_windows(lookahead_plan(schedules, 16)[1]).max() >= 3


@pytest.mark.parametrize("algorithm,options,name", [
    ("ca2fl", {}, "immediate"),  # n x d cache, several jobs per step
    ("ace", {}, "all_active"),  # initialization round, n x d cache, gradient uploads
    ("area", {"lr_schedule": "decreasing"}, "clock"),  # client memory, hyper-parameters read at dispatch, empty steps
    ("asyncfeded", {"initial_steps": 2, "max_steps": 4}, "availability"),  # per-job step counts, dropouts
])
def test_lookahead_gives_the_results_of_training_at_dispatch(task, algorithm, options, name):
    alg = get_algorithm(algorithm, **options)
    schedules = list(common_widths({s: SCHEDULES[name](s) for s in (0, 1)}).values())
    kw = dict(seeds=[0, 1], eval_every=10, progress=False)
    plain = simulate(task, alg, schedules, LOCAL, **kw)
    batched = simulate(task, alg, schedules, LOCAL, lookahead=6, **kw)
    np.testing.assert_allclose(batched.final_params, plain.final_params, rtol=1e-5, atol=1e-6)
    for k in plain.metrics:
        np.testing.assert_allclose(batched.metrics[k], plain.metrics[k], rtol=1e-5, atol=1e-6)
    assert batched.lookahead["L"] == 6 and batched.lookahead["max_window"] <= 6
    assert sum(batched.lookahead["window_histogram"]) == batched.lookahead["num_windows"]
    assert plain.lookahead is None


def test_lookahead_resumes_from_a_checkpoint_bit_for_bit(task, tmp_path, monkeypatch):
    from test_checkpoint import StoppingBar, raise_keyboard_interrupt

    from asyncfl_jax import engine
    from asyncfl_jax.checkpoint import SimulationInterrupted

    schedule = SCHEDULES["all_active"](0)
    alg = get_algorithm("ace")
    kw = dict(eval_every=10, progress=False, lookahead=4)
    uninterrupted = simulate(task, alg, schedule, LOCAL, **kw)
    folder = str(tmp_path / "ckpt")
    monkeypatch.setattr(engine.callbacks, "progress_bar", lambda *a, **k: StoppingBar(2, raise_keyboard_interrupt))
    with pytest.raises(SimulationInterrupted):
        simulate(task, alg, schedule, LOCAL, checkpoint_dir=folder, **kw)
    monkeypatch.undo()
    resumed = simulate(task, alg, schedule, LOCAL, checkpoint_dir=folder, resume=True, **kw)
    assert resumed.final_params.tobytes() == uninterrupted.final_params.tobytes()


def test_bad_lookahead_is_refused(task):
    from asyncfl_jax.timing.clock import EventClock

    with pytest.raises(ValueError, match="lookahead must be an integer >= 1"):
        simulate(task, get_algorithm("fedasync"), SCHEDULES["all_active"](0), LOCAL, lookahead=0, progress=False)
    with pytest.raises(ValueError, match="cannot be combined with shard_jobs"):
        simulate(task, get_algorithm("fedasync"), SCHEDULES["all_active"](0), LOCAL, lookahead=4, shard_jobs=True,
                 progress=False)
    with pytest.raises(ValueError, match="needs a pre-sampled schedule"):
        simulate(task, get_algorithm("fedasync"), EventClock(N, 10, DelayModel()), LOCAL, lookahead=4,
                 progress=False)
