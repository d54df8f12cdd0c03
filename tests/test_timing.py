"""Tests of asyncfl_jax.timing: delay models, arrival protocols, schedule statistics."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncfl_jax.timing import (
    DelayModel,
    Schedule,
    all_active,
    client_speeds,
    concurrency_profile,
    concurrent,
    counter_uniforms,
    job_durations_table,
    make_schedule,
    max_concurrency,
    participation_counts,
    schedule_summary,
    staleness_histogram,
    synchronous,
)
from asyncfl_jax.timing.policies import AllInFlight, Boundary, Count, Immediate, Rounds
from asyncfl_jax.timing.protocols import build_schedule
from asyncfl_jax.timing.schedule import _ARRAY_FIELDS
from support import replay_jobs

DELAY_MODELS = {
    "ca2fl": DelayModel(),
    "ca2fl_shift": DelayModel.ca2fl(scale_high=1.0, shift=5.0),
    "constant": DelayModel.constant(1.0),
    "zero": DelayModel(speed="constant", speed_value=0.0, noise="none"),
    "exp_exp": DelayModel(speed="exponential", speed_value=2.0, noise="exponential", noise_scale=0.5),
    "lognormal": DelayModel(speed="lognormal", speed_mean=0.5, speed_sigma=1.0, noise="lognormal", noise_sigma=0.3),
    "normal_add": DelayModel(speed="normal", speed_mean=1.0, speed_std=1.0, noise="uniform", noise_low=0.0,
                             noise_high=2.0, combine="add", comm_time=0.25),
    "uniform_halfnormal": DelayModel(speed="uniform", speed_low=1.0, speed_high=3.0, noise="half_normal",
                                     noise_scale=2.0),
}


def assert_same(a: Schedule, b: Schedule, check_info: bool = True) -> None:
    for f in _ARRAY_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        assert x.shape == y.shape, f
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f
    assert a.num_clients == b.num_clients
    assert a.num_slots == b.num_slots
    assert a.init_time == b.init_time
    if check_info:
        assert a.info == b.info


def check_concurrent(s: Schedule, n: int, T: int, Mc: int, M: int, refill: str) -> None:
    s.validate()
    assert s.num_steps == T and s.buffer_width == M and s.dispatch_width == M and s.num_clients == n
    assert (s.arrival_clients >= 0).all(), "every step has exactly M arrivals"
    assert (s.staleness >= 0).all()
    assert s.num_slots <= Mc + M
    # Initial jobs: Mc distinct clients at time 0.
    assert s.init_clients.shape == (Mc,) and len(set(s.init_clients.tolist())) == Mc
    # Dispatch row sizes.
    real = (s.dispatch_clients >= 0).sum(axis=1)
    if refill == "boundary":
        assert real[0] == 0 and (real[1:] == M).all()
        for t in range(T):
            assert len(set(s.arrival_clients[t].tolist())) == M, "a client appears twice in one step"
    else:
        assert real[0] == M - 1 and (real[1:] == M).all()
    assert np.isnan(s.dispatch_times[s.dispatch_clients < 0]).all()
    assert not np.isnan(s.dispatch_times[s.dispatch_clients >= 0]).any()
    # Times: steps non-decreasing, arrivals in time order and inside their step's interval.
    assert (np.diff(s.step_times) >= 0).all()
    flat = s.arrival_times.ravel()
    assert (np.diff(flat) >= 0).all()
    assert np.array_equal(s.step_times, s.arrival_times[:, -1])
    prev = np.concatenate([[s.init_time], s.step_times[:-1]])
    assert (s.arrival_times >= prev[:, None]).all() and (s.arrival_times <= s.step_times[:, None]).all()
    # Dispatches happen inside their step (between the previous step time and the step time).
    d = s.dispatch_clients >= 0
    rows = np.nonzero(d)[0]
    assert (s.dispatch_times[d] >= prev[rows]).all() and (s.dispatch_times[d] <= s.step_times[rows]).all()
    if refill == "boundary":
        assert np.array_equal(s.dispatch_times[1:][d[1:]], np.repeat(s.step_times[:-1], M))
    # Every arrival preceded by its dispatch; a client never has two jobs in flight.
    jobs = replay_jobs(s)
    last: dict[int, dict] = {}
    for job in jobs:
        if job["arrival"] is not None:
            assert job["start"] <= job["arrival"] and job["version"] <= job["step"]
        c = job["client"]
        if c in last:
            p = last[c]
            assert p["arrival"] is not None, f"client {c} dispatched while in flight"
            assert p["arrival"] <= job["start"]
            if refill == "boundary":
                assert p["step"] < job["version"], "boundary refill: re-dispatched before its arrival step ended"
            else:
                assert p["step"] <= job["version"]
        last[c] = job
    # Jobs in flight never above Mc (replay by time).
    assert max_concurrency(s) <= Mc
    assert (concurrency_profile(s) <= Mc).all()


# ---------------------------------------------------------------------- delay models
def test_delay_model_dict_round_trip_and_json():
    for model in DELAY_MODELS.values():
        d = model.to_dict()
        assert DelayModel.from_dict(json.loads(json.dumps(d))) == model
    assert DelayModel.from_dict({"speed": "constant", "speed_value": 2}) == DelayModel(speed="constant", speed_value=2.0)
    assert isinstance(DelayModel(speed_high=4).speed_high, float)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"speed": "fast"}, r"delays\.speed must be one of .*'fast'"),
        ({"noise": "gauss"}, r"delays\.noise must be one of .*'gauss'"),
        ({"combine": "mul"}, r"delays\.combine must be one of"),
        ({"speed_low": 1.0, "speed_high": 0.0}, r"delays\.speed_high must be > speed_low, got 0\.0 <= 1\.0"),
        ({"speed_low": -1.0}, r"delays\.speed_low must be >= 0"),
        ({"speed": "exponential", "speed_value": 0.0}, r"delays\.speed_value must be > 0"),
        ({"speed": "constant", "speed_value": -1.0}, r"delays\.speed_value must be >= 0"),
        ({"speed": "lognormal", "speed_sigma": -0.1}, r"delays\.speed_sigma"),
        ({"speed": "normal", "speed_std": -1.0}, r"delays\.speed_std"),
        ({"speed": "normal", "speed_min": -1.0}, r"delays\.speed_min"),
        ({"noise_scale": -1.0}, r"delays\.noise_scale must be > 0"),
        ({"noise": "lognormal", "noise_sigma": -1.0}, r"delays\.noise_sigma"),
        ({"noise": "uniform", "noise_low": 2.0, "noise_high": 1.0}, r"delays\.noise_high must be > noise_low"),
        ({"noise": "uniform", "noise_low": -1.0}, r"delays\.noise_low must be >= 0"),
        ({"comm_time": -0.5}, r"delays\.comm_time must be >= 0"),
        ({"comm_time": float("inf")}, r"delays\.comm_time must be finite"),
        ({"speed_high": "5"}, r"delays\.speed_high must be a real number"),
    ],
)
def test_delay_model_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DelayModel(**kwargs)


def test_delay_model_from_dict_rejects_unknown_key():
    with pytest.raises(ValueError, match=r"unknown key 'speed_hi'.*valid keys.*speed_high"):
        DelayModel.from_dict({"speed": "uniform", "speed_hi": 3})


def test_sample_speeds_distributions():
    rng = np.random.default_rng(0)
    n = 200_000
    s = DelayModel().sample_speeds(rng, n)
    assert s.dtype == np.float64 and s.shape == (n,)
    assert 0 <= s.min() and s.max() < 5 and abs(s.mean() - 2.5) < 0.02
    s = DelayModel(speed="constant", speed_value=3.0).sample_speeds(rng, 5)
    assert (s == 3.0).all()
    s = DelayModel(speed="lognormal", speed_mean=0.2, speed_sigma=0.5).sample_speeds(rng, n)
    assert abs(np.log(s).mean() - 0.2) < 0.01 and abs(np.log(s).std() - 0.5) < 0.01
    s = DelayModel(speed="exponential", speed_value=2.0).sample_speeds(rng, n)
    assert abs(s.mean() - 2.0) < 0.03
    s = DelayModel(speed="normal", speed_mean=0.5, speed_std=1.0, speed_min=0.01).sample_speeds(rng, n)
    assert s.min() == 0.01 and abs((s == 0.01).mean() - 0.3085) < 0.01


@pytest.mark.parametrize("name", sorted(DELAY_MODELS))
def test_sample_durations_nonnegative_with_expected_mean(name):
    model = DELAY_MODELS[name]
    rng = np.random.default_rng(1)
    speeds = np.full(200_000, 1.5)
    d = model.sample_durations(rng, speeds)
    assert d.shape == speeds.shape and (d >= 0).all()
    expected = float(model.mean_duration(np.array(1.5)))
    assert abs(d.mean() - expected) <= 0.02 * max(expected, 1e-9) + 1e-12


def test_half_normal_noise_matches_ca2fl():
    # CA2FL: duration ~ HalfNormal(scale s_i) = |N(0, s_i^2)|: mean s*sqrt(2/pi), E[d^2] = s^2.
    d = DelayModel().sample_durations(np.random.default_rng(2), np.full(400_000, 3.0))
    assert abs(d.mean() - 3.0 * math.sqrt(2 / math.pi)) < 0.01
    assert abs((d**2).mean() - 9.0) < 0.06


def test_counter_uniforms_are_uniform_and_independent():
    clients = np.repeat(np.arange(100), 2000)
    jobs = np.tile(np.arange(2000), 100)
    u1, u2 = counter_uniforms(12345, clients, jobs)
    for u in (u1, u2):
        assert u.min() >= 0 and u.max() < 1
        counts = np.bincount((u * 20).astype(int), minlength=20)
        chi2 = ((counts - u.size / 20) ** 2 / (u.size / 20)).sum()
        assert chi2 < 60  # 19 dof
    assert abs(np.corrcoef(u1, u2)[0, 1]) < 0.01
    assert abs(np.corrcoef(u1[:-1], u1[1:])[0, 1]) < 0.01
    v1, _ = counter_uniforms(12346, clients, jobs)
    assert abs(np.corrcoef(u1, v1)[0, 1]) < 0.01
    # Pure function of (key, client, job): any batching gives the same values.
    w1, w2 = counter_uniforms(12345, clients[::7], jobs[::7])
    assert np.array_equal(w1, u1[::7]) and np.array_equal(w2, u2[::7])


def test_job_durations_independent_of_batching():
    table = job_durations_table(50, DelayModel(noise="lognormal"), seed=3)
    full = table.block(np.arange(50), 0, 40)
    assert np.array_equal(full[7, 16:32], table.block(np.array([7]), 16, 16)[0])
    assert table.durations(7, 20) == full[7, 20]
    assert np.array_equal(table.durations(np.arange(50), 5), full[:, 5])


# ---------------------------------------------------------------------- concurrent protocol: properties
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 12),
    data=st.data(),
    refill=st.sampled_from(["immediate", "boundary"]),
    model=st.sampled_from(sorted(DELAY_MODELS)),
    seed=st.integers(0, 2**32 - 1),
    T=st.integers(1, 40),
)
def test_concurrent_properties(n, data, refill, model, seed, T):
    Mc = data.draw(st.integers(1, n), label="Mc")
    M = data.draw(st.integers(1, Mc), label="M")
    s = concurrent(n, T, DELAY_MODELS[model], seed, concurrency=Mc, buffer_size=M, refill=refill)
    check_concurrent(s, n, T, Mc, M, refill)
    assert s.info["protocol"] == "concurrent" and s.info["seed"] == seed
    assert s.info["delays"] == DELAY_MODELS[model].to_dict()
    assert (s.info["concurrency"], s.info["buffer_size"], s.info["refill"]) == (Mc, M, refill)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 10),
    model=st.sampled_from(sorted(DELAY_MODELS)),
    seed=st.integers(0, 2**32 - 1),
    T=st.integers(1, 60),
    extra=st.integers(1, 30),
)
def test_schedules_are_prefix_consistent(n, model, seed, T, extra):
    """A schedule for T steps equals the first T steps of the one for T + extra steps."""
    delays = DELAY_MODELS[model]
    for build in (
        lambda steps: concurrent(n, steps, delays, seed, concurrency=max(1, n - 1), buffer_size=1, refill="immediate"),
        lambda steps: concurrent(n, steps, delays, seed, concurrency=n, buffer_size=max(1, n // 2), refill="boundary"),
        lambda steps: all_active(n, steps, delays, seed),
        lambda steps: synchronous(n, steps, delays, seed, participants=max(1, n // 2)),
    ):
        short, long = build(T), build(T + extra).truncate(T)
        short = dataclasses.replace(short, num_slots=long.num_slots, info=long.info)
        assert_same(short, long)


@pytest.mark.parametrize("model", ["ca2fl", "lognormal", "exp_exp"])
def test_boundary_mean_staleness_identity(model):
    """CA2FL (boundary refill): mean staleness -> (Mc - M) / M whatever the delay distribution."""
    s = concurrent(100, 2000, DELAY_MODELS[model], seed=5, concurrency=20, buffer_size=10, refill="boundary")
    summary = schedule_summary(s)
    assert abs(summary["staleness_mean"] - 1.0) < 0.1
    # Right after each refill exactly Mc clients are in flight.
    assert (concurrency_profile(s)[:-1] == 20).all()
    s = concurrent(100, 1000, DELAY_MODELS[model], seed=6, concurrency=20, buffer_size=5, refill="boundary")
    assert abs(schedule_summary(s)["staleness_mean"] - 3.0) < 0.15


@pytest.mark.parametrize("model", ["ca2fl", "lognormal"])
def test_immediate_mean_staleness_identity(model):
    """Immediate refill keeps Mc in flight: Mc - 1 jobs cross each boundary, so mean staleness -> (Mc - 1) / M."""
    s = concurrent(100, 2000, DELAY_MODELS[model], seed=7, concurrency=20, buffer_size=10, refill="immediate")
    assert abs(schedule_summary(s)["staleness_mean"] - 1.9) < 0.1
    assert (concurrency_profile(s)[:-1] == 20).all()  # the last refill would belong to step T


def test_boundary_and_immediate_agree_for_buffer_one():
    for model in ("ca2fl", "zero"):
        a = concurrent(30, 300, DELAY_MODELS[model], 11, concurrency=10, buffer_size=1, refill="immediate")
        b = concurrent(30, 300, DELAY_MODELS[model], 11, concurrency=10, buffer_size=1, refill="boundary")
        assert_same(a, b, check_info=False)


def test_zero_durations_ties_are_deterministic():
    # All jobs take 0: everything happens at time 0, ties by client id.
    s = all_active(4, 10, DELAY_MODELS["zero"], 0)
    s.validate()
    assert (s.step_times == 0).all() and (s.arrival_clients[:, 0] == 0).all()
    s = concurrent(6, 5, DelayModel.constant(2.0), 0, concurrency=6, buffer_size=3, refill="boundary")
    check_concurrent(s, 6, 5, 6, 3, "boundary")
    assert s.arrival_clients[0].tolist() == [0, 1, 2] and s.arrival_clients[1].tolist() == [3, 4, 5]
    assert s.step_times.tolist() == [2.0, 2.0, 4.0, 4.0, 6.0]


# ---------------------------------------------------------------------- all-active / fast paths
def _all_active_options(n: int, refill: str) -> dict:
    return {"concurrency": n, "buffer_size": 1, "refill": refill}


@pytest.mark.parametrize("model", sorted(DELAY_MODELS))
@pytest.mark.parametrize("n, T", [(1, 50), (2, 1000), (7, 300), (40, 2000), (300, 500)])
def test_fast_path_equals_event_loop(model, n, T):
    delays = DELAY_MODELS[model]
    for seed in (0, 9):
        fast = build_schedule("concurrent", n, T, delays, seed, Immediate(n), Count(1),
                              _all_active_options(n, "immediate"))
        slow = build_schedule("concurrent", n, T, delays, seed, Immediate(n), Count(1),
                              _all_active_options(n, "immediate"), fast=False)
        slow_b = build_schedule("concurrent", n, T, delays, seed, Boundary(n), Count(1),
                                _all_active_options(n, "boundary"), fast=False)
        fast.validate()
        assert_same(fast, slow)
        assert_same(fast, slow_b, check_info=False)
    check_concurrent(fast, n, T, n, 1, "immediate")


@pytest.mark.parametrize("model", sorted(DELAY_MODELS))
@pytest.mark.parametrize("n, T, m", [(1, 20, None), (5, 40, 2), (5, 40, 5), (30, 60, None), (30, 60, 7)])
def test_synchronous_fast_path_equals_event_loop(model, n, T, m):
    delays = DELAY_MODELS[model]
    for seed in (0, 9):
        fast = synchronous(n, T, delays, seed, participants=m)
        slow = build_schedule("synchronous", n, T, delays, seed, Rounds(m), AllInFlight(),
                              {"participants": n if m is None else m}, fast=False)
        fast.validate()
        assert_same(fast, slow)


def test_all_active_is_concurrent_with_all_clients():
    a = all_active(25, 400, DelayModel(), 4)
    b = concurrent(25, 400, DelayModel(), 4, concurrency=25, buffer_size=1)
    assert_same(a, b, check_info=False)
    assert a.info["protocol"] == "all_active" and a.num_slots == 25
    assert np.array_equal(a.arrival_slots, a.arrival_clients)
    assert abs(schedule_summary(all_active(20, 5000, DelayModel(), 1))["staleness_mean"] - 19) < 1.0


def test_participation_consistent_with_speed():
    """Renewal theory: client i reports about total_time / E[duration_i] times; faster clients report more."""
    delays = DelayModel(speed="uniform", speed_low=1.0, speed_high=5.0, noise="exponential", noise_scale=1.0)
    n, T, seed = 20, 20_000, 3
    s = all_active(n, T, delays, seed)
    counts = participation_counts(s)
    speeds = client_speeds(n, delays, seed)
    total = s.step_times[-1] - s.init_time
    expected = total / delays.mean_duration(speeds)
    # Exponential durations: Var N(t) ~ t / mu, so the count is within a few sqrt(expected) of expected.
    assert (np.abs(counts - expected) <= 4 * np.sqrt(expected) + 2).all(), (counts, expected)
    rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731
    spearman = np.corrcoef(rank(counts), rank(-speeds))[0, 1]
    assert spearman > 0.9


def test_durations_match_job_table():
    """Each job's length (arrival - start) is the k-th duration of its client's stream."""
    delays = DELAY_MODELS["lognormal"]
    table = job_durations_table(15, delays, 21)
    for s in (concurrent(15, 200, delays, 21, concurrency=6, buffer_size=2, refill="boundary"),
              concurrent(15, 200, delays, 21, concurrency=6, buffer_size=3, refill="immediate"),
              all_active(15, 200, delays, 21)):
        seen: dict[int, int] = {}
        for job in replay_jobs(s):
            k = seen.get(job["client"], 0)
            seen[job["client"]] = k + 1
            if job["arrival"] is not None:
                assert job["arrival"] == job["start"] + table.durations(job["client"], k)


# ---------------------------------------------------------------------- determinism, save/load
def test_same_seed_same_schedule_different_seed_differs():
    for build in (
        lambda seed: concurrent(50, 100, DelayModel(), seed, concurrency=10, buffer_size=5, refill="boundary"),
        lambda seed: concurrent(50, 100, DelayModel(), seed, concurrency=10, buffer_size=5, refill="immediate"),
        lambda seed: all_active(50, 300, DelayModel(), seed),
        lambda seed: synchronous(50, 20, DelayModel(), seed, participants=10),
    ):
        assert_same(build(123), build(123))
        a, b = build(123), build(124)
        assert not np.array_equal(a.arrival_times, b.arrival_times)
        assert a.info["seed"] == 123 and b.info["seed"] == 124


def test_timing_does_not_touch_global_rng():
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    concurrent(20, 50, DelayModel(), 1, concurrency=5, buffer_size=2, refill="boundary")
    synchronous(20, 5, DelayModel(), 1, participants=4)
    assert np.array_equal(np.random.get_state()[1], before)


def test_save_load_round_trip_and_tampered_file(tmp_path):
    s = concurrent(30, 80, DelayModel(), 2, concurrency=8, buffer_size=4, refill="immediate")
    path = tmp_path / "sched.npz"
    s.save(path)
    loaded = Schedule.load(path)
    assert_same(s, loaded)
    json.dumps(loaded.info)
    # Tamper: a version larger than its step.
    with np.load(path) as z:
        entries = {k: np.array(z[k]) for k in z.files}
    entries["arrival_versions"][5, 1] = 6
    bad = tmp_path / "bad.npz"
    np.savez(bad, **entries)
    with pytest.raises(ValueError, match=r"arrival\[5, 1\]"):
        Schedule.load(bad)
    # Tamper: an arrival reading a slot its client never wrote.
    entries["arrival_versions"] = np.array(s.arrival_versions)
    entries["arrival_slots"][10, 0] = (entries["arrival_slots"][10, 0] + 1) % s.num_slots
    np.savez(bad, **entries)
    with pytest.raises(ValueError, match=r"arrival\[10, 0\]"):
        Schedule.load(bad)


# ---------------------------------------------------------------------- synchronous
def test_synchronous_full_participation():
    delays = DELAY_MODELS["uniform_halfnormal"]
    n, T = 8, 30
    s = synchronous(n, T, delays, 4)
    s.validate()
    assert s.init_clients.shape == (0,) and s.num_slots == n
    assert (s.staleness == 0).all()
    assert (s.arrival_clients == np.arange(n)).all() and np.array_equal(s.dispatch_clients, s.arrival_clients)
    assert np.array_equal(s.dispatch_slots, s.arrival_slots) and (s.arrival_slots == np.arange(n)).all()
    table = job_durations_table(n, delays, 4)
    start = np.concatenate([[0.0], s.step_times[:-1]])
    for t in range(T):
        d = table.durations(np.arange(n), t)
        assert np.array_equal(s.arrival_times[t], start[t] + d)
        assert s.step_times[t] == start[t] + d.max()
        assert (s.dispatch_times[t] == start[t]).all()
    summary = schedule_summary(s)
    assert summary["participation"] == [T] * n and summary["max_concurrency"] == n


def test_synchronous_partial_participation():
    s = synchronous(10, 200, DelayModel(), 5, participants=3)
    s.validate()
    assert s.buffer_width == 3 and s.dispatch_width == 3 and s.num_slots == 3
    assert (s.staleness == 0).all()
    for t in range(s.num_steps):
        row = s.arrival_clients[t].tolist()
        assert len(set(row)) == 3 and row == sorted(row)
    assert np.array_equal(s.step_times, s.arrival_times.max(axis=1))
    counts = participation_counts(s)
    assert counts.sum() == 600 and counts.min() > 30  # uniform sampling: about 60 each
    assert max_concurrency(s) == 3


# ---------------------------------------------------------------------- make_schedule, bad arguments
def test_make_schedule_dispatch():
    d = DelayModel()
    assert_same(make_schedule("concurrent", 20, 30, d, 1, concurrency=5, buffer_size=2, refill="boundary"),
                concurrent(20, 30, d, 1, concurrency=5, buffer_size=2, refill="boundary"))
    assert_same(make_schedule("all_active", 20, 30, d.to_dict(), 1), all_active(20, 30, d, 1))
    assert_same(make_schedule("synchronous", 20, 3, d, 1, participants=4), synchronous(20, 3, d, 1, 4))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: concurrent(0, 10, DelayModel(), 0, 1, 1), "num_clients"),
        (lambda: concurrent(10, 0, DelayModel(), 0, 1, 1), "num_steps"),
        (lambda: concurrent(10, 10, DelayModel(), -1, 1, 1), "seed"),
        (lambda: concurrent(10, 10, DelayModel(), 1.5, 1, 1), "seed"),
        (lambda: concurrent(10, 10, DelayModel(), 0, 11, 1), r"concurrency must be in \[1, num_clients=10\], got 11"),
        (lambda: concurrent(10, 10, DelayModel(), 0, 0, 1), "concurrency"),
        (lambda: concurrent(10, 10, DelayModel(), 0, 4, 5), r"buffer_size must be in \[1, concurrency=4\], got 5"),
        (lambda: concurrent(10, 10, DelayModel(), 0, 4, 0), "buffer_size"),
        (lambda: concurrent(10, 10, DelayModel(), 0, 4, 2, refill="lazy"), r"refill must be one of .*'lazy'"),
        (lambda: concurrent(10, 10, {"speed": "fast"}, 0, 4, 2), r"delays\.speed"),
        (lambda: synchronous(10, 10, DelayModel(), 0, participants=11), "participants"),
        (lambda: synchronous(10, 10, DelayModel(), 0, participants=0), "participants"),
        (lambda: make_schedule("fedbuff", 10, 10, DelayModel(), 0), r"protocol must be one of"),
        (lambda: make_schedule("concurrent", 10, 10, DelayModel(), 0, concurrency=3), r"requires option 'buffer_size'"),
        (lambda: make_schedule("all_active", 10, 10, DelayModel(), 0, concurrency=3), r"unknown option 'concurrency'"),
        (lambda: make_schedule("synchronous", 10, 10, DelayModel(), 0, buffer=3), r"unknown option 'buffer'"),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------- stats
def test_summary_is_json_and_consistent():
    s = concurrent(40, 300, DelayModel(), 8, concurrency=12, buffer_size=4, refill="boundary")
    summary = schedule_summary(s)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["num_steps"] == 300 and summary["num_uploads"] == 1200
    hist = staleness_histogram(s)
    assert summary["staleness_histogram"] == hist.tolist() and hist.sum() == 1200
    assert len(hist) == summary["staleness_max"] + 1
    st_values = s.staleness.ravel()
    assert summary["staleness_mean"] == pytest.approx(st_values.mean())
    assert summary["staleness_std"] == pytest.approx(st_values.std())
    part = summary["participation"]
    assert len(part) == 40 and sum(part) == 1200
    assert summary["participation_min"] == min(part) and summary["participation_max"] == max(part)
    assert summary["total_time"] == pytest.approx(s.step_times[-1])
    assert summary["mean_time_per_step"] == pytest.approx(s.step_times[-1] / 300)
    assert summary["max_concurrency"] == 12 and summary["num_slots"] <= 16
    assert summary["protocol"] == "concurrent"


def test_concurrency_profile_counts_jobs_in_flight():
    s = synchronous(5, 4, DelayModel.constant(1.0), 0)
    # At each step time the round's jobs have arrived and the next round's 5 jobs start (none after the last).
    assert concurrency_profile(s).tolist() == [5, 5, 5, 0]
    assert concurrency_profile(s, np.array([0.5, 1.5, 3.99])).tolist() == [5, 5, 5]


# ---------------------------------------------------------------------- scale (not timed; times are printed)
@pytest.mark.slow
def test_scale_all_active_and_concurrent(capsys):
    t0 = time.perf_counter()
    s = all_active(100_000, 1_000_000, DelayModel(), 0)
    t1 = time.perf_counter()
    assert s.num_steps == 1_000_000 and (s.staleness >= 0).all()
    assert np.all(np.diff(s.step_times) >= 0)
    c = concurrent(100_000, 10_000, DelayModel(), 0, concurrency=1000, buffer_size=100, refill="immediate")
    t2 = time.perf_counter()
    assert c.uploads_per_step.sum() == 1_000_000 and c.num_slots <= 1100
    with capsys.disabled():
        print(f"\n[timing scale] all_active n=100k T=1M: {t1 - t0:.2f}s; "
              f"concurrent n=100k Mc=1000 M=100 T=10k (1M arrivals): {t2 - t1:.2f}s")


def test_an_infinite_time_window_is_synchronous_rounds():
    """AsynFL's time-window server with W = inf waits for everyone: synchronous rounds (of Mc clients)."""
    delays = DelayModel()
    window = all_active(6, 5, delays, 1, aggregation="periodic", period=math.inf)
    rounds = synchronous(6, 5, delays, 1)
    for field in ("arrival_clients", "arrival_versions", "dispatch_clients", "step_times", "arrival_times"):
        np.testing.assert_array_equal(getattr(window, field), getattr(rounds, field))
    assert window.info["period"] == "inf" and window.info["protocol"] == "synchronous"
    part = concurrent(6, 5, delays, 1, concurrency=3, aggregation="periodic", period=math.inf)
    np.testing.assert_array_equal(part.arrival_clients, synchronous(6, 5, delays, 1, participants=3).arrival_clients)
    with pytest.raises(ValueError, match="period must be a finite number > 0"):
        all_active(6, 5, delays, 1, aggregation="periodic", period=-math.inf)


@pytest.mark.parametrize("field,index,value,match", [
    ("arrival_times", (7, 0), -1.0, r"arrival\[7, 0\]: client \d+ arrives at time -1.0, before its job started"),
    ("arrival_times", (7, 0), 1e9, r"arrival\[7, 0\]: client \d+ arrives at time 1000000000.0, after step 7 was applied"),
    ("arrival_times", (7, 0), np.nan, r"arrival\[7, 0\]"),
    ("dispatch_times", (4, 0), -3.0, r"dispatch\[4, 0\]: client \d+ starts at time -3.0, before the schedule's start"),
    ("arrival_clients", (3, 0), 99, r"arrival_clients\[3, 0\] = 99 is not a client id in \[0, 10\)"),
    ("step_times", (6,), -5.0, r"step_times must be non-decreasing: step 6"),
])
def test_a_malformed_schedule_file_names_the_entry_at_fault(tmp_path, field, index, value, match):
    s = all_active(10, 20, DelayModel(), 0)
    path = tmp_path / "s.npz"
    s.save(path)
    with np.load(path) as z:
        entries = {k: np.array(z[k]) for k in z.files}
    entries[field][index] = value
    np.savez(path, **entries)
    with pytest.raises(ValueError, match=match):
        Schedule.load(path)
