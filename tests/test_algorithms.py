"""FedAvg, FedAsync, FedBuff and ASGD against the independent numpy reference (tests/reference.py).

Full-batch local steps make every job deterministic, so the engine's final model must equal the reference's to float
tolerance on the same schedule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference as ref
from support import CLASSES, FEATURES, TOY_DELAYS, toy_problem
from asyncfl_jax.algorithms import ace, asgd, ca2fl, fedasync, fedavg, fedbuff, mifa
from asyncfl_jax.client import LocalConfig
from asyncfl_jax.algorithms import ServerMeta
from asyncfl_jax.engine import default_hparams, make_simulation, schedule_arrays, simulate
from asyncfl_jax.task import task_arrays
from asyncfl_jax.timing import make_schedule

NUM_CLIENTS = 6
DELAYS = TOY_DELAYS


TASK, CLIENT_DATA, X0 = toy_problem(NUM_CLIENTS)
REF_MODEL = ref.LogReg(FEATURES, CLASSES)
STEPS, LR = 3, 0.3


def _run_engine(algorithm, schedule, hparams, local=None):
    local = local or LocalConfig(steps=STEPS, batch_size=None)
    history = simulate(TASK, algorithm, schedule, local=local, hparams={"client_lr": LR, **hparams},
                       eval_every=7, progress=False)
    return history.final_params[0]


def _run_reference(schedule, server_step, **local_kw):
    train = lambda c, start: ref.local_delta(REF_MODEL, start, CLIENT_DATA[c], STEPS, LR, **local_kw)
    return ref.replay(schedule, X0, train, server_step)


def _assert_close(engine, reference):
    np.testing.assert_allclose(engine, reference, rtol=2e-4, atol=2e-5)
    assert np.abs(reference - X0).max() > 1e-2  # the run moved the model: the comparison is not vacuous


@pytest.mark.parametrize("participants", [None, 3])
def test_fedavg_matches_reference(participants):
    schedule = make_schedule("synchronous", NUM_CLIENTS, 12, DELAYS, seed=1, participants=participants)
    engine = _run_engine(fedavg(), schedule, {"server_lr": 0.8})
    _assert_close(engine, _run_reference(schedule, ref.fedavg_step(0.8)))


@pytest.mark.parametrize("refill", ["boundary", "immediate"])
@pytest.mark.parametrize("staleness,normalization", [("constant", "buffer"), ("inverse_sqrt", "buffer"),
                                                      ("inverse_sqrt", "weights"), ("constant", "none")])
def test_fedbuff_matches_reference(refill, staleness, normalization):
    schedule = make_schedule("concurrent", NUM_CLIENTS, 15, DELAYS, seed=2, concurrency=4, buffer_size=2,
                             refill=refill)
    assert schedule.staleness.max() > 0  # stale updates are exercised
    engine = _run_engine(fedbuff(staleness, normalization), schedule, {"server_lr": 0.7})
    _assert_close(engine, _run_reference(schedule, ref.fedbuff_step(0.7, staleness, normalization)))


@pytest.mark.parametrize("staleness,a,b", [("constant", 0.0, 0.0), ("polynomial", 0.5, 0.0), ("hinge", 2.0, 1.0)])
def test_fedasync_matches_reference(staleness, a, b):
    schedule = make_schedule("all_active", NUM_CLIENTS, 30, DELAYS, seed=3)
    assert schedule.staleness.max() > 1
    hp = {"alpha": 0.6, "staleness_a": a, "staleness_b": b}
    hp = {k: v for k, v in hp.items() if k in fedasync(staleness).hyperparams}
    engine = _run_engine(fedasync(staleness), schedule, hp)
    _assert_close(engine, _run_reference(schedule, ref.fedasync_step(0.6, staleness, a, b)))


def test_fedasync_with_buffer_mixes_arrivals_in_order():
    schedule = make_schedule("concurrent", NUM_CLIENTS, 10, DELAYS, seed=4, concurrency=5, buffer_size=2,
                             refill="immediate")
    engine = _run_engine(fedasync("polynomial"), schedule, {"alpha": 0.5, "staleness_a": 1.0})
    _assert_close(engine, _run_reference(schedule, ref.fedasync_step(0.5, "polynomial", 1.0)))


def test_asgd_matches_reference():
    schedule = make_schedule("all_active", NUM_CLIENTS, 25, DELAYS, seed=5)
    engine = _run_engine(asgd(), schedule, {"server_lr": 0.5})
    _assert_close(engine, _run_reference(schedule, ref.asgd_step(0.5)))


def test_local_options_match_reference():
    """Momentum, coupled weight decay and the FedProx term in local training."""
    schedule = make_schedule("concurrent", NUM_CLIENTS, 8, DELAYS, seed=6, concurrency=3, buffer_size=2,
                             refill="boundary")
    hp = {"server_lr": 1.0, "momentum": 0.9, "weight_decay": 0.01, "prox_mu": 0.5}
    engine = _run_engine(fedbuff(), schedule, hp, local=LocalConfig(steps=STEPS, batch_size=None, use_momentum=True))
    reference = _run_reference(schedule, ref.fedbuff_step(1.0), momentum=0.9, weight_decay=0.01, prox_mu=0.5)
    _assert_close(engine, reference)


def test_epochs_give_each_client_its_own_step_count():
    """With ``epochs`` set and B >= every client's size, each job is ceil(epochs) full passes: K_i = epochs."""
    schedule = make_schedule("synchronous", NUM_CLIENTS, 4, DELAYS, seed=7)
    local = LocalConfig(steps=5, batch_size=64, epochs=2)
    engine = simulate(TASK, fedavg(), schedule, local=local, hparams={"client_lr": LR}, progress=False).final_params[0]
    train = lambda c, start: ref.local_delta(REF_MODEL, start, CLIENT_DATA[c], 2, LR)
    _assert_close(engine, ref.replay(schedule, X0, train, ref.fedavg_step(1.0)))


def test_gradient_output_is_one_minibatch_gradient():
    from asyncfl_jax.client import make_local_update

    grad_fn = make_local_update(TASK.model, LocalConfig(steps=1, batch_size=None), output="gradient")
    hp = {"client_lr": jnp.float32(LR), "momentum": 0.0, "weight_decay": 0.0, "prox_mu": 0.0}
    g = grad_fn(TASK.model.flat_params, jnp.int32(2), jax.random.PRNGKey(0), hp, TASK.train)
    np.testing.assert_allclose(g, REF_MODEL.loss_grad(X0, *CLIENT_DATA[2]), rtol=1e-4, atol=1e-6)


def _simulate_full(algorithm, schedule, hparams):
    return simulate(TASK, algorithm, schedule, local=LocalConfig(steps=STEPS, batch_size=None),
                    hparams={"client_lr": LR, **hparams}, eval_every=5, progress=False)


@pytest.mark.parametrize("concurrency,buffer_size", [(4, 2), (5, 1), (6, 3)])
def test_ca2fl_matches_reference_and_caches_hold_last_deltas(concurrency, buffer_size):
    schedule = make_schedule("concurrent", NUM_CLIENTS, 20, DELAYS, seed=8, concurrency=concurrency,
                             buffer_size=buffer_size, refill="boundary")
    history = _simulate_full(ca2fl(), schedule, {"server_lr": 0.9})
    server = ref.CA2FLReference(NUM_CLIENTS, X0.size, 0.9)
    last_delta = {}

    def train(c, start):
        delta = ref.local_delta(REF_MODEL, start, CLIENT_DATA[c], STEPS, LR)
        last_delta[c] = delta  # arrivals are trained in schedule order, so this ends as each client's last delta
        return delta

    _assert_close(history.final_params[0], ref.replay(schedule, X0, train, server))
    # The cache invariant: h_i is client i's latest delta (zero if it never reported).
    run = make_simulation(TASK, ca2fl(), LocalConfig(steps=STEPS, batch_size=None), schedule.num_steps,
                          schedule.num_slots, eval_every=20)
    hp = {**default_hparams(ca2fl()), "client_lr": LR, "server_lr": 0.9}
    out = jax.jit(run)(schedule_arrays(schedule), hp, jax.random.PRNGKey(0), task_arrays(TASK))
    cache = np.asarray(out.carry.server.cache)
    for c in range(NUM_CLIENTS):
        np.testing.assert_allclose(cache[c], last_delta.get(c, np.zeros(X0.size)), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out.carry.server.cache_mean), cache.mean(axis=0), rtol=1e-4, atol=1e-6)


def test_ca2fl_with_everyone_every_step_is_fedavg():
    """M = Mc = n and every client reporting each step: CA2FL's calibrated update is the plain mean of the deltas."""
    everyone = make_schedule("concurrent", NUM_CLIENTS, 6, DELAYS, seed=9, concurrency=NUM_CLIENTS,
                             buffer_size=NUM_CLIENTS, refill="boundary")
    rounds = make_schedule("synchronous", NUM_CLIENTS, 6, DELAYS, seed=9)
    a = _simulate_full(ca2fl(), everyone, {"server_lr": 1.0}).final_params[0]
    b = _simulate_full(fedavg(), rounds, {"server_lr": 1.0}).final_params[0]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ca2fl_client_arriving_twice_in_a_step_counts_its_latest_delta():
    """Immediate refill can bring one client twice into a buffer; arrivals are folded in one at a time."""
    alg = ca2fl()
    state = alg.init(jnp.zeros(2), 3)
    meta = ServerMeta(clients=jnp.array([1, 1, 2]), mask=jnp.array([True, True, True]),
                      staleness=jnp.zeros(3, jnp.int32), step=jnp.int32(0), time=jnp.float32(0))
    deltas = jnp.array([[1.0, 0.0], [3.0, 0.0], [0.0, 6.0]])
    new = alg.server(state, deltas, meta, {"server_lr": 1.0})
    # acc = (1 - 0) + (3 - 1) + (6 - 0) -> v = acc / 3 (hbar was 0); cache: h_1 = [3, 0], h_2 = [0, 6].
    np.testing.assert_allclose(new.x, [1.0, 2.0])
    np.testing.assert_allclose(new.cache, [[0, 0], [3, 0], [0, 6]])
    np.testing.assert_allclose(new.cache_mean, [1.0, 2.0])


@pytest.mark.parametrize("buffer_size", [1, 4])
@pytest.mark.parametrize("make", [
    lambda: ca2fl(),
    lambda: ca2fl(cache="int8"),
    lambda: ace(),
    lambda: ace(cache="int4"),
    lambda: mifa(cache="bfloat16"),
], ids=["ca2fl", "mf_ca2fl_int8", "ace", "ace_int4", "mifa_bf16"])
def test_cache_step_updates_the_cache_in_place(buffer_size, make):
    """A step writes |S| rows of the n x d cache; the compiled scan must not copy the whole cache (O(n d) per step)."""
    import re

    n, d, m = 37, 1000, buffer_size
    alg = make()

    def body(state, t):
        rows = (jnp.arange(m) * 7 + t) % n
        meta = ServerMeta(clients=rows, mask=jnp.ones(m, bool), staleness=jnp.zeros(m, jnp.int32), step=t,
                          time=jnp.float32(0), key=jax.random.fold_in(jax.random.PRNGKey(0), t))
        return alg.server(state, jnp.ones((m, d)) * t + jnp.arange(d) / d, meta, {"server_lr": 1.0}), None

    run = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(5))[0], donate_argnums=(0,))
    hlo = run.lower(alg.init(jnp.zeros(d), n)).compile().as_text()
    copies = [line for line in hlo.splitlines() if re.search(rf"\w+\[{n},\d+\]\S* copy\(", line)]
    assert not copies, copies
