"""The papers' own conventions, offered as options beside the project's defaults, against plain references written
here (numpy, float64, arrival by arrival):

* FedAvg weighted by client data size (``fedavg(weights="data_size")``; McMahan et al., AsyncFedED Eq. 38);
* CA2FL and MF-CA2FL normalized by the number of distinct clients (``normalize="distinct"``; the ACE paper's CA2FL
  baseline, Alg. a.3), on a schedule where clients arrive twice in a step;
* the symmetric per-row absmax cache code (``cache_code="absmax"``; ACE digest item 19);
* nearest rounding of the QSGD quantizers (``quant_rounding="nearest"``);
* weight decay on gradient uploads (``g + wd x``), the same term local steps add to deltas.

Full-batch local steps make every job a function of (client, start model), so the engine's final model must equal
the reference's on the same schedule to float32 tolerance. Each configuration is compiled once and run, vmapped, on
its schedules at the same time.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, common_widths, toy_problem
from asyncfl_jax import cli
from asyncfl_jax.algorithms import ServerMeta, ace, ca2fl, fedavg, fedbuff, get_algorithm, make_compressor, mf_ca2fl
from asyncfl_jax.algorithms.cache import dequantize_absmax, make_cache, quantize_absmax
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.engine import make_simulation, resolve_hparams, stack_schedules
from asyncfl_jax.task import task_arrays
from asyncfl_jax.timing import make_schedule

N = 6
T, STEPS, LR = 20, 3, 0.3
DELAYS = TOY_DELAYS
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
ETA = 0.9

TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
D = X0.size
SIZES = {c: len(DATA[c][1]) for c in range(N)}  # n_i, each client's number of training examples


def _schedules():
    raw = {
        "synchronous": make_schedule("synchronous", N, T, DELAYS, seed=1),
        "sampled": make_schedule("synchronous", N, T, DELAYS, seed=2, participants=3),
        # buffer 3 with immediate refill: some clients arrive twice in a step
        "immediate": make_schedule("concurrent", N, T, DELAYS, seed=0, concurrency=5, buffer_size=3,
                                   refill="immediate"),
        "all_active": make_schedule("all_active", N, T, DELAYS, seed=3),
    }
    return common_widths(raw)


SCHEDULES = _schedules()


def _twice(schedule) -> int:
    """Steps in which some client arrives more than once."""
    return sum(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in schedule.arrival_clients)


def test_the_schedules_exercise_the_cases():
    assert len(set(SIZES.values())) > 2  # clients of different sizes: data-size weights differ from uniform ones
    assert _twice(SCHEDULES["immediate"]) >= 2
    assert (SCHEDULES["sampled"].uploads_per_step == 3).all()


# --------------------------------------------------------------------------------------------------- the engine
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_OUTPUTS: dict = {}


def _engine(key: str, build, names: tuple[str, ...], hp: dict) -> list[np.ndarray]:
    """The final models of ``build()`` run on the schedules ``names`` (one compiled, vmapped program; cached)."""
    if key not in _OUTPUTS:
        algorithm = build()
        sched, slots = stack_schedules([SCHEDULES[name] for name in names])
        h = resolve_hparams(algorithm, {"client_lr": LR, **hp})
        hps = {k: jnp.full((len(names),), v, jnp.float32) for k, v in h.items()}
        keys = jnp.stack([jax.random.PRNGKey(i) for i in range(len(names))])
        run = make_simulation(TASK, algorithm, LOCAL, T, slots, eval_every=T)
        args = (sched, hps, keys, task_arrays(TASK))
        compiled = jax.jit(jax.vmap(run, in_axes=(0, 0, 0, None))).lower(*args).compile(compiler_options=FAST_COMPILE)
        params = np.asarray(compiled(*args).params, np.float64)
        _OUTPUTS[key] = [params[i] for i in range(len(names))]
    return _OUTPUTS[key]


def _delta(c, start, version):
    return ref.local_delta(MODEL, start, DATA[c], STEPS, LR)


def _gradient(c, start, version):
    return ref.gradient(MODEL, start, DATA[c])


def _reference(name, server, train=_delta, client=None, init_round=False) -> np.ndarray:
    return ref.replay_steps(SCHEDULES[name], X0, train, server, client=client, init_round=init_round)[-1]


def _assert_close(engine, reference, rtol=2e-4, atol=2e-5):
    np.testing.assert_allclose(engine, reference, rtol=rtol, atol=atol)
    assert np.abs(reference - X0).max() > 1e-2  # the run moved the model: the comparison is not vacuous


def _differ(a, b, rtol=2e-4, atol=2e-5) -> bool:
    return bool((np.abs(a - b) > atol + rtol * np.abs(b)).any())


# --------------------------------------------------------------------------------------------------- FedAvg weights
def fedavg_data_size(server_lr: float):
    """x <- x + eta sum_{k in S_t} n_k Delta_k / sum_{k in S_t} n_k (each arrival counted; unchanged if none)."""

    def step(x, t, arrivals):
        if not arrivals:
            return x
        total = sum(SIZES[a.client] * a.message for a in arrivals)
        return x + server_lr * total / sum(SIZES[a.client] for a in arrivals)

    return step


def fedavg_uniform(server_lr: float):
    def step(x, t, arrivals):
        return x + server_lr * sum(a.message for a in arrivals) / len(arrivals) if arrivals else x

    return step


FEDAVG_RUNS = ("synchronous", "sampled", "immediate")


@pytest.mark.parametrize("i,name", list(enumerate(FEDAVG_RUNS)))
def test_fedavg_weighted_by_data_size_matches_reference(i, name):
    got = _engine("fedavg_data_size", lambda: fedavg(weights="data_size"), FEDAVG_RUNS, {"server_lr": ETA})[i]
    expected = _reference(name, fedavg_data_size(ETA))
    _assert_close(got, expected)
    assert _differ(expected, _reference(name, fedavg_uniform(ETA)))  # the weights change the result


def test_fedavg_uniform_default_is_unchanged():
    got = _engine("fedavg_uniform", lambda: fedavg(), ("sampled",), {"server_lr": ETA})[0]
    _assert_close(got, _reference("sampled", fedavg_uniform(ETA)))
    assert fedavg().options == {"weights": "uniform"}


def test_data_size_weights_need_the_sizes_in_the_meta():
    algorithm = fedavg(weights="data_size")
    meta = ServerMeta(clients=jnp.array([0, 1]), mask=jnp.array([True, True]), staleness=jnp.zeros(2, jnp.int32),
                      step=jnp.int32(0), time=jnp.float32(0.0))
    state = algorithm.init(jnp.zeros(3), 2)
    with pytest.raises(ValueError, match="ServerMeta.sizes"):
        algorithm.server(state, jnp.ones((2, 3)), meta, {"server_lr": jnp.float32(1.0)})
    sized = meta._replace(sizes=jnp.array([1.0, 3.0]))
    out = algorithm.server(state, jnp.array([[4.0, 0, 0], [0, 8.0, 0]]), sized, {"server_lr": jnp.float32(1.0)})
    np.testing.assert_allclose(out.x, [1.0, 6.0, 0.0])  # (1 * [4, 0, 0] + 3 * [0, 8, 0]) / 4


# --------------------------------------------------------------------------------------------------- CA2FL normalize
class CA2FLByDistinct:
    """CA2FL as the ACE paper's baseline (Alg. a.3): for every arrival in order, acc += Delta - h_c, h_c = store(
    Delta); at the step, v = hbar_before + acc / |distinct clients| (or / |arrivals|), x += eta v."""

    def __init__(self, server_lr: float, distinct: bool, store=lambda v: np.array(v, np.float64)):
        self.h = np.zeros((N, D))
        self.lr, self.distinct, self.store = server_lr, distinct, store

    def __call__(self, x, t, arrivals):
        if not arrivals:
            return x
        hbar = self.h.mean(axis=0)
        acc = np.zeros(D)
        for a in arrivals:
            acc += a.message - self.h[a.client]
            self.h[a.client] = self.store(a.message)
        count = len({a.client for a in arrivals}) if self.distinct else len(arrivals)
        return x + self.lr * (hbar + acc / count)


CA2FL_RUNS = ("immediate", "synchronous")


@pytest.mark.parametrize("i,name", list(enumerate(CA2FL_RUNS)))
def test_ca2fl_normalized_by_distinct_clients_matches_reference(i, name):
    got = _engine("ca2fl_distinct", lambda: ca2fl(normalize="distinct"), CA2FL_RUNS, {"server_lr": ETA})[i]
    expected = _reference(name, CA2FLByDistinct(ETA, distinct=True))
    _assert_close(got, expected)
    by_arrivals = _reference(name, CA2FLByDistinct(ETA, distinct=False))
    # the two conventions differ exactly when a client arrives twice in a step
    assert _differ(expected, by_arrivals) == (_twice(SCHEDULES[name]) > 0)


def test_ca2fl_default_normalizes_by_arrivals():
    got = _engine("ca2fl_arrivals", lambda: ca2fl(), ("immediate",), {"server_lr": ETA})[0]
    _assert_close(got, _reference("immediate", CA2FLByDistinct(ETA, distinct=False)))


# --------------------------------------------------------------------------------------------------- absmax code
def absmax_row(v: np.ndarray, bits: int, rounding: str = "nearest", rng=None) -> np.ndarray:
    """Q(v) of the symmetric code in v's dtype: L = 2^(b-1) - 1, s = max|v| / L, q = clip(floor(v / s + r), -L, L)
    with r = 1/2 or U[0, 1), Q = q s; Q(0) = 0."""
    v = np.asarray(v)
    f = v.dtype.type
    top = np.abs(v).max()
    if top == 0:
        return np.zeros_like(v)
    levels = f(2 ** (bits - 1) - 1)
    scale = top / levels
    r = f(0.5) if rounding == "nearest" else rng.random(v.shape).astype(v.dtype)
    return np.clip(np.floor(v / scale + r), -levels, levels) * scale


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_absmax_quantizer_matches_numpy(bits):
    """Nearest rounding against the numpy formula. Not bit for bit (XLA:CPU turns ``v / scale`` into
    ``v * (1 / scale)``, see tests/test_bias_correction.py): the levels agree except within rounding of a half-way
    point, the scale and the values to a few ulps."""
    rng = np.random.default_rng(bits)
    rows = np.concatenate([rng.normal(size=(5, 37)), np.zeros((1, 37)), -np.abs(rng.normal(size=(1, 37)))]
                          ).astype(np.float32)
    rows[0, 3] = 0.0
    q = quantize_absmax(jnp.asarray(rows), bits, "nearest")
    got = np.asarray(dequantize_absmax(q, bits, rows.shape[1]))
    levels = 2 ** (bits - 1) - 1
    top = np.abs(rows.astype(np.float64)).max(axis=1)
    np.testing.assert_allclose(np.asarray(q.scale), top / levels, rtol=1e-6)
    assert q.codes.shape == (7, math.ceil(37 * bits / 8)) and q.scale.dtype == jnp.float32
    assert (got[5] == 0).all() and got[0, 3] == 0  # zero is exact, also in a zero row
    varying = top > 0
    exact = rows[varying].astype(np.float64) / (top[varying] / levels)[:, None] + 0.5
    expected_level = np.clip(np.floor(exact), -levels, levels)
    got_level = got[varying] / np.asarray(q.scale)[varying][:, None]
    np.testing.assert_allclose(got_level, np.round(got_level), atol=1e-4)  # on the grid -L..L
    got_level = np.round(got_level)
    near_half = np.abs(exact - np.round(exact)) < 1e-4
    assert (got_level[~near_half] == expected_level[~near_half]).all()
    assert np.abs(got_level - expected_level).max() <= 1
    assert np.abs(got_level).max() == levels  # the largest entry takes the top level
    np.testing.assert_allclose(got[varying], np.stack([absmax_row(r, bits) for r in rows[varying]]), rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("bits", [8, 2])
def test_absmax_stochastic_rounding_is_unbiased(bits):
    rng = np.random.default_rng(7)
    v = rng.normal(size=16).astype(np.float32)
    draws = np.stack([np.asarray(dequantize_absmax(quantize_absmax(jnp.asarray(np.tile(v, (500, 1))), bits,
                                                                   "stochastic", jax.random.PRNGKey(k)), bits, 16))
                      for k in range(8)]).reshape(-1, 16).astype(np.float64)
    scale = np.abs(v).max() / (2 ** (bits - 1) - 1)
    se = scale / 2 / np.sqrt(len(draws))  # the per-entry standard deviation is at most scale / 2
    assert np.abs(draws.mean(axis=0) - v).max() < 5 * se
    assert np.abs(draws - v).max() <= scale * (1 + 1e-5)  # one of the two neighbouring levels
    assert len(np.unique(draws[:, 0])) == 2 or bits == 8  # it does round both ways


def test_absmax_cache_memory_and_validation():
    d = 1000
    assert make_cache("int8", "nearest", "absmax").bytes_per_client(d) == d + 4  # codes + one float32 scale
    assert make_cache("int4", "nearest", "absmax").bytes_per_client(d) == d // 2 + 4
    assert make_cache("int2", "nearest", "minmax").bytes_per_client(d) == d // 4 + 8  # + lo and scale
    with pytest.raises(ValueError, match="cache_code"):
        make_cache("int8", "nearest", "symmetric")
    with pytest.raises(ValueError, match="applies to the int caches"):
        ace(cache="bfloat16", cache_code="absmax")


def test_ace_absmax_cache_matches_reference():
    got = _engine("ace_absmax", lambda: ace(cache="int8", cache_rounding="nearest", cache_code="absmax"),
                  ("all_active", "immediate"), {"server_lr": 0.5})
    for i, name in enumerate(("all_active", "immediate")):
        expected = _reference(name, ref.ACEReference(N, D, 0.5, store=lambda v: absmax_row(v, 8)), train=_gradient,
                              init_round=True)
        _assert_close(got[i], expected)
        minmax = _reference(name, ref.ACEReference(N, D, 0.5, store=ref.cache_store("int8")), train=_gradient,
                            init_round=True)
        assert _differ(expected, minmax, rtol=0, atol=1e-6)  # the code matters


def test_mf_ca2fl_absmax_distinct_matches_reference():
    """MF-CA2FL with a 4-bit absmax cache and the distinct-client normalization, on the schedule with repeats."""
    got = _engine("mf_ca2fl_absmax", lambda: mf_ca2fl(bits=4, rounding="nearest", code="absmax",
                                                      normalize="distinct"), ("immediate",), {"server_lr": ETA})[0]
    expected = _reference("immediate", CA2FLByDistinct(ETA, True, store=lambda v: absmax_row(v, 4)))
    _assert_close(got, expected)


# --------------------------------------------------------------------------------------------------- weight decay
WD = 0.2


def _decayed_gradient(c, start, version):
    """A gradient upload with coupled weight decay: ``grad F_c(x) + wd x``, the same L2 term a local SGD step adds."""
    return ref.gradient(MODEL, start, DATA[c]) + WD * start


def test_weight_decay_reaches_gradient_uploads_as_it_reaches_local_steps():
    """``weight_decay`` is one L2 term for every upload kind: a delta's local steps use ``g + wd y`` (PyTorch's
    coupled decay) and a gradient upload sends ``g + wd x`` (ACE digest, ambiguity 5)."""
    got = _engine("ace_wd", ace, ("all_active", "immediate"), {"server_lr": 0.5, "weight_decay": WD})
    for i, name in enumerate(("all_active", "immediate")):
        expected = _reference(name, ref.ACEReference(N, D, 0.5), train=_decayed_gradient, init_round=True)
        _assert_close(got[i], expected)
        plain = _reference(name, ref.ACEReference(N, D, 0.5), train=_gradient, init_round=True)
        assert _differ(expected, plain)  # the decay term is there, not ignored
    got = _engine("fedbuff_wd", fedbuff, ("immediate",), {"server_lr": ETA, "weight_decay": WD})[0]
    delta = lambda c, start, version: ref.local_delta(MODEL, start, DATA[c], STEPS, LR, weight_decay=WD)  # noqa: E731
    _assert_close(got, _reference("immediate", fedavg_uniform(ETA), train=delta))  # M = 3 arrivals every step


# --------------------------------------------------------------------------------------------------- QSGD nearest
def qsgd_nearest(v: np.ndarray, levels: int, norm: str) -> np.ndarray:
    """scale sign(v_j) min(floor(s |v_j| / scale + 1/2), s) / s with scale = ||v||_2 or max|v_j|; 0 for v = 0."""
    scale = np.linalg.norm(v) if norm == "l2" else np.abs(v).max()
    if scale == 0:
        return np.zeros_like(v)
    level = np.minimum(np.floor(np.abs(v) / scale * levels + 0.5), levels)
    return np.sign(v) * level * (scale / levels)


def top_k_qsgd_nearest(v: np.ndarray, k: int, levels: int, norm: str) -> np.ndarray:
    idx = np.argsort(-np.abs(v), kind="stable")[:k]
    out = np.zeros_like(v)
    out[idx] = qsgd_nearest(v[idx], levels, norm)
    return out


@pytest.mark.parametrize("name,options,reference", [
    ("qsgd", {"quant_bits": 4}, lambda v: qsgd_nearest(v, 7, "l2")),
    ("qsgd", {"levels": 3, "norm": "max"}, lambda v: qsgd_nearest(v, 3, "max")),
    ("qsgd_max", {"quant_bits": 2}, lambda v: qsgd_nearest(v, 1, "max")),
    ("top_k_qsgd", {"k": 5, "quant_bits": 4}, lambda v: top_k_qsgd_nearest(v, 5, 7, "max")),
    ("top_k_qsgd", {"k": 6, "levels": 2, "norm": "l2"}, lambda v: top_k_qsgd_nearest(v, 6, 2, "l2")),
])
def test_nearest_quantizers_match_reference(name, options, reference):
    comp = make_compressor(name, quant_rounding="nearest", **options)
    assert not comp.stochastic and make_compressor(name, **options).stochastic
    rng = np.random.default_rng(0)
    for v in (rng.normal(size=23), np.zeros(23), np.r_[np.zeros(22), -2.0]):
        got = np.asarray(comp(jnp.asarray(v, jnp.float32), None, {}), np.float64)
        np.testing.assert_allclose(got, reference(v.astype(np.float32).astype(np.float64)), rtol=1e-6, atol=1e-7)
    assert comp.bits(23) == make_compressor(name, **options).bits(23)  # the same code, the same cost


def test_nearest_compression_keeps_no_key_stream():
    algorithm = fedbuff_compressed("nearest")
    assert algorithm.options["quant_rounding"] == "nearest" and "compression_seed" not in algorithm.options
    assert algorithm.init_clients(jnp.zeros(4), 3)[1].key is None
    assert get_algorithm("fedbuff", compressor="qsgd").options["quant_rounding"] == "stochastic"


def fedbuff_compressed(rounding: str):
    return get_algorithm("fedbuff", compressor="top_k_qsgd", k=6, quant_bits=4, quant_rounding=rounding)


def _fedbuff_step(server_lr: float):
    def step(x, t, arrivals):
        return x + server_lr * sum(a.message for a in arrivals) / len(arrivals) if arrivals else x

    return step


QSGD_RUNS = ("immediate", "all_active")


@pytest.mark.parametrize("config,build,compress", [
    ("qsgd_l2", lambda: get_algorithm("fedbuff", compressor="qsgd", quant_bits=4, quant_rounding="nearest"),
     lambda v: qsgd_nearest(v, 7, "l2")),
    ("top_k_qsgd", lambda: fedbuff_compressed("nearest"), lambda v: top_k_qsgd_nearest(v, 6, 7, "max")),
])
def test_fedbuff_with_nearest_quantized_uploads_matches_reference(config, build, compress):
    got = _engine(config, build, QSGD_RUNS, {"server_lr": ETA})
    for i, name in enumerate(QSGD_RUNS):
        expected = _reference(name, _fedbuff_step(ETA), client=lambda c, start, delta: compress(delta))
        _assert_close(got[i], expected)
        assert _differ(expected, _reference(name, _fedbuff_step(ETA)))  # the compression changes the result


# --------------------------------------------------------------------------------------------------- config and CLI
@pytest.mark.parametrize("algorithm,options,expected", [
    ("fedavg", {"weights": "n_k"}, "fedavg weights must be one of ['uniform', 'data_size'], got 'n_k'"),
    ("ca2fl", {"normalize": "clients"}, "ca2fl normalize must be one of ['arrivals', 'distinct']"),
    ("mf_ca2fl", {"normalize": 2}, "ca2fl normalize must be one of"),
    ("mf_ca2fl", {"code": "sym"}, "mf_ca2fl code must be one of ['minmax', 'absmax']"),
    ("ace", {"cache": "int8", "cache_code": "abs"}, "cache_code must be one of ['minmax', 'absmax']"),
    ("aced", {"cache_code": "absmax"}, "cache_code='absmax' applies to the int caches"),
    ("fedbuff", {"compressor": "qsgd", "quant_rounding": "down"}, "quant_rounding must be one of"),
    ("fedbuff", {"compressor": "top_k", "quant_rounding": "nearest"}, "has no option 'quant_rounding'"),
    ("fedbuff", {"quant_rounding": "nearest"}, "need a compressor"),
])
def test_bad_convention_options_are_refused_by_the_config(algorithm, options, expected):
    cfg = ExperimentConfig.from_dict({"runs": [{"algorithm": algorithm, "options": options, "arrivals": 200}]})
    with pytest.raises(ConfigError, match="runs\\[0\\].options") as error:
        validate(cfg)
    assert expected in str(error.value)


def test_good_convention_options_pass_the_config():
    runs = [{"algorithm": "fedavg", "options": {"weights": "data_size"}, "arrivals": 200, "protocol": {
                "name": "synchronous"}},
            {"algorithm": "mf_ca2fl", "options": {"normalize": "distinct", "code": "absmax"}, "arrivals": 200},
            {"algorithm": "ace", "options": {"cache": "int4", "cache_code": "absmax"}, "arrivals": 200,
             "protocol": {"name": "all_active"}},
            {"algorithm": "asynflc_ef", "options": {"compressor": "top_k_qsgd", "quant_rounding": "nearest"},
             "arrivals": 200}]
    validate(ExperimentConfig.from_dict({"runs": runs}))


def test_cli_passes_and_checks_convention_options(capsys):
    assert cli.main(["run", "--no-progress", "--algorithm", "ca2fl", "--option", "normalize=distinct2"]) == 2
    assert "normalize must be one of ['arrivals', 'distinct']" in capsys.readouterr().err
    args = cli._build_parser().parse_args(["run", "--algorithm", "fedavg", "--option", "weights=data_size",
                                           "--protocol", "synchronous"])
    cfg = cli._config_from_args(args)
    validate(cfg)
    assert cfg.runs[0].options == {"weights": "data_size"}


def test_arrival_sizes_are_the_clients_example_counts():
    from asyncfl_jax.engine.jobs import arrival_sizes
    counts = task_arrays(TASK).train.counts
    assert [int(c) for c in counts] == [SIZES[c] for c in range(N)]
    got = arrival_sizes(counts, jnp.array([2, -1, 0, 2]), jnp.array([True, False, True, True]))
    np.testing.assert_array_equal(got, [SIZES[2], 0.0, SIZES[0], SIZES[2]])
