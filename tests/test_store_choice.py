"""The store of a program is chosen by value, once, where the run is planned (the timeline: train at dispatch,
lookahead batching or train at arrival); the names of earlier versions keep working and a wrong value is refused
with what is allowed."""

from __future__ import annotations

import pytest

from asyncfl_jax import LocalConfig, fedbuff, make_model, make_schedule
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.engine import PresampledClock, make_replicas
from asyncfl_jax.engine.step import build_program, make_program
from asyncfl_jax.engine.stores import Lookahead, TrainAtArrival, TrainAtDispatch, presampled_store
from asyncfl_jax.engine.timelines import make_timeline
from asyncfl_jax.task import make_task
from asyncfl_jax.timing import DelayModel
from asyncfl_jax.timing.clock import EventClock

N = 6
LOCAL = LocalConfig(steps=1, batch_size=4)


@pytest.fixture(scope="module")
def task():
    data = synthetic_leaf(num_clients=N, seed=1, max_samples=60)
    return make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))


def _store(task, *args, **kwargs):
    return make_program(task, fedbuff(), LOCAL, PresampledClock(), *args, num_slots=3, **kwargs).store


def test_the_store_is_a_value_and_the_old_names_give_the_same_stores(task):
    assert type(_store(task)) is TrainAtDispatch
    assert type(_store(task, TrainAtArrival)) is TrainAtArrival
    looked = _store(task, presampled_store(3))
    assert type(looked) is Lookahead and looked.lookahead == 3 and looked.num_slots == 3
    assert _store(task, Lookahead, lookahead=4).lookahead == 4
    for kind, cls in (("dispatch", TrainAtDispatch), ("lookahead", Lookahead), ("arrival", TrainAtArrival)):
        assert type(_store(task, store_kind=kind, lookahead=2)) is cls
        assert type(_store(task, kind, lookahead=2)) is cls
    assert presampled_store(1) is TrainAtDispatch
    assert type(build_program(task, fedbuff(), LOCAL, 3, lookahead=2).store) is Lookahead


def test_a_wrong_store_is_refused_with_what_is_allowed(task):
    with pytest.raises(ValueError, match=r"store_kind must be one of \['arrival', 'dispatch', 'lookahead'\], got 'x'"):
        _store(task, store_kind="x")
    with pytest.raises(ValueError, match="make_store must be a store class .* got 3"):
        _store(task, 3)
    with pytest.raises(ValueError, match="not both"):
        _store(task, TrainAtArrival, store_kind="arrival")
    with pytest.raises(ValueError, match="lookahead must be an integer >= 1, got 0"):
        presampled_store(0)


def test_the_timeline_chooses_the_store_once_from_the_options(task):
    replicas = make_replicas(fedbuff(), [0])
    schedule = make_schedule("concurrent", N, 8, DelayModel(), seed=0, concurrency=3, buffer_size=1)
    for lookahead, cls in ((1, TrainAtDispatch), (2, Lookahead)):
        timeline = make_timeline(schedule, [0], replicas, N, 4, lookahead)
        assert type(timeline.program(task, fedbuff(), LOCAL, None).store) is cls
    timeline = make_timeline(EventClock(N, 8, DelayModel(), seed=0), [0], replicas, N, 4, 1)
    assert type(timeline.program(task, fedbuff(), LOCAL, None).store) is TrainAtArrival
