"""float64 runs (``simulate(..., precision="float64")``) against the independent float64 numpy reference.

On a tiny full-batch problem a float64 run agrees with the reference (tests/reference.py, float64 throughout) to
~1e-12, where the float32 run of the same configuration agrees only to float32 rounding (~1e-7). The schedule has a
client arriving twice in one step. ``jax_enable_x64`` is set for the float64 run only (``jax.enable_x64``, restored
afterwards): the tests check that the flag is back and that a float32 run after a float64 one is unchanged, bit for
bit, so nothing leaks into the other tests of the worker.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, toy_problem
from asyncfl_jax import cli
from asyncfl_jax.algorithms import REGISTRY, ace, ca2fl, fedbuff, get_algorithm, with_server_optimizer
from asyncfl_jax.algorithms.compression import error_feedback
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.engine import prepare_run, simulate
from asyncfl_jax.precision import cast_task, check_precision
from asyncfl_jax.timing import DelayModel, make_schedule

N, T, STEPS, LR = 5, 12, 3, 0.3
TASK, DATA, X0 = toy_problem(N)
MODEL = ref.LogReg(FEATURES, CLASSES)
LOCAL = LocalConfig(steps=STEPS, batch_size=None)
# Immediate refill with a buffer of 3: some client arrives twice in one step.
SCHEDULE = make_schedule("concurrent", N, T, TOY_DELAYS, seed=0, concurrency=5, buffer_size=3, refill="immediate")
SYNC = make_schedule("synchronous", N, 4, DelayModel(), seed=0)


def _twice_in_a_step(schedule) -> bool:
    rows = schedule.arrival_clients
    return any(len(set(r[r >= 0].tolist())) < int((r >= 0).sum()) for r in rows)


def _delta(c, start, version):
    return ref.local_delta(MODEL, start, DATA[c], STEPS, LR)


def _gradient(c, start, version):
    return ref.gradient(MODEL, start, DATA[c])


# name -> (algorithm, its hyper-parameters, the reference's final model)
CASES = {
    "fedbuff": (fedbuff, {"server_lr": 0.7},
                lambda: ref.replay_steps(SCHEDULE, X0, _delta, lambda x, t, a: ref.fedbuff_step(0.7)(
                    x, [(b.client, b.staleness, b.message, b.start) for b in a]))[-1]),
    "ca2fl": (ca2fl, {"server_lr": 0.9},
              lambda: ref.replay_steps(SCHEDULE, X0, _delta, ref.CachedCA2FLReference(N, X0.size, 0.9))[-1]),
    "ace": (ace, {"server_lr": 0.5},
            lambda: ref.replay_steps(SCHEDULE, X0, _gradient, ref.ACEReference(N, X0.size, 0.5),
                                     init_round=True)[-1]),
}


def _run(make, hparams, precision, **kw):
    return simulate(TASK, make(**kw), SCHEDULE, LOCAL, hparams={"client_lr": LR, **hparams}, eval_every=5,
                    progress=False, precision=precision)


def test_the_schedule_has_a_client_arriving_twice_in_a_step():
    assert _twice_in_a_step(SCHEDULE)


@pytest.mark.parametrize("name", sorted(CASES))
def test_float64_run_matches_the_float64_reference_where_float32_only_rounds(name):
    make, hparams, reference = CASES[name]
    expected = reference()
    assert np.abs(expected - X0).max() > 1e-2  # the run moved the model: the comparison is not vacuous
    run64, run32 = _run(make, hparams, "float64"), _run(make, hparams, "float32")
    assert run64.precision == "float64" and run32.precision == "float32"
    assert run64.final_params.dtype == np.float64 and run32.final_params.dtype == np.float32
    assert all(v.dtype == np.float64 for v in run64.metrics.values())
    err64 = np.abs(run64.final_params[0] - expected).max()
    err32 = np.abs(run32.final_params[0].astype(np.float64) - expected).max()
    assert err64 < 1e-12, err64
    assert 1e-10 < err32 < 1e-4, err32  # float32 agrees only to its rounding: the float64 run is really float64
    assert not jax.config.jax_enable_x64  # the flag was set for the run only


def test_float64_int8_cache_keeps_integer_codes_with_float64_scales():
    """ACE-8bit (nearest rounding) in float64: the cache codes stay uint8, the per-row min and scale are float64, and
    the run equals the float64 reference that quantizes each row in float64 (the same order of operations)."""
    expected = ref.replay_steps(SCHEDULE, X0, _gradient,
                                ref.ACEReference(N, X0.size, 0.5, store=ref.cache_store("int8")), init_round=True)[-1]
    run = prepare_run(TASK, ace(cache="int8", cache_rounding="nearest"), SCHEDULE, LOCAL,
                      hparams={"client_lr": LR, "server_lr": 0.5}, precision="float64")
    cache = run.carry_shape.server.cache
    assert cache.codes.dtype == jnp.uint8 and cache.lo.dtype == jnp.float64 and cache.scale.dtype == jnp.float64
    history = _run(ace, {"server_lr": 0.5}, "float64", cache="int8", cache_rounding="nearest")
    assert np.abs(history.final_params[0] - expected).max() < 1e-12


MAKERS = {name: (lambda name=name: get_algorithm(name)) for name in sorted(REGISTRY)}
MAKERS.update({"mf_ca2fl_int4": lambda: ca2fl(cache="int4", cache_rounding="nearest"),
               "ace_int8_absmax": lambda: ace(cache="int8", cache_code="absmax"),
               "fedbuff_polynomial": lambda: fedbuff(staleness="polynomial"),
               "fedbuff_ef_qsgd": lambda: error_feedback(fedbuff(), "qsgd"),
               "fedbuff_adam": lambda: with_server_optimizer(fedbuff(), "adam")})


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_float_of_the_state_stays_float64_through_a_chunk(name):
    """The carry of a float64 run (server state, caches, residuals, memories, messages in flight) holds no float32
    leaf, before and after a traced chunk of steps (``jax.eval_shape``: a scan whose carry changed dtype would be
    refused here; nothing is compiled)."""
    schedule = SYNC if name == "fedavg" else SCHEDULE
    run = prepare_run(TASK, MAKERS[name](), schedule, LOCAL, precision="float64", eval_every=4)
    floats = [leaf.dtype for leaf in jax.tree_util.tree_leaves(run.carry_shape)
              if jnp.issubdtype(leaf.dtype, jnp.floating)]
    assert floats and all(d == jnp.float64 for d in floats), floats
    assert all(v.dtype == jnp.float64 for v in run.placed.hp.values())
    with jax.enable_x64(True):
        part = run.timeline.chunk_inputs(run.placed.inputs, 0, 4, None)
        advance = jax.vmap(run.program.advance, in_axes=(0, run.timeline.chunk_axes, 0, 0, None))
        after, _ = jax.eval_shape(advance, run.carry_shape, part, run.placed.hp, run.placed.keys, run.placed.data)
    assert jax.tree_util.tree_structure(after) == jax.tree_util.tree_structure(run.carry_shape)
    assert [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(after)] == \
        [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(run.carry_shape)]


def test_a_float32_run_is_unchanged_by_a_float64_run_before_it():
    make, hparams, _ = CASES["fedbuff"]
    before = _run(make, hparams, "float32")
    _run(make, hparams, "float64")
    after = _run(make, hparams, "float32")
    assert not jax.config.jax_enable_x64
    np.testing.assert_array_equal(before.final_params, after.final_params)
    for k in before.metrics:
        np.testing.assert_array_equal(before.metrics[k], after.metrics[k])


def test_cast_task_keeps_a_float32_task_and_converts_to_float64_in_scope():
    assert cast_task(TASK, "float32") is TASK
    with jax.enable_x64(True):
        task64 = cast_task(TASK, "float64")
        assert task64.model.flat_params.dtype == jnp.float64 and task64.train.features.dtype == jnp.float64
        assert task64.train.labels.dtype == TASK.train.labels.dtype  # class labels stay integers
        np.testing.assert_array_equal(np.asarray(task64.model.flat_params), np.asarray(TASK.model.flat_params))
    with pytest.raises(ValueError, match="needs jax_enable_x64"):  # outside the scope float64 cannot exist
        cast_task(TASK, "float64")


@pytest.mark.parametrize("value", ["float16", "double", None, 64])
def test_bad_precision_is_refused_before_compiling(value):
    with pytest.raises(ValueError, match=r"precision must be one of \['float32', 'float64'\]"):
        check_precision(value)
    with pytest.raises(ValueError, match=r"precision must be one of \['float32', 'float64'\]"):
        simulate(TASK, fedbuff(), SCHEDULE, LOCAL, progress=False, precision=value)


def test_config_and_cli_carry_the_precision(capsys):
    cfg = ExperimentConfig.from_dict({"precision": "float64"})
    validate(cfg)
    assert cfg.precision == "float64"
    with pytest.raises(ConfigError, match=r"invalid option precision = 'half': must be one of \['float32', "):
        validate(ExperimentConfig.from_dict({"precision": "half"}))
    assert cli._config_from_args(cli._build_parser().parse_args(["run", "--precision", "float64"])).precision \
        == "float64"
    with pytest.raises(SystemExit) as info:
        cli._build_parser().parse_args(["run", "--precision", "float16"])
    assert info.value.code == 2 and "--precision: invalid choice: 'float16'" in capsys.readouterr().err
