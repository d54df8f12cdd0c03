"""The in-scan event clock (state-dependent durations) and AsyncFedED.

* With durations that do not depend on the state, the clock produces exactly the events of the pre-sampled
  ``all_active`` schedule (arrivals, versions, dispatch rows; times to double-float precision), with suspensions and
  dropouts too, and trains the same jobs as the pre-sampled engine.
* AsyncFedED under the clock agrees with the independent float64 event-by-event reference
  (tests/reference_asyncfeded.py): the same events, the same K of every job, the same models.
* K stays within [min_steps, max_steps]; replicas with their own clocks run together as they run alone; a clocked
  run interrupted and resumed from its checkpoint gives the same History; bad input is refused before compiling.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from reference_asyncfeded import asyncfeded_reference
from support import CLASSES, FEATURES, common_widths, toy_problem
from test_checkpoint import StoppingBar, raise_keyboard_interrupt

from asyncfl_jax import engine
from asyncfl_jax.engine import clocks
from asyncfl_jax.algorithms import asyncfeded, fedasync, get_algorithm
from asyncfl_jax.checkpoint import SimulationInterrupted
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.engine import simulate
from asyncfl_jax.timing import DelayModel, all_active
from asyncfl_jax.timing.clock import EventClock, split_double

MODEL = ref.LogReg(FEATURES, CLASSES)
N = 5
DELAYS = {
    "default": DelayModel(),
    "lognormal": DelayModel(speed="lognormal", speed_sigma=0.8, noise="lognormal", noise_sigma=0.3, comm_time=0.25),
    "suspensions": DelayModel(suspension_prob=0.3, suspension_mean=2.0),
    "dropouts": DelayModel(dropout_fraction=0.4, dropout_time=6.0),
    "both": DelayModel(suspension_prob=0.2, suspension_mean=1.5, dropout_fraction=0.2, dropout_time=5.0),
}
FULL_BATCH = LocalConfig(steps=3, batch_size=None)
FEDED_HP = {"client_lr": 0.3, "feded_lambda": 1.0, "feded_epsilon": 1.0, "target_staleness": 3.0, "kappa": 1.0}


@pytest.fixture(scope="module")
def toy():
    return toy_problem(N, seed=1)


def run(task, algorithm, timing, local=FULL_BATCH, **kw):
    kw = {"eval_every": 10, "progress": False, **kw}
    return simulate(task, algorithm, timing, local, **kw)


def assert_same_events(presampled, realized):
    """Equal arrivals, versions and dispatches (slots aside: a clocked client always uses slot i)."""
    for field in ("init_clients", "arrival_clients", "arrival_versions", "dispatch_clients"):
        np.testing.assert_array_equal(getattr(presampled, field), getattr(realized, field), err_msg=field)
    np.testing.assert_allclose(realized.arrival_times, presampled.arrival_times, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(realized.dispatch_times, presampled.dispatch_times, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(realized.step_times, presampled.step_times, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("algorithm", ["fedasync", "asyncfeded_constant_k"])
def test_state_independent_durations_give_the_presampled_events(toy, algorithm):
    """One replica per delay model (each with its own clock or schedule), minibatch steps (so the job keys matter)."""
    task, _, _ = toy
    T = 60
    alg = fedasync() if algorithm == "fedasync" else asyncfeded(initial_steps=2, adaptive_steps=False)
    local = LocalConfig(steps=2, batch_size=3)
    seeds = list(range(len(DELAYS)))
    schedules = common_widths({name: all_active(N, T, delays, seed=3) for name, delays in DELAYS.items()})
    presampled = run(task, alg, list(schedules.values()), local, seeds=seeds, hparams={"client_lr": 0.3})
    clocks = [EventClock(N, T, delays, seed=3) for delays in DELAYS.values()]
    clocked_run = run(task, alg, clocks, local, seeds=seeds, hparams={"client_lr": 0.3})
    for r, name in enumerate(DELAYS):
        realized = clocked_run.realized_schedules[r]
        realized.validate()
        assert_same_events(all_active(N, T, DELAYS[name], seed=3), realized)
        assert clocked_run.schedule_stats[r]["num_uploads"] == T
    # the same jobs, trained with the same keys: the same models up to float rounding
    np.testing.assert_allclose(clocked_run.final_params, presampled.final_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(clocked_run.metrics["test_loss"], presampled.metrics["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(clocked_run.times, presampled.times, rtol=1e-13)
    assert (clocked_run.job_steps == 2).all()
    stats = clocked_run.schedule_stats
    assert stats[2]["num_suspensions"] > 0 and stats[3]["num_dropped"] > 0


@pytest.mark.parametrize("rounding", ["floor", "trunc"])
def test_asyncfeded_matches_the_event_by_event_reference(toy, rounding):
    """One replica per delay model; the reference runs each on its own."""
    task, data, x0 = toy
    T = 50
    alg = asyncfeded(initial_steps=3, max_steps=6, rounding=rounding)
    clocks = [EventClock(N, T, delays, seed=2) for delays in DELAYS.values()]
    history = run(task, alg, clocks, seeds=list(range(len(DELAYS))), hparams=FEDED_HP, eval_every=10)
    for r, delays in enumerate(DELAYS.values()):
        expected = asyncfeded_reference(
            MODEL, data, x0, N, T, delays, 2, nominal_steps=3, client_lr=0.3, lam=1.0, epsilon=1.0,
            target_staleness=3.0, kappa=1.0, initial_steps=3, max_steps=6, min_steps=1, rounding=rounding)
        realized = history.realized_schedules[r]
        np.testing.assert_array_equal(realized.arrival_clients[:, 0], expected["clients"])
        np.testing.assert_array_equal(realized.arrival_versions[:, 0], expected["versions"])
        np.testing.assert_allclose(realized.arrival_times[:, 0], expected["arrival_times"], rtol=1e-6)
        np.testing.assert_array_equal(history.job_steps[r], expected["steps_used"])
        assert len(set(expected["steps_used"].tolist())) > 1, "K should adapt in this setting"
        np.testing.assert_allclose(history.final_params[r], expected["x"], rtol=1e-4, atol=1e-5)


def test_adaptive_steps_stay_within_bounds_and_change_durations(toy):
    task, _, _ = toy
    T = 120
    alg = asyncfeded(initial_steps=4, min_steps=2, max_steps=7)
    hp = {**FEDED_HP, "kappa": 5.0}
    history = run(task, alg, EventClock(N, T, DelayModel(), seed=0), hparams=hp, eval_every=40)
    k = history.job_steps[0]
    assert k.min() >= 2 and k.max() <= 7
    assert k.min() == 2 and k.max() == 7, "kappa = 5 should reach both bounds"
    fixed = run(task, asyncfeded(initial_steps=4, adaptive_steps=False), EventClock(N, T, DelayModel(), seed=0),
                hparams=hp, eval_every=40)
    assert not np.array_equal(history.realized_schedules[0].arrival_clients, fixed.realized_schedules[0].arrival_clients)


def test_replicas_with_their_own_clocks_run_together_as_alone(toy):
    task, _, _ = toy
    clocks = [EventClock(N, 30, DELAYS["suspensions"], seed=s) for s in (0, 1)]
    alg = asyncfeded(initial_steps=3, max_steps=6)
    together = run(task, alg, clocks, seeds=[0, 1], hparams={**FEDED_HP, "kappa": [0.5, 2.0]})
    for r, (seed, kappa) in [(1, (0, 2.0)), (2, (1, 0.5))]:
        alone = run(task, alg, clocks[seed], seeds=[seed], hparams={**FEDED_HP, "kappa": kappa})
        np.testing.assert_array_equal(together.job_steps[r], alone.job_steps[0])
        np.testing.assert_array_equal(together.realized_schedules[r].arrival_clients,
                                      alone.realized_schedules[0].arrival_clients)
        np.testing.assert_allclose(together.final_params[r], alone.final_params[0], rtol=1e-5, atol=1e-6)


def test_a_clocked_run_resumes_from_its_checkpoint_bit_for_bit(toy, tmp_path, monkeypatch):
    task, _, _ = toy
    clock = EventClock(N, 40, DELAYS["both"], seed=4)
    alg = asyncfeded(initial_steps=3, max_steps=6)
    uninterrupted = run(task, alg, clock, hparams=FEDED_HP, eval_every=8)
    folder = str(tmp_path / "ckpt")
    monkeypatch.setattr(engine.callbacks, "progress_bar", lambda *a, **k: StoppingBar(2, raise_keyboard_interrupt))
    with pytest.raises(SimulationInterrupted):
        run(task, alg, clock, hparams=FEDED_HP, eval_every=8, checkpoint_dir=folder)
    monkeypatch.undo()
    assert os.path.exists(os.path.join(folder, "checkpoint.json"))
    resumed = run(task, alg, clock, hparams=FEDED_HP, eval_every=8, checkpoint_dir=folder, resume=True)
    assert resumed.final_params.tobytes() == uninterrupted.final_params.tobytes()
    for k in uninterrupted.metrics:
        assert resumed.metrics[k].tobytes() == uninterrupted.metrics[k].tobytes()
    np.testing.assert_array_equal(resumed.job_steps, uninterrupted.job_steps)
    np.testing.assert_array_equal(resumed.times, uninterrupted.times)


def test_double_float_times_add_like_float64():
    rng = np.random.default_rng(0)
    a, b = rng.exponential(size=1000) * 1e3, rng.exponential(size=1000)
    total = clocks.time_add(clocks.Time(*map(jnp.asarray, split_double(a))),
                             clocks.Time(*map(jnp.asarray, split_double(b))))
    got = np.asarray(total.hi, np.float64) + np.asarray(total.lo, np.float64)
    np.testing.assert_allclose(got, a + b, rtol=1e-13)
    inf = clocks.time_add(clocks.Time(jnp.float32(jnp.inf), jnp.float32(0)), clocks.Time(jnp.float32(1), jnp.float32(0)))
    assert float(inf.hi) == np.inf and float(inf.lo) == 0.0
    index, smallest = clocks.earliest(clocks.Time(jnp.asarray([2.0, 1.0, 1.0]), jnp.asarray([0.0, 1e-8, 1e-8])))
    assert int(index) == 1 and float(smallest.hi) == 1.0


def test_bad_input_is_refused_before_compiling(toy):
    task, _, _ = toy
    with pytest.raises(ValueError, match="num_clients"):
        EventClock(0, 10, DelayModel())
    with pytest.raises(ValueError, match="delays"):
        EventClock(3, 10, {"speed": "warp"})
    with pytest.raises(ValueError, match="not a mix"):
        run(task, fedasync(), [EventClock(N, 10, DelayModel()), all_active(N, 10, DelayModel(), 0)], seeds=[0, 1])
    with pytest.raises(ValueError, match="clients but the task has"):
        run(task, fedasync(), EventClock(N + 1, 10, DelayModel()))
    with pytest.raises(ValueError, match="min_steps <= initial_steps <= max_steps"):
        asyncfeded(initial_steps=60)
    with pytest.raises(ValueError, match="rounding"):
        get_algorithm("asyncfeded", rounding="round")


# ---------------------------------------------------------------------------------------------------- configuration
def _config(*argv):
    from asyncfl_jax import cli

    return cli._config_from_args(cli._build_parser().parse_args(["run", *argv]))


def test_presets_expand_into_the_configuration():
    from asyncfl_jax.presets import PRESETS, get_preset

    cfg = _config("--preset", "asyncfeded/synthetic/asyncfeded", "--steps", "30")
    (run_cfg,) = cfg.runs
    assert run_cfg.algorithm == "asyncfeded" and run_cfg.protocol.name == "event_clock"
    assert run_cfg.hparams == {"feded_lambda": 5.0, "feded_epsilon": 5.0, "target_staleness": 3.0, "kappa": 1.0}
    assert (cfg.local.steps, cfg.local.batch_size, cfg.local.lr, cfg.local.momentum) == (10, 10, 0.01, 0.5)
    femnist = get_preset("asyncfeded/femnist/asyncfeded")  # its values, whether or not the LEAF files are here
    assert femnist["hparams"] == {"feded_lambda": 1.0, "feded_epsilon": 1.0, "target_staleness": 3.0, "kappa": 0.05}
    hinge = _config("--preset", "asyncfeded/synthetic/fedasync_hinge").runs[0]
    assert hinge.options == {"staleness": "hinge"} and hinge.hparams == {"alpha": 0.1, "staleness_a": 5.0,
                                                                         "staleness_b": 5.0}
    assert get_preset("asyncfeded/shakespeare/fedprox")["hparams"] == {"prox_mu": 0.01}
    for name in (n for n in PRESETS if "/synthetic/" in n):  # every runnable preset is a valid configuration
        from asyncfl_jax.config import validate

        validate(_config("--preset", name, "--steps", "5"))
    with pytest.raises(ValueError, match="did you mean 'asyncfeded/femnist/fedprox'"):
        get_preset("asyncfeded/femnst/fedprox")


def test_asyncfeded_runs_on_the_event_clock_by_default_and_bad_clock_options_are_refused():
    from asyncfl_jax.config import ConfigError, set_option, validate

    assert _config("--algorithm", "asyncfeded").runs[0].protocol.name == "event_clock"
    cfg = _config("--algorithm", "fedasync", "--protocol", "event_clock", "--steps", "10")
    validate(cfg)
    raw = cfg.to_dict()
    set_option(raw, 'runs.protocol.aggregation="periodic"')
    set_option(raw, "runs.protocol.period=1.0")
    with pytest.raises(ConfigError, match="event clock applies every arrival"):
        validate(type(cfg).from_dict(raw))
    with pytest.raises(ConfigError, match="--preset and --algorithm"):
        _config("--preset", "asyncfeded/synthetic/fedavg", "--algorithm", "fedbuff")


def test_a_diverged_clocked_replica_is_frozen_and_its_schedule_stops(toy):
    task, _, _ = toy
    alg = asyncfeded(initial_steps=3, max_steps=6)
    with pytest.warns(RuntimeWarning, match="diverged"):
        history = run(task, alg, EventClock(N, 40, DelayModel(), seed=0),
                      hparams={**FEDED_HP, "client_lr": [0.3, 1e38]}, eval_every=10)
    assert history.diverged_at[0] == -1 and history.diverged_at[1] >= 0
    healthy, frozen = history.realized_schedules
    assert healthy.num_steps == 40 and 0 < frozen.num_steps < 40
    frozen.validate()
    assert (history.job_steps[1, frozen.num_steps:] == -1).all() and (history.job_steps[0] >= 1).all()
    assert np.isfinite(history.metrics["test_loss"][0]).all()
    assert history.times[1, -1] == frozen.step_times[-1]


def test_repeated_seeds_with_one_schedule_per_seed_are_refused(toy):
    task, _, _ = toy
    clocks = [EventClock(N, 10, DelayModel(), seed=s) for s in (0, 1)]
    with pytest.raises(ValueError, match="repeat a seed"):
        run(task, fedasync(), clocks, seeds=[0, 0])
    with pytest.raises(ValueError, match="repeat a seed"):
        run(task, fedasync(), [all_active(N, 10, DelayModel(), s) for s in (0, 1)], seeds=[3, 3])
