"""The accelerator path, checked on a CPU: the carry is donated (an ``n x d`` cache is held once), the memory budget
counts it once against the device's real memory, a run compiles each program once whatever its number of chunks,
and bfloat16 local-training compute with float32 master weights (``precision.mixed_precision``) stays close to
float32 while computing in bfloat16."""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support import TOY_DELAYS, toy_problem
from asyncfl_jax.algorithms import ace, ca2fl, fedbuff
from asyncfl_jax.client import LocalConfig, make_local_update
from asyncfl_jax.compile_cache import apply_settings, current_settings, disable_compile_cache
from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.engine import HostLoop, prepare_run, simulate
from asyncfl_jax.engine.budget import MemoryBudget, MemoryRefusal, compiled_bytes, device_memory_bytes
from asyncfl_jax.models.core import make_model
from asyncfl_jax.precision import mixed_precision
from asyncfl_jax.task import make_task
from asyncfl_jax.timing import DelayModel, make_schedule


def _cache_task(num_clients: int = 600, features: int = 64, classes: int = 10):
    """Logistic regression (d = 650) with 4 examples per client: an ``n x d`` cache of 1.5 MiB dominates the state."""
    rng = np.random.default_rng(0)
    m = 4 * num_clients
    ds = Dataset("cache", rng.random((m, features), dtype=np.float32), rng.integers(0, classes, m).astype(np.int32),
                 rng.random((8, features), dtype=np.float32), rng.integers(0, classes, 8).astype(np.int32), classes)
    return make_task(ds, [np.arange(4 * i, 4 * i + 4) for i in range(num_clients)],
                     make_model("logreg", (features,), classes), train_eval_size=8)


@pytest.mark.parametrize("name", ["ace", "ca2fl"])
def test_the_compiled_chunk_updates_the_donated_state_in_place(name):
    """The chunk the host loop compiles aliases its whole carry (outputs written into the donated inputs), so XLA's
    own count of what it holds is about one state plus the data, not two states: ACE's n x d cache and its n x d
    in-flight gradients, CA2FL's cache, are not copied per chunk."""
    task = _cache_task()
    n = task.num_clients
    if name == "ace":
        algorithm, schedule = ace(), make_schedule("all_active", n, 6, DelayModel(), seed=0)
    else:
        algorithm = ca2fl()
        schedule = make_schedule("concurrent", n, 6, DelayModel(), seed=0, concurrency=20, buffer_size=10)
    run = prepare_run(task, algorithm, schedule, LocalConfig(steps=1, batch_size=4), eval_every=3)
    loop, placed = HostLoop(run), run.placed
    part = run.timeline.chunk_inputs(placed.inputs, 0, 3, None)
    compiled = loop.chunk_fns[False].lower(run.carry_shape, part, placed.hp, placed.keys, placed.data).compile()
    stats = compiled.memory_analysis()
    budget = run.budget()
    cache_bytes = 4 * n * task.model.num_params
    assert budget.server >= cache_bytes  # the cache is in the state the budget counts
    assert stats.alias_size_in_bytes >= budget.state  # every byte of the state is donated and written in place
    assert compiled_bytes(compiled) < budget.state + budget.data + cache_bytes // 4  # not a second copy of it


def test_the_budget_counts_the_donated_state_once_against_the_device_limit():
    """ACE with an n x d cache and n x d in-flight gradients of 20 GiB each fits an 80 GiB device once (2 x 40 GiB
    would not); 80 GiB of state does not."""
    data = 2 * 2**30
    fits = MemoryBudget(server=20 * 2**30, clients=0, pending=20 * 2**30, data=data, replicas=1, available=80 * 2**30)
    fits.check()
    too_big = MemoryBudget(server=40 * 2**30, clients=0, pending=40 * 2**30, data=data, replicas=1,
                           available=80 * 2**30)
    with pytest.raises(MemoryRefusal, match="the simulation state of 80.00 GiB"):
        too_big.check()


class _Device:
    platform = "gpu"

    def __init__(self, stats):
        self._stats = stats

    def memory_stats(self):
        return self._stats


def test_device_memory_is_the_allocators_limit_when_the_backend_reports_it():
    assert device_memory_bytes(_Device({"bytes_limit": 123 * 2**30, "bytes_in_use": 0})) == 123 * 2**30
    assert device_memory_bytes(_Device(None)) is None  # an accelerator that reports nothing: no guess


class _Compiles:
    """XLA compilations per function name while registered (JAX's ``backend_compile_duration`` events)."""

    def __init__(self):
        self.counts = collections.Counter()

    def _listen(self, event: str, seconds: float, **kwargs) -> None:
        del seconds
        if event.endswith("backend_compile_duration"):
            self.counts[kwargs.get("fun_name")] += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


def test_a_run_compiles_nothing_after_its_first_chunks():
    """Eight chunks of equal length: after the second chunk nothing more is compiled (no recompilation of the chunk,
    of the evaluation or of the host's per-chunk slicing, e.g. from a carry whose dtypes or weak types change after
    the first chunk), and the chunk, the initialization and the evaluation are each compiled once."""
    task, _, _ = toy_problem(6)
    schedule = make_schedule("concurrent", 6, 16, TOY_DELAYS, seed=0, concurrency=4, buffer_size=2)
    saved = current_settings()
    disable_compile_cache()  # a persistent-cache hit (a program another test compiled) is no compile event
    jax.clear_caches()
    seen = []
    try:
        with _Compiles() as c:
            h = simulate(task, fedbuff(), schedule, LocalConfig(steps=2, batch_size=None), eval_every=2,
                         progress=False, callbacks=[lambda update: seen.append(dict(c.counts))])
    finally:
        apply_settings(saved)
    assert len(h.steps) == 9 and len(seen) == 8
    assert all(counts == seen[1] for counts in seen[2:]), [sum(x.values()) for x in seen]
    assert c.counts["jit(advance)"] == c.counts["jit(init)"] == c.counts["jit(_evaluate_replicas)"] == 1, c.counts


def _mlp_task():
    rng = np.random.default_rng(1)
    m, classes = 240, 4
    centers = rng.normal(size=(classes, 12))
    y = rng.integers(0, classes, m).astype(np.int32)
    x = (centers[y] + 0.5 * rng.normal(size=(m, 12))).astype(np.float32)
    ds = Dataset("blobs", x, y, x[:60], y[:60], classes)
    return make_task(ds, [np.arange(i, m, 8) for i in range(8)], make_model("mlp", (12,), classes, hidden=(16,)))


def test_mixed_precision_computes_in_bfloat16_and_keeps_float32_master_weights():
    task = _mlp_task()
    model = task.model
    bf16 = mixed_precision(model)
    assert mixed_precision(model, "float32") is model  # float32: the same model, bit-identical runs
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        mixed_precision(model, "float16")
    x = jnp.asarray(task.test_x[:5])
    assert bf16.train_apply(model.init_params, x, jax.random.PRNGKey(0)).dtype == jnp.float32
    hlo = jax.jit(lambda p: bf16.train_apply(p, x, None)).lower(model.init_params).as_text()
    assert "bf16" in hlo  # the forward pass runs on bfloat16 operands
    local = LocalConfig(steps=3, batch_size=8)
    hp = {"client_lr": jnp.float32(0.1), "momentum": jnp.float32(0), "weight_decay": jnp.float32(0),
          "prox_mu": jnp.float32(0)}
    key = jax.random.PRNGKey(3)
    d32 = make_local_update(model, local)(model.flat_params, 2, key, hp, task.train)
    d16 = make_local_update(bf16, local)(model.flat_params, 2, key, hp, task.train)
    assert d16.dtype == jnp.float32  # the delta (master weights' update) stays float32
    rel = float(jnp.linalg.norm(d16 - d32) / jnp.linalg.norm(d32))
    assert 0 < rel < 0.05  # bfloat16 rounding: different, and close (same minibatches, same steps)


def test_mixed_precision_training_reaches_the_float32_accuracy_on_a_tiny_problem():
    """FedBuff on well separated blobs: bfloat16 compute ends within 3 points of float32's test accuracy (and both
    learn), the evaluation itself in float32."""
    task = _mlp_task()
    schedule = make_schedule("concurrent", 8, 20, TOY_DELAYS, seed=0, concurrency=4, buffer_size=2)
    local = LocalConfig(steps=3, batch_size=8)
    acc = {}
    for compute in ("float32", "bfloat16"):
        t = task if compute == "float32" else dataclasses.replace(task, model=mixed_precision(task.model))
        h = simulate(t, fedbuff(), schedule, local, hparams={"client_lr": 0.1}, eval_every=20, progress=False)
        acc[compute] = float(np.asarray(h.metrics["test_accuracy"])[0, -1])
    assert acc["float32"] > 0.8 and abs(acc["bfloat16"] - acc["float32"]) <= 0.03, acc
