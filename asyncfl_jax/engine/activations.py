"""The activations of local training, counted before anything is compiled.

A job's local step keeps the outputs of the model's layers for the backward pass: for a batch of ``B`` examples at
least ``B x a`` bytes, where ``a`` (:func:`activation_bytes_per_example`) is the size of the outputs of the model's
convolutions and matrix products on one example, read from the model's traced forward pass (``jax.make_jaxpr`` on
abstract inputs: nothing is computed or allocated). A lower bound: XLA keeps more (the inputs of the nonlinearities,
the convolutions' patches, the gradients) but never less, since each of these outputs is needed by the backward pass.

The jobs of a server step are trained together (:mod:`asyncfl_jax.engine.executors`): all ``M`` of them with the
``vmap`` executor, ``G`` at a time with ``grouped:G``, one at a time with ``unrolled``; the replicas of a chunk
together, or ``replica_batch`` at a time. So the local step holds at least

    activations = replicas in parallel x jobs in parallel x B x a

bytes while it runs (:func:`local_step_activation_bytes`). The memory budget adds them to the state and the data
(:class:`~asyncfl_jax.engine.budget.MemoryBudget`, and from the configuration alone
:func:`asyncfl_jax.preflight.check_memory`), so a run whose local step cannot fit is refused before it is compiled;
the compiled chunk is then checked once more on XLA's own count (:func:`~asyncfl_jax.engine.budget.check_compiled`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np

LAYER_PRIMITIVES = ("conv_general_dilated", "dot_general")
"""The operations whose outputs count as activations (a layer's pre-activation)."""


def _sub_jaxprs(params: dict[str, Any]) -> list[Any]:
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", None)
            if inner is not None:
                found.append(inner if hasattr(inner, "eqns") else getattr(inner, "jaxpr", None))
    return [j for j in found if j is not None and hasattr(j, "eqns")]


def layer_output_bytes(jaxpr: Any) -> int:
    """Bytes of the outputs of the convolutions and matrix products of ``jaxpr`` (and of the functions it calls)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in LAYER_PRIMITIVES:
            total += sum(math.prod(v.aval.shape) * np.dtype(v.aval.dtype).itemsize for v in eqn.outvars)
        for inner in _sub_jaxprs(eqn.params):
            total += layer_output_bytes(inner)
    return total


def activation_bytes_per_example(apply: Callable[[Any, Any], Any], params: Any, example: Any) -> int:
    """``a``: bytes of the layer outputs of ``apply(params, x)`` for one example ``x`` of the shape and dtype of
    ``example`` (one example, without a batch axis: it is added here). ``params`` and ``example`` may be arrays or
    ``jax.ShapeDtypeStruct``."""
    x = jax.ShapeDtypeStruct((1, *example.shape), example.dtype)
    p = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    return layer_output_bytes(jax.make_jaxpr(apply)(p, x).jaxpr)


def jobs_in_parallel(executor: Any, jobs_per_step: int) -> int:
    """How many of a step's ``jobs_per_step`` jobs are trained at the same time by ``executor`` (``"vmap"``,
    ``"unrolled"``, ``"grouped:G"``, or the :class:`~asyncfl_jax.engine.options.EngineOptions` holding it;
    ``"auto"`` counts as one at a time: a lower bound)."""
    executor = str(getattr(executor, "job_executor", executor))
    jobs = max(1, int(jobs_per_step))
    if executor == "vmap":
        return jobs
    if executor.startswith("grouped:"):
        return min(jobs, int(executor.split(":", 1)[1]))
    return 1


def replicas_trained_together(options: Any, replicas: int, backend: str) -> int:
    """How many of ``replicas`` one device trains at the same time under ``options``: ``replica_batch`` at a time
    when it is given; all of them on an accelerator or when the state is spread over devices; on a CPU otherwise
    one (grouped automatically, engine/replica_groups.py, possibly one at a time: a lower bound). Divided among the
    devices the state is spread over."""
    together = int(replicas)
    placement = options.placement
    if options.replica_batch is not None:
        together = min(together, int(options.replica_batch))
    elif backend == "cpu" and not placement.splits_state:
        together = 1
    return -(-together // devices_of(placement))


def devices_of(placement: Any) -> int:
    """The devices a placement spreads the state over (``shard_replicas`` / ``shard_clients``: every device), else 1."""
    return max(1, jax.device_count()) if placement.splits_state else 1


def local_step_activation_bytes(per_example: int, batch: int, jobs: int, replicas: int) -> int:
    """``replicas x jobs x batch x per_example`` (see the module docstring)."""
    return int(replicas) * int(jobs) * int(batch) * int(per_example)


def run_activation_bytes(run: Any) -> int:
    """The activations of one local step of a prepared :class:`~asyncfl_jax.engine.loop.Run` on the most loaded
    device: its model and batch (``local.batch_size``, or the largest client's examples for full batch), the jobs of
    its widest server step as its executor trains them, and the replicas a chunk computes together (``replica_batch``,
    else all of them, spread over the devices of a placement that splits the state: :func:`devices_of`)."""
    task, local = run.task, run.local
    per_example = activation_bytes_per_example(task.model.flat_apply, task.model.flat_params,
                                               task.train.features[0])
    batch = local.batch_size or int(task.train.indices.shape[1])
    schedules = getattr(run.timeline, "schedules", None)
    jobs = max(int(np.max(s.uploads_per_step, initial=1)) for s in schedules) if schedules else 1
    replicas = -(-(run.replica_batch or len(run.replicas)) // devices_of(run.placement))
    return local_step_activation_bytes(per_example, batch, jobs_in_parallel(run.options, jobs), replicas)
