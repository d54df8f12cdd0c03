"""Datasets on the host and client datasets on the device.

A :class:`Dataset` holds a train and a test split as numpy arrays. A partition is a list of index arrays, one per
client, into the train split. :class:`ClientData` puts the train split on the device once and keeps, for every client,
a padded row of indices into it together with the client's true size, so no example is copied per client and
minibatches are drawn inside the compiled program.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A dataset as host arrays: classification (int labels) or regression (float targets).

    Attributes:
      name: short name, e.g. ``"fashion_mnist"``.
      train_x: float32 [N, ...] training features.
      train_y: int32 [N] training labels in ``[0, num_classes)``, or float32 [N] / [N, k] regression targets.
      test_x: float32 [N_test, ...] test features.
      test_y: int32 [N_test] test labels (float32 targets for regression).
      num_classes: number of classes (for regression: the number of outputs ``k``, 1 for [N] targets).
      natural_partition: for datasets with built-in clients (LEAF Synthetic), the index arrays of each client into the
        training split; ``None`` otherwise.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    natural_partition: list[np.ndarray] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClientData:
    """Every client's training examples as device arrays (index-based, no per-client copies).

    Client ``i`` owns examples ``features[indices[i, :counts[i]]]``; entries of ``indices`` past ``counts[i]`` are
    padding (0) and are never used.

    Attributes:
      features: [N, ...] float32, the pooled training features.
      labels: [N] int32, the pooled training labels, or float32 [N] / [N, k] regression targets.
      indices: [n, P] int32, each client's example indices, padded to the largest client size P.
      counts: [n] int32, each client's number of examples (>= 1).
    """

    features: jax.Array
    labels: jax.Array
    indices: jax.Array
    counts: jax.Array

    @property
    def num_clients(self) -> int:
        return int(self.indices.shape[0])

    @property
    def max_size(self) -> int:
        return int(self.indices.shape[1])

    @classmethod
    def from_partition(cls, features: np.ndarray, labels: np.ndarray, parts: Sequence[np.ndarray]) -> "ClientData":
        """Builds client data from pooled arrays and one index array per client."""
        if len(parts) == 0:
            raise ValueError("a partition needs at least one client")
        counts = np.array([len(p) for p in parts], dtype=np.int32)
        if counts.min() < 1:
            empty = int(np.argmin(counts))
            raise ValueError(f"client {empty} has no examples; every client needs at least one")
        indices = np.zeros((len(parts), int(counts.max())), dtype=np.int32)
        for i, p in enumerate(parts):
            indices[i, : len(p)] = p
        return cls(
            features=jnp.asarray(features, dtype=jnp.float32),
            labels=jnp.asarray(labels, dtype=label_dtype(labels)),
            indices=jnp.asarray(indices),
            counts=jnp.asarray(counts),
        )

    def client_arrays(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of one client's (features, labels), for inspection and reference implementations."""
        idx = np.asarray(self.indices[client, : int(self.counts[client])])
        return np.asarray(self.features)[idx], np.asarray(self.labels)[idx]

    def as_padded(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Padded per-client arrays ``(x [n, P, ...], y [n, P], mask [n, P])`` (copies every example)."""
        mask = jnp.arange(self.max_size)[None, :] < self.counts[:, None]
        return self.features[self.indices], self.labels[self.indices], mask


def label_dtype(labels: np.ndarray | jax.Array) -> jnp.dtype:
    """int32 for integer class labels, float32 for float (regression) targets; anything else is refused."""
    kind = np.dtype(labels.dtype)
    if np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.bool_):
        return jnp.int32
    if np.issubdtype(kind, np.floating):
        return jnp.float32
    raise ValueError(f"labels must be integers (classification) or floats (regression targets), got dtype {kind}")
