"""LEAF / FedProx Synthetic(α, β): a procedural federated classification dataset that needs no files.

This is the generator of Li et al., "Federated Optimization in Heterogeneous Networks" (FedProx, MLSys 2020), §5.1,
as written in the FedProx reference code (``data/synthetic_*/generate_*.py``), and used by LEAF, q-FFL and AsyncFedED
("Synthetic-1-1"). For client ``i`` (``d = num_features``, ``C = num_classes``):

* ``u_i ~ N(0, α)``; ``W_i ∈ R^{d×C}`` and ``b_i ∈ R^C`` have entries ``~ N(u_i, 1)`` (α: how much the *models*
  differ between clients);
* ``B_i ~ N(0, β)``; ``v_i ∈ R^d`` has entries ``~ N(B_i, 1)`` (β: how much the *inputs* differ between clients);
* ``x ~ N(v_i, Σ)`` with ``Σ = diag(j^{-1.2})``, ``j = 1..d``;
* ``y = argmax(softmax(x W_i + b_i))``;
* ``n_i = int(LogNormal(4, 2)) + 50`` examples (the "power law" of client sizes).

As in the reference code, α and β are passed to the normal distribution as its *scale* (standard deviation); with the
usual α = β = 1 (or 0) this is the same as a variance.
"""

from __future__ import annotations

import numpy as np

from asyncfl_jax.data.client_data import Dataset

DEFAULT_MAX_SAMPLES = 1000
"""Default cap on a Synthetic client's total size (train + test); see :func:`synthetic_leaf`."""


def synthetic_leaf(
    num_clients: int = 100,
    alpha: float = 1.0,
    beta: float = 1.0,
    seed: int = 0,
    num_features: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    test_fraction: float = 0.1,
    min_samples: int = 50,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
) -> Dataset:
    """Generates LEAF's Synthetic(α, β) dataset with its natural one-client-per-generator partition.

    Args:
      num_clients: number of clients (each has its own generator ``W_i, b_i, v_i``).
      alpha: spread of the clients' label models: ``u_i ~ N(0, alpha)`` (standard deviation).
      beta: spread of the clients' input means: ``B_i ~ N(0, beta)`` (standard deviation).
      seed: seed of the ``np.random.default_rng`` that draws everything; equal arguments give identical arrays.
      num_features: input dimension ``d`` (60 in the reference).
      num_classes: number of classes ``C`` (10 in the reference).
      iid: the reference code's "Synthetic IID" branch: one shared ``W, b`` with entries ``~ N(0, 1)`` for all
        clients (``alpha`` is then unused) and input means ``v_i = B_i · 1`` (every coordinate equal to ``B_i``,
        ``B_i ~ N(0, beta)``). FedProx's Synthetic-IID dataset is ``iid=True, beta=0``, which gives ``v_i = 0`` and
        the same distribution on every client; with ``beta > 0`` the clients' inputs are shifted by different amounts.
      test_fraction: fraction of *each* client's examples held out; the held-out examples of all clients are pooled
        into one test split. As in the reference (which uses 0.9 / 0.1), client ``i`` keeps
        ``int((1 - test_fraction) * n_i)`` training examples, and always at least one.
      min_samples: the additive floor of the client sizes, ``n_i = int(LogNormal(4, 2)) + min_samples`` (50 in the
        reference), so every client has at least ``min_samples`` examples before the split.
      max_samples: cap on ``n_i`` (train + test) applied after drawing it, ``n_i = min(n_i, max_samples)``; ``None``
        keeps the reference's uncapped sizes. **Default 1000**: LogNormal(4, 2) has median ≈ 55 but a very heavy
        tail (mean ≈ 400; with 100 clients the largest has a median of about 7,000 over seeds and is above
        30,000 for one seed in twenty). The
        simulator pads every client to the largest size and runs as many local steps as the largest client needs in
        each vectorised group, so one giant client would make every round of the default experiment tens of times
        slower while changing little else. With the cap about 8% of clients are truncated at 1000 and the sizes stay
        strongly skewed (max / median ≈ 10). Pass ``max_samples=None`` to reproduce the reference sizes exactly.

    Returns:
      A :class:`Dataset` named ``"synthetic"`` with float32 features ``[N, num_features]``, int32 labels in
      ``[0, num_classes)``, and ``natural_partition`` giving each client's (contiguous, int64) indices into the pooled
      training arrays. Client ``i``'s training examples are stored before client ``i + 1``'s.
    """
    _check_arguments(num_clients, alpha, beta, num_features, num_classes, test_fraction, min_samples, max_samples)
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + min_samples
    if max_samples is not None:
        sizes = np.minimum(sizes, max_samples)

    mean_w = rng.normal(0.0, alpha, num_clients)  # u_i; the reference also uses it as the mean of b_i
    big_b = rng.normal(0.0, beta, num_clients)  # B_i
    if iid:
        mean_x = np.repeat(big_b[:, None], num_features, axis=1)
        w_global = rng.normal(0.0, 1.0, (num_features, num_classes))
        b_global = rng.normal(0.0, 1.0, num_classes)
    else:
        mean_x = rng.normal(big_b[:, None], 1.0, (num_clients, num_features))
    std_x = np.power(np.arange(1, num_features + 1, dtype=np.float64), -1.2 / 2.0)  # sqrt of diag(Σ)

    train_x, train_y, test_x, test_y, parts = [], [], [], [], []
    offset = 0
    for i in range(num_clients):
        if iid:
            w, b = w_global, b_global
        else:
            w = rng.normal(mean_w[i], 1.0, (num_features, num_classes))
            b = rng.normal(mean_w[i], 1.0, num_classes)
        n = int(sizes[i])
        # x ~ N(v_i, Σ) with diagonal Σ, i.e. v_i + sqrt(Σ) z.
        x = mean_x[i] + std_x * rng.standard_normal((n, num_features))
        y = np.argmax(x @ w + b, axis=1)  # argmax of the softmax = argmax of the logits
        n_train = max(1, int((1.0 - test_fraction) * n))
        train_x.append(x[:n_train])
        train_y.append(y[:n_train])
        test_x.append(x[n_train:])
        test_y.append(y[n_train:])
        parts.append(np.arange(offset, offset + n_train, dtype=np.int64))
        offset += n_train

    return Dataset(
        name="synthetic",
        train_x=np.concatenate(train_x).astype(np.float32),
        train_y=np.concatenate(train_y).astype(np.int32),
        test_x=np.concatenate(test_x).astype(np.float32).reshape(-1, num_features),
        test_y=np.concatenate(test_y).astype(np.int32),
        num_classes=num_classes,
        natural_partition=parts,
    )


def _check_arguments(num_clients: int, alpha: float, beta: float, num_features: int, num_classes: int,
                     test_fraction: float, min_samples: int, max_samples: int | None) -> None:
    """The ranges of :func:`synthetic_leaf`'s arguments (a ``ValueError`` naming the first one out of range)."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if min_samples < 1:
        raise ValueError(f"min_samples must be >= 1, got {min_samples}")
    if max_samples is not None and max_samples < min_samples:
        raise ValueError(f"max_samples must be >= min_samples ({min_samples}) or None, got {max_samples}")
