"""Compile once: what a run traces, lowers and compiles, counted with JAX's monitoring events.

* ``init`` is traced once per run (``prepare_run`` traces the jitted function the host loop then compiles);
* the evaluation is one process-wide jitted function (``engine.loop.evaluate_replicas``) whose static arguments
  compare equal for the same model and loss, so a second run with the same shapes (another algorithm, the same
  experiment again) neither traces nor compiles it again;
* a second identical ``simulate`` in the same process, with the persistent cache on, compiles nothing new (every
  program it cannot take from memory is loaded from the cache).
"""

from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

from asyncfl_jax import DelayModel, LocalConfig, fedasync, fedbuff, make_model, make_schedule, make_task, simulate
from asyncfl_jax.compile_cache import apply_settings, current_settings, enable_compile_cache
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.task import make_evaluator, task_arrays


class _Compiles:
    """Counts, while registered, JAX's compile events per function: traces (``jaxpr_trace_duration``), lowerings
    (``jaxpr_to_mlir_module_duration``) and XLA compilations (``backend_compile_duration``), and the persistent
    cache's hits and misses."""

    def __init__(self):
        self.durations = collections.Counter()
        self.events = collections.Counter()

    def _duration(self, event: str, seconds: float, **kwargs) -> None:
        del seconds
        if event.startswith("/jax/core/compile/"):
            self.durations[(event.rsplit("/", 1)[1], kwargs.get("fun_name"))] += 1

    def _event(self, event: str, **kwargs) -> None:
        del kwargs
        if event.startswith("/jax/compilation_cache/cache_"):
            self.events[event.rsplit("_", 1)[1]] += 1

    def count(self, stage: str, fun_name: str) -> int:
        return self.durations[(stage, fun_name)]

    def total(self, stage: str) -> int:
        return sum(n for (s, _), n in self.durations.items() if s == stage)

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        jax.monitoring.register_event_listener(self._event)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._duration)
        jax.monitoring.unregister_event_listener(self._event)


@pytest.fixture
def fresh_cache(tmp_path):
    """An empty persistent cache folder for the test (the session's settings are put back afterwards)."""
    saved = current_settings()
    enable_compile_cache(tmp_path / "cache")
    jax.clear_caches()
    yield
    apply_settings(saved)


def _task():
    data = synthetic_leaf(num_clients=6, seed=2, max_samples=60)
    return make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[8]))


def _run(task, algorithm, steps=12, eval_every=4):
    schedule = make_schedule("concurrent", 6, steps, DelayModel(), seed=0, concurrency=3, buffer_size=2,
                             refill="boundary")
    return simulate(task, algorithm, schedule, LocalConfig(steps=2, batch_size=4), seeds=[0], eval_every=eval_every,
                    progress=False)


def test_init_is_traced_once_per_run(fresh_cache):
    with _Compiles() as counts:
        _run(_task(), fedbuff())
    assert counts.count("jaxpr_trace_duration", "init") == 1
    assert counts.count("jaxpr_to_mlir_module_duration", "jit(init)") == 1


def test_a_second_identical_run_compiles_nothing_new(fresh_cache):
    task = _task()
    with _Compiles() as cold:
        first = _run(task, fedbuff())
    assert cold.events["misses"] > 0 and cold.count("backend_compile_duration", "jit(_evaluate_replicas)") == 1
    with _Compiles() as warm:
        second = _run(task, fedbuff())
    # Nothing compiled by XLA: each program is taken from memory (the evaluation, the eager operations) or loaded
    # from the persistent cache (the run's own init and chunk programs, new closures of a new Program).
    assert warm.events["misses"] == 0
    assert warm.total("backend_compile_duration") == warm.events["hits"]
    # The evaluation is not even traced again.
    assert warm.count("jaxpr_trace_duration", "_evaluate_replicas") == 0
    assert warm.count("jaxpr_to_mlir_module_duration", "jit(_evaluate_replicas)") == 0
    np.testing.assert_array_equal(second.final_params, first.final_params)
    for k in first.metrics:
        np.testing.assert_array_equal(second.metrics[k], first.metrics[k])


def test_runs_of_one_experiment_share_the_evaluation(fresh_cache):
    """FedBuff then FedAsync on one task (as in the default experiment): one evaluation program between them, and
    the shared one gives what a plain jitted evaluation of the final model gives."""
    task = _task()
    with _Compiles() as counts:
        histories = [_run(task, fedbuff()), _run(task, fedasync())]
    assert counts.count("jaxpr_trace_duration", "_evaluate_replicas") == 1
    assert counts.count("backend_compile_duration", "jit(_evaluate_replicas)") == 1
    assert counts.count("jaxpr_trace_duration", "init") == 2  # one per algorithm
    evaluate = jax.jit(make_evaluator(task.model, loss=task.loss))
    arrays = task_arrays(task)
    for h in histories:
        reference = evaluate(np.asarray(h.final_params[0]), arrays)
        for k in h.metrics:
            np.testing.assert_allclose(h.metrics[k][0, -1], float(reference[k]), rtol=1e-6, atol=1e-7)


def test_evaluators_compare_equal_only_for_the_same_computation():
    task = _task()
    a, b = make_evaluator(task.model, loss=task.loss), make_evaluator(task.model, loss=task.loss)
    assert a is not b and a == b and hash(a) == hash(b)
    assert a != make_evaluator(task.model, batch_size=7, loss=task.loss)
    data = synthetic_leaf(num_clients=6, seed=2, max_samples=60)
    wider = make_model("mlp", data.input_shape, data.num_classes, hidden=[9])
    assert a != make_evaluator(wider, loss=task.loss)  # other parameter shapes
    other_apply = task.model._replace(apply_fn=lambda p, x: task.model.apply_fn(p, x))
    assert a != make_evaluator(other_apply, loss=task.loss)  # another model function, whatever its shapes
    same_shapes = task.model._replace(init_params=jax.tree_util.tree_map(lambda x: x + 1, task.model.init_params))
    assert a == make_evaluator(same_shapes, loss=task.loss)  # initial values are not part of the computation
