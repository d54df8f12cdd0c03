"""A Task bundles what a simulation trains and evaluates: the model, every client's data and the test data."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asyncfl_jax.data.client_data import ClientData, Dataset, label_dtype
from asyncfl_jax.losses import CLASSIFICATION, Batch, Loss, get_loss
from asyncfl_jax.models.core import Model


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """Model + client data + evaluation data.

    Attributes:
      model: the model (``apply_fn`` and initial parameters ``x_0``).
      train: every client's training data on the device.
      test_x, test_y: the pooled test set.
      train_eval_x, train_eval_y: a fixed sample of the pooled training data on which the train loss is reported.
      num_classes: number of classes (regression: number of outputs).
      name: a short description, e.g. ``"synthetic(1,1)/mlp"``.
      loss: what local training minimizes and evaluation reports (:mod:`asyncfl_jax.losses`).
    """

    model: Model
    train: ClientData
    test_x: jax.Array
    test_y: jax.Array
    train_eval_x: jax.Array
    train_eval_y: jax.Array
    num_classes: int
    name: str = "task"
    loss: Loss = CLASSIFICATION

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def num_params(self) -> int:
        return self.model.num_params


def make_task(
    dataset: Dataset,
    parts: Sequence[np.ndarray],
    model: Model,
    train_eval_size: int = 5000,
    seed: int = 0,
    loss: Loss | str | None = None,
) -> Task:
    """Builds a task from a dataset, a partition of its training split and a model.

    The train loss is evaluated on ``train_eval_size`` examples drawn once (without replacement, with ``seed``) from
    the examples the clients hold; all of them when there are fewer. ``loss``: ``None`` picks classification for
    integer labels and regression (MSE) for float targets; ``"classification"``, ``"regression"`` or a
    :class:`~asyncfl_jax.losses.Loss` (e.g. :func:`~asyncfl_jax.losses.custom_loss`), checked against the labels.
    """
    loss = get_loss(loss, dataset.train_y)
    train = ClientData.from_partition(dataset.train_x, dataset.train_y, parts)
    held = np.concatenate([np.asarray(p) for p in parts])
    rng = np.random.default_rng([seed, 0xE7A1])
    sample = np.sort(rng.choice(held, size=min(train_eval_size, held.size), replace=False))
    return Task(
        model=model,
        train=train,
        test_x=jnp.asarray(dataset.test_x, jnp.float32),
        test_y=jnp.asarray(dataset.test_y, label_dtype(dataset.test_y)),
        train_eval_x=jnp.asarray(dataset.train_x[sample], jnp.float32),
        train_eval_y=jnp.asarray(dataset.train_y[sample], label_dtype(dataset.train_y)),
        num_classes=dataset.num_classes,
        name=f"{dataset.name}/{model.name}",
        loss=loss,
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TaskArrays:
    """The arrays of a task, passed to compiled functions as arguments (never embedded as constants).

    Attributes:
      train: every client's training data.
      x0: the initial global model, flat [d].
      test_x, test_y, train_eval_x, train_eval_y: evaluation data (see :class:`Task`).
    """

    train: ClientData
    x0: jax.Array
    test_x: jax.Array
    test_y: jax.Array
    train_eval_x: jax.Array
    train_eval_y: jax.Array


def task_arrays(task: Task) -> TaskArrays:
    return TaskArrays(
        train=task.train,
        x0=task.model.flat_params,
        test_x=task.test_x,
        test_y=task.test_y,
        train_eval_x=task.train_eval_x,
        train_eval_y=task.train_eval_y,
    )


def make_evaluator(model: Model, batch_size: int = 2000, loss: Loss | None = None):
    """Returns ``evaluate(flat_params, arrays) -> {"test_accuracy", "test_loss", "train_loss"}`` (pure, jittable).

    ``arrays`` is the task's :class:`TaskArrays`. The data are split into fixed batches (the last one padded and
    masked) so memory stays bounded for large test sets. ``loss`` (default: classification) gives the losses and
    the test metrics: ``test_<name>`` for each of its metrics (classification: ``test_accuracy``; regression: none).
    """
    loss = CLASSIFICATION if loss is None else loss

    def batched(x: jax.Array, y: jax.Array):
        n = int(x.shape[0])
        b = min(batch_size, n)
        nb = -(-n // b)
        pad = nb * b - n
        xp = jnp.concatenate([x, jnp.zeros((pad, *x.shape[1:]), x.dtype)]).reshape(nb, b, *x.shape[1:])
        yp = jnp.concatenate([y, jnp.zeros((pad, *y.shape[1:]), y.dtype)]).reshape(nb, b, *y.shape[1:])
        wp = (jnp.arange(nb * b) < n).astype(jnp.float32).reshape(nb, b)
        return xp, yp, wp, n

    def sums(flat: jax.Array, x: jax.Array, y: jax.Array):
        xp, yp, wp, n = batched(x, y)

        def one(batch):
            xb, yb, wb = batch
            params, data = model.unravel(flat), Batch(xb, yb, wb)
            metrics = {} if loss.metrics is None else loss.metrics(model, params, data)
            return loss.value(model, params, data) * jnp.sum(wb), metrics  # weighted mean -> sum; metrics are sums

        losses, metrics = jax.lax.map(one, (xp, yp, wp))
        return jnp.sum(losses) / n, {k: jnp.sum(v) / n for k, v in metrics.items()}

    def evaluate(flat: jax.Array, arrays: TaskArrays) -> dict[str, jax.Array]:
        test_loss, test_metrics = sums(flat, arrays.test_x, arrays.test_y)
        train_loss, _ = sums(flat, arrays.train_eval_x, arrays.train_eval_y)
        return {**{f"test_{k}": v for k, v in test_metrics.items()}, "test_loss": test_loss, "train_loss": train_loss}

    return evaluate
