"""Losses: what local training minimizes and what evaluation reports.

A :class:`Loss` is a pure function ``value(model, params, batch) -> scalar`` of the model, its parameter pytree and
a :class:`Batch`, plus optional extra metrics. Every batch the simulator builds carries a per-example ``weight``
that is 1 on real examples and 0 on padding rows (a client with fewer examples than the batch size, the padded last
evaluation batch), so **a loss must be the weighted mean** ``sum_j w_j l_j / max(sum_j w_j, 1)`` of per-example
losses ``l_j``: evaluation multiplies each batch's value by ``sum_j w_j`` and divides the total by the number of
examples, which is the exact mean over the data only for a weighted mean.

Built-in losses:

* :data:`CLASSIFICATION` (the default for integer labels): softmax cross-entropy of the model's logits ``[B, C]``
  against int labels ``[B]``; evaluation reports ``test_accuracy``, ``test_loss`` and ``train_loss``.
* :data:`REGRESSION` (the default for float targets): mean squared error. Targets are float ``[N]`` or ``[N, k]``;
  the model outputs ``[B, k]`` (``[B, 1]`` or ``[B]`` for ``[N]`` targets). The per-example loss is the mean over
  the ``k`` outputs, ``l_j = (1/k) sum_c (f(x_j)_c - y_jc)^2``. Evaluation reports ``test_loss`` and ``train_loss``
  (the MSE) and no accuracy.
* :func:`custom_loss`: any ``fn(params, batch) -> scalar`` (the user applies the model in it), with optional
  ``metrics(params, batch) -> {name: weighted mean}`` reported on the test data as ``test_<name>``.

Dropout: in local training ``batch.key`` is a PRNG key for the step (see :mod:`asyncfl_jax.client`); in evaluation
it is ``None`` (deterministic). The built-in losses pass it to :meth:`Model.forward
<asyncfl_jax.models.core.Model.forward>`, which uses the model's training-mode apply when the model has one.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

TARGETS = ("int", "float", "any")


class Batch(NamedTuple):
    """One batch of examples.

    Attributes:
      x: float32 [B, ...] features.
      y: [B] int32 labels (classification) or float32 [B] / [B, k] targets (regression).
      weight: float32 [B], 1 on real examples and 0 on padding rows.
      key: the step's dropout key in local training; ``None`` in evaluation.
    """

    x: jax.Array
    y: jax.Array
    weight: jax.Array
    key: jax.Array | None = None


LossFn = Callable[[Any, Any, Batch], jax.Array]
MetricsFn = Callable[[Any, Any, Batch], Mapping[str, jax.Array]]


class Loss(NamedTuple):
    """A loss and the metrics evaluation reports with it.

    Attributes:
      name: ``"classification"``, ``"regression"`` or the custom loss's name.
      value: ``value(model, params, batch) -> scalar``, the weighted mean of per-example losses.
      metrics: ``metrics(model, params, batch) -> {name: sum_j w_j m_j}``, the weighted *sums* over the batch of
        per-example metrics ``m_j``; evaluation divides their totals by the number of examples and reports them on
        the test data as ``test_<name>`` (classification: ``accuracy``); ``None``: none.
      targets: the label dtype the loss needs: ``"int"``, ``"float"`` or ``"any"``.
    """

    name: str
    value: LossFn
    metrics: MetricsFn | None = None
    targets: str = "any"


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_j w_j v_j / max(sum_j w_j, 1)``: the mean over the real examples of a padded batch."""
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def cross_entropy_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """Mean softmax cross-entropy; with ``weights`` a weighted mean (padding rows get weight 0)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    if weights is None:
        return jnp.mean(losses)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def _classification_value(model: Any, params: Any, batch: Batch) -> jax.Array:
    return cross_entropy_loss(model.forward(params, batch.x, batch.key), batch.y, batch.weight)


def _classification_metrics(model: Any, params: Any, batch: Batch) -> dict[str, jax.Array]:
    logits = model.forward(params, batch.x, batch.key)
    return {"accuracy": jnp.sum((jnp.argmax(logits, axis=-1) == batch.y) * batch.weight)}  # correct examples


def squared_errors(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-example squared error ``(1/k) sum_c (out_c - y_c)^2`` for targets ``[B]`` or ``[B, k]``."""
    if targets.ndim == 1:
        if outputs.ndim == 2 and outputs.shape[1] == 1:
            outputs = outputs[:, 0]
        if outputs.shape != targets.shape:
            raise ValueError(f"regression: model outputs of shape {outputs.shape} do not match targets of shape "
                             f"{targets.shape} (a model for [N] targets outputs [B, 1] or [B])")
        return (outputs - targets) ** 2
    if outputs.shape != targets.shape:
        raise ValueError(f"regression: model outputs of shape {outputs.shape} do not match targets of shape "
                         f"{targets.shape}")
    return jnp.mean((outputs - targets) ** 2, axis=tuple(range(1, targets.ndim)))


def _regression_value(model: Any, params: Any, batch: Batch) -> jax.Array:
    return weighted_mean(squared_errors(model.forward(params, batch.x, batch.key), batch.y), batch.weight)


CLASSIFICATION = Loss("classification", _classification_value, _classification_metrics, targets="int")
"""Softmax cross-entropy on int labels; evaluation adds ``test_accuracy``."""

REGRESSION = Loss("regression", _regression_value, None, targets="float")
"""Mean squared error on float targets ``[N]`` or ``[N, k]``; evaluation reports losses only."""

LOSSES = {"classification": CLASSIFICATION, "regression": REGRESSION}


def custom_loss(fn: Callable[[Any, Batch], jax.Array],
                metrics: Callable[[Any, Batch], Mapping[str, jax.Array]] | None = None,
                name: str = "custom", targets: str = "any") -> Loss:
    """A user loss ``fn(params, batch) -> scalar`` (``params``: the model's parameter pytree).

    ``fn`` must be the weighted mean of per-example losses with ``batch.weight`` (see the module docstring), and
    apply the model itself (e.g. ``model.apply_fn(params, batch.x)``, or ``model.forward(params, batch.x,
    batch.key)`` for the training mode: ``batch.key`` is the dropout key in training and ``None`` in evaluation).
    ``metrics(params, batch) -> {name: weighted mean}`` (optional) is reported
    on the test data as ``test_<name>``; ``targets`` ("int", "float" or "any") is checked against the data.
    """
    if not callable(fn):
        raise ValueError(f"custom_loss: fn must be a function (params, batch) -> scalar, got {fn!r}")
    if metrics is not None and not callable(metrics):
        raise ValueError(f"custom_loss: metrics must be a function (params, batch) -> dict or None, got {metrics!r}")
    if targets not in TARGETS:
        raise ValueError(f"custom_loss: targets must be one of {list(TARGETS)}, got {targets!r}")
    value = lambda model, params, batch: fn(params, batch)  # noqa: E731
    def extra(model: Any, params: Any, batch: Batch) -> dict[str, jax.Array]:  # weighted means -> weighted sums
        values = dict(metrics(params, batch))
        if "loss" in values:
            raise ValueError(f"custom_loss {name!r}: a metric may not be named 'loss' (it would replace test_loss)")
        total = jnp.sum(batch.weight)
        return {k: v * total for k, v in values.items()}

    return Loss(name, value, None if metrics is None else extra, targets)


def get_loss(loss: "Loss | str | None", labels: np.ndarray | jax.Array) -> Loss:
    """The task's loss: ``None`` picks classification for integer labels and regression for float targets; a name
    is looked up in :data:`LOSSES`; a :class:`Loss` is checked against the labels' dtype."""
    is_int = np.issubdtype(np.dtype(labels.dtype), np.integer)
    if loss is None:
        return CLASSIFICATION if is_int else REGRESSION
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)} or a Loss (losses.custom_loss), got {loss!r}")
        loss = LOSSES[loss]
    if not isinstance(loss, Loss):
        raise ValueError(f"loss must be a name in {sorted(LOSSES)} or a Loss (wrap a function (params, batch) -> "
                         f"scalar with losses.custom_loss), got {loss!r}")
    if loss.targets == "int" and not is_int:
        raise ValueError(f"loss {loss.name!r} needs integer labels, got targets of dtype {labels.dtype} "
                         f"(float targets: use loss='regression')")
    if loss.targets == "float" and is_int:
        raise ValueError(f"loss {loss.name!r} needs float targets, got labels of dtype {labels.dtype} (cast the "
                         f"targets to float32, or use loss='classification' for class labels)")
    return loss
