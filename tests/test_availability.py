"""Client dropouts, suspensions and the server clock (asyncfl_jax.timing), and their configuration options."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.timing import (
    DelayModel,
    Schedule,
    all_active,
    concurrency_profile,
    concurrent,
    dropped_clients,
    job_durations_table,
    make_schedule,
    num_suspensions,
    schedule_summary,
    suspension_table,
    synchronous,
)
from asyncfl_jax.timing.policies import AllInFlight, Count, Immediate, Rounds
from asyncfl_jax.timing.protocols import build_schedule
from asyncfl_jax.timing.schedule import _ARRAY_FIELDS
from reference_timing import concurrent_reference
from support import replay_jobs

CA2FL = DelayModel()
# Durations made of products and sums of uniforms only (no log/cos): bit-identical on every platform.
ARITH = DelayModel(speed="uniform", speed_low=0.5, speed_high=4.0, noise="uniform", noise_low=0.5, noise_high=1.5)
POSITIVE_MODELS = {
    "ca2fl_shift": DelayModel.ca2fl(scale_high=1.0, shift=0.5),
    "constant": DelayModel.constant(1.0),
    "exp_exp": DelayModel(speed="exponential", speed_value=2.0, noise="exponential", noise_scale=0.5),
    "arith": ARITH,
}


def with_availability(model: DelayModel, **fields) -> DelayModel:
    return DelayModel.from_dict({**model.to_dict(), **fields})


def assert_same(a: Schedule, b: Schedule, check_info: bool = True) -> None:
    for f in _ARRAY_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f
    assert (a.num_clients, a.num_slots, a.init_time) == (b.num_clients, b.num_slots, b.init_time)
    if check_info:
        assert a.info == b.info


def digest(s: Schedule) -> str:
    h = hashlib.sha256()
    for f in _ARRAY_FIELDS:
        a = np.ascontiguousarray(getattr(s, f))
        h.update(f.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    h.update(str(s.num_slots).encode())
    return h.hexdigest()[:16]


def check_schedule(s: Schedule, delays: DelayModel, n: int, seed: int, clock: bool, all_active_: bool) -> None:
    """Invariants of every schedule built with dropouts, suspensions and/or a clock."""
    s.validate()
    T = s.num_steps
    assert s.num_clients == n and s.step_times.shape == (T,)
    assert (np.diff(s.step_times) >= 0).all()
    prev = np.concatenate([[s.init_time], s.step_times[:-1]])
    mask = s.arrival_mask
    # Padding is -1 / nan; real entries are finite.
    assert np.isnan(s.arrival_times[~mask]).all() and np.isfinite(s.arrival_times[mask]).all()
    assert (s.arrival_slots[~mask] == -1).all() and (s.arrival_versions[~mask] == -1).all()
    dmask = s.dispatch_clients >= 0
    assert np.isnan(s.dispatch_times[~dmask]).all() and np.isfinite(s.dispatch_times[dmask]).all()
    # Each row's real entries come first.
    assert (np.diff(mask.astype(int), axis=1) <= 0).all() and (np.diff(dmask.astype(int), axis=1) <= 0).all()
    rows = np.nonzero(mask)[0]
    if clock:  # every arrival lies in (step_times[t-1], step_times[t]]
        assert (s.arrival_times[mask] > prev[rows]).all() or T == 0
    else:
        assert (s.arrival_times[mask] >= prev[rows]).all()
    assert (s.arrival_times[mask] <= s.step_times[rows]).all()
    assert (np.diff(s.arrival_times[mask]) >= 0).all(), "arrivals in time order"
    assert (s.staleness[mask] >= 0).all() and (s.staleness[~mask] == -1).all()
    # A job dispatched in row t starts between step t-1's and step t's times.
    drows = np.nonzero(dmask)[0]
    assert (s.dispatch_times[dmask] >= prev[drows]).all() and (s.dispatch_times[dmask] <= s.step_times[drows]).all()
    # Durations, dropouts, suspensions, one job per client.
    table = job_durations_table(n, delays, seed)
    susp = suspension_table(n, delays, seed)
    dropped = set(s.info.get("dropped_clients", []))
    drop_time = s.info.get("dropout_time", math.inf)
    assert len(dropped) == (delays.num_dropped(n) if delays.has_dropouts(n) else 0)
    jobs = replay_jobs(s)
    by_client: dict[int, list[dict]] = {}
    for job in jobs:
        by_client.setdefault(job["client"], []).append(job)
    for c, cj in by_client.items():
        uploads = 0
        for k, job in enumerate(cj):
            d = float(table.durations(c, k))
            if c in dropped:
                assert job["start"] <= drop_time, "a dropped client was dispatched after the dropout"
                if job["arrival"] is not None:
                    assert job["arrival"] <= drop_time
            if job["arrival"] is not None:
                assert job["arrival"] == job["start"] + d
                assert job["version"] <= job["step"]
            elif k + 1 < len(cj):  # not applied but followed by another job: it was discarded at the dropout
                assert c in dropped and job["start"] + d > drop_time
            if k + 1 < len(cj):
                nxt = cj[k + 1]
                assert job["arrival"] is not None or c in dropped
                if job["arrival"] is not None:
                    assert nxt["start"] >= job["arrival"], f"client {c} dispatched while in flight"
                    length = float(susp.lengths(c, uploads))
                    if not math.isnan(length):
                        assert nxt["start"] >= job["arrival"] + length, f"client {c} dispatched while suspended"
                        if all_active_:
                            assert nxt["start"] == job["arrival"] + length
                    elif all_active_:
                        assert nxt["start"] == job["arrival"], "all_active: re-dispatched at once"
            if job["arrival"] is not None:
                uploads += 1


# ---------------------------------------------------------------------- off by default: identical schedules
GOLDEN = {  # computed with the code before dropouts, suspensions and clocks existed
    "concurrent_boundary": "95548063676a6ccb",
    "concurrent_immediate": "0e6d0ed7c08fcf78",
    "all_active": "2f7f0e0e833221b3",
    "synchronous": "86c775cdefc50197",
}


def _golden_builds(delays: DelayModel, **clock):
    return {
        "concurrent_boundary": concurrent(40, 120, delays, 7, concurrency=12, buffer_size=4, refill="boundary",
                                          **clock),
        "concurrent_immediate": concurrent(40, 120, delays, 7, concurrency=12, buffer_size=4, refill="immediate",
                                           **clock),
        "all_active": all_active(40, 500, delays, 7, **clock),
        "synchronous": synchronous(40, 30, delays, 7, participants=9),
    }


def test_off_by_default_schedules_are_unchanged():
    explicit = DelayModel.from_dict({**ARITH.to_dict(), "dropout_fraction": 0.0, "dropout_time": math.inf,
                                     "suspension_prob": 0.0, "suspension_mean": 1.0})
    assert explicit == ARITH and explicit.to_dict() == ARITH.to_dict()
    default = _golden_builds(ARITH)
    assert {k: digest(s) for k, s in default.items()} == GOLDEN
    for other in (_golden_builds(explicit), _golden_builds(ARITH, aggregation="count")):
        for k in GOLDEN:
            assert_same(default[k], other[k])
    # A dropout that never happens, or a fraction that rounds to no client, changes nothing but info["delays"].
    for model in (with_availability(ARITH, dropout_fraction=0.5), with_availability(ARITH, dropout_fraction=0.02,
                                                                                       dropout_time=3.0)):
        for k, s in _golden_builds(model).items():
            assert_same(default[k], s, check_info=False)
            assert "dropped_clients" not in s.info
    # Suspensions that never happen, and only a different mean: the same arrays.
    for k, s in _golden_builds(with_availability(ARITH, suspension_mean=7.0)).items():
        assert_same(default[k], s, check_info=False)


def test_to_dict_omits_availability_defaults():
    d = CA2FL.to_dict()
    assert not {"dropout_fraction", "dropout_time", "suspension_prob", "suspension_mean"} & set(d)
    model = DelayModel(dropout_fraction=0.25, dropout_time=4, suspension_prob=0.5, suspension_mean=2)
    d = model.to_dict()
    assert d["dropout_fraction"] == 0.25 and d["dropout_time"] == 4.0 and d["suspension_prob"] == 0.5
    assert DelayModel.from_dict(json.loads(json.dumps(d))) == model
    assert "dropout_time" not in DelayModel(dropout_fraction=0.1).to_dict()  # inf is never written


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 12), data=st.data(), refill=st.sampled_from(["immediate", "boundary"]),
       model=st.sampled_from(["ca2fl", "zero", "constant", "arith"]), seed=st.integers(0, 2**32 - 1),
       T=st.integers(1, 40))
def test_event_loop_equals_plain_reference_when_features_are_off(n, data, refill, model, seed, T):
    delays = {"ca2fl": CA2FL, "zero": DelayModel(speed="constant", speed_value=0.0, noise="none"),
              "constant": DelayModel.constant(1.0), "arith": ARITH}[model]
    Mc = data.draw(st.integers(1, n), label="Mc")
    M = data.draw(st.integers(1, Mc), label="M")
    reference = concurrent_reference(n, T, delays, seed, Mc, M, refill)
    new = concurrent(n, T, delays, seed, concurrency=Mc, buffer_size=M, refill=refill)
    assert_same(reference, new)
    assert_same(all_active(n, T, delays, seed),
                build_schedule("all_active", n, T, delays, seed, Immediate(n), Count(1),
                               {"concurrency": n, "buffer_size": 1}, fast=False))


# ---------------------------------------------------------------------- delay-model fields
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dropout_fraction": 1.0}, r"delays\.dropout_fraction must be in \[0, 1\).*got 1\.0"),
        ({"dropout_fraction": -0.1}, r"delays\.dropout_fraction must be in \[0, 1\)"),
        ({"dropout_fraction": "x"}, r"delays\.dropout_fraction must be a real number"),
        ({"dropout_time": -1}, r"delays\.dropout_time must be >= 0.*got -1\.0"),
        ({"dropout_time": float("nan")}, r"delays\.dropout_time must be >= 0"),
        ({"suspension_prob": 1.5}, r"delays\.suspension_prob must be in \[0, 1\].*got 1\.5"),
        ({"suspension_prob": float("nan")}, r"delays\.suspension_prob must be finite"),
        ({"suspension_mean": 0.0}, r"delays\.suspension_mean must be > 0"),
        ({"suspension_mean": float("inf")}, r"delays\.suspension_mean must be finite"),
    ],
)
def test_availability_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DelayModel(**kwargs)


def test_num_dropped_and_dropped_clients():
    assert DelayModel(dropout_fraction=0.29).num_dropped(100) == 29
    assert DelayModel(dropout_fraction=0.3).num_dropped(10) == 3
    assert DelayModel(dropout_fraction=0.09).num_dropped(10) == 0
    d = DelayModel(dropout_fraction=0.37, dropout_time=2.0)
    a = dropped_clients(50, d, 3)
    assert a.tolist() == sorted(set(a.tolist())) and len(a) == 18 and a.min() >= 0 and a.max() < 50
    assert np.array_equal(a, dropped_clients(50, d, 3)) and not np.array_equal(a, dropped_clients(50, d, 4))


def test_suspension_stream_is_counter_based():
    d = DelayModel(suspension_prob=0.3, suspension_mean=2.0)
    s = suspension_table(20, d, 5)
    full = s.block(np.arange(20), 0, 4000)
    assert np.array_equal(full[3, 100:200], s.block(np.array([3]), 100, 100)[0], equal_nan=True)
    hit = ~np.isnan(full)
    assert abs(hit.mean() - 0.3) < 0.01
    assert abs(full[hit].mean() - 2.0) < 0.05 and (full[hit] >= 0).all()
    assert np.isnan(suspension_table(20, DelayModel(), 5).block(np.arange(20), 0, 10)).all()
    assert (~np.isnan(suspension_table(20, DelayModel(suspension_prob=1.0), 5).block(np.arange(20), 0, 10))).all()


# ---------------------------------------------------------------------- property test over all features
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 10),
    data=st.data(),
    protocol=st.sampled_from(["concurrent", "all_active"]),
    aggregation=st.sampled_from(["count", "periodic", "poisson"]),
    model=st.sampled_from(sorted(POSITIVE_MODELS)),
    fraction=st.sampled_from([0.0, 0.3, 0.6]),
    dropout_time=st.sampled_from([0.0, 1.5, 5.0, math.inf]),
    prob=st.sampled_from([0.0, 0.3, 1.0]),
    mean=st.sampled_from([0.5, 5.0]),
    seed=st.integers(0, 2**32 - 1),
    T=st.integers(1, 30),
)
def test_schedule_properties_with_availability_and_clock(n, data, protocol, aggregation, model, fraction,
                                                          dropout_time, prob, mean, seed, T):
    delays = with_availability(POSITIVE_MODELS[model], dropout_fraction=fraction, dropout_time=dropout_time,
                               suspension_prob=prob, suspension_mean=mean)
    clock = {} if aggregation == "count" else (
        {"aggregation": "periodic", "period": data.draw(st.sampled_from([0.3, 1.0, 3.0]), label="period")}
        if aggregation == "periodic" else {"aggregation": "poisson", "rate": data.draw(st.sampled_from([0.5, 2.0]))})
    options = dict(clock)
    if protocol == "concurrent":
        Mc = data.draw(st.integers(1, n), label="Mc")
        options["concurrency"] = Mc
        if aggregation == "count":
            options["buffer_size"] = data.draw(st.integers(1, Mc), label="M")
            options["refill"] = data.draw(st.sampled_from(["immediate", "boundary"]), label="refill")
    live = n - (delays.num_dropped(n) if delays.has_dropouts(n) else 0)
    try:
        s = make_schedule(protocol, n, T, delays, seed, **options)
    except ValueError as e:
        assert options.get("refill") == "boundary" and live < options["buffer_size"], e
        assert "fewer than buffer_size" in str(e)
        return
    check_schedule(s, delays, n, seed, clock=bool(clock), all_active_=protocol == "all_active")
    if clock:
        assert s.info["aggregation"] == aggregation and "buffer_size" not in s.info
    else:
        assert (s.uploads_per_step == options.get("buffer_size", 1)).all()
    summary = schedule_summary(s)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["num_uploads"] == int(s.uploads_per_step.sum())
    assert summary["num_empty_steps"] == int((s.uploads_per_step == 0).sum())
    # Determinism and prefix consistency.
    again = make_schedule(protocol, n, T, delays, seed, **options)
    assert_same(s, again)
    try:
        longer = make_schedule(protocol, n, T + 7, delays, seed, **options).truncate(T)
    except ValueError as e:  # T steps ended before the dropout; T + 7 would need more live clients than remain
        assert options.get("refill") == "boundary" and live < options["buffer_size"], e
        assert "fewer than buffer_size" in str(e)
        return
    longer = longer.pad(s.buffer_width, s.dispatch_width)
    s = s.pad(longer.buffer_width, longer.dispatch_width)
    for f in _ARRAY_FIELDS:
        assert np.array_equal(getattr(s, f), getattr(longer, f), equal_nan=getattr(s, f).dtype.kind == "f"), f


# ---------------------------------------------------------------------- dropouts
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 12), data=st.data(), model=st.sampled_from(sorted(POSITIVE_MODELS)),
       fraction=st.sampled_from([0.0, 0.3, 0.6]), dropout_time=st.sampled_from([0.0, 1.0, 2.5, math.inf]),
       prob=st.sampled_from([0.0, 0.3, 1.0]), mean=st.sampled_from([0.5, 5.0]), seed=st.integers(0, 2**32 - 1),
       T=st.integers(1, 25))
def test_synchronous_round_path_equals_event_loop(n, data, model, fraction, dropout_time, prob, mean, seed, T):
    """The vectorized one-round-at-a-time path (fast.rounds_log) gives the event loop's schedule."""
    delays = with_availability(POSITIVE_MODELS[model], dropout_fraction=fraction, dropout_time=dropout_time,
                               suspension_prob=prob, suspension_mean=mean)
    m = data.draw(st.sampled_from([None, *range(1, n + 1)]), label="participants")
    options = {"participants": n if m is None else m}
    fast = build_schedule("synchronous", n, T, delays, seed, Rounds(m), AllInFlight(), options)
    loop = build_schedule("synchronous", n, T, delays, seed, Rounds(m), AllInFlight(), options, fast=False)
    assert_same(fast, loop)
    assert_same(fast, synchronous(n, T, delays, seed, participants=m))


def test_dropout_concurrent_immediate():
    n, Mc, M, T = 40, 12, 3, 600
    delays = with_availability(CA2FL, dropout_fraction=0.75, dropout_time=20.0)
    s = concurrent(n, T, delays, 2, concurrency=Mc, buffer_size=M, refill="immediate")
    check_schedule(s, delays, n, 2, clock=False, all_active_=False)
    dropped = s.info["dropped_clients"]
    assert len(dropped) == 30 and s.info["dropout_time"] == 20.0 and dropped == dropped_clients(n, delays, 2).tolist()
    assert s.step_times[-1] > 40.0, "the dropout happens well inside the schedule"
    is_dropped = np.isin(s.arrival_clients, dropped)
    assert (s.arrival_times[is_dropped] <= 20.0).all()
    assert is_dropped[s.step_times < 15.0].any(), "dropped clients did take part before the dropout"
    d_dropped = np.isin(s.dispatch_clients, dropped)
    assert (s.dispatch_times[d_dropped] <= 20.0).all()
    # Concurrency: Mc before the dropout, min(Mc, live) = 10 after (the discarded jobs end at the dropout).
    profile = concurrency_profile(s)
    before, after = s.step_times < 20.0, s.step_times > 20.0
    assert (profile[before] == Mc).all()
    assert (profile[after][:-1] == min(Mc, n - 30)).all()
    assert concurrency_profile(s, np.array([20.0]))[0] == min(Mc, n - 30)
    summary = schedule_summary(s)
    assert summary["num_dropped"] == 30 and summary["dropout_time"] == 20.0
    assert summary["max_concurrency"] == Mc


def test_dropout_replacements_start_from_the_current_model():
    """Each discarded job is replaced at the dropout time by a live idle client, in dispatch row t = steps done."""
    n, Mc, M = 30, 6, 2
    delays = with_availability(ARITH, dropout_fraction=0.5, dropout_time=7.25)
    s = concurrent(n, 200, delays, 1, concurrency=Mc, buffer_size=M, refill="boundary")
    check_schedule(s, delays, n, 1, clock=False, all_active_=False)
    t = int(np.searchsorted(s.step_times, 7.25, side="left"))  # steps completed before the dropout
    at_dropout = s.dispatch_times[t] == 7.25
    jobs = replay_jobs(s)
    discarded = [j for j in jobs if j["arrival"] is None and j["start"] <= 7.25 and j["client"] in
                 s.info["dropped_clients"]]
    assert len(discarded) >= 1
    assert at_dropout.sum() == len(discarded)
    assert not np.isin(s.dispatch_clients[t][at_dropout], s.info["dropped_clients"]).any()
    # With refill="boundary" the step's own arrivals still wait for the boundary: all M of row t+1 at step_times[t].
    assert (s.dispatch_times[t + 1][s.dispatch_clients[t + 1] >= 0] == s.step_times[t]).all()


def test_dropout_all_active_nothing_replaces():
    n = 20
    delays = with_availability(CA2FL, dropout_fraction=0.4, dropout_time=10.0)
    s = all_active(n, 400, delays, 3)
    check_schedule(s, delays, n, 3, clock=False, all_active_=True)
    profile = concurrency_profile(s)
    assert (profile[s.step_times < 10.0] == n).all()
    assert (profile[s.step_times > 10.0][:-1] == n - 8).all()
    late = s.arrival_clients[s.step_times > 10.0]
    assert not np.isin(late, s.info["dropped_clients"]).any()


def test_dropout_too_few_live_clients_raises():
    delays = with_availability(CA2FL, dropout_fraction=0.8, dropout_time=5.0)
    with pytest.raises(ValueError, match=r"cannot complete num_steps=500.*only 2 live client\(s\) remain, fewer than "
                                         r"buffer_size=3"):
        concurrent(10, 500, delays, 0, concurrency=5, buffer_size=3, refill="boundary")
    # Enough steps before the dropout: no error. Immediate refill always progresses (a client may report twice).
    s = concurrent(10, 2, delays, 0, concurrency=5, buffer_size=3, refill="boundary")
    assert s.step_times[-1] < 5.0
    s = concurrent(10, 500, delays, 0, concurrency=5, buffer_size=3, refill="immediate")
    check_schedule(s, delays, 10, 0, clock=False, all_active_=False)


def test_dropout_at_time_zero():
    delays = with_availability(ARITH, dropout_fraction=0.5, dropout_time=0.0)
    s = concurrent(10, 50, delays, 4, concurrency=10, buffer_size=2, refill="immediate")
    check_schedule(s, delays, 10, 4, clock=False, all_active_=False)
    assert not np.isin(s.arrival_clients, s.info["dropped_clients"]).any()
    assert (concurrency_profile(s)[:-1] == 5).all()


def test_dropout_synchronous():
    n = 12
    delays = with_availability(ARITH, dropout_fraction=0.5, dropout_time=6.0)
    s = synchronous(n, 20, delays, 2)
    s.validate()
    dropped = s.info["dropped_clients"]
    assert len(dropped) == 6
    start = np.concatenate([[0.0], s.step_times[:-1]])
    for t in range(20):
        row = s.dispatch_clients[t][s.dispatch_clients[t] >= 0]
        if start[t] >= 6.0:
            assert not np.isin(row, dropped).any() and len(row) == n - 6
        arrived = s.arrival_clients[t][s.arrival_mask[t]]
        assert (s.arrival_times[t][s.arrival_mask[t]] <= s.step_times[t]).all()
        lost = set(row.tolist()) - set(arrived.tolist())
        assert lost <= set(dropped)
        if lost:  # the round waited until the participants that left were known to be gone
            assert s.step_times[t] >= 6.0
    assert (s.staleness[s.arrival_mask] == 0).all()


# ---------------------------------------------------------------------- suspensions
def test_suspension_prob_zero_is_no_suspension():
    for build in (lambda d: concurrent(30, 100, d, 1, concurrency=8, buffer_size=2, refill="boundary"),
                  lambda d: all_active(30, 200, d, 1), lambda d: synchronous(30, 10, d, 1, participants=5)):
        assert_same(build(CA2FL), build(with_availability(CA2FL, suspension_prob=0.0, suspension_mean=3.0)),
                    check_info=False)


@pytest.mark.parametrize("protocol", ["all_active", "concurrent_immediate", "concurrent_boundary"])
def test_suspension_always_with_long_mean(protocol):
    n, mean = 15, 40.0
    delays = with_availability(ARITH, suspension_prob=1.0, suspension_mean=mean)
    if protocol == "all_active":
        s = all_active(n, 300, delays, 6)
    else:
        s = concurrent(n, 300, delays, 6, concurrency=5, buffer_size=2, refill=protocol.split("_")[1])
    check_schedule(s, delays, n, 6, clock=False, all_active_=protocol == "all_active")
    susp = suspension_table(n, delays, 6)
    jobs = replay_jobs(s)
    gaps = []
    for c in range(n):
        cj = [j for j in jobs if j["client"] == c]
        for u, (a, b) in enumerate(zip(cj, cj[1:])):
            length = float(susp.lengths(c, u))
            assert length > 0 and b["start"] >= a["arrival"] + length
            gaps.append(b["start"] - a["arrival"])
            # Nothing of client c is dispatched while it is suspended.
            during = (s.dispatch_times > a["arrival"]) & (s.dispatch_times < a["arrival"] + length)
            assert not ((s.dispatch_clients == c) & during).any()
    assert np.mean(gaps) > mean / 3
    summary = schedule_summary(s)
    assert summary["num_suspensions"] == summary["num_uploads"] == num_suspensions(s)
    if protocol == "all_active":
        assert s.dispatch_width > 1 or s.uploads_per_step.sum() < 2  # rows hold a variable number of jobs
        assert (s.uploads_per_step == 1).all()


def test_suspension_all_active_dispatch_rows_vary_and_versions_are_current():
    n = 10
    delays = with_availability(ARITH, suspension_prob=0.5, suspension_mean=3.0)
    s = all_active(n, 400, delays, 2)
    check_schedule(s, delays, n, 2, clock=False, all_active_=True)
    sizes = (s.dispatch_clients >= 0).sum(axis=1)
    assert sizes.min() == 0 and sizes.max() >= 2 and s.dispatch_width == sizes.max()
    summary = schedule_summary(s)
    assert 0 < summary["num_suspensions"] < summary["num_uploads"]
    assert abs(summary["num_suspensions"] / summary["num_uploads"] - 0.5) < 0.1


def test_suspension_synchronous_waits_and_skips():
    n = 6
    delays = with_availability(ARITH, suspension_prob=1.0, suspension_mean=20.0)
    s = synchronous(n, 12, delays, 1, participants=4)
    s.validate()
    susp = suspension_table(n, delays, 1)
    start = np.concatenate([[0.0], s.step_times[:-1]])
    uploads = np.zeros(n, dtype=int)
    back = np.zeros(n)
    waited = 0
    for t in range(s.num_steps):
        row = s.dispatch_clients[t][s.dispatch_clients[t] >= 0]
        when = s.dispatch_times[t][0]
        assert when >= start[t]
        assert (back[row] <= when).all(), "a suspended client was sampled"
        available = int((back <= when).sum())
        assert len(row) == min(4, available) >= 1
        if when > start[t]:
            waited += 1
            assert when == back[back > start[t]].min(), "the round starts when the first client returns"
        for c, a in zip(s.arrival_clients[t][s.arrival_mask[t]], s.arrival_times[t][s.arrival_mask[t]]):
            back[c] = a + float(susp.lengths(c, uploads[c]))
            uploads[c] += 1
    assert waited >= 1


# ---------------------------------------------------------------------- server clock
def test_periodic_clock_shorter_than_any_job_gives_empty_steps():
    delays = DelayModel.ca2fl(scale_high=1.0, shift=2.0)  # every job takes >= 2
    s = all_active(8, 200, delays, 0, aggregation="periodic", period=0.5)
    check_schedule(s, delays, 8, 0, clock=True, all_active_=True)
    assert np.allclose(s.step_times, 0.5 * np.arange(1, 201)) and s.step_times[3] == 2.0
    assert (s.uploads_per_step[:3] == 0).all() and (s.uploads_per_step == 0).sum() > 20
    empty = s.uploads_per_step == 0
    assert (s.arrival_clients[empty] == -1).all() and (s.staleness[empty] == -1).all()
    assert s.buffer_width == s.uploads_per_step.max()
    summary = schedule_summary(s)
    assert summary["num_empty_steps"] == int(empty.sum()) and summary["num_steps"] == 200
    # Every step aggregates what arrived within the last period.
    prev = np.concatenate([[0.0], s.step_times[:-1]])
    for t in np.flatnonzero(~empty):
        a = s.arrival_times[t][s.arrival_mask[t]]
        assert (a > prev[t]).all() and (a <= s.step_times[t]).all()


@pytest.mark.parametrize("clock", [{"aggregation": "periodic", "period": 0.7}, {"aggregation": "poisson", "rate": 3.0}])
def test_clock_regroups_the_all_active_arrivals(clock):
    """Same per-client jobs, so the same arrivals in the same (time) order as count/buffer_size=1, grouped by tick."""
    n = 12
    s = all_active(n, 150, CA2FL, 5, **clock)
    check_schedule(s, CA2FL, n, 5, clock=True, all_active_=True)
    mask = s.arrival_mask
    K = int(mask.sum())
    ref = concurrent(n, K, CA2FL, 5, concurrency=n, buffer_size=1)  # the count protocol, one arrival per step
    assert np.array_equal(s.arrival_clients[mask], ref.arrival_clients[:, 0])
    assert np.array_equal(s.arrival_times[mask], ref.arrival_times[:, 0])
    assert len(np.unique(ref.arrival_times)) == K, "no ties"
    # Grouped differently: version = number of ticks before the job started.
    jobs = replay_jobs(s)
    ticks = s.step_times
    for job in jobs:
        assert job["version"] == int(np.searchsorted(ticks, job["start"], side="left"))


def test_concurrent_periodic_keeps_concurrency():
    n, Mc = 50, 10
    s = concurrent(n, 300, CA2FL, 8, concurrency=Mc, aggregation="periodic", period=0.25)
    check_schedule(s, CA2FL, n, 8, clock=True, all_active_=False)
    assert (concurrency_profile(s) == Mc).all()
    assert s.info["aggregation"] == "periodic" and s.info["period"] == 0.25 and s.info["refill"] == "immediate"
    staleness = s.staleness[s.arrival_mask]
    assert staleness.min() >= 0 and staleness.max() >= 1


def test_poisson_clock_gaps():
    rate, T = 4.0, 20_000
    s = concurrent(30, T, ARITH, 3, concurrency=5, aggregation="poisson", rate=rate)
    gaps = np.diff(np.concatenate([[0.0], s.step_times]))
    assert (gaps > 0).all()
    # Exp(rate): mean 1/rate, sd 1/rate; 5 standard errors.
    assert abs(gaps.mean() - 1 / rate) < 5 / rate / math.sqrt(T)
    assert abs(gaps.std() - 1 / rate) < 0.05 / rate
    again = concurrent(30, 100, ARITH, 3, concurrency=5, aggregation="poisson", rate=rate)
    assert np.array_equal(again.step_times, s.step_times[:100])
    other = concurrent(30, 100, ARITH, 4, concurrency=5, aggregation="poisson", rate=rate)
    assert not np.array_equal(other.step_times, again.step_times)


def test_clock_with_zero_length_jobs_raises():
    with pytest.raises(ValueError, match=r"zero-length jobs"):
        all_active(5, 10, DelayModel(speed="constant", speed_value=0.0, noise="none"), 0,
                   aggregation="periodic", period=1.0)


def test_clock_with_dropouts_and_suspensions():
    n = 30
    delays = with_availability(CA2FL, dropout_fraction=0.5, dropout_time=15.0, suspension_prob=0.3,
                               suspension_mean=4.0)
    for s in (all_active(n, 120, delays, 1, aggregation="periodic", period=0.5),
              concurrent(n, 120, delays, 1, concurrency=10, aggregation="poisson", rate=2.0)):
        check_schedule(s, delays, n, 1, clock=True, all_active_=s.info["protocol"] == "all_active")
        assert s.step_times[-1] > 15.0
        summary = schedule_summary(s)
        assert summary["num_dropped"] == 15 and summary["num_suspensions"] > 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: concurrent(10, 5, CA2FL, 0, 4, aggregation="periodic", period=1.0, refill="boundary"),
         r"refill must be 'immediate' with aggregation='periodic'"),
        (lambda: concurrent(10, 5, CA2FL, 0, 4, 2, aggregation="periodic", period=1.0),
         r"buffer_size must not be given with aggregation='periodic'"),
        (lambda: concurrent(10, 5, CA2FL, 0, 4), r"buffer_size is required with aggregation='count'"),
        (lambda: concurrent(10, 5, CA2FL, 0, 4, aggregation="periodic"), r"requires period"),
        (lambda: concurrent(10, 5, CA2FL, 0, 4, aggregation="poisson"), r"requires rate"),
        (lambda: all_active(10, 5, CA2FL, 0, aggregation="periodic", period=0.0),
         r"period must be a finite number > 0"),
        (lambda: all_active(10, 5, CA2FL, 0, aggregation="poisson", rate=-1), r"rate must be a finite number > 0"),
        (lambda: all_active(10, 5, CA2FL, 0, aggregation="poisson", rate=float("inf")), r"rate must be a finite"),
        (lambda: all_active(10, 5, CA2FL, 0, period=1.0), r"period is only used with aggregation='periodic'"),
        (lambda: all_active(10, 5, CA2FL, 0, aggregation="periodic", period=1.0, rate=1.0), r"rate is only used"),
        (lambda: all_active(10, 5, CA2FL, 0, aggregation="time"), r"aggregation must be one of"),
        (lambda: make_schedule("synchronous", 10, 5, CA2FL, 0, aggregation="periodic"), r"unknown option"),
        (lambda: make_schedule("concurrent", 10, 5, CA2FL, 0, concurrency=3), r"requires option 'buffer_size'"),
    ],
)
def test_clock_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_make_schedule_with_a_clock():
    a = make_schedule("concurrent", 20, 30, CA2FL, 1, concurrency=5, aggregation="periodic", period=0.5)
    b = concurrent(20, 30, CA2FL, 1, concurrency=5, aggregation="periodic", period=0.5)
    assert_same(a, b)
    a = make_schedule("all_active", 20, 30, CA2FL.to_dict(), 1, aggregation="poisson", rate=2.0)
    assert_same(a, all_active(20, 30, CA2FL, 1, aggregation="poisson", rate=2.0))


# ---------------------------------------------------------------------- schedule plumbing
def test_save_load_validate_and_pad(tmp_path):
    delays = with_availability(CA2FL, dropout_fraction=0.5, dropout_time=5.0, suspension_prob=0.2)
    s = concurrent(20, 100, delays, 3, concurrency=8, aggregation="periodic", period=0.4)
    path = tmp_path / "s.npz"
    s.save(path)
    loaded = Schedule.load(path)
    assert_same(s, loaded)
    assert loaded.info["dropped_clients"] == s.info["dropped_clients"] and loaded.info["dropout_time"] == 5.0
    assert schedule_summary(loaded) == schedule_summary(s)
    wide = s.pad(buffer_width=s.buffer_width + 3, dispatch_width=s.dispatch_width + 2)
    wide.validate()
    assert wide.buffer_width == s.buffer_width + 3 and wide.dispatch_width == s.dispatch_width + 2
    assert np.array_equal(wide.uploads_per_step, s.uploads_per_step)
    assert schedule_summary(wide) == schedule_summary(s)
    assert s.pad(1, 1) is s
    # Without the dropout record the reuse of a discarded job's slot is an error.
    forged = Schedule(**{f: getattr(s, f) for f in _ARRAY_FIELDS}, num_clients=s.num_clients, num_slots=s.num_slots,
                      info={k: v for k, v in s.info.items() if k != "dropped_clients"})
    with pytest.raises(ValueError, match=r"is still held by client"):
        forged.validate()


# ---------------------------------------------------------------------- configuration
def _config(delays=None, protocol=None, **run):
    raw = {"data": {"num_clients": 20}, "runs": [{"algorithm": "fedbuff", "protocol": protocol or {}, **run}]}
    if delays is not None:
        raw["delays"] = delays
    return ExperimentConfig.from_dict(raw)


def test_config_accepts_and_validates_availability_fields():
    cfg = _config({"speed": "uniform", "speed_low": 0.5, "dropout_fraction": 0.25, "dropout_time": 30,
                   "suspension_prob": 0.1, "suspension_mean": 2.0}, arrivals=100)
    validate(cfg)
    assert cfg.delay_model().dropout_fraction == 0.25 and cfg.delay_model().dropout_time == 30.0
    for delays, match in (({"dropout_fraction": 1.5}, r"delays\.dropout_fraction must be in \[0, 1\)"),
                          ({"suspension_prob": -1}, r"delays\.suspension_prob"),
                          ({"suspension_mean": 0}, r"delays\.suspension_mean must be > 0"),
                          ({"dropout_tme": 3}, r"unknown key 'dropout_tme'")):
        with pytest.raises(ConfigError, match=match):
            validate(_config(delays, arrivals=100))


@pytest.mark.parametrize(
    "protocol, run, match",
    [
        ({"aggregation": "periodic", "period": 1.0}, {"steps": 10},
         r"protocol\.refill = 'boundary'.*refill = 'immediate'"),
        ({"aggregation": "periodic", "refill": "immediate"}, {"steps": 10}, r"protocol\.period = None.*needs a period"),
        ({"aggregation": "poisson", "rate": 0, "refill": "immediate"}, {"steps": 10}, r"protocol\.rate = 0"),
        ({"aggregation": "count", "period": 2.0}, {"steps": 10}, r"protocol\.period = 2\.0: only used with"),
        ({"aggregation": "periodic", "period": 1.0, "refill": "immediate"}, {"arrivals": 100},
         r"arrivals = 100: with a server clock .* runs\[0\]\.steps"),
        ({"aggregation": "hourly"}, {"steps": 10}, r"protocol\.aggregation = 'hourly': must be one of"),
        ({"name": "synchronous", "aggregation": "periodic", "period": 1.0}, {"steps": 10},
         r"synchronous rounds have no server clock"),
    ],
)
def test_config_clock_options_are_validated(protocol, run, match):
    with pytest.raises(ConfigError, match=match):
        validate(_config(protocol=protocol, **run))


def test_config_builds_clock_schedules_with_common_widths():
    from asyncfl_jax.experiment import build_schedules

    cfg = _config({"speed": "uniform", "speed_low": 0.5, "suspension_prob": 0.3},
                  {"name": "concurrent", "concurrency": 6, "refill": "immediate", "aggregation": "poisson",
                   "rate": 2.0}, steps=40)
    cfg.seeds = [0, 1, 2]
    validate(cfg)
    schedules = build_schedules(cfg, cfg.runs[0])
    assert len({(s.buffer_width, s.dispatch_width) for s in schedules}) == 1
    for seed, s in zip(cfg.seeds, schedules):
        s.validate()
        assert s.info["aggregation"] == "poisson" and s.info["seed"] == seed and s.num_steps == 40
        raw = concurrent(20, 40, cfg.delay_model(), seed, concurrency=6, aggregation="poisson", rate=2.0)
        assert np.array_equal(s.uploads_per_step, raw.uploads_per_step)
    cfg = _config(protocol={"name": "all_active", "aggregation": "periodic", "period": 0.5}, steps=20)
    validate(cfg)
    (s,) = build_schedules(cfg, cfg.runs[0])
    assert s.info["protocol"] == "all_active" and s.info["period"] == 0.5


def test_print_config_shows_the_clock_options(capsys):
    from asyncfl_jax import cli

    assert cli.main(["run", "--print-config"]) == 0
    raw = json.loads(capsys.readouterr().out)
    protocol = raw["runs"][0]["protocol"]
    assert protocol["aggregation"] == "count" and protocol["period"] is None and protocol["rate"] is None
