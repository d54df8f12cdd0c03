"""Bias-correcting and cache-based methods (ACE, ACED, delay-adaptive ASGD, ASGD with gradients, AREA, AS-FedAvg,
MIFA, MF-CA2FL) and the quantized caches, against the independent numpy reference (tests/reference.py).

Full-batch local steps make every job a function of (client, start model), so the engine's final model must equal
the float64 reference's on the same schedule to float32 tolerance. To keep the file fast, each algorithm is compiled
once and run, vmapped, on several schedules (padded to one shape) and hyper-parameter settings at the same time.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, common_widths, toy_problem
from asyncfl_jax.algorithms import (ace, aced, area, as_fedavg, asgd, ca2fl, delay_adaptive_asgd, fedbuff,
                                    mf_ca2fl, mifa, ServerMeta)
from asyncfl_jax.algorithms.cache import dequantize, quantize
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import make_simulation, resolve_hparams, simulate, stack_schedules
from asyncfl_jax.task import task_arrays
from asyncfl_jax.timing import make_schedule

N = 8
T, STEPS, LR = 30, 3, 0.3
DELAYS = TOY_DELAYS
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
GAP = 10  # the step the "gap" schedule leaves empty


TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
D = X0.size


# ---------------------------------------------------------------------------------------------------- schedules
def _with_empty_step(schedule, t):
    """The schedule with step ``t`` emptied (no dispatch, no arrival): a synchronous run with one idle step."""
    arrays = {}
    for name, fill in (("dispatch_clients", -1), ("dispatch_slots", -1), ("dispatch_times", np.nan),
                       ("arrival_clients", -1), ("arrival_slots", -1), ("arrival_versions", -1),
                       ("arrival_times", np.nan)):
        a = getattr(schedule, name).copy()
        a[t] = fill
        arrays[name] = a
    out = dataclasses.replace(schedule, **arrays)
    out.validate()
    return out


def _schedules():
    raw = {
        "all_active": make_schedule("all_active", N, T, DELAYS, seed=3),
        # buffer 3 with immediate refill: clients arrive twice in a step, and are dispatched twice in a step.
        "immediate": make_schedule("concurrent", N, T, DELAYS, seed=0, concurrency=6, buffer_size=3,
                                   refill="immediate"),
        "boundary": make_schedule("concurrent", N, T, DELAYS, seed=2, concurrency=5, buffer_size=2,
                                  refill="boundary"),
        "synchronous": make_schedule("synchronous", N, T, DELAYS, seed=1),
        "everyone": make_schedule("concurrent", N, T, DELAYS, seed=9, concurrency=N, buffer_size=N,
                                  refill="boundary"),
        "gap": _with_empty_step(make_schedule("synchronous", N, T, DELAYS, seed=4), GAP),
        # AREA's independent server clock, with clients that drop out and get suspended: a variable number of
        # arrivals per step (some steps empty) and dispatch rows of varying width.
        "clock": make_schedule("all_active", N, T, dataclasses.replace(
            DELAYS, dropout_fraction=0.25, dropout_time=8.0, suspension_prob=0.3, suspension_mean=2.0), seed=6,
            aggregation="periodic", period=0.7),
    }
    return common_widths(raw)


SCHEDULES = _schedules()


def _duplicates(a: np.ndarray) -> int:
    """Number of steps in which some client appears twice in a row of ``a`` ([T, width], -1 = padding)."""
    return sum(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in a)


def test_schedules_exercise_the_cases():
    s = SCHEDULES
    assert s["all_active"].staleness.max() > 3
    assert _duplicates(s["immediate"].arrival_clients) > 0 and _duplicates(s["immediate"].dispatch_clients) > 0
    assert s["immediate"].staleness.max() > 3 and s["boundary"].staleness.max() > 3
    assert _duplicates(s["boundary"].arrival_clients) == 0 and _duplicates(s["boundary"].dispatch_clients) == 0
    for name in ("all_active", "immediate"):  # fresh and stale arrivals (delay-adaptive ASGD, ACED)
        staleness = s[name].staleness[s[name].arrival_mask]
        assert (staleness == 0).any() and (staleness > 3).any()
    for name in ("synchronous", "everyone"):
        assert (s[name].uploads_per_step == N).all() and s[name].staleness.max() == 0
    assert s["gap"].uploads_per_step[GAP] == 0 and (np.delete(s["gap"].uploads_per_step, GAP) == N).all()
    clock = s["clock"]
    assert (clock.uploads_per_step == 0).any() and clock.uploads_per_step.max() > 1
    assert clock.info["dropped_clients"] and (clock.dispatch_clients >= 0).sum(axis=1).max() > 1


# --------------------------------------------------------------------------------------------------- running the engine
# Each configuration: a constructor and the (schedule, hyper-parameters) replicas it is run with, all in one program.
ETA, ETA_MIFA, ETA_CA2FL = 0.5, 0.9, 0.9
LR_C, LR_D = 3.0, 10.0
CONFIGS = {
    "ace": (lambda: ace(), [("all_active", {"server_lr": ETA}), ("immediate", {"server_lr": ETA}),
                            ("clock", {"server_lr": ETA})]),
    "ace_no_init": (lambda: ace(init_round=False), [("all_active", {"server_lr": ETA})]),
    "ace_bfloat16": (lambda: ace(cache="bfloat16", cache_rounding="nearest"),
                     [("all_active", {"server_lr": ETA}), ("immediate", {"server_lr": ETA})]),
    "ace_int8": (lambda: ace(cache="int8", cache_rounding="nearest"),
                 [("all_active", {"server_lr": ETA}), ("immediate", {"server_lr": ETA})]),
    "aced": (lambda: aced(), [("all_active", {"server_lr": ETA, "tau_algo": 1000.0}),
                              ("all_active", {"server_lr": ETA, "tau_algo": 0.0}),
                              ("all_active", {"server_lr": ETA, "tau_algo": 3.0}),
                              ("immediate", {"server_lr": ETA, "tau_algo": 2.0}),
                              ("gap", {"server_lr": ETA, "tau_algo": 0.0})]),
    "aced_cache_age": (lambda: aced(active="cache_age"), [("all_active", {"server_lr": ETA, "tau_algo": 1000.0}),
                                                          ("all_active", {"server_lr": ETA, "tau_algo": 0.0}),
                                                          ("all_active", {"server_lr": ETA, "tau_algo": 3.0}),
                                                          ("immediate", {"server_lr": ETA, "tau_algo": 1.0})]),
    "delay_adaptive": (lambda: delay_adaptive_asgd(), [("all_active", {"server_lr": 0.3, "tau_c": 2.0}),
                                                       ("immediate", {"server_lr": 0.3, "tau_c": 1.0})]),
    "asgd_gradient": (lambda: asgd(upload="gradient"), [("all_active", {"server_lr": 0.3})]),
    "area": (lambda: area(), [("immediate", {}), ("boundary", {}), ("synchronous", {}), ("clock", {})]),
    "area_decreasing": (lambda: area(lr_schedule="decreasing"), [("boundary", {"lr_c": LR_C, "lr_d": LR_D}),
                                                                 ("immediate", {"lr_c": LR_C, "lr_d": LR_D})]),
    "as_fedavg": (lambda: as_fedavg(), [("immediate", {}), ("synchronous", {})]),
    "mifa": (lambda: mifa(), [("immediate", {"server_lr": ETA_MIFA}), ("all_active", {"server_lr": ETA_MIFA}),
                              ("synchronous", {"server_lr": 1.0})]),
    "mifa_int4": (lambda: mifa(cache="int4", cache_rounding="nearest"), [("immediate", {"server_lr": ETA_MIFA})]),
    "mf_ca2fl": (lambda: mf_ca2fl(bits=8, rounding="nearest"),
                 [("boundary", {"server_lr": ETA_CA2FL}), ("immediate", {"server_lr": ETA_CA2FL}),
                  ("everyone", {"server_lr": 1.0})]),
    "mf_ca2fl_fresh": (lambda: mf_ca2fl(bits=8, rounding="nearest", quantize_fresh=True),
                       [("boundary", {"server_lr": ETA_CA2FL}), ("immediate", {"server_lr": ETA_CA2FL})]),
    "ca2fl_float32": (lambda: ca2fl(cache="float32"), [("immediate", {"server_lr": ETA_CA2FL}),
                                                       ("everyone", {"server_lr": 1.0}),
                                                       ("synchronous", {"server_lr": 1.0})]),
    "fedbuff": (lambda: fedbuff(), [("synchronous", {"server_lr": 1.0})]),
}
_OUTPUTS: dict[str, object] = {}
# The programs are tiny and run once: spend less time optimizing them (float results within rounding of the default).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _engine(config: str):
    """The compiled run of ``CONFIGS[config]`` (cached): a SimulationOutput with a leading replica axis."""
    if config not in _OUTPUTS:
        build, runs = CONFIGS[config]
        algorithm = build()
        sched, slots = stack_schedules([SCHEDULES[name] for name, _ in runs])
        hps = [resolve_hparams(algorithm, {"client_lr": LR, **hp}) for _, hp in runs]
        hp = {k: jnp.asarray([h[k] for h in hps], jnp.float32) for k in hps[0]}
        keys = jnp.stack([jax.random.PRNGKey(i) for i in range(len(runs))])
        run = make_simulation(TASK, algorithm, LOCAL, T, slots, eval_every=T)
        args = (sched, hp, keys, task_arrays(TASK))
        compiled = jax.jit(jax.vmap(run, in_axes=(0, 0, 0, None))).lower(*args).compile(compiler_options=FAST_COMPILE)
        _OUTPUTS[config] = compiled(*args)
    return _OUTPUTS[config]


def _replica(config: str, name: str, **hp) -> int:
    """The index, in ``CONFIGS[config]``, of the run on schedule ``name`` whose hyper-parameters include ``hp``."""
    runs = CONFIGS[config][1]
    return next(i for i, (s, h) in enumerate(runs) if s == name and all(h[k] == v for k, v in hp.items()))


def _final(config: str, name: str, **hp) -> np.ndarray:
    """The engine's final model of the run of ``config`` on schedule ``name`` (with hyper-parameters ``hp``)."""
    return np.asarray(_engine(config).params[_replica(config, name, **hp)], np.float64)


def _assert_close(engine, reference, rtol=2e-4, atol=2e-5):
    np.testing.assert_allclose(engine, reference, rtol=rtol, atol=atol)
    assert np.abs(reference - X0).max() > 1e-2  # the run moved the model: the comparison is not vacuous


def _distinguishable(a, b, rtol=2e-4, atol=2e-5) -> bool:
    """The two models differ by more than the engine-vs-reference tolerance (so a test can tell them apart)."""
    return bool((np.abs(a - b) > atol + rtol * np.abs(b)).any())


# ---------------------------------------------------------------------------------------------------- reference runs
def _gradient(c, start, version):
    return ref.gradient(MODEL, start, DATA[c])


def _delta(lr=LR):
    return lambda c, start, version: ref.local_delta(MODEL, start, DATA[c], STEPS, lr)


def _reference(name, server, train=None, client=None, init_round=False) -> list[np.ndarray]:
    """The reference models ``[x_0, ..., x_T]`` of ``server`` on schedule ``name``."""
    return ref.replay_steps(SCHEDULES[name], X0, train or _delta(), server, client=client, init_round=init_round)


def _fedavg(name: str) -> np.ndarray:
    """Full-participation FedAvg (server_lr 1) on a synchronous schedule, by the original reference."""
    return ref.replay(SCHEDULES[name], X0, lambda c, start: ref.local_delta(MODEL, start, DATA[c], STEPS, LR),
                      ref.fedavg_step(1.0))


# ---------------------------------------------------------------------------------------------------- quantizer
def _dequantize(q, bits: int, dim: int):
    """``dequantize`` of the package (it takes the row width and the bit count besides the rows)."""
    if len(inspect.signature(dequantize).parameters) == 1:
        return dequantize(q)
    return dequantize(q, bits, dim)


def _rows(seed=0, k=6, d=37):
    rng = np.random.default_rng(seed)
    rows = (rng.normal(size=(k, d)) * rng.uniform(0.01, 3.0, size=(k, 1)) + rng.normal(size=(k, 1))).astype(np.float32)
    rows[1] = np.float32(0.25)  # a constant row: stored as is
    rows[2, :5] = rows[2].max()  # ties at the top of the range
    return rows


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_nearest_quantizer_matches_numpy_reference(bits):
    """quantize + dequantize with round-to-nearest against the float32 numpy reference (same formula, same order).

    Not bit for bit: XLA:CPU rewrites ``x / broadcast(s)`` as ``x * broadcast(1 / s)`` and fuses ``lo + code * scale``
    into one FMA (checked on tiny jitted programs), so values may differ by a few float32 ulps, and a code by one
    where ``(v - lo) / scale + 1/2`` lands on an integer within rounding. Everything else must agree exactly."""
    rows = _rows(k=24, d=101)
    q = quantize(jnp.asarray(rows), bits, "nearest", jax.random.PRNGKey(0))
    got = np.asarray(_dequantize(q, bits, rows.shape[1]))
    expected = np.stack([ref.quantize_row(r, bits, "nearest") for r in rows])  # float32 arithmetic, same order
    assert got.dtype == np.float32 and got.shape == rows.shape
    np.testing.assert_array_equal(got[1], rows[1])  # a constant row is stored as is
    levels = np.float32(2 ** bits - 1)
    lo, hi = rows.min(axis=1, keepdims=True), rows.max(axis=1, keepdims=True)
    np.testing.assert_array_equal(got.min(axis=1, keepdims=True), lo)  # code 0 is lo exactly
    varying = (hi > lo)[:, 0]
    lo, hi, v, got, expected = lo[varying], hi[varying], rows[varying], got[varying], expected[varying]
    scale = (hi - lo) / levels
    # Codes: integers in [0, 2^b - 1], both ends used, equal to the reference's but at rounding boundaries.
    codes = (got - lo) / scale
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)
    codes = np.round(codes)
    assert codes.min() == 0 and codes.max() == levels
    t = (v - lo) / scale + np.float32(0.5)
    ref_codes = np.clip(np.floor(t), 0, levels)
    differ = codes != ref_codes
    on_boundary = np.abs(t - np.round(t)) <= 8 * np.finfo(np.float32).eps * np.maximum(np.abs(t), 1)
    assert not (differ & ~on_boundary).any()
    assert (np.abs(codes - ref_codes) <= 1).all() and differ.sum() <= max(1, differ.size // 100)
    # Values: equal up to a few ulps of the row's magnitude where the codes agree.
    magnitude = np.maximum(np.abs(lo), np.abs(hi))
    assert (np.abs(got - expected)[~differ] <= (4 * np.finfo(np.float32).eps * magnitude + 0 * got)[~differ]).all()
    # Nearest rounding is off by at most half a step.
    assert (np.abs(got - v) <= scale / 2 * (1 + 1e-4) + 4 * np.finfo(np.float32).eps * magnitude).all()


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_stochastic_quantizer_is_unbiased_with_bounded_variance(bits):
    v = _rows(seed=1)[0]
    draws_per_key, num_keys = 2000, 4
    lo, hi = v.min(), v.max()
    scale = float((hi - lo) / (2 ** bits - 1))
    draws = []
    for k in range(num_keys):  # every row of one call draws its own uniforms; several keys on top of that
        q = quantize(jnp.asarray(np.tile(v, (draws_per_key, 1))), bits, "stochastic", jax.random.PRNGKey(100 + k))
        draws.append(np.asarray(_dequantize(q, bits, v.size), np.float64))
    draws = np.concatenate(draws)
    count = draws.shape[0]
    # Every draw rounds each entry to one of its two neighbouring levels ...
    assert (np.abs(draws - v) <= scale * (1 + 1e-4) + 1e-6).all()
    codes = (draws - float(lo)) / scale
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)
    assert codes.min() > -1e-3 and codes.max() < 2 ** bits - 1 + 1e-3
    # ... with the probabilities that make it unbiased: |mean - v| within 5 sigma of the variance bound scale^2/4.
    assert (np.abs(draws.mean(axis=0) - v) <= 5 * (scale / 2) / np.sqrt(count) + 1e-6).all()
    assert (draws.var(axis=0) <= scale ** 2 / 4 * 1.1 + 1e-9).all()
    assert draws.var(axis=0).max() > scale ** 2 / 100  # it does round randomly


def test_reference_bfloat16_rounding_is_ml_dtypes():
    import ml_dtypes

    v = np.random.default_rng(0).normal(size=4096) * 10.0 ** np.random.default_rng(1).integers(-6, 6, size=4096)
    expected = v.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(ref.round_bfloat16(v), expected)


@pytest.mark.parametrize("kind,divisor", [("float32", 1.0), ("bfloat16", 1.9), ("int8", 3.9), ("int4", 7.0),
                                          ("int2", 13.0)])
def test_quantized_cache_memory(kind, divisor):
    """Codes are packed: an int-b cache costs about d b / 8 bytes per client (plus two float32 numbers)."""
    n, d = 8, 4096
    state = ace(cache=kind).init(jnp.zeros(d, jnp.float32), n)
    nbytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state.cache))
    full = n * d * 4
    assert nbytes <= full / divisor
    if kind.startswith("int"):
        assert nbytes >= n * d * int(kind[3:]) // 8  # and no smaller than the codes themselves
    for build in (lambda: mifa(cache=kind), lambda: aced(cache=kind), lambda: ca2fl(cache=kind)):
        other = build().init(jnp.zeros(d, jnp.float32), n)
        assert sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(other.cache)) == nbytes


# ---------------------------------------------------------------------------------------------------- ACE
@pytest.mark.parametrize("name", ["all_active", "immediate", "clock"])
def test_ace_matches_reference_and_caches_every_latest_gradient(name):
    server = ref.ACEReference(N, D, ETA)
    models = _reference(name, server, train=_gradient, init_round=True)
    out = _engine("ace")
    _assert_close(_final("ace", name), models[-1])
    replica = _replica("ace", name)
    # Every client's row is its latest gradient (the init round's for a client that never arrived), and the step
    # uses the mean over all n rows: cache_mean is that mean.
    cache = np.asarray(out.carry.server.cache[replica])
    np.testing.assert_allclose(cache, server.cache, rtol=2e-4, atol=2e-5)
    assert (np.abs(server.cache) > 1e-3).any(axis=1).all()  # every row was written (by the init round at least)
    np.testing.assert_allclose(np.asarray(out.carry.server.cache_mean[replica]), cache.mean(axis=0),
                               rtol=1e-4, atol=1e-6)


def test_ace_direct_equals_incremental_and_counts_init_uploads():
    names = ["all_active", "immediate"]
    schedules = [SCHEDULES[name] for name in names]
    history = simulate(TASK, ace(rule="direct"), schedules, local=LOCAL, seeds=[0, 1],
                       hparams={"client_lr": LR, "server_lr": ETA}, eval_every=T, progress=False)
    incremental = np.asarray(_engine("ace").params)[[_replica("ace", name) for name in names]]
    np.testing.assert_allclose(history.final_params, incremental, rtol=1e-5, atol=1e-6)
    for r, (name, s) in enumerate(zip(names, schedules)):
        reference = _reference(name, ref.ACEReference(N, D, ETA), train=_gradient, init_round=True)
        _assert_close(history.final_params[r], reference[-1])
        # The n uploads of the init round are counted at step 0.
        assert history.uploads[r, 0] == N
        assert history.uploads[r, -1] == N + s.uploads_per_step.sum()


def test_ace_without_init_round_matches_reference():
    models = _reference("all_active", ref.ACEReference(N, D, ETA), train=_gradient, init_round=False)
    _assert_close(_final("ace_no_init", "all_active"), models[-1])
    with_init = _reference("all_active", ref.ACEReference(N, D, ETA), train=_gradient, init_round=True)
    assert _distinguishable(with_init[-1], models[-1])  # the init round matters


@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
@pytest.mark.parametrize("name", ["all_active", "immediate"])
def test_ace_quantized_cache_matches_reference(kind, name):
    """Round-to-nearest caches: the server reads the stored (rounded) rows everywhere, and cache_mean is their mean."""
    models = _reference(name, ref.ACEReference(N, D, ETA, store=ref.cache_store(kind)), train=_gradient,
                        init_round=True)
    exact = _reference(name, ref.ACEReference(N, D, ETA), train=_gradient, init_round=True)
    assert _distinguishable(models[-1], exact[-1])  # the rounding is visible in the result
    _assert_close(_final(f"ace_{kind}", name), models[-1])


# ---------------------------------------------------------------------------------------------------- ACED
@pytest.mark.parametrize("name,tau", [("all_active", 1000.0), ("all_active", 0.0),
                                      ("all_active", 3.0), ("immediate", 2.0), ("gap", 0.0)])
def test_aced_matches_reference(name, tau):
    server = ref.ACEDReference(N, D, ETA, tau, active="since_report")
    models = _reference(name, server, train=_gradient, init_round=True)
    _assert_close(_final("aced", name, tau_algo=tau), models[-1])
    if tau < 1000:
        assert min(server.active_counts.values()) < N  # some steps average over a strict subset of the cache


def test_aced_with_large_tau_equals_ace():
    """tau_algo beyond every client's age: every client is active at every step, which is ACE (same init round).

    The bound is on the ages the rule sees, not on the staleness of the arrivals: a client whose job is still in
    flight at the end (since_report), or whose cached gradient is old (cache_age), can be older than any arrival's
    staleness. On this schedule tau_algo = max staleness (19) still differs from ACE; ages are at most T + 1."""
    assert 1000 > T + 1
    ace_final = _final("ace", "all_active")
    np.testing.assert_allclose(_final("aced", "all_active", tau_algo=1000.0), ace_final, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_final("aced_cache_age", "all_active", tau_algo=1000.0), ace_final, rtol=1e-5,
                               atol=1e-6)
    a = _reference("all_active", ref.ACEDReference(N, D, ETA, 1000.0), train=_gradient, init_round=True)
    b = _reference("all_active", ref.ACEReference(N, D, ETA), train=_gradient, init_round=True)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_aced_skips_the_step_where_no_client_is_active():
    """The gap schedule: every client reports at every step but GAP. With tau_algo = 0, step GAP still moves x
    (every t_start is GAP: all active on their cached gradients); at GAP + 1 every client arrives, but the activity
    is judged on the timestamps from before this step's resets (all GAP, age 1): nobody is active, x is unchanged."""
    server = ref.ACEDReference(N, D, ETA, 0.0, active="since_report")
    models = _reference("gap", server, train=_gradient, init_round=True)
    assert server.active_counts[GAP] == N and server.active_counts[GAP + 1] == 0
    assert list(server.active_counts.values()).count(0) == 1
    assert np.abs(models[GAP + 1] - models[GAP]).max() > 1e-3
    np.testing.assert_array_equal(models[GAP + 2], models[GAP + 1])
    _assert_close(_final("aced", "gap", tau_algo=0.0), models[-1])
    # Not skipping would have been a different run.
    ace_like = _reference("gap", ref.ACEDReference(N, D, ETA, 1.0), train=_gradient, init_round=True)
    assert _distinguishable(ace_like[-1], models[-1])


def test_aced_server_step_uses_timestamps_from_before_the_resets():
    """One server call on a hand-made state: at step 1 every t_start is 0 (age 1 > tau = 0), so the arrivals are
    cached and their clients' t_start reset to 2, but x does not move; at step 2 with no arrivals, exactly those
    clients are active."""
    alg = aced()
    state = alg.init(jnp.zeros(2), 3)
    assert np.asarray(state.t_start).tolist() == [0, 0, 0]
    meta = ServerMeta(clients=jnp.array([1, 2, -1]), mask=jnp.array([True, True, False]),
                      staleness=jnp.zeros(3, jnp.int32), step=jnp.int32(1), time=jnp.float32(0))
    hp = {"server_lr": jnp.float32(0.5), "tau_algo": jnp.float32(0.0)}
    grads = jnp.array([[1.0, 0.0], [0.0, 4.0], [9.0, 9.0]])
    server = jax.jit(alg.server)
    state = server(state, grads, meta, hp)
    np.testing.assert_array_equal(np.asarray(state.x), [0.0, 0.0])
    assert np.asarray(state.t_start).tolist() == [0, 2, 2]
    empty = meta._replace(clients=jnp.full(3, -1), mask=jnp.zeros(3, bool), step=jnp.int32(2))
    state = server(state, grads, empty, hp)
    np.testing.assert_allclose(np.asarray(state.x), [-0.25, -1.0])  # -0.5 * mean(U_1, U_2)


@pytest.mark.parametrize("name,tau", [("all_active", 1000.0), ("all_active", 0.0),
                                      ("all_active", 3.0), ("immediate", 1.0)])
def test_aced_cache_age_matches_reference(name, tau):
    server = ref.ACEDReference(N, D, ETA, tau, active="cache_age")
    models = _reference(name, server, train=_gradient, init_round=True)
    _assert_close(_final("aced_cache_age", name, tau_algo=tau), models[-1])
    if tau == 0.0:
        skipped = [t for t, count in server.active_counts.items() if count == 0]
        assert skipped  # steps whose arrivals are all stale and no cached gradient is fresh: x stays put
        assert all(np.array_equal(models[t + 1], models[t]) for t in skipped)


# ---------------------------------------------------------------------------------------------------- gradient ASGD
@pytest.mark.parametrize("name,tau_c", [("all_active", 2.0), ("immediate", 1.0)])
def test_delay_adaptive_asgd_matches_reference(name, tau_c):
    models = _reference(name, ref.delay_adaptive_step(0.3, tau_c), train=_gradient)
    _assert_close(_final("delay_adaptive", name), models[-1])
    plain = _reference(name, ref.gradient_asgd_step(0.3), train=_gradient)
    assert _distinguishable(plain[-1], models[-1])  # the staleness damping matters on this schedule


def test_asgd_with_gradient_upload_matches_reference():
    models = _reference("all_active", ref.gradient_asgd_step(0.3), train=_gradient)
    _assert_close(_final("asgd_gradient", "all_active"), models[-1])


# ---------------------------------------------------------------------------------------------------- AREA
def _arrived_memory(name: str, models: list[np.ndarray], train) -> np.ndarray:
    """[n, d]: AREA's y_i after the arrived jobs, from the schedule alone: the local model of client i's last
    arrival (x_init if it never arrived)."""
    s = SCHEDULES[name]
    y = np.tile(X0, (N, 1))
    for t in range(T):
        for c, v in zip(s.arrival_clients[t].tolist(), s.arrival_versions[t].tolist()):
            if c >= 0:
                y[c] = models[v] + train(c, models[v], v)
    return y


def _dispatched_memory(name: str, models: list[np.ndarray], train) -> np.ndarray:
    """[n, d]: y_i after every dispatched job (what clients that train at dispatch hold at the end)."""
    s = SCHEDULES[name]
    y = np.tile(X0, (N, 1))
    jobs = [(c, 0) for c in s.init_clients.tolist()]
    jobs += [(c, t) for t in range(T) for c in s.dispatch_clients[t].tolist()]
    for c, v in jobs:
        if c >= 0:
            y[c] = models[v] + train(c, models[v], v)
    return y


def _memory_leaf(carry_clients, replica: int) -> np.ndarray:
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(carry_clients) if leaf.shape[1:] == (N, D)]
    assert len(leaves) == 1, [leaf.shape for leaf in jax.tree_util.tree_leaves(carry_clients)]
    return np.asarray(leaves[0][replica], np.float64)


@pytest.mark.parametrize("config,name", [("area", "boundary"), ("area_decreasing", "boundary"),
                                         ("area", "immediate"), ("area_decreasing", "immediate"), ("area", "clock")])
def test_area_matches_reference_and_the_model_is_the_mean_of_the_memories(config, name):
    """AREA's server model is the mean of the clients' memories of their arrived jobs. On the "immediate" schedule
    a client is sometimes dispatched twice in one step (it arrives, is picked again, arrives again): its second job
    must upload ``x_new - y`` with the ``y`` its first job just set (0 here: both jobs start from the same model), not
    the memory from before the step."""
    if config == "area_decreasing":
        lrs = ref.area_step_sizes(SCHEDULES[name], LR_C, LR_D)
        assert lrs[0] == LR_C / LR_D and lrs[-1] < lrs[0] / 5
        train = lambda c, start, v: ref.local_delta(MODEL, start, DATA[c], STEPS, lrs[v])
    else:
        train = _delta()
    server = ref.AREAReference(N, X0)
    models = _reference(name, server, train=train, client=server.client)
    # The invariant, in the reference: after every step, x_{t+1} = (1/n) sum_i y_i over the arrived memories.
    for t in range(T):
        np.testing.assert_allclose(models[t + 1], server.mean_y[t], rtol=1e-12, atol=1e-12)
    arrived = _arrived_memory(name, models, train)
    np.testing.assert_allclose(server.y, arrived, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(models[-1], arrived.mean(axis=0), rtol=1e-12, atol=1e-12)
    # The engine: the same final model, i.e. the mean of the arrived memories.
    engine = _final(config, name)
    _assert_close(engine, models[-1])
    np.testing.assert_allclose(engine, arrived.mean(axis=0), rtol=2e-4, atol=2e-5)
    # The engine's clients train at dispatch: their memory already includes the jobs still in flight.
    memory = _memory_leaf(_engine(config).carry.clients, _replica(config, name))
    np.testing.assert_allclose(memory, _dispatched_memory(name, models, train), rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------------------------------- AS-FedAvg, MIFA
def test_as_fedavg_matches_reference():
    models = _reference("immediate", ref.as_fedavg_step())
    _assert_close(_final("as_fedavg", "immediate"), models[-1])


@pytest.mark.parametrize("config,name", [("mifa", "immediate"), ("mifa", "all_active"),
                                         ("mifa_int4", "immediate")])
def test_mifa_matches_reference(config, name):
    kind = "int4" if config == "mifa_int4" else "float32"
    models = _reference(name, ref.MIFAReference(N, D, ETA_MIFA, store=ref.cache_store(kind)))
    _assert_close(_final(config, name), models[-1])
    if kind != "float32":
        exact = _reference(name, ref.MIFAReference(N, D, ETA_MIFA))
        assert _distinguishable(models[-1], exact[-1])


# ---------------------------------------------------------------------------------------------------- MF-CA2FL
@pytest.mark.parametrize("config", ["mf_ca2fl", "mf_ca2fl_fresh"])
@pytest.mark.parametrize("name", ["boundary", "immediate"])
def test_mf_ca2fl_matches_reference(config, name):
    """int8 cache with round-to-nearest: v = hbar + mean(Delta_i - Q_old_i) with the full-precision delta (or its
    quantized value with quantize_fresh); hbar is the mean of the stored rows. On the immediate schedule clients
    arrive twice in a step: the second arrival replaces what the first one stored."""
    fresh = config == "mf_ca2fl_fresh"
    server = ref.CachedCA2FLReference(N, D, ETA_CA2FL, store=ref.cache_store("int8"), quantize_fresh=fresh)
    models = _reference(name, server)
    exact = _reference(name, ref.CachedCA2FLReference(N, D, ETA_CA2FL))
    other = ref.CachedCA2FLReference(N, D, ETA_CA2FL, store=ref.cache_store("int8"), quantize_fresh=not fresh)
    assert _distinguishable(models[-1], exact[-1]) and _distinguishable(models[-1], _reference(name, other)[-1])
    _assert_close(_final(config, name), models[-1])
    out = _engine(config)
    replica = _replica(config, name)
    state = out.carry.server
    np.testing.assert_allclose(np.asarray(state.cache_mean[replica]), server.cache.mean(axis=0), rtol=2e-4,
                               atol=2e-5)


def test_ca2fl_float32_cache_matches_sequential_reference_with_repeated_clients():
    models = _reference("immediate", ref.CachedCA2FLReference(N, D, ETA_CA2FL))
    _assert_close(_final("ca2fl_float32", "immediate"), models[-1])


# ---------------------------------------------------------------------------------------------------- FedAvg limits
@pytest.mark.parametrize("config,name", [
    ("area", "synchronous"), ("as_fedavg", "synchronous"), ("fedbuff", "synchronous"), ("mifa", "synchronous"),
    ("ca2fl_float32", "everyone"), ("ca2fl_float32", "synchronous"), ("mf_ca2fl", "everyone"),
])
def test_full_participation_without_delay_is_fedavg(config, name):
    """Every client reports at every step on the model of that step: AREA, AS-FedAvg, FedBuff (server_lr 1), MIFA
    (server_lr 1) and CA2FL with M = Mc = n reduce to FedAvg. For MF-CA2FL the quantized rows cancel too: with all n
    arriving, hbar - mean_i(Q_old_i) = 0 and v is the mean of the full-precision deltas."""
    fedavg = _fedavg(name)
    _assert_close(_final(config, name), fedavg)


def test_reference_full_participation_limits_are_exact():
    """The same limits in the float64 reference, to rounding."""
    fedavg = _fedavg("synchronous")
    area_server = ref.AREAReference(N, X0)
    cases = [
        _reference("synchronous", area_server, client=area_server.client),
        _reference("synchronous", ref.as_fedavg_step()),
        _reference("synchronous", ref.MIFAReference(N, D, 1.0)),
        _reference("synchronous", ref.CachedCA2FLReference(N, D, 1.0, store=ref.cache_store("int2"))),
    ]
    for models in cases:
        np.testing.assert_allclose(models[-1], fedavg, rtol=1e-10, atol=1e-12)
