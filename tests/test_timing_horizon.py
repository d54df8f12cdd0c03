"""asyncfl_jax.timing.horizon, padding and rounds: schedules built past a horizon and cut at it, padded to common
widths, and synchronous rounds that wait for suspended clients. (The AREA reproduction's use of them, with Poisson
rates, is tested in test_reproduce_area.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from asyncfl_jax.timing import (DelayModel, build_past, concurrent, cut_at_horizon, job_durations_table,
                                pad_to_common_widths, poisson_delays, steps_within, suspension_table, synchronous,
                                wait_rounds)


def test_build_past_doubles_the_steps_until_the_last_one_is_after_the_horizon():
    delays = DelayModel.constant(1.0)
    built = []

    def build(steps):
        built.append(steps)
        return synchronous(4, steps, delays, seed=0)  # step t at time t + 1

    schedule, steps = build_past(build, 10.5, 3)
    assert built == [3, 6, 12] and steps == 12 and schedule.num_steps == 12
    assert steps_within(schedule, 10.5) == 10 and steps_within(schedule, 10.0) == 10


def test_cut_at_horizon_empties_the_late_steps_and_keeps_the_length():
    schedule = concurrent(6, 40, poisson_delays(10.0, 5.0), seed=1, concurrency=6, buffer_size=2, refill="immediate")
    horizon = float(schedule.step_times[20])
    cut = cut_at_horizon(schedule, horizon, 30)
    keep = steps_within(schedule, horizon)
    assert cut.num_steps == 30 and keep == 21 and cut.info["steps_in_horizon"] == keep
    np.testing.assert_array_equal(cut.arrival_clients[:keep], schedule.arrival_clients[:keep])
    assert np.all(cut.arrival_clients[keep:] == -1) and np.all(cut.dispatch_clients[keep:] == -1)
    assert np.all(np.isnan(cut.arrival_times[keep:]))
    np.testing.assert_array_equal(cut.step_times, schedule.step_times[:30])
    assert cut_at_horizon(schedule, float(schedule.step_times[-1]) + 1.0, 40).num_steps == 40


def test_pad_to_common_widths():
    a = concurrent(8, 5, DelayModel(), seed=0, concurrency=4, buffer_size=2)
    b = concurrent(8, 5, DelayModel(), seed=0, concurrency=8, buffer_size=4)
    padded = pad_to_common_widths([a, b])
    assert {(s.buffer_width, s.dispatch_width) for s in padded} == {(4, max(a.dispatch_width, b.dispatch_width))}
    np.testing.assert_array_equal(padded[0].arrival_clients[:, :2], a.arrival_clients)
    assert np.all(padded[0].arrival_clients[:, 2:] == -1)


@pytest.mark.parametrize("prob", [0.0, 0.5])
def test_wait_rounds_wait_for_every_client(prob):
    n, rounds = 5, 12
    delays = DelayModel(speed="uniform", speed_low=0.5, speed_high=2.0, noise="exponential", suspension_prob=prob,
                        suspension_mean=1.0)
    s = wait_rounds(n, rounds, delays, seed=3)
    assert s.info["suspensions"] == "wait" and np.all(s.uploads_per_step == n)
    durations = job_durations_table(n, delays, 3).durations(np.arange(n)[None, :], np.arange(rounds)[:, None])
    np.testing.assert_allclose(s.arrival_times - s.dispatch_times, durations)
    np.testing.assert_allclose(s.step_times, s.arrival_times.max(axis=1))
    assert np.all(s.dispatch_times[1:] >= s.step_times[:-1, None] - 1e-12)  # a round starts after the last one
    if prob == 0.0:  # nobody is suspended: the package's synchronous rounds
        np.testing.assert_allclose(s.step_times, synchronous(n, rounds, delays, seed=3).step_times)
    else:  # a client suspended after its upload of round t-1 starts round t when it returns
        hang = suspension_table(n, delays, 3).lengths(np.arange(n)[None, :], np.arange(rounds - 1)[:, None])
        suspended = np.isfinite(hang)
        assert suspended.any()
        late = s.arrival_times[:-1] + np.nan_to_num(hang)
        np.testing.assert_allclose(s.dispatch_times[1:][suspended],
                                   np.maximum(s.step_times[:-1, None], late)[suspended])
