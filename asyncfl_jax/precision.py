"""The float precision of a run: ``"float32"`` (the default) or ``"float64"``.

A float64 run carries everything that is real-valued in float64: the data (features, regression targets), the model
parameters ``x``, the server state (caches, running means, residuals, memories, optimizer states), the client
updates, the staleness weights and the hyper-parameters (``lr = 0.1`` is then the double ``0.1``, not the float
``0.1000000015``), and the metrics. Integer things stay integers (labels, indices, steps, quantized cache codes), and
the virtual times of the schedules keep their own representation (float64 on the host, double-float pairs in the
event clock).

JAX computes in float64 only with ``jax_enable_x64`` on, a flag of the whole process that changes the default dtypes
of every array created while it is on. :func:`precision_scope` sets it for the duration of one run (JAX's
``jax.enable_x64`` context, thread-local) and restores it afterwards, so a float64 run does not change what a later
float32 run of the same process computes, and a float32 run is the same whether or not the process turned x64 on.
Arrays created before a float64 run (a task's float32 data, a Flax model's float32 parameters) are converted by
:func:`cast_task`: their values are the float32 values, exactly, as float64 numbers. Data that must be float64 from
the start (e.g. features computed in float64) has to be built while x64 is on (``jax.config.update
("jax_enable_x64", True)`` at the start of the program): without x64, ``jnp.asarray(a, jnp.float64)`` silently gives
float32 (:func:`cast_task` refuses such a task rather than compute with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

PRECISIONS = ("float32", "float64")


def check_precision(precision: Any, name: str = "precision") -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a ValueError naming the option and the allowed values."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"{name} must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def precision_dtype(precision: str) -> Any:
    """The numpy dtype of a precision: ``float32`` or ``float64``."""
    return np.dtype(check_precision(precision))


def float_dtype(*arrays: Any) -> Any:
    """The float dtype a computation on ``arrays`` should use: float64 when one of them is float64 and x64 is on (a
    float64 run), else float32. Used where a value is built from integers (staleness, counts) or quantized, so that
    it follows the run's precision."""
    if jax.config.jax_enable_x64 and any(getattr(a, "dtype", None) == jnp.float64 for a in arrays):
        return jnp.float64
    return jnp.float32


@contextlib.contextmanager
def precision_scope(precision: str) -> Iterator[None]:
    """``jax_enable_x64`` on for a float64 run, off for a float32 run, for the duration of the ``with`` block
    (restored afterwards; see the module docstring)."""
    with jax.enable_x64(check_precision(precision) == "float64"):
        yield


def _cast_leaf(leaf: Any, dtype: Any) -> Any:
    if leaf is None or not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.floating):
        return leaf
    if leaf.dtype == dtype:
        return leaf
    return jnp.asarray(leaf, dtype)


def cast_tree(tree: Any, dtype: Any) -> Any:
    """Every floating-point leaf of ``tree`` as ``dtype`` (integer and boolean leaves unchanged)."""
    return jax.tree_util.tree_map(lambda a: _cast_leaf(a, dtype), tree)


def cast_task(task: Any, precision: str) -> Any:
    """``task`` (a :class:`~asyncfl_jax.task.Task`) with its model parameters and every floating-point data array in
    ``precision`` (the same task when nothing changes, so a float32 run of a float32 task is untouched)."""
    dtype = precision_dtype(precision)
    if dtype == np.float64 and not jax.config.jax_enable_x64:  # jnp would silently give float32
        raise ValueError("precision='float64' needs jax_enable_x64: run it inside "
                         "asyncfl_jax.precision.precision_scope('float64') (simulate and prepare_run do)")
    fields = ("train", "test_x", "test_y", "train_eval_x", "train_eval_y", "val_x", "val_y", "client_test")
    changes = {f: cast_tree(getattr(task, f), dtype) for f in fields}
    params = cast_tree(task.model.init_params, dtype)
    unchanged = all(a is b for a, b in zip(jax.tree_util.tree_leaves(params),
                                           jax.tree_util.tree_leaves(task.model.init_params)))
    unchanged = unchanged and all(
        all(a is b for a, b in zip(jax.tree_util.tree_leaves(changes[f]), jax.tree_util.tree_leaves(getattr(task, f))))
        for f in fields)
    if unchanged:
        return task
    return dataclasses.replace(task, model=task.model._replace(init_params=params), **changes)


# ---------------------------------------------------------------------------------------------------- mixed precision
COMPUTE_DTYPES = ("float32", "bfloat16")


def _to_compute(tree: Any, dtype: Any) -> Any:
    """Every float32 leaf of ``tree`` as ``dtype`` (integers, e.g. token ids, and float64 leaves unchanged)."""
    return jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if hasattr(a, "dtype") and a.dtype == jnp.float32 else a, tree)


def mixed_precision(model: Any, compute_dtype: str = "bfloat16") -> Any:
    """``model`` with its *local training* computed in ``compute_dtype`` and float32 master weights.

    Local training (:func:`asyncfl_jax.client.make_local_update`) calls the model's training-mode forward pass
    ``train_apply``; the returned model's one is

        logits = float32( f(bfloat16(params), bfloat16(x)) )

    so every matmul and convolution of the forward and backward passes runs on bfloat16 operands (the accelerators'
    fast path), while the flat parameter vector ``x``, the gradient (the transpose of the cast gives it back in
    float32), the optimizer's update ``y_{k+1} = y_k - eta * g_k``, the uploaded delta, the server's state and the
    loss (softmax cross-entropy of float32 logits) stay float32: the usual "bf16 compute, f32 master weights"
    recipe. Evaluation (``apply_fn``) stays in float32, so test accuracies are not rounded by the option.

    A model without a training mode gets one that ignores its dropout key (local training then derives a dropout key
    per step, which draws nothing: the minibatches are the same as without the option). ``compute_dtype="float32"``
    returns ``model`` itself (bit-identical runs).

    Whether it is faster depends on the device: on an accelerator with bfloat16 matrix units (TPU, NVIDIA Ampere and
    later) large matmuls run several times faster, on a CPU the casts often cost more than they save
    (docs/benchmarks.md). Measure on your GPU (``scripts/bench_accelerator.py``, part ``mixed_precision``), and check
    the accuracy of your task against a float32 run: bfloat16 keeps 8 bits of mantissa, so per-step gradients are
    rounded to about 3 significant digits.
    """
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {compute_dtype!r}")
    if compute_dtype == "float32":
        return model
    dtype = jnp.dtype(compute_dtype)
    inner_train = model.train_apply

    def train_apply(params: Any, x: jax.Array, key: jax.Array) -> jax.Array:
        params, x = _to_compute(params, dtype), _to_compute(x, dtype)
        out = model.apply_fn(params, x) if inner_train is None else inner_train(params, x, key)
        return out.astype(jnp.float32)

    return model._replace(train_apply=train_apply, name=f"{model.name}[{compute_dtype} compute]")
