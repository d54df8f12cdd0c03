"""Random configurations either run or are rejected with a ConfigError, never with an exception from inside JAX."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncfl_jax.algorithms import REGISTRY
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.experiment import run_config

# Valid values and plausible mistakes side by side, so that both paths are exercised.
FIELDS = {
    ("data", "num_clients"): st.sampled_from([-1, 0, 2, 6, 8, 2.5, "6"]),
    ("data", "partition"): st.sampled_from(["natural", "iid", "dirichlet", "shards", "power_law", "random"]),
    ("data", "dirichlet_alpha"): st.sampled_from([0.1, 1.0, 0.0, -1.0]),
    ("data", "synthetic_max_samples"): st.sampled_from([60, 80, 20]),
    ("model", "name"): st.sampled_from(["logreg", "mlp", "cnn", "resnet"]),
    ("model", "hidden"): st.sampled_from([[8], [8, 8], [], [0]]),
    ("local", "steps"): st.sampled_from([0, 1, 2, -3, "two"]),
    ("local", "batch_size"): st.sampled_from([None, 0, 4, -1]),
    ("local", "epochs"): st.sampled_from([None, None, 1, 0, -0.5]),
    ("local", "lr"): st.sampled_from([0.05, 0.0, -0.1, math.inf]),
    ("local", "momentum"): st.sampled_from([0.0, 0.9, 1.0, -0.2]),
    ("delays", "speed"): st.sampled_from(["uniform", "lognormal", "constant", "warp"]),
    ("delays", "suspension_prob"): st.sampled_from([0.0, 0.3, 1.5]),
    ("delays", "dropout_fraction"): st.sampled_from([0.0, 0.25, 1.0]),
    ("eval_points", None): st.sampled_from([1, 2, 0]),
    ("seeds", None): st.sampled_from([[0], [0, 1], [], [-1]]),
}
RUN_FIELDS = {
    "algorithm": st.sampled_from(sorted(REGISTRY) + ["fedbuf"]),
    "arrivals": st.sampled_from([6, 12, 0, None]),
    "steps": st.sampled_from([None, None, 4, -2]),
    "hparams": st.sampled_from([{}, {"server_lr": 0.5}, {"server_lr": -1.0}, {"client_lr": [0.05, 0.1]},
                                {"alpha": 0.5}, {"tau_algo": 2.0}, {"nonsense": 1.0}]),
    "options": st.sampled_from([{}, {"cache": "int8"}, {"cache": "int9"}, {"staleness": "hinge"},
                                {"upload": "gradient"}, {"lr_schedule": "decreasing"}, {"bits": 4}]),
    "protocol": st.fixed_dictionaries({
        "name": st.sampled_from(["all_active", "concurrent", "synchronous", "lottery"]),
        "concurrency": st.sampled_from([1, 3, 6, 50, 0]),
        "buffer_size": st.sampled_from([1, 2, 4, 0]),
        "refill": st.sampled_from(["immediate", "boundary", "sometimes"]),
        "participants": st.sampled_from([None, 2, 0, 99]),
        "aggregation": st.sampled_from(["count", "count", "periodic", "hourly"]),
        "period": st.sampled_from([None, 0.5, -1.0]),
    }),
}


@st.composite
def raw_configs(draw):
    raw = {"data": {"name": "synthetic", "num_clients": 6, "synthetic_max_samples": 60},
           "model": {"name": "logreg"}, "local": {"steps": 1, "batch_size": 4}, "delays": {},
           "eval_points": 2, "seeds": [0]}
    for (section, key), strategy in FIELDS.items():
        if draw(st.integers(0, 4)) == 4:  # change a few fields per example, so that some examples are valid
            if key is None:
                raw[section] = draw(strategy)
            else:
                raw[section][key] = draw(strategy)
    run = {"algorithm": "fedbuff", "arrivals": 6,
           "protocol": {"name": "concurrent", "concurrency": 3, "buffer_size": 2, "refill": "boundary"}}
    for key, strategy in RUN_FIELDS.items():
        if draw(st.integers(0, 2)) == 2:
            run[key] = draw(strategy)
    if draw(st.integers(0, 9)) == 9:
        run["colour"] = "blue"  # an unknown key
    raw["runs"] = [run]
    return raw


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(raw_configs())
def test_a_random_configuration_runs_or_is_rejected_clearly(raw):
    try:
        cfg = ExperimentConfig.from_dict(raw)
        validate(cfg)
    except ConfigError as e:
        message = str(e)
        first = message.split()[0] if message else ""
        # The message names the option at fault: "invalid option data.x = ...", "unknown option ...", "delays.x ...".
        assert message.startswith(("invalid option", "unknown option", "option ")) or "." in first, message
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a valid but diverging learning rate is allowed
        histories = run_config(cfg, progress=False, write=False)
    assert len(histories) == 1 and histories[0].steps[-1] >= 1


def test_the_random_configurations_exercised_both_outcomes():
    """The strategy produces both valid configurations (which the property test runs) and rejected ones: the same
    derandomized examples, classified here by validation alone, so that the check does not depend on which test
    process ran the property test first (pytest-xdist spreads a module's tests over its workers)."""
    outcomes = {"valid": 0, "rejected": 0}

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(raw_configs())
    def classify(raw):
        try:
            validate(ExperimentConfig.from_dict(raw))
        except ConfigError:
            outcomes["rejected"] += 1
            return
        outcomes["valid"] += 1

    classify()
    assert outcomes["valid"] >= 3 and outcomes["rejected"] >= 3, outcomes


def test_a_small_ace_configuration_runs():
    raw = {"data": {"name": "synthetic", "num_clients": 6, "synthetic_max_samples": 60}, "model": {"name": "logreg"},
           "local": {"steps": 1, "batch_size": 4}, "eval_points": 2, "seeds": [0],
           "runs": [{"algorithm": "ace", "arrivals": 6, "protocol": {"name": "all_active"}}]}
    cfg = ExperimentConfig.from_dict(raw)
    validate(cfg)
    assert run_config(cfg, progress=False, write=False)[0].steps[-1] == 6


@pytest.mark.parametrize("raw_run,expected", [
    ({"algorithm": "ace", "options": {"cache": "int9"}}, "cache must be one of"),
    ({"algorithm": "area", "protocol": {"name": "concurrent", "concurrency": 6, "buffer_size": 2,
                                        "refill": "boundary", "aggregation": "periodic", "period": 1.0}},
     "refill"),
])
def test_specific_rejections(raw_run, expected):
    raw = {"data": {"name": "synthetic", "num_clients": 6}, "runs": [{"arrivals": 6, **raw_run}]}
    with pytest.raises(ConfigError, match=expected):
        validate(ExperimentConfig.from_dict(raw))
