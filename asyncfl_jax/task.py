"""A Task bundles what a simulation trains and evaluates: the model, every client's data and the evaluation data.

Evaluation data (all optional beyond the pooled test set, see :func:`make_task`):

* the pooled test set (the dataset's test split): ``test_accuracy``, ``test_loss``;
* a fixed sample of the clients' training examples: ``train_loss``;
* a pooled validation set held out of every client's training examples (``validation_fraction``): ``val_accuracy``,
  ``val_loss``;
* each client's own held-out test examples (``client_test_fraction``), on all clients or a fixed subset of them
  (``eval_clients``): the per-client vectors ``client_accuracy``, ``client_loss`` and their summaries
  ``client_accuracy_mean``, ``client_accuracy_worst10``, ``client_accuracy_std``, ``client_accuracy_min`` (and the
  same for the loss, where the worst clients are those with the highest loss).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from asyncfl_jax.arguments import _got, check_instance, check_int
from asyncfl_jax.data.client_data import ClientData, Dataset, label_dtype
from asyncfl_jax.losses import CLASSIFICATION, REGRESSION, Batch, Loss, get_loss, squared_errors
from asyncfl_jax.models.core import Model, check_parameters

WORST_FRACTION = 0.1  # client_*_worst10: the mean over the worst ceil(10%) of the evaluated clients
HIGHER_IS_BETTER = ("accuracy",)  # per-example metrics whose worst clients are the lowest; the others: the highest


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientTestSet:
    """The evaluated clients' own test examples, flattened into one list (no per-client padding).

    Example ``j`` of the list is ``features[index[j]]`` of the training arrays (:class:`ClientData`) and belongs to
    the evaluated client at position ``position[j]`` (``0 <= position[j] < C``; the client's id is
    ``Task.eval_client_ids[position[j]]``).

    Attributes:
      index: int32 [M], the examples' indices into the pooled training arrays.
      position: int32 [M], the position of each example's client among the evaluated clients.
      counts: float32 [C], each evaluated client's number of test examples (>= 1).
    """

    index: jax.Array
    position: jax.Array
    counts: jax.Array

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """Model + client data + evaluation data.

    Attributes:
      model: the model (``apply_fn`` and initial parameters ``x_0``).
      train: every client's training data on the device (held-out examples excluded).
      test_x, test_y: the pooled test set.
      train_eval_x, train_eval_y: a fixed sample of the pooled training data on which the train loss is reported.
      num_classes: number of classes (regression: number of outputs).
      name: a short description, e.g. ``"synthetic(1,1)/mlp"``.
      val_x, val_y: the pooled validation set (None: no validation split).
      client_test: the evaluated clients' own test examples (None: no per-client split).
      eval_client_ids: int [C], the ids of the clients whose per-client metrics are reported, ascending (None: no
        per-client split).
      client_test_fraction, validation_fraction: the fractions the split was made with (0: off).
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
    val_x: jax.Array | None = None
    val_y: jax.Array | None = None
    client_test: ClientTestSet | None = None
    eval_client_ids: np.ndarray | None = None
    client_test_fraction: float = 0.0
    validation_fraction: float = 0.0
    loss: Loss = CLASSIFICATION

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def num_params(self) -> int:
        return self.model.num_params

    def evaluation_options(self) -> dict[str, Any]:
        """The evaluation split as plain values (``{}`` when there is none): what a checkpoint must match too."""
        if self.client_test is None and self.val_x is None:
            return {}
        ids = None if self.eval_client_ids is None else [int(i) for i in self.eval_client_ids]
        return {"client_test_fraction": self.client_test_fraction, "validation_fraction": self.validation_fraction,
                "eval_client_ids": ids}


# ---------------------------------------------------------------------------------------------------- splits
@dataclasses.dataclass(frozen=True)
class ClientSplit:
    """Each client's examples split three ways (index arrays into the pooled training arrays, one per client)."""

    train: list[np.ndarray]
    test: list[np.ndarray]
    validation: list[np.ndarray]


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value) \
            or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a finite number in [0, 1) (0: off), got {value!r}")
    return float(value)


def _round_half_up(value: float) -> int:
    return int(math.floor(value + 0.5))


def held_out_sizes(num_examples: int, client_test_fraction: float, validation_fraction: float) -> tuple[int, int]:
    """``(n_test, n_val)`` of a client holding ``m = num_examples`` distinct examples.

    ``n_test = min(max(1, round(f_test * m)), m - 1)`` when ``f_test > 0`` (at least one test example, at least one
    training example left), else 0; ``n_val = min(round(f_val * (m - n_test)), m - n_test - 1)`` (a fraction of the
    examples left for training, at least one training example kept; it may be 0 for a small client). ``round``
    rounds halves up.
    """
    n_test = 0
    if client_test_fraction > 0:
        n_test = min(max(1, _round_half_up(client_test_fraction * num_examples)), num_examples - 1)
    n_val = 0
    if validation_fraction > 0:
        rest = num_examples - n_test
        n_val = min(_round_half_up(validation_fraction * rest), rest - 1)
    return n_test, n_val


def split_clients_held_out(parts: Sequence[np.ndarray], client_test_fraction: float, validation_fraction: float,
                           seed: int = 0) -> ClientSplit:
    """Splits every client's examples into its own train, test and validation examples (seeded, deterministic).

    The split is over a client's *distinct* examples (a partition drawn with replacement may list one twice): each
    (client, example) pair gets a uniform random key (one generator seeded with ``seed``), a client's pairs are
    ordered by key, the first ``n_test`` become its test examples and the next ``n_val`` its validation examples
    (:func:`held_out_sizes`); the client trains on the rest, every occurrence of a held-out example removed and the
    order of its list kept. The test examples do not depend on ``validation_fraction``. Vectorized over clients (no
    Python loop but the final split into one array per client). Raises ``ValueError`` when
    ``client_test_fraction > 0`` and a client holds fewer than 2 distinct examples (one to test, one to train).

    Returns index arrays (int64) into the pooled training arrays; test and validation examples in ascending order.
    """
    client_test_fraction = _check_fraction("client_test_fraction", client_test_fraction)
    validation_fraction = _check_fraction("validation_fraction", validation_fraction)
    num_clients = len(parts)
    sizes = np.array([len(p) for p in parts], np.int64)
    flat = np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in parts]) if num_clients else np.zeros(0, int)
    owner = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    span = int(flat.max()) + 1 if flat.size else 1
    pairs, inverse = np.unique(owner * span + flat, return_inverse=True)  # distinct (client, example), by client
    pair_owner, pair_example = pairs // span, pairs % span
    m = np.bincount(pair_owner, minlength=num_clients)
    if client_test_fraction > 0 and (m < 2).any():
        i = int(np.flatnonzero(m < 2)[0])
        raise ValueError(f"client_test_fraction = {client_test_fraction} needs every client to hold at least 2 "
                         f"distinct examples (one to test, one to train); client {i} holds {int(m[i])}")
    n_test, n_val = _held_out_sizes_array(m, client_test_fraction, validation_fraction)
    keys = np.random.default_rng([seed, 0x5E1D]).random(pairs.size)
    order = np.lexsort((keys, pair_owner))  # by client, then by random key
    rank = np.empty(pairs.size, np.int64)
    rank[order] = np.arange(pairs.size) - np.repeat(np.cumsum(m) - m, m)
    role = np.where(rank < n_test[pair_owner], 1, np.where(rank < (n_test + n_val)[pair_owner], 2, 0))

    def per_client(values: np.ndarray, of: np.ndarray) -> list[np.ndarray]:
        return np.split(values, np.searchsorted(of, np.arange(1, num_clients)))

    keep = role[inverse] == 0
    train = per_client(flat[keep], owner[keep])
    test_pairs, val_pairs = role == 1, role == 2
    test = per_client(pair_example[test_pairs], pair_owner[test_pairs])
    validation = per_client(pair_example[val_pairs], pair_owner[val_pairs])
    return ClientSplit(train, test, validation)


def _held_out_sizes_array(m: np.ndarray, client_test_fraction: float,
                          validation_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`held_out_sizes` for an array of client sizes."""
    n_test = np.zeros_like(m)
    if client_test_fraction > 0:
        n_test = np.minimum(np.maximum(1, np.floor(client_test_fraction * m + 0.5).astype(np.int64)), m - 1)
    n_val = np.zeros_like(m)
    if validation_fraction > 0:
        rest = m - n_test
        n_val = np.maximum(np.minimum(np.floor(validation_fraction * rest + 0.5).astype(np.int64), rest - 1), 0)
    return n_test, n_val


def choose_eval_clients(num_clients: int, eval_clients: int | None, seed: int = 0) -> np.ndarray:
    """The ids (ascending) of the clients whose per-client metrics are reported: all of them when ``eval_clients`` is
    None or ``num_clients``, else ``eval_clients`` of them drawn once without replacement with ``seed`` (the data
    seed: the same subset for every replica and every evaluation)."""
    if eval_clients is None:
        return np.arange(num_clients)
    if isinstance(eval_clients, bool) or not isinstance(eval_clients, (int, np.integer)) \
            or not 1 <= eval_clients <= num_clients:
        raise ValueError(f"eval_clients must be null (all clients) or an integer in [1, {num_clients}] (the number "
                         f"of clients), got {eval_clients!r}")
    if eval_clients == num_clients:
        return np.arange(num_clients)
    rng = np.random.default_rng([seed, 0xC11E])
    return np.sort(rng.choice(num_clients, size=int(eval_clients), replace=False))


def client_test_set(test_parts: Sequence[np.ndarray], ids: np.ndarray) -> ClientTestSet:
    """The flat :class:`ClientTestSet` of the clients ``ids`` (their test index arrays ``test_parts[i]``)."""
    chosen = [np.asarray(test_parts[i]) for i in ids]
    counts = np.array([p.size for p in chosen], np.float32)
    return ClientTestSet(
        index=jnp.asarray(np.concatenate(chosen).astype(np.int32)),
        position=jnp.asarray(np.repeat(np.arange(len(chosen)), [p.size for p in chosen]).astype(np.int32)),
        counts=jnp.asarray(counts),
    )


def check_make_task(dataset: Any, parts: Any, model: Any, train_eval_size: Any, seed: Any,
                    client_test_fraction: Any, validation_fraction: Any, eval_clients: Any, loss: Any) -> None:
    """The types of :func:`~asyncfl_jax.task.make_task`'s arguments (the values are checked there)."""
    check_instance("dataset", dataset, Dataset, "a Dataset (e.g. afl.data.synthetic_leaf(...))")
    if isinstance(parts, (str, bytes, Mapping)) or not isinstance(parts, (list, tuple, np.ndarray)) or len(parts) == 0:
        raise TypeError(f"parts must be a non-empty list of integer index arrays (one per client), {_got(parts)}")
    for i, part in enumerate(parts):
        array = None
        if isinstance(part, (list, tuple, range)) or hasattr(part, "__array__"):  # NumPy, JAX, lists of indices
            array = np.asarray(part)
        if array is None or array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise TypeError(f"parts[{i}] must be a 1-D array of integer example indices, {_got(part)}")
    check_instance("model", model, Model, "a Model (from make_model or model_from_apply)")
    check_int("train_eval_size", train_eval_size, minimum=1)
    check_int("seed", seed, minimum=0)
    # client_test_fraction and validation_fraction: _check_fraction (a ValueError naming the range, as before)
    check_int("eval_clients", eval_clients, minimum=1, optional=True)
    if not (loss is None or isinstance(loss, (str, Loss))):
        raise TypeError(f"loss must be None, 'classification', 'regression' or a Loss, {_got(loss)}")


def check_parts_in_range(parts: Sequence[Any], num_examples: int) -> None:
    """Refuses (``ValueError`` naming ``parts[i]``) an example index outside the training split ``0..N-1``."""
    for i, part in enumerate(parts):
        array = np.asarray(part)
        bad = array[(array < 0) | (array >= num_examples)]
        if bad.size:
            raise ValueError(f"parts[{i}] holds the example index {int(bad[0])}, outside the training split's "
                             f"{num_examples} examples (indices 0..{num_examples - 1})")


def check_model_accepts(model: Model, dataset: Dataset) -> None:
    """Refuses (``ValueError`` naming ``model``) a model that cannot be applied to the dataset's examples (another
    input shape), found by tracing it on one abstract example (``jax.eval_shape``: nothing is computed), before
    anything is built or compiled."""
    shape = tuple(np.shape(dataset.train_x)[1:])
    example = jax.ShapeDtypeStruct((1, *shape), jnp.float32)
    try:
        jax.eval_shape(model.flat_apply, model.flat_params, example)
    except Exception as e:  # noqa: BLE001 - any failure of the trace is this mismatch; its text says which
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"model {model.name!r} cannot be applied to the examples of dataset {dataset.name!r} (shape "
                         f"{shape}): {first}; build the model for this input shape, e.g. make_model(name, "
                         "dataset.input_shape, dataset.num_classes)") from None


def make_task(
    dataset: Dataset,
    parts: Sequence[np.ndarray],
    model: Model,
    train_eval_size: int = 5000,
    seed: int = 0,
    client_test_fraction: float = 0.0,
    validation_fraction: float = 0.0,
    eval_clients: int | None = None,
    loss: Loss | str | None = None,
) -> Task:
    """Builds a task from a dataset, a partition of its training split and a model.

    The train loss is evaluated on ``train_eval_size`` examples drawn once (without replacement, with ``seed``) from
    the examples the clients train on; all of them when there are fewer.

    Args:
      loss: ``None`` picks classification for integer labels and regression (MSE) for float targets;
        ``"classification"``, ``"regression"`` or a :class:`~asyncfl_jax.losses.Loss` (e.g.
        :func:`~asyncfl_jax.losses.custom_loss`), checked against the labels.
      client_test_fraction: in [0, 1); > 0 holds that fraction of each client's examples out as the client's own test
        examples (at least one; see :func:`split_clients_held_out` for the rule), on which the per-client metrics are
        reported. 0 (default): no per-client split, the clients keep every example.
      validation_fraction: in [0, 1); > 0 holds that fraction of each client's remaining (training) examples out into
        a pooled validation set (``val_accuracy``, ``val_loss``); the clients never train on them.
      eval_clients: report the per-client metrics on a fixed random subset of this many clients (drawn with
        ``seed``); None: all clients. Needs ``client_test_fraction > 0``.
      seed: the data seed: the train-loss sample, the held-out split and the evaluated subset.
    """
    check_make_task(dataset, parts, model, train_eval_size, seed, client_test_fraction, validation_fraction,
                    eval_clients, loss)
    check_parameters(model.init_params, "make_task: the model")  # a Model built by hand: no BatchNorm statistics
    check_parts_in_range(parts, len(dataset.train_x))
    check_model_accepts(model, dataset)
    loss = get_loss(loss, dataset.train_y)
    client_test_fraction = _check_fraction("client_test_fraction", client_test_fraction)
    validation_fraction = _check_fraction("validation_fraction", validation_fraction)
    if eval_clients is not None and client_test_fraction == 0:
        raise ValueError(f"eval_clients = {eval_clients!r} needs client_test_fraction > 0 (the per-client metrics "
                         "are measured on each client's own test examples)")
    ids = choose_eval_clients(len(parts), eval_clients, seed) if client_test_fraction > 0 else None
    extra: dict[str, Any] = {}
    if client_test_fraction > 0 or validation_fraction > 0:
        split = split_clients_held_out(parts, client_test_fraction, validation_fraction, seed)
        parts = split.train
        if client_test_fraction > 0:
            extra.update(client_test=client_test_set(split.test, ids), eval_client_ids=ids)
        if validation_fraction > 0:
            val = np.concatenate(split.validation).astype(np.int64)
            if val.size == 0:
                raise ValueError(f"validation_fraction = {validation_fraction} holds out no example: every client "
                                 "is too small (each keeps at least one training example); raise it or use 0")
            extra.update(val_x=jnp.asarray(dataset.train_x[val], jnp.float32),
                         val_y=jnp.asarray(dataset.train_y[val], label_dtype(dataset.train_y)))
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
        client_test_fraction=client_test_fraction,
        validation_fraction=validation_fraction,
        **extra,
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
      val_x, val_y, client_test: the optional validation set and per-client test examples (None when off; a None
        field has no leaves, so a task without them has the same arrays as before they existed).
    """

    train: ClientData
    x0: jax.Array
    test_x: jax.Array
    test_y: jax.Array
    train_eval_x: jax.Array
    train_eval_y: jax.Array
    val_x: jax.Array | None = None
    val_y: jax.Array | None = None
    client_test: ClientTestSet | None = None


def task_arrays(task: Task) -> TaskArrays:
    return TaskArrays(
        train=task.train,
        x0=task.model.flat_params,
        test_x=task.test_x,
        test_y=task.test_y,
        train_eval_x=task.train_eval_x,
        train_eval_y=task.train_eval_y,
        val_x=task.val_x,
        val_y=task.val_y,
        client_test=task.client_test,
    )


# ---------------------------------------------------------------------------------------------------- evaluation
def example_metrics(model: Model, loss: Loss, flat: jax.Array, x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
    """Per-example metrics [b] of the model ``flat`` on a batch (the one place a batch is scored): ``"loss"`` (the
    task's per-example loss) and each of the loss's metrics (classification: ``"accuracy"``, 1.0 where the arg-max
    class is the label, else 0.0).

    The built-in losses are scored on the whole batch; a custom loss, which only gives batch means, is applied to
    each example as a batch of one (vmapped), so any :class:`~asyncfl_jax.losses.Loss` has per-example values."""
    params = model.unravel(flat)
    if loss is CLASSIFICATION:
        logits = model.forward(params, x, None)
        return {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, y),
                "accuracy": (jnp.argmax(logits, axis=-1) == y).astype(logits.dtype)}
    if loss is REGRESSION:
        return {"loss": squared_errors(model.forward(params, x, None), y)}

    def one(xi: jax.Array, yi: jax.Array) -> dict[str, jax.Array]:
        batch = Batch(xi[None], yi[None], jnp.ones((1,), jnp.float32))
        extra = {} if loss.metrics is None else dict(loss.metrics(model, params, batch))  # sums over one example
        return {"loss": loss.value(model, params, batch), **extra}

    return jax.vmap(one)(x, y)


def _batches(n: int, batch_size: int) -> tuple[int, int]:
    """``(number of batches, batch size)`` covering ``n`` items in batches of at most ``batch_size``."""
    b = max(1, min(batch_size, n))
    return -(-n // b), b


def _padded(a: jax.Array, nb: int, b: int) -> jax.Array:
    """``a`` [n, ...] zero-padded to ``nb * b`` rows and reshaped to [nb, b, ...]."""
    pad = nb * b - int(a.shape[0])
    return jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)]).reshape(nb, b, *a.shape[1:])


def pooled_metrics(model: Model, loss: Loss, flat: jax.Array, x: jax.Array, y: jax.Array,
                   batch_size: int) -> dict[str, jax.Array]:
    """The example-weighted mean of every per-example metric over ``(x, y)``: ``(1/n) sum_j v_j``, computed in fixed
    batches (the last one padded and masked) so memory stays bounded."""
    n = int(x.shape[0])
    nb, b = _batches(n, batch_size)
    w = (jnp.arange(nb * b) < n).astype(jnp.float32).reshape(nb, b)

    def one(batch):
        xb, yb, wb = batch
        return {k: jnp.sum(v * wb) for k, v in example_metrics(model, loss, flat, xb, yb).items()}

    totals = jax.lax.map(one, (_padded(x, nb, b), _padded(y, nb, b), w))
    return {k: jnp.sum(v) / n for k, v in totals.items()}


def per_client_metrics(model: Model, loss: Loss, flat: jax.Array, features: jax.Array, labels: jax.Array,
                       clients: ClientTestSet, batch_size: int) -> dict[str, jax.Array]:
    """Every per-example metric averaged over each evaluated client's own test examples: ``[C]`` vectors
    ``v_i = (1/m_i) sum_{j in client i} v_j``.

    One pass over the flat list of all evaluated clients' examples in fixed batches (gathered from the training
    arrays batch by batch), then a segment sum by client: no per-client padding and no loop over clients."""
    m = int(clients.index.shape[0])
    nb, b = _batches(m, batch_size)
    w = (jnp.arange(nb * b) < m).astype(jnp.float32).reshape(nb, b)

    def one(batch):
        ib, wb = batch
        return {k: v * wb for k, v in example_metrics(model, loss, flat, features[ib], labels[ib]).items()}

    values = jax.lax.map(one, (_padded(clients.index, nb, b), w))
    position = _padded(clients.position, nb, b).reshape(-1)
    c = clients.num_clients
    return {k: jax.ops.segment_sum(v.reshape(-1), position, num_segments=c) / clients.counts
            for k, v in values.items()}


def client_summaries(name: str, values: jax.Array) -> dict[str, jax.Array]:
    """Summaries over the evaluated clients of one per-client metric ``values`` [C] (each client counts once):

    * ``client_<name>_mean``: the unweighted mean over clients;
    * ``client_<name>_worst10``: the mean over the worst ``k = ceil(0.1 C)`` clients (the lowest values for accuracy,
      the highest for a loss), as in the fairness literature (q-FFL, Ditto);
    * ``client_<name>_std``: the standard deviation over clients (population, ``ddof = 0``);
    * ``client_<name>_min`` for accuracy (the worst client), ``client_<name>_max`` for a loss.
    """
    c = int(values.shape[0])
    k = max(1, math.ceil(WORST_FRACTION * c - 1e-9))
    higher_better = name in HIGHER_IS_BETTER
    ordered = jnp.sort(values)
    worst = ordered[:k] if higher_better else ordered[c - k:]
    extreme = ("min", ordered[0]) if higher_better else ("max", ordered[-1])
    return {f"client_{name}_mean": jnp.mean(values), f"client_{name}_worst10": jnp.mean(worst),
            f"client_{name}_std": jnp.std(values), f"client_{name}_{extreme[0]}": extreme[1]}


def make_evaluator(model: Model, batch_size: int = 2000, loss: Loss | None = None) -> "Evaluator":
    """Returns ``evaluate(flat_params, arrays) -> metrics`` (pure, jittable); ``arrays`` is the task's
    :class:`TaskArrays`, ``loss`` the task's loss (default: classification).

    The metrics are scalars, except the per-client vectors ``client_loss`` and ``client_<metric>`` ([C], in the
    order of ``Task.eval_client_ids``). With ``m`` ranging over the loss's metrics (classification: ``accuracy``;
    regression: none; a custom loss: its own):

    * always ``test_<m>``, ``test_loss`` (pooled test set) and ``train_loss`` (the train-loss sample);
    * with a validation set, ``val_<m>`` and ``val_loss`` (pooled over its examples);
    * with per-client test examples, the vectors and their summaries (:func:`client_summaries`).

    Pooled metrics are example-weighted means, per-client summaries weigh every client once. The data are scored in
    fixed batches of ``batch_size`` (the last one padded and masked) so memory stays bounded.
    """
    return Evaluator(model, CLASSIFICATION if loss is None else loss, int(batch_size))


def _same(a: Any, b: Any) -> bool:
    """Identity for objects (functions, losses), equality for the plain values of a key (shapes, dtypes, treedefs)."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (str, int, np.dtype, jax.tree_util.PyTreeDef)):
        return type(a) is type(b) and a == b
    return a is b


@dataclasses.dataclass(frozen=True, eq=False)
class Evaluator:
    """The evaluation function of :func:`make_evaluator`: ``evaluator(flat_params, arrays) -> metrics``.

    Two evaluators are equal (and hash alike) when they trace the same computation: the same ``apply_fn`` and loss
    (the same objects), the same parameter structure (tree, shapes and dtypes of ``model.init_params``, which
    ``unravel`` follows; the values of the initial parameters are not used) and the same batch size. A jitted
    function that takes the evaluator as a static argument then reuses its compiled program for every run of the
    same model and data shapes (e.g. the algorithms of one experiment), instead of tracing and compiling a new
    closure per run."""

    model: Model
    loss: Loss
    batch_size: int

    def _key(self) -> tuple:
        leaves, treedef = jax.tree_util.tree_flatten(self.model.init_params)
        avals = tuple((tuple(int(d) for d in np.shape(x)), np.dtype(getattr(x, "dtype", np.asarray(x).dtype)))
                      for x in leaves)
        return (self.model.apply_fn, self.loss, treedef, avals, self.batch_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Evaluator) and _same(self._key(), other._key())

    def __hash__(self) -> int:
        apply_fn, loss, treedef, avals, batch_size = self._key()
        return hash((id(apply_fn), id(loss), treedef, avals, batch_size))

    def __call__(self, flat: jax.Array, arrays: TaskArrays) -> dict[str, jax.Array]:
        model, loss, batch_size = self.model, self.loss, self.batch_size

        def named(prefix: str, values: dict[str, jax.Array]) -> dict[str, jax.Array]:
            """``{prefix_<metric>..., prefix_loss}``: the loss's metrics first, then the loss."""
            return {**{f"{prefix}_{k}": v for k, v in values.items() if k != "loss"},
                    f"{prefix}_loss": values["loss"]}

        test = pooled_metrics(model, loss, flat, arrays.test_x, arrays.test_y, batch_size)
        train = pooled_metrics(model, loss, flat, arrays.train_eval_x, arrays.train_eval_y, batch_size)
        out = {**named("test", test), "train_loss": train["loss"]}
        if arrays.val_x is not None:
            out.update(named("val", pooled_metrics(model, loss, flat, arrays.val_x, arrays.val_y, batch_size)))
        if arrays.client_test is not None:
            per_client = per_client_metrics(model, loss, flat, arrays.train.features, arrays.train.labels,
                                            arrays.client_test, batch_size)
            for name in sorted(per_client):  # accuracy, loss
                out.update(client_summaries(name, per_client[name]))
            out.update({f"client_{name}": v for name, v in sorted(per_client.items())})
        return out
