"""Compressors, the compression / error-feedback wrappers and AsynFL, AsynFLC, AsynFLC-EF against float64 references
(tests/reference_compression.py, with tests/reference.py's replay).

Full-batch local steps make every job a function of (client, start model), so with deterministic compressors (top-k,
scaled sign) the engine's final model must equal the reference's on the same schedule to float32 tolerance. Each
configuration is compiled once and run, vmapped, on several schedules (padded to one shape) at the same time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, common_widths, toy_problem
import reference_compression as cref
from asyncfl_jax.algorithms import (COMPRESSORS, REGISTRY, Compressor, ServerMeta, area, asynfl, asynflc, asynflc_ef,
                                    ca2fl, compressed, error_feedback, fedasync, fedbuff, get_algorithm,
                                    make_compressor, message_bits)
from asyncfl_jax.algorithms.compression import CompressionClientState, content_hash, num_kept
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import make_simulation, resolve_hparams, stack_schedules
from asyncfl_jax.task import task_arrays
from asyncfl_jax.timing import make_schedule

N = 8
T, STEPS, LR = 30, 3, 0.3
DELAYS = TOY_DELAYS
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
ETA = 3.0  # eta_g with the paper's 1/n normalization (n = 8)
FRACTION = 0.25  # top-k keeps ceil(0.25 * 18) = 5 of the 18 parameters
ETA_FEDBUFF, ETA_CA2FL = 0.8, 0.9


TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
D = X0.size
K = num_kept(D, FRACTION)


# ---------------------------------------------------------------------------------------------------- schedules
def _schedules():
    raw = {
        "all_active": make_schedule("all_active", N, T, DELAYS, seed=3),
        # buffer 3 with immediate refill: clients arrive twice in a step, and are dispatched twice in a step.
        "immediate": make_schedule("concurrent", N, T, DELAYS, seed=0, concurrency=6, buffer_size=3,
                                   refill="immediate"),
        "boundary": make_schedule("concurrent", N, T, DELAYS, seed=2, concurrency=5, buffer_size=2,
                                  refill="boundary"),
        # the paper's waiting window: all clients train, the server aggregates whatever arrived every period
        # (a varying |S_t|, some steps empty).
        "window": make_schedule("all_active", N, T, DELAYS, seed=5, aggregation="periodic", period=0.7),
    }
    return common_widths(raw)


SCHEDULES = _schedules()
NAMES = list(SCHEDULES)


def _duplicates(a: np.ndarray) -> int:
    """Number of steps in which some client appears twice in a row of ``a`` ([T, width], -1 = padding)."""
    return sum(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in a)


def test_schedules_exercise_the_cases():
    s = SCHEDULES
    assert s["all_active"].staleness.max() > 3 and s["boundary"].staleness.max() > 3
    assert _duplicates(s["immediate"].arrival_clients) > 0 and _duplicates(s["immediate"].dispatch_clients) > 0
    window = s["window"].uploads_per_step
    assert (window == 0).any() and window.max() > 1


# --------------------------------------------------------------------------------------------------- running the engine
TOPK = {"compressor": "top_k", "fraction": FRACTION}
CONFIGS = {
    "asynfl": (lambda: asynfl(), [(name, {"server_lr": ETA}) for name in NAMES]),
    "asynflc_top_k": (lambda: asynflc(**TOPK), [(name, {"server_lr": ETA}) for name in NAMES]),
    "asynflc_ef_top_k": (lambda: asynflc_ef(**TOPK), [(name, {"server_lr": ETA}) for name in NAMES]),
    "asynflc_ef_sign": (lambda: asynflc_ef("sign"), [("all_active", {"server_lr": ETA}),
                                                     ("immediate", {"server_lr": ETA})]),
    "asynflc_ef_identity": (lambda: asynflc_ef("identity"), [(name, {"server_lr": ETA}) for name in NAMES]),
    "fedbuff_ef": (lambda: get_algorithm("fedbuff", error_feedback=True, **TOPK),
                   [("immediate", {"server_lr": ETA_FEDBUFF}), ("boundary", {"server_lr": ETA_FEDBUFF})]),
    "ca2fl_compressed": (lambda: get_algorithm("ca2fl", **TOPK),
                         [("immediate", {"server_lr": ETA_CA2FL}), ("boundary", {"server_lr": ETA_CA2FL})]),
    "area_ef": (lambda: error_feedback(area(), "top_k", fraction=FRACTION), [("immediate", {}), ("boundary", {})]),
    # a stochastic compressor: it runs, reproducibly, with a key stream per client
    "asynflc_ef_top_k_qsgd": (lambda: asynflc_ef("top_k_qsgd", fraction=FRACTION, quant_bits=2),
                              [("all_active", {"server_lr": ETA}), ("immediate", {"server_lr": ETA}),
                               ("immediate", {"server_lr": ETA})]),
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


def _replica(config: str, name: str) -> int:
    return next(i for i, (s, _) in enumerate(CONFIGS[config][1]) if s == name)


def _final(config: str, name: str, replica: int | None = None) -> np.ndarray:
    r = _replica(config, name) if replica is None else replica
    return np.asarray(_engine(config).params[r], np.float64)


def _own_state(config: str, replica: int) -> CompressionClientState:
    """The compression wrapper's client state of one replica."""
    inner, own = _engine(config).carry.clients
    return jax.tree_util.tree_map(lambda a: np.asarray(a[replica]), own)


def _assert_close(engine, reference, rtol=2e-4, atol=2e-5):
    np.testing.assert_allclose(engine, reference, rtol=rtol, atol=atol)
    assert np.abs(reference - X0).max() > 1e-2  # the run moved the model: the comparison is not vacuous


def _distinguishable(a, b, rtol=2e-4, atol=2e-5) -> bool:
    return bool((np.abs(a - b) > atol + rtol * np.abs(b)).any())


# ---------------------------------------------------------------------------------------------------- references
def _delta(c, start, version):
    return ref.local_delta(MODEL, start, DATA[c], STEPS, LR)


def _reference(name, server, client=None) -> list[np.ndarray]:
    return ref.replay_steps(SCHEDULES[name], X0, _delta, server, client=client)


def _top_k(v):
    return cref.top_k(v, cref.kept(D, fraction=FRACTION))


def _ef_memory_at_end(name: str, models: list[np.ndarray], compress, inner=None) -> np.ndarray:
    """e_i after every *dispatched* job, in dispatch order (the engine compresses at dispatch)."""
    client = cref.ErrorFeedbackClient(N, D, compress, inner=inner)
    for c, v in cref.dispatched_jobs(SCHEDULES[name]):
        client(c, models[v], _delta(c, models[v], v))
    return client.e


# ---------------------------------------------------------------------------------------------------- AsynFL family
@pytest.mark.parametrize("name", NAMES)
def test_asynfl_matches_reference(name):
    """x_{t+1} = x_t + (eta_g / n) sum_{S_t} Delta_i: 1/n, not 1/|S_t| (Eq. 5)."""
    models = _reference(name, cref.asynfl_step(ETA, N))
    _assert_close(_final("asynfl", name), models[-1])
    by_arrivals = _reference(name, cref.asynfl_step(ETA, N, "arrivals"))
    assert _distinguishable(models[-1], by_arrivals[-1])


@pytest.mark.parametrize("normalization", ["clients", "arrivals"])
def test_asynfl_server_step(normalization):
    """One server call: the masked arrivals' deltas, summed, times eta_g / n (or / |S_t|); no arrival, no change."""
    alg = asynfl(normalization=normalization)
    state = alg.init(jnp.ones(3, jnp.float32), 8)
    deltas = jnp.array([[1.0, 2.0, 0.0], [3.0, 0.0, -1.0], [100.0, 100.0, 100.0]])
    meta = ServerMeta(clients=jnp.array([4, 1, -1]), mask=jnp.array([True, True, False]),
                      staleness=jnp.array([0, 5, 0]), step=jnp.int32(3), time=jnp.float32(1.0))
    server = jax.jit(alg.server)
    out = server(state, deltas, meta, {"server_lr": jnp.float32(2.0)})
    z = 8 if normalization == "clients" else 2
    np.testing.assert_allclose(np.asarray(out.x), 1.0 + 2.0 * np.array([4.0, 2.0, -1.0]) / z, rtol=1e-6)
    empty = meta._replace(clients=jnp.full(3, -1), mask=jnp.zeros(3, bool))
    np.testing.assert_array_equal(np.asarray(server(state, deltas, empty, {"server_lr": jnp.float32(2.0)}).x), 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_asynflc_top_k_matches_reference(name):
    """AsynFLC: x += (eta_g / n) sum C(Delta_i), no memory (Eq. 7)."""
    models = _reference(name, cref.asynfl_step(ETA, N), client=cref.CompressedClient(_top_k))
    _assert_close(_final("asynflc_top_k", name), models[-1])
    assert _distinguishable(models[-1], _reference(name, cref.asynfl_step(ETA, N))[-1])
    inner, own = _engine("asynflc_top_k").carry.clients
    assert not jax.tree_util.tree_leaves((inner, own))  # deterministic, no error feedback: no client state


EF_COMPRESSORS = {"asynflc_ef_top_k": _top_k, "asynflc_ef_sign": cref.scaled_sign}


@pytest.mark.parametrize("config,name", [(c, s) for c in EF_COMPRESSORS for s, _ in CONFIGS[c][1]])
def test_asynflc_ef_matches_reference(config, name):
    """AsynFLC-EF: client i sends C(Delta + e_i), e_i <- e_i + Delta - C(Delta + e_i) (Eqs. 8-10). The engine's e_i
    (after every dispatched job, including those still in flight) equals the reference's in dispatch order."""
    compress = EF_COMPRESSORS[config]
    client = cref.ErrorFeedbackClient(N, D, compress)
    models = _reference(name, cref.asynfl_step(ETA, N), client=client)
    _assert_close(_final(config, name), models[-1])
    no_ef = _reference(name, cref.asynfl_step(ETA, N), client=cref.CompressedClient(compress))
    assert _distinguishable(models[-1], no_ef[-1])  # error feedback changes the run
    own = _own_state(config, _replica(config, name))
    assert own.key is None and own.jobs is None  # deterministic compressors keep no key stream
    memory = _ef_memory_at_end(name, models, compress)
    assert np.abs(memory).max() > 1e-3
    np.testing.assert_allclose(own.error, memory, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", NAMES)
def test_error_feedback_with_identity_is_no_compression(name):
    np.testing.assert_allclose(_final("asynflc_ef_identity", name), _final("asynfl", name), rtol=1e-6, atol=1e-7)
    assert not np.asarray(_own_state("asynflc_ef_identity", _replica("asynflc_ef_identity", name)).error).any()


# ---------------------------------------------------------------------------------------------------- other algorithms
@pytest.mark.parametrize("name", ["immediate", "boundary"])
def test_fedbuff_with_error_feedback_matches_reference(name):
    step = cref.tuple_step(ref.fedbuff_step(ETA_FEDBUFF))
    models = _reference(name, step, client=cref.ErrorFeedbackClient(N, D, _top_k))
    _assert_close(_final("fedbuff_ef", name), models[-1])
    assert _distinguishable(models[-1], _reference(name, step)[-1])


@pytest.mark.parametrize("name", ["immediate", "boundary"])
def test_ca2fl_with_compressed_uploads_matches_reference(name):
    """The server caches the compressed deltas: h_i = C(Delta_i)."""
    server = ref.CachedCA2FLReference(N, D, ETA_CA2FL)
    models = _reference(name, server, client=cref.CompressedClient(_top_k))
    _assert_close(_final("ca2fl_compressed", name), models[-1])
    assert _distinguishable(models[-1], _reference(name, ref.CachedCA2FLReference(N, D, ETA_CA2FL))[-1])


@pytest.mark.parametrize("name", ["immediate", "boundary"])
def test_area_with_error_feedback_composes_client_states(name):
    """AREA's memory y_i and the EF residual e_i both live on the clients: the message is C(x_new - y_i + e_i)."""
    area_ref = ref.AREAReference(N, X0)
    models = _reference(name, area_ref, client=cref.ErrorFeedbackClient(N, D, _top_k, inner=area_ref.client))
    _assert_close(_final("area_ef", name), models[-1])
    plain = ref.AREAReference(N, X0)
    assert _distinguishable(models[-1], _reference(name, plain, client=plain.client)[-1])
    inner, own = _engine("area_ef").carry.clients
    r = _replica("area_ef", name)
    assert inner.shape[1:] == (N, D) and own.error.shape[1:] == (N, D)
    dispatched = ref.AREAReference(N, X0)
    memory = _ef_memory_at_end(name, models, _top_k, inner=dispatched.client)
    np.testing.assert_allclose(np.asarray(own.error[r]), memory, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(inner[r]), dispatched.y, rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------------------------------- stochastic runs
def test_stochastic_compression_runs_with_a_key_stream_per_client():
    """top-k + 2-bit quantization with EF: finite, different from the deterministic runs; every client counts the
    jobs it compressed; the same schedule and seed give the same run (replicas 1 and 2)."""
    config = "asynflc_ef_top_k_qsgd"
    out = _engine(config)
    assert (np.asarray(out.diverged_at) == -1).all()
    for r, (name, _) in enumerate(CONFIGS[config][1]):
        final = _final(config, name, r)
        assert np.isfinite(final).all() and np.abs(final - X0).max() > 1e-2
        assert _distinguishable(final, _final("asynfl", name))
        assert _distinguishable(final, _final("asynflc_ef_top_k", name))
        own = _own_state(config, r)
        jobs = np.bincount([c for c, _ in cref.dispatched_jobs(SCHEDULES[name])], minlength=N)
        np.testing.assert_array_equal(own.jobs, jobs)
        assert len({tuple(k) for k in own.key.tolist()}) == N  # one key stream per client
        assert np.abs(own.error).max() > 0
    np.testing.assert_array_equal(np.asarray(out.params[1]), np.asarray(out.params[2]))


@pytest.mark.parametrize("ef", [True, False])
def test_stochastic_client_draws_from_its_key_stream(ef):
    """The client with a stochastic compressor, job by job: the message is C(Delta + e) (e = 0 without error
    feedback) with the key ``fold_in(fold_in(base_c, jobs_c), hash(Delta + e))``, base_c =
    ``fold_in(PRNGKey(compression_seed), c)``; then e <- Delta + e - message and jobs_c += 1."""
    wrap = asynflc_ef if ef else asynflc
    alg = wrap("top_k_qsgd", fraction=FRACTION, quant_bits=2, compression_seed=7)
    comp = make_compressor("top_k_qsgd", fraction=FRACTION, quant_bits=2)
    state = alg.init_clients(jnp.zeros(D, jnp.float32), N)
    assert (state[1].error is not None) == ef

    @jax.jit
    def job(row, delta):
        message, new_row = alg.client(jnp.zeros(D), delta, row, {})
        v = delta + row[1].error if ef else delta
        key = jax.random.fold_in(jax.random.fold_in(row[1].key, row[1].jobs), content_hash(v))
        return message, new_row, v, comp(v, key, {})

    rng = np.random.default_rng(0)
    messages = []
    for c in (0, 3, 3):
        row = jax.tree_util.tree_map(lambda a: a[c], state)
        message, new_row, v, expected = job(row, jnp.asarray(rng.normal(size=D), jnp.float32))
        np.testing.assert_array_equal(np.asarray(message), np.asarray(expected))
        assert (np.asarray(message) != 0).sum() <= K and np.asarray(message).any()
        if ef:
            np.testing.assert_allclose(np.asarray(new_row[1].error), np.asarray(v - message), rtol=1e-6, atol=1e-7)
        assert int(new_row[1].jobs) == int(row[1].jobs) + 1
        state = jax.tree_util.tree_map(lambda a, r: a.at[c].set(r), state, new_row)
        messages.append(np.asarray(message))
    np.testing.assert_array_equal(np.asarray(state[1].key[3]),
                                  np.asarray(jax.random.fold_in(jax.random.PRNGKey(7), 3)))
    assert np.asarray(state[1].jobs).tolist() == [1, 0, 0, 2, 0, 0, 0, 0]


# ---------------------------------------------------------------------------------------------------- compressors
def _vector(seed=0, d=200):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=d) * rng.uniform(0.1, 3.0, size=d)).astype(np.float32)


@pytest.mark.parametrize("d,options,k", [(200, {"fraction": 0.03}, 6), (200, {"k": 17}, 17),
                                         (100, {"fraction": 0.03}, 3), (7, {"fraction": 0.01}, 1),
                                         (10, {"fraction": 1.0}, 10)])
def test_top_k_keeps_exactly_k_largest(d, options, k):
    comp = make_compressor("top_k", **options)
    v = _vector(d=d)
    ties_in = np.where(np.arange(d) % 2, 1.0, -1.0).astype(np.float32)
    out, ties = np.asarray(jax.jit(jax.vmap(lambda x: comp(x, None, {})))(jnp.asarray(np.stack([v, ties_in]))))
    assert (out != 0).sum() == k
    kept = out != 0
    np.testing.assert_array_equal(out[kept], v[kept])
    assert np.abs(v[~kept]).max(initial=0) <= np.abs(v[kept]).min()
    np.testing.assert_array_equal(out, cref.top_k(v.astype(np.float64), k).astype(np.float32))
    # ties: exactly k entries even when all magnitudes are equal, the lower indices first
    assert (ties != 0).sum() == k and (ties[:k] != 0).all()


def test_deterministic_compressors_ignore_the_key():
    v = jnp.asarray(_vector())
    for name in ("identity", "top_k", "sign"):
        comp = make_compressor(name)
        assert not comp.stochastic
        a, b = comp(v, jax.random.PRNGKey(0), {}), comp(v, None, {})
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name in ("random_k", "qsgd", "qsgd_max", "top_k_qsgd"):
        assert make_compressor(name).stochastic


def _draws(comps, v, count=4000, seed=0):
    """``count`` draws of each compressor in ``comps`` (one compressor: its draws) on ``v``, keys shared."""
    single = isinstance(comps, Compressor)  # (a NamedTuple: not a list of compressors)
    comps = [comps] if single else comps
    keys = jax.random.split(jax.random.PRNGKey(seed), count)
    fn = jax.vmap(lambda k: [c(jnp.asarray(v), k, {}) for c in comps])
    out = jax.jit(fn).lower(keys).compile(compiler_options=FAST_COMPILE)(keys)
    out = [np.asarray(o, np.float64) for o in out]
    return out[0] if single else out


@pytest.mark.parametrize("name,options,levels", [("qsgd", {"quant_bits": 4}, 7), ("qsgd", {"quant_bits": 2}, 1),
                                                 ("qsgd", {"levels": 3}, 3), ("qsgd_max", {"quant_bits": 2}, 1),
                                                 ("qsgd_max", {"quant_bits": 8}, 127)])
def test_qsgd_is_unbiased_with_bounded_variance(name, options, levels):
    """Each entry is rounded to one of its two neighbouring levels of scale/s, with probabilities that make
    E[Q(v)] = v; per entry Var <= (scale/s)^2 / 4, so the mean of N draws is within 5 sigma of v; and QSGD's bound
    E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 holds."""
    v = _vector(seed=1, d=50)
    x = v.astype(np.float64)
    comp = make_compressor(name, **options)
    draws = _draws(comp, v)
    scale = np.linalg.norm(x) if name == "qsgd" else np.abs(x).max()
    step = scale / levels
    codes = np.abs(draws) / step
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)  # on the grid
    assert (np.abs(draws - x) <= step * (1 + 1e-5)).all()  # one of the two neighbours
    assert ((np.sign(draws) == np.sign(x)) | (draws == 0)).all()
    sigma = step / 2 / np.sqrt(draws.shape[0])
    assert (np.abs(draws.mean(axis=0) - x) <= 5 * sigma + 1e-6).all()
    assert (draws.var(axis=0) <= step ** 2 / 4 * 1.1 + 1e-9).all()
    assert draws.var(axis=0).max() > step ** 2 / 100  # it does round randomly
    error = ((draws - x) ** 2).sum(axis=1).mean()
    if name == "qsgd":
        d = v.size
        assert error <= min(d / levels ** 2, math.sqrt(d) / levels) * (x ** 2).sum()


@pytest.mark.parametrize("norm", ["max", "l2"])
def test_top_k_qsgd_quantizes_the_kept_entries_unbiasedly(norm):
    v = _vector(seed=2, d=60)
    x = v.astype(np.float64)
    k = 9
    comp = make_compressor("top_k_qsgd", k=k, quant_bits=2, norm=norm)
    scaled = make_compressor("top_k_qsgd", k=k, quant_bits=2, norm=norm, basu_scaled=True)
    draws, scaled_draws = _draws([comp, scaled], v)
    support = cref.top_k(x, k) != 0
    assert not draws[:, ~support].any()
    kept = x[support]
    scale = np.abs(kept).max() if norm == "max" else np.linalg.norm(kept)
    sigma = scale / 2 / np.sqrt(draws.shape[0])  # s = 1 level
    np.testing.assert_allclose(draws.mean(axis=0), cref.top_k(x, k), atol=5 * sigma + 1e-6)
    beta = min(k / 1.0, math.sqrt(k) / 1.0)  # s = 1
    np.testing.assert_allclose(scaled_draws, draws / (1 + beta), rtol=1e-6)


def test_scaled_sign_has_the_l1_scale():
    v = _vector(seed=3, d=101)
    v[5] = 0.0
    out = np.asarray(make_compressor("sign")(jnp.asarray(v), None, {}), np.float64)
    x = v.astype(np.float64)
    np.testing.assert_allclose(np.abs(out), np.abs(x).sum() / x.size, rtol=1e-5)  # every entry ||v||_1 / d
    np.testing.assert_allclose(np.abs(out).sum(), np.abs(x).sum(), rtol=1e-5)  # ||C(v)||_1 = ||v||_1
    np.testing.assert_allclose(np.linalg.norm(out), np.abs(x).sum() / np.sqrt(x.size), rtol=1e-5)
    assert (np.sign(out) == np.where(x >= 0, 1, -1)).all()  # sign(0) = +1
    np.testing.assert_allclose(out, cref.scaled_sign(x), rtol=1e-5)
    unscaled = np.asarray(make_compressor("sign", scaled=False)(jnp.asarray(v), None, {}))
    assert set(np.unique(unscaled).tolist()) == {-1.0, 1.0}


def test_random_k_is_unbiased_with_scaling_and_a_contraction_without():
    v = _vector(seed=4, d=40)
    x = v.astype(np.float64)
    d, k = v.size, 10
    scaled, plain = _draws([make_compressor("random_k", k=k, unbiased=True), make_compressor("random_k", k=k)], v)
    assert ((scaled != 0).sum(axis=1) == k).all()
    np.testing.assert_allclose(scaled[scaled != 0], (np.broadcast_to(x, scaled.shape) * d / k)[scaled != 0],
                               rtol=1e-6)
    sigma = np.abs(x) * np.sqrt(d / k - 1) / np.sqrt(scaled.shape[0])  # Var of one entry: v_j^2 (d/k - 1)
    assert (np.abs(scaled.mean(axis=0) - x) <= 5 * sigma + 1e-6).all()
    assert ((plain != 0).sum(axis=1) == k).all()
    np.testing.assert_allclose(plain.mean(axis=0), x * k / d, atol=5 * np.abs(x).max() / np.sqrt(plain.shape[0]))
    # E||v - C(v)||^2 = (1 - k/d) ||v||^2
    np.testing.assert_allclose(((plain - x) ** 2).sum(axis=1).mean(), (1 - k / d) * (x ** 2).sum(), rtol=0.05)
    # each coordinate is kept with probability k/d
    np.testing.assert_allclose((plain != 0).mean(axis=0), k / d, atol=5 * math.sqrt(0.25 * 0.75 / plain.shape[0]))


def test_zero_vector_compresses_to_zero():
    outs = _draws([make_compressor(name) for name in COMPRESSORS], np.zeros(30, np.float32), count=2)
    for out in outs:
        assert np.isfinite(out).all() and not out.any()


# ---------------------------------------------------------------------------------------------------- bits
def test_message_bits():
    d = 1000
    idx = 10  # ceil(log2 1000)
    assert message_bits(fedbuff(), d) == (32 * d, 0)
    assert message_bits(asynfl(), d) == (32 * d, 0)
    assert message_bits(asynflc("identity"), d) == (32 * d, 0)
    assert message_bits(asynflc(), d) == (32 * 30, 30 * idx)  # top3
    assert message_bits(asynflc_ef(k=64), d) == (32 * 64, 64 * idx)
    assert message_bits(asynflc("random_k", fraction=0.1), d) == (32 * 100, 100 * idx)
    assert message_bits(asynflc("qsgd"), d) == (4 * d + 32, 0)  # Q4b
    assert message_bits(asynflc("qsgd", quant_bits=2), d) == (2 * d + 32, 0)
    assert message_bits(asynflc("qsgd_max", quant_bits=8), d) == (8 * d + 32, 0)
    assert message_bits(asynflc("qsgd", levels=3), d) == (3 * d + 32, 0)  # sign + 2 bits for {0..3}
    assert message_bits(asynflc("sign"), d) == (d + 32, 0)
    assert message_bits(asynflc("sign", scaled=False), d) == (d, 0)
    assert message_bits(asynflc_ef("top_k_qsgd", fraction=0.06, quant_bits=4), d) == (4 * 60 + 32, 60 * idx)
    assert message_bits(get_algorithm("ca2fl", compressor="top_k", k=5), 1024) == (32 * 5, 5 * 10)
    assert message_bits(get_algorithm("mf_ca2fl", bits=4), d) == (32 * d, 0)  # a server-side cache, not the upload
    assert make_compressor("top_k", fraction=0.03).bits(100) == (96, 3 * 7)
    options = dict(asynflc_ef(k=64).options)  # e.g. a History's algorithm_options
    assert message_bits(options, d) == (32 * 64, 64 * idx) and message_bits(dict(fedbuff().options), d) == (32 * d, 0)
    assert make_compressor("top_k").bits(1) == (32, 0)


# ---------------------------------------------------------------------------------------------------- construction
def test_wrapping_sets_name_options_and_hyperparameters():
    a = get_algorithm("fedbuff", compressor="top_k", fraction=0.01, error_feedback=True, staleness="inverse_sqrt")
    assert a.name == "fedbuff_ef"
    assert dict(a.options) == {"staleness": "inverse_sqrt", "normalization": "buffer", "compressor": "top_k",
                               "fraction": 0.01, "k": None, "error_feedback": True}
    assert dict(a.hyperparams) == dict(fedbuff(staleness="inverse_sqrt").hyperparams)
    assert "compressor" not in get_algorithm("fedbuff").options
    assert get_algorithm("ca2fl", compressor="top_k").name == "ca2fl_compressed"
    assert get_algorithm("asynfl", compressor="sign").name == "asynflc"
    assert get_algorithm("asynfl", compressor="sign", error_feedback=True).name == "asynflc_ef"
    c = asynflc_ef("qsgd", quant_bits=8, compression_seed=3)
    assert c.name == "asynflc_ef" and c.options["compression_seed"] == 3 and c.options["quant_bits"] == 8
    assert "compression_seed" not in asynflc_ef().options
    assert asynflc().options["compressor"] == "top_k" and asynflc().options["fraction"] == 0.03
    assert dict(asynflc().hyperparams) == {"server_lr": 10.0}  # AsynFL's default (docs/defaults.md)
    assert compressed(asynfl(), "sign", name="mine").name == "mine"
    assert get_algorithm("fedbuff", compressor="top_k", k=np.int64(3)).options["k"] == 3  # plain int in options
    for name in ("asynfl", "asynflc", "asynflc_ef"):
        assert name in REGISTRY and REGISTRY[name]().name == name
    assert REGISTRY["fedbuff"].__doc__ == fedbuff.__doc__


@pytest.mark.parametrize("name,options,match", [
    ("fedbuff", {"fraction": 0.1}, "need a compressor"),
    ("fedbuff", {"error_feedback": True}, "need a compressor"),
    ("fedbuff", {"compressor": "top_k", "quant_bits": 4}, "no option 'quant_bits'"),
    ("fedbuff", {"compressor": "gzip"}, "compressor must be one of"),
    ("fedbuff", {"compressor": "top_k", "fraction": 0.0}, "fraction"),
    ("fedbuff", {"compressor": "top_k", "fraction": 0.1, "k": 3}, "not both"),
    ("fedbuff", {"compressor": "qsgd", "quant_bits": 1}, "quant_bits"),
    ("fedbuff", {"compressor": "qsgd", "norm": "l1"}, "norm"),
    ("fedbuff", {"compressor": "top_k", "k": 2.5}, "k must be an integer"),
    ("fedbuff", {"compressor": "sign", "scaled": "yes"}, "scaled must be true or false"),
    ("fedasync", {"compressor": "top_k"}, "local model"),
    ("as_fedavg", {"compressor": "top_k"}, "local model"),
    ("asynflc", {"error_feedback": True}, "asynflc has no error feedback"),
    ("asynflc_ef", {"error_feedback": False}, "asynflc_ef is AsynFLC with error feedback"),
])
def test_invalid_compression_options(name, options, match):
    with pytest.raises(ValueError, match=match):
        get_algorithm(name, **options)


def test_cannot_wrap_twice():
    with pytest.raises(ValueError, match="already compresses"):
        error_feedback(asynflc(), "top_k")
    with pytest.raises(ValueError, match="local model"):
        compressed(fedasync())
    assert ca2fl().options.get("compressor") is None


def test_history_counts_upload_bits_and_the_volume_to_reach_an_accuracy():
    """Communication accounting: bits per message from the compressor, cumulative bits, and ``to_reach``."""
    from asyncfl_jax.engine import simulate

    schedule = make_schedule("all_active", N, 30, DELAYS, seed=3)
    d = TASK.model.num_params
    plain = simulate(TASK, asynfl(), schedule, local=LocalConfig(steps=2, batch_size=None),
                     hparams={"client_lr": 0.3}, eval_every=5, progress=False)
    sparse = simulate(TASK, asynflc_ef(compressor="top_k", k=3), schedule, local=LocalConfig(steps=2, batch_size=None),
                      hparams={"client_lr": 0.3}, eval_every=5, progress=False)
    index_bits = 3 * int(np.ceil(np.log2(d)))
    assert plain.message_bits == {"payload": 32 * d, "index": 0}
    assert sparse.message_bits == {"payload": 32 * 3, "index": index_bits}
    np.testing.assert_array_equal(sparse.upload_bits, sparse.uploads * 96.0)
    np.testing.assert_array_equal(sparse.upload_bits_with_index, sparse.uploads * (96.0 + index_bits))
    acc = plain.metrics["test_accuracy"][0]
    target = float(np.max(acc))
    first = int(np.argmax(acc >= target))
    assert plain.to_reach(target)[0] == plain.uploads[0, first] * 32.0 * d
    assert plain.to_reach(target, by="step")[0] == plain.steps[first]
    assert np.isnan(plain.to_reach(1.5)[0])  # never reached
    assert plain.summary()["upload_bits"] == [float(plain.uploads[0, -1] * 32 * d)]
