"""The Python API's boundary: a wrong type for any argument of ``simulate``, ``make_task``, ``make_schedule`` and
``LocalConfig`` is refused up front (before anything is compiled) with a TypeError/ValueError naming the argument;
and a replica whose model explodes without becoming NaN (``client_lr = 1e30``) is flagged as diverged."""

from __future__ import annotations

import time

import numpy as np
import pytest

import asyncfl_jax as afl
from asyncfl_jax.engine.step import DIVERGENCE_BOUND

WRONG = [None, "x", 1.5, -1, [1, 2], {"a": 1}, object(), True, np.float32(2.0), lambda update: None]
"""Values of the wrong type for most arguments (those an argument accepts are skipped per argument)."""


@pytest.fixture(scope="module")
def parts():
    ds = afl.data.synthetic_leaf(num_clients=4, alpha=1.0, beta=1.0, max_samples=60)
    model = afl.make_model("logreg", ds.input_shape, ds.num_classes)
    task = afl.make_task(ds, ds.natural_partition, model)
    schedule = afl.make_schedule("concurrent", 4, 3, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1)
    return ds, model, task, schedule


def _cases(fn_name, base, accepted):
    for name in base:
        for value in WRONG:
            shown = repr(value) if not callable(value) else "a function"
            if any(value is ok or (type(value) is type(ok) and value == ok) for ok in accepted.get(name, ())):
                continue
            yield pytest.param(fn_name, name, value, id=f"{fn_name}-{name}={shown[:12]}")


SIMULATE = ["task", "algorithm", "schedules", "local", "seeds", "hparams", "eval_every", "progress", "label",
            "shard_jobs", "shard_replicas", "shard_clients", "lookahead", "checkpoint_dir", "checkpoint_every",
            "resume", "callbacks", "precision", "trajectory", "replica_batch"]
SIMULATE_OK = {"local": [None], "hparams": [None, {"a": 1}], "seeds": [[1, 2]], "label": ["x", None], "checkpoint_dir": [None, "x"],
               "trajectory": [None, True, WRONG[-1]], "replica_batch": [None], "progress": [True],
               "eval_every": [None], "checkpoint_every": [None],  # None: 30 evaluations; checkpoints by interval
               "resume": [True], "shard_jobs": [True], "shard_replicas": [True], "shard_clients": [True],
               "precision": []}
TASK = ["dataset", "parts", "model", "train_eval_size", "seed", "client_test_fraction", "validation_fraction",
        "eval_clients", "loss"]
TASK_OK = {"eval_clients": [None], "loss": [None], "client_test_fraction": [], "validation_fraction": []}
SCHEDULE = ["protocol", "num_clients", "num_steps", "delays", "seed"]
LOCAL = ["steps", "batch_size", "epochs", "use_momentum"]
LOCAL_OK = {"batch_size": [None], "epochs": [None, 1.5, np.float32(2.0)], "use_momentum": [True]}


def _call(fn_name, name, value, parts):
    ds, model, task, schedule = parts
    if fn_name == "simulate":
        kwargs = dict(task=task, algorithm=afl.fedbuff(), schedules=schedule, local=afl.LocalConfig(steps=1),
                      seeds=[0], hparams={}, eval_every=3, progress=False, label=None, shard_jobs=False,
                      shard_replicas=False, shard_clients=False, lookahead=1, checkpoint_dir=None,
                      checkpoint_every=None, resume=False, callbacks=[], precision="float32", trajectory=None,
                      replica_batch=None)
        return afl.simulate(**{**kwargs, name: value})
    if fn_name == "make_task":
        kwargs = dict(dataset=ds, parts=ds.natural_partition, model=model, train_eval_size=100, seed=0,
                      client_test_fraction=0.0, validation_fraction=0.0, eval_clients=None, loss=None)
        return afl.make_task(**{**kwargs, name: value})
    if fn_name == "make_schedule":
        kwargs = dict(protocol="concurrent", num_clients=4, num_steps=3, delays=afl.DelayModel(), seed=0)
        return afl.make_schedule(**{**kwargs, name: value}, concurrency=2, buffer_size=1)
    return afl.LocalConfig(**{**dict(steps=1, batch_size=4), name: value}).validate()


@pytest.mark.parametrize("fn_name, name, value", [
    *_cases("simulate", SIMULATE, SIMULATE_OK), *_cases("make_task", TASK, TASK_OK),
    *_cases("make_schedule", SCHEDULE, {}), *_cases("LocalConfig", LOCAL, LOCAL_OK)])
def test_a_wrong_argument_is_refused_up_front_naming_it(parts, fn_name, name, value):
    t0 = time.perf_counter()
    with pytest.raises((TypeError, ValueError)) as caught:
        _call(fn_name, name, value, parts)
    assert name in str(caught.value), f"{type(caught.value).__name__}: {caught.value}"
    assert time.perf_counter() - t0 < 5, "refused only after compiling"


@pytest.mark.parametrize("kwargs, message", [
    ({"callbacks": [5]}, r"callbacks\[0\] must be a function fn\(update\) or an object with one of the hooks"),
    ({"callbacks": print}, r"callbacks must be a list of callbacks; wrap the single one given in a list"),
    ({"hparams": [1, 2]}, r"hparams must be a dict of hyper-parameter name -> value"),
    ({"hparams": {"client_lr": "fast"}}, r"hparams\['client_lr'\] must be a number or a list of numbers"),
    ({"seeds": 3}, r"seeds must be a list of integers"),
    ({"label": 5}, r"label must be a string or None, got 5 \(int\)"),
])
def test_the_messages_say_what_is_allowed(parts, kwargs, message):
    ds, model, task, schedule = parts
    with pytest.raises(TypeError, match=message):
        afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=1), eval_every=3, progress=False,
                     **kwargs)


def test_an_exploding_replica_is_flagged_as_diverged(parts):
    """``client_lr = 1e30`` keeps the model finite (1e30 fits a float32) but meaningless: flagged as diverged at
    the first step whose model exceeds DIVERGENCE_BOUND, as a NaN is; the sane replica beside it is not."""
    ds, model, task, schedule = parts
    schedule = afl.make_schedule("concurrent", 4, 6, afl.DelayModel(), seed=0, concurrency=2, buffer_size=1)
    with pytest.warns(RuntimeWarning, match="diverged"):
        h = afl.simulate(task, afl.fedbuff(), schedule, afl.LocalConfig(steps=1, batch_size=None), eval_every=6,
                         progress=False, hparams={"client_lr": [0.05, 1e30]})
    assert h.diverged_at[0] == -1 and h.diverged_at[1] >= 0
    assert DIVERGENCE_BOUND == 1e10


@pytest.mark.parametrize("case, message", [
    ("index past the end", r"parts\[1\] holds the example index 100000, outside the training split's \d+ examples"),
    ("negative index", r"parts\[0\] holds the example index -1, outside the training split"),
    ("model for another input", r"model 'logreg' cannot be applied to the examples of dataset 'synthetic' "
                                r"\(shape \(60,\)\)"),
])
def test_make_task_refuses_values_of_the_right_type_that_cannot_work(parts, case, message):
    """Values the type checks let through: an example index outside the training split (was an IndexError from
    NumPy), a model built for another input shape (was accepted, then failed while the run was traced)."""
    ds, model, task, schedule = parts
    split = [np.asarray(p) for p in ds.natural_partition]
    if case == "index past the end":
        split[1] = np.append(split[1], 100_000)
    elif case == "negative index":
        split[0] = np.append(split[0], -1)
    else:
        model = afl.make_model("logreg", (7,), ds.num_classes)
    with pytest.raises(ValueError, match=message):
        afl.make_task(ds, split, model)
