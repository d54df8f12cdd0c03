"""asyncfl_jax.timing.window and asyncfl_jax.timing.client_delays: the AsynFLC-EF paper's window server (clients wait
for the window to close) and every client's delay at every step (Def. 4), on the paper's job times."""

from __future__ import annotations

import numpy as np

from asyncfl_jax.reproduce import asynflc_ef as R  # the paper's job times and its 1000 s cap
from asyncfl_jax.timing import DelayModel, delay_statistics, job_durations_table, schedule_summary, window_schedule


def test_window_schedule_follows_the_digest_event_model():
    n, T, W = 30, 12, 500.0
    delays = R.delay_model()
    s = window_schedule(n, T, W, delays, seed=3, max_duration=R.MAX_DURATION)  # validates itself
    table = job_durations_table(n, delays, 3)
    jobs = np.zeros(n, dtype=int)
    np.testing.assert_array_equal(s.step_times, W * (np.arange(T) + 1))
    for t in range(T):
        came = s.arrival_clients[t][s.arrival_clients[t] >= 0]
        # Every arrival of step t finished inside the window ((t W, (t+1) W]) and took the package's duration.
        times = s.arrival_times[t][: came.size]
        assert np.all(times <= (t + 1) * W) and np.all(times > t * W)
        assert np.all(np.diff(times) >= 0)
        start = s.arrival_versions[t][: came.size] * W
        np.testing.assert_allclose(times - start, np.minimum(table.durations(came, jobs[came]), R.MAX_DURATION))
        jobs[came] += 1
        if t + 1 < T:  # ... and restarts from x_{t+1} when the window closes
            nxt = s.dispatch_clients[t + 1][s.dispatch_clients[t + 1] >= 0]
            assert sorted(nxt) == sorted(came)
            assert np.all(s.dispatch_times[t + 1][: nxt.size] == (t + 1) * W)
    assert 0 < schedule_summary(s)["staleness_max"] <= 1  # durations <= 1000 s = 2 W
    # W >= the longest job: synchronous rounds of all n clients, staleness 0.
    sync = window_schedule(n, 6, R.MAX_DURATION, delays, seed=3, max_duration=R.MAX_DURATION)
    assert np.all(sync.uploads_per_step == n) and schedule_summary(sync)["staleness_max"] == 0
    stats = delay_statistics(sync)
    assert stats["tau_max"] == 0 and stats["tau_avg0"] == 0 and stats["S_mean"] == n and stats["S_min"] == n


def test_delay_statistics_on_a_hand_computed_schedule():
    # Every job takes 700 s, W = 500 s: a client reports every other window (at steps 1, 3, 5, ...) with staleness 1
    # and starts again from the new model, so tau_t^i alternates 0, 1.
    s = window_schedule(4, 8, 500.0, DelayModel.constant(700.0), seed=0)
    assert list(s.uploads_per_step) == [0, 4] * 4
    stats = delay_statistics(s)
    assert stats["tau_max"] == 1 and stats["tau_avg0"] == 0.5 and stats["tau_avgm0"] == 0.5
    # tau_avg1 averages the step mean at t - tau_t^i, which is always an even step (where every tau is 0).
    assert stats["tau_avg1"] == 0.0 and stats["tau_avgm1"] == 0.0
    assert stats["S_mean"] == 2.0 and stats["empty_rounds"] == 4 and stats["staleness_mean"] == 1.0
    assert stats["participation_min"] == stats["participation_max"] == 0.5
    # The package's immediate-restart window server: a client is re-sent x_t at once (no idling), so it reports
    # more often than when it waits for the window to close.
    wait, immediate = (R.window_schedules(20, 8, 500.0, [0], how)[0] for how in ("wait", "immediate"))
    assert delay_statistics(immediate)["uploads"] > delay_statistics(wait)["uploads"]
