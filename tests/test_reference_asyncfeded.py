"""Checks of the AsyncFedED reference (tests/reference_asyncfeded.py) itself.

With a constant number of local steps equal to ``nominal_steps`` its own event clock must reproduce the package's
pre-sampled ``all_active`` schedule (arrivals, versions, times, every job started), with and without suspensions and
dropouts; the server rule is checked on a hand-computed two-client case, and K's clip on a longer adaptive run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference as ref
from reference_asyncfeded import RESULT_KEYS, asyncfeded_reference
from support import CLASSES, FEATURES, replay_jobs, toy_problem
from asyncfl_jax.timing import DelayModel
from asyncfl_jax.timing.protocols import all_active, dropped_clients, job_durations_table

MODEL = ref.LogReg(FEATURES, CLASSES)
HP = dict(client_lr=0.3, lam=1.0, epsilon=1.0, target_staleness=3.0, kappa=1.0, max_steps=10)

DELAYS = {
    "default": DelayModel(),
    "lognormal": DelayModel(speed="lognormal", speed_sigma=0.8, noise="lognormal", noise_sigma=0.3),
    "ca2fl_shift": DelayModel.ca2fl(scale_high=3.0, shift=0.5),
}


def run(n, T, delays, seed, **kw):
    _, data, x0 = toy_problem(n, seed=1)
    args = {**HP, "nominal_steps": 3, "initial_steps": 3, "adaptive": False, **kw}
    return asyncfeded_reference(MODEL, data, x0, n, T, delays, seed, **args), data, x0


def fixed_rule_replay(schedule, data, x0, steps):
    """x_T of AsyncFedED with fixed K on a pre-sampled schedule (replay_steps walks its arrivals)."""

    def server(x, t, arrivals):
        for a in arrivals:
            gamma = np.linalg.norm(x - a.start) / np.linalg.norm(a.message)
            x = x + HP["lam"] / (gamma + HP["epsilon"]) * a.message
        return x

    train = lambda c, start, v: ref.local_delta(MODEL, start, data[c], steps, HP["client_lr"])  # noqa: E731
    return ref.replay_steps(schedule, x0, train, server)


def assert_same_as_schedule(out, schedule, time_scale=1.0):
    np.testing.assert_array_equal(out["clients"], schedule.arrival_clients[:, 0])
    np.testing.assert_array_equal(out["versions"], schedule.arrival_versions[:, 0])
    np.testing.assert_allclose(out["arrival_times"], time_scale * schedule.arrival_times[:, 0], rtol=0, atol=1e-12)
    jobs = replay_jobs(schedule)
    np.testing.assert_array_equal(out["job_clients"], [j["client"] for j in jobs])
    np.testing.assert_array_equal(out["job_versions"], [j["version"] for j in jobs])
    np.testing.assert_allclose(out["job_times"], [time_scale * j["start"] for j in jobs], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------- event clock
@pytest.mark.parametrize("name", sorted(DELAYS))
@pytest.mark.parametrize("n,T,seed", [(4, 40, 0), (6, 60, 3)])
def test_fixed_steps_reproduce_all_active(name, n, T, seed):
    delays = DELAYS[name]
    out, data, x0 = run(n, T, delays, seed)
    assert set(out) == set(RESULT_KEYS)
    schedule = all_active(n, T, delays, seed)
    assert_same_as_schedule(out, schedule)
    assert (out["versions"] < np.arange(T)).any()  # some staleness
    np.testing.assert_array_equal(out["steps_used"], 3)
    np.testing.assert_array_equal(out["K"], 3)
    np.testing.assert_array_equal(out["job_steps"], 3)
    # The model: the fixed-K rule replayed on the schedule.
    models = fixed_rule_replay(schedule, data, x0, 3)
    np.testing.assert_allclose(out["models"], np.stack(models), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out["x"], out["models"][-1])
    assert np.isnan(out["gamma"]).sum() == 0 and (out["gamma"][out["versions"] == np.arange(T)] == 0).all()
    np.testing.assert_allclose(out["eta"], HP["lam"] / (out["gamma"] + HP["epsilon"]), rtol=1e-15)


def test_double_steps_double_times_without_comm():
    """With comm_time = 0 a job of 2 * nominal steps lasts exactly twice its table duration."""
    delays = DELAYS["default"]
    out, _, _ = run(5, 40, delays, 2, initial_steps=6)
    assert_same_as_schedule(out, all_active(5, 40, delays, 2), time_scale=2.0)


@pytest.mark.parametrize("n,T,seed", [(4, 50, 0), (6, 60, 1), (5, 60, 7)])
def test_suspensions_reproduce_all_active(n, T, seed):
    delays = DelayModel(suspension_prob=0.3, suspension_mean=2.0)
    out, data, x0 = run(n, T, delays, seed)
    schedule = all_active(n, T, delays, seed)
    assert_same_as_schedule(out, schedule)
    # Some job started on a return from suspension (not at an arrival time).
    assert not np.isin(out["job_times"][n:], out["arrival_times"]).all()
    np.testing.assert_allclose(out["models"], np.stack(fixed_rule_replay(schedule, data, x0, 3)), atol=1e-12)


@pytest.mark.parametrize("suspend", [False, True])
@pytest.mark.parametrize("n,T,seed", [(5, 50, 0), (6, 60, 4)])
def test_dropouts_reproduce_all_active(suspend, n, T, seed):
    extra = dict(suspension_prob=0.3, suspension_mean=2.0) if suspend else {}
    middle = float(all_active(n, T, DelayModel(**extra), seed).arrival_times[T // 2, 0])
    delays = DelayModel(dropout_fraction=0.4, dropout_time=middle + 1e-3, **extra)
    out, data, x0 = run(n, T, delays, seed)
    schedule = all_active(n, T, delays, seed)
    assert_same_as_schedule(out, schedule)
    gone = dropped_clients(n, delays, seed)
    assert gone.size == 2
    late = out["arrival_times"] > delays.dropout_time
    assert late.any() and not np.isin(out["clients"][late], gone).any()
    assert np.isin(out["clients"][~late], gone).any()
    # Jobs lost at the dropout: started, never arrived.
    lost = [j for j in replay_jobs(schedule) if j["arrival"] is None and j["version"] < T]
    assert any(j["client"] in gone.tolist() and j["start"] <= delays.dropout_time for j in lost)
    np.testing.assert_allclose(out["models"], np.stack(fixed_rule_replay(schedule, data, x0, 3)), atol=1e-12)


def test_arrival_exactly_at_dropout_time():
    """Constant durations 1, dropout at time 2 (a tie with the second wave of arrivals): the dropped clients 0 and 2
    still arrive at time 2 and then leave; the live clients 1 and 3 restart at once from the model after their own
    step (versions 6 and 8). (The package's all_active schedule differs here: there client 1's restart waits for
    dropped client 2's arrival at the same instant, version 7.)"""
    n, T = 4, 10
    delays = DelayModel(**{**DelayModel.constant(1.0).to_dict(), "dropout_fraction": 0.5, "dropout_time": 2.0})
    np.testing.assert_array_equal(dropped_clients(n, delays, 0), [0, 2])
    out, _, _ = run(n, T, delays, 0)
    np.testing.assert_array_equal(out["clients"], [0, 1, 2, 3, 0, 1, 2, 3, 1, 3])
    np.testing.assert_array_equal(out["versions"], [0, 0, 0, 0, 1, 2, 3, 4, 6, 8])
    np.testing.assert_array_equal(out["arrival_times"], [1.0] * 4 + [2.0] * 4 + [3.0] * 2)
    np.testing.assert_array_equal(out["job_clients"], [0, 1, 2, 3, 0, 1, 2, 3, 1, 3, 1])
    np.testing.assert_array_equal(out["job_versions"], [0, 0, 0, 0, 1, 2, 3, 4, 6, 8, 9])
    np.testing.assert_array_equal(out["job_times"], [0.0] * 4 + [1.0] * 4 + [2.0, 2.0, 3.0])


# ---------------------------------------------------------------------------------------------- server rule
@pytest.mark.parametrize("rounding,min_steps,k1", [("floor", 1, 2), ("trunc", 1, 3), ("floor", 3, 3)])
def test_hand_computed_two_clients(rounding, min_steps, k1):
    """Constant durations: both clients arrive at time 1 (client 0 first). Step 0 has gamma = 0, so
    eta_0 = lam / eps and K_0 = clip(3 + floor(4.5), ., 4) = 4 (upper clip). Step 1: gamma_1 = eta_0 |d_0| / |d_1|,
    and kappa, target are chosen so that kappa (target - gamma_1) = -0.5: floor gives K_1 = 2, trunc 3, and with
    min_steps = 3 the floor's 2 is clipped up to 3."""
    _, data, x0 = toy_problem(2, seed=1)
    lam, eps, lr = 1.0, 0.1, 0.3
    d0 = ref.local_delta(MODEL, x0, data[0], 3, lr)
    d1 = ref.local_delta(MODEL, x0, data[1], 3, lr)
    x1 = x0 + (lam / eps) * d0
    gamma1 = np.linalg.norm(x1 - x0) / np.linalg.norm(d1)
    assert math.isclose(gamma1, (lam / eps) * np.linalg.norm(d0) / np.linalg.norm(d1))
    target, kappa = 0.9 * gamma1, 5.0 / gamma1  # kappa * target = 4.5; kappa * (target - gamma1) = -0.5
    eta1 = lam / (gamma1 + eps)
    x2 = x1 + eta1 * d1
    out = asyncfeded_reference(MODEL, data, x0, 2, 2, DelayModel.constant(1.0), 0, nominal_steps=3, client_lr=lr,
                               lam=lam, epsilon=eps, target_staleness=target, kappa=kappa, initial_steps=3,
                               max_steps=4, min_steps=min_steps, rounding=rounding)
    np.testing.assert_array_equal(out["clients"], [0, 1])
    np.testing.assert_array_equal(out["versions"], [0, 0])
    np.testing.assert_array_equal(out["arrival_times"], [1.0, 1.0])
    np.testing.assert_allclose(out["gamma"], [0.0, gamma1], rtol=1e-13)
    np.testing.assert_allclose(out["eta"], [lam / eps, eta1], rtol=1e-13)
    np.testing.assert_array_equal(out["steps_used"], [3, 3])
    np.testing.assert_array_equal(out["K"], [[4, 3], [4, k1]])
    np.testing.assert_allclose(out["models"], [x0, x1, x2], rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(out["x"], out["models"][-1])
    # Jobs: the two initial ones, then client 0's from x_1 with its new K (client 1's follow-up, after the last
    # step, is not started).
    np.testing.assert_array_equal(out["job_clients"], [0, 1, 0])
    np.testing.assert_array_equal(out["job_versions"], [0, 0, 1])
    np.testing.assert_array_equal(out["job_times"], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(out["job_steps"], [3, 3, 4])
    np.testing.assert_array_equal(out["job_index"], [0, 0, 1])


def test_zero_delta_changes_nothing():
    _, data, x0 = toy_problem(2, seed=1)
    out = asyncfeded_reference(MODEL, data, x0, 2, 4, DelayModel.constant(1.0), 0, nominal_steps=3, client_lr=0.0,
                               lam=1.0, epsilon=1.0, target_staleness=3.0, kappa=1.0, initial_steps=3, max_steps=10)
    np.testing.assert_array_equal(out["models"], np.stack([x0] * 5))
    assert np.isnan(out["gamma"]).all() and (out["eta"] == 0).all()
    np.testing.assert_array_equal(out["K"], 3)
    np.testing.assert_array_equal(out["clients"], [0, 1, 0, 1])
    np.testing.assert_array_equal(out["versions"], [0, 0, 1, 2])


# ---------------------------------------------------------------------------------------------- adaptive K
@pytest.mark.parametrize("delays", [DelayModel(comm_time=0.3),
                                    DelayModel(speed="lognormal", speed_sigma=1.0, suspension_prob=0.2)])
def test_adaptive_K_stays_in_bounds_and_sets_durations(delays):
    n, T, lo, hi, nominal = 6, 150, 2, 7, 4
    _, data, x0 = toy_problem(n, seed=1)
    out = asyncfeded_reference(MODEL, data, x0, n, T, delays, 5, nominal_steps=nominal, client_lr=0.3, lam=1.0,
                               epsilon=1.0, target_staleness=2.0, kappa=1.0, initial_steps=4, max_steps=hi,
                               min_steps=lo)
    K = out["K"]
    assert K.min() >= lo and K.max() <= hi
    assert (K == lo).any() and (K == hi).any() and len(np.unique(K)) > 2  # the rule moves K
    assert (out["steps_used"] >= lo).all() and (out["steps_used"] <= hi).all()
    # The K update of the arriving client, step by step.
    before = np.vstack([np.full((1, n), 4), K[:-1]])
    raw = []
    for t in range(T):
        c, g = out["clients"][t], out["gamma"][t]
        assert out["steps_used"][t] == before[t, c]
        raw.append(before[t, c] + math.floor(2.0 - g))
        assert K[t, c] == min(max(raw[-1], lo), hi)
        others = np.arange(n) != c
        np.testing.assert_array_equal(K[t, others], before[t, others])
    assert min(raw) < lo and max(raw) > hi  # both clips bite
    # Without dropouts the m-th arrival of a client is its m-th job: its K, version and duration.
    table = job_durations_table(n, delays, 5)
    for c in range(n):
        arrived = np.flatnonzero(out["clients"] == c)
        mine = np.flatnonzero(out["job_clients"] == c)[: arrived.size]
        np.testing.assert_array_equal(out["job_index"][mine], np.arange(arrived.size))
        np.testing.assert_array_equal(out["job_steps"][mine], out["steps_used"][arrived])
        np.testing.assert_array_equal(out["job_versions"][mine], out["versions"][arrived])
        d = table.durations(c, np.arange(arrived.size))
        k = out["job_steps"][mine]
        expected = np.where(k == nominal, d, delays.comm_time + (k / nominal) * (d - delays.comm_time))
        np.testing.assert_allclose(out["arrival_times"][arrived] - out["job_times"][mine], expected, atol=1e-12)
    assert (out["job_steps"] != nominal).any()
    assert np.all(np.diff(out["arrival_times"]) >= 0) and np.all(np.diff(out["job_times"]) >= 0)
