"""Partitioners: split a labelled training set among clients.

Every partitioner takes the label array of the training split and returns ``list[np.ndarray]``: one int64 index
array per client, sorted ascending, pairwise disjoint, and together covering every example exactly once. They are
deterministic given the ``rng`` argument, which may be a ``np.random.Generator`` (advanced in place) or an ``int``
seed.

* :func:`iid` — uniform random split into equal sizes (±1).
* :func:`dirichlet` — FedMA's "hetero-dir" label skew with a minimum-size rule (Wang et al. 2020; the split of CA2FL).
* :func:`shards` — the pathological split of McMahan et al. 2017: sorted by label, cut into shards, a few per client.
* :func:`power_law` — IID labels with power-law (Pareto) client sizes.

:func:`partition` dispatches by name with validated options; :func:`partition_summary` and :func:`plot_partition`
describe a partition in numbers and in a picture.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Sequence

import numpy as np

from asyncfl_jax.errors import PartitionError

def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _check_labels(labels: np.ndarray, targets_ok: bool = False) -> np.ndarray:
    """Class labels as int64; with ``targets_ok`` (partitioners that only use the number of examples), float
    regression targets ``[N]`` or ``[N, k]`` are accepted too and returned as they are."""
    labels = np.asarray(labels)
    if targets_ok and labels.size and np.issubdtype(labels.dtype, np.floating) and labels.ndim in (1, 2):
        return labels
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be >= 0, got {labels.min()}")
    return labels.astype(np.int64, copy=False)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_num_clients(num_clients: Any, n: int) -> int:
    num_clients = _check_int("num_clients", num_clients, 1)
    if num_clients > n:
        raise PartitionError(f"num_clients ({num_clients}) must be <= the number of examples ({n})")
    return num_clients


def _finish(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator | int | None = None) -> list[np.ndarray]:
    """Uniform random split: a random permutation cut into ``num_clients`` parts whose sizes differ by at most 1."""
    labels = _check_labels(labels, targets_ok=True)
    num_clients = _check_num_clients(num_clients, len(labels))
    perm = _rng(rng).permutation(len(labels))
    return _finish(np.array_split(perm, num_clients))


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator | int | None = None,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """FedMA's "hetero-dir" Dirichlet label split (Wang et al., ICLR 2020), as used by CA2FL and FedBuff-style papers.

    One try: for each class ``k`` (in order), draw proportions ``p ~ Dir_n(alpha)``; set ``p_j = 0`` for every client
    ``j`` that already holds ``>= N / n`` examples; renormalise; shuffle class ``k``'s indices and cut them at
    ``int(cumsum(p) * N_k)``. Tries are repeated (the generator advancing) until the smallest client holds at least
    ``min_size`` examples. Smaller ``alpha`` gives more skewed label mixes (and more unequal sizes).

    Args:
      labels: int [N] class labels.
      num_clients: n, the number of clients.
      alpha: Dirichlet concentration, > 0 (e.g. 0.1 very skewed, 100 nearly IID).
      rng: generator or seed.
      min_size: each client's minimum number of examples (FedMA: 10); ``min_size * n <= N`` is required.
      max_tries: give up after this many tries.

    Raises:
      ValueError: an invalid option (named in the message), ``min_size * num_clients > N``, or no try within
        ``max_tries`` met ``min_size``.
    """
    labels = _check_labels(labels)
    n_total = labels.size
    num_clients = _check_num_clients(num_clients, n_total)
    alpha = _check_positive("alpha", alpha)
    min_size = _check_int("min_size", min_size, 0)
    max_tries = _check_int("max_tries", max_tries, 1)
    if min_size * num_clients > n_total:
        raise PartitionError(
            f"min_size ({min_size}) * num_clients ({num_clients}) = {min_size * num_clients} exceeds the number of "
            f"examples ({n_total}); lower min_size or num_clients"
        )
    rng = _rng(rng)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    cap = n_total / num_clients
    smallest = 0
    for _ in range(max_tries):
        batches: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        held = np.zeros(num_clients, dtype=np.int64)
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))
            p = np.where(held < cap, p, 0.0)
            total = p.sum()
            if not np.isfinite(total) or total <= 0.0:
                # Every eligible client drew (numerically) zero: fall back to an even split among them.
                p = (held < cap).astype(np.float64)
                total = p.sum()
            p = p / total
            cuts = (np.cumsum(p) * len(idx_k)).astype(np.int64)[:-1]
            for j, chunk in enumerate(np.split(idx_k, cuts)):
                batches[j].append(chunk)
                held[j] += len(chunk)
        smallest = int(held.min())
        if smallest >= min_size:
            return _finish([np.concatenate(b) if b else np.zeros(0, np.int64) for b in batches])
    raise PartitionError(
        f"dirichlet: no split with every client holding >= min_size={min_size} examples in max_tries={max_tries} "
        f"tries (alpha={alpha}, num_clients={num_clients}, N={n_total}; last try's smallest client: {smallest}); "
        "raise alpha or max_tries, or lower min_size or num_clients"
    )


def shards(
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int = 2,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """Pathological non-IID split (McMahan et al. 2017): each client gets ``shards_per_client`` label-sorted shards.

    The examples are sorted by label (ties in random order), cut into ``num_clients * shards_per_client`` contiguous
    shards of equal size (±1 when it does not divide), and each client receives ``shards_per_client`` shards chosen at
    random without replacement. A shard spans at most two labels when every class has at least a shard's worth of
    examples, so a client then sees at most ``2 * shards_per_client`` labels (usually ``shards_per_client``).

    Raises:
      ValueError: ``shards_per_client < 1`` or ``num_clients * shards_per_client > N``.
    """
    labels = _check_labels(labels)
    num_clients = _check_num_clients(num_clients, labels.size)
    shards_per_client = _check_int("shards_per_client", shards_per_client, 1)
    num_shards = num_clients * shards_per_client
    if num_shards > labels.size:
        raise PartitionError(
            f"num_clients ({num_clients}) * shards_per_client ({shards_per_client}) = {num_shards} shards exceeds the "
            f"number of examples ({labels.size}); lower shards_per_client"
        )
    rng = _rng(rng)
    perm = rng.permutation(labels.size)
    order = perm[np.argsort(labels[perm], kind="stable")]
    pieces = np.array_split(order, num_shards)
    owner = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _finish([np.concatenate([pieces[s] for s in row]) for row in owner])


def power_law(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator | int | None = None,
    exponent: float = 1.5,
    min_size: int = 10,
) -> list[np.ndarray]:
    """IID labels with power-law client sizes.

    Each client gets a weight ``w_j ~ Pareto(exponent)`` (classical Pareto with scale 1: ``P(w > t) = t^-exponent``;
    smaller exponents give heavier tails). Client ``j`` gets ``min_size`` examples plus a share of the remaining
    ``N - n * min_size`` proportional to ``w_j`` (largest-remainder rounding, so the sizes sum to ``N`` exactly);
    the examples themselves are a uniform random permutation, so every client's label mix is IID.

    Raises:
      ValueError: ``exponent <= 0``, ``min_size < 0``, or ``min_size * num_clients > N``.
    """
    labels = _check_labels(labels, targets_ok=True)
    n_total = len(labels)
    num_clients = _check_num_clients(num_clients, n_total)
    exponent = _check_positive("exponent", exponent)
    min_size = _check_int("min_size", min_size, 0)
    if min_size * num_clients > n_total:
        raise PartitionError(
            f"min_size ({min_size}) * num_clients ({num_clients}) = {min_size * num_clients} exceeds the number of "
            f"examples ({n_total}); lower min_size or num_clients"
        )
    rng = _rng(rng)
    weights = rng.pareto(exponent, num_clients) + 1.0
    rest = n_total - min_size * num_clients
    share = weights / weights.sum() * rest
    extra = np.floor(share).astype(np.int64)
    shortfall = rest - int(extra.sum())
    if shortfall > 0:
        extra[np.argsort(-(share - extra), kind="stable")[:shortfall]] += 1
    sizes = min_size + extra
    perm = rng.permutation(n_total)
    return _finish(np.split(perm, np.cumsum(sizes)[:-1]))


def dirichlet_sampled(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    examples_per_client: int = 32,
    rng: np.random.Generator | int | None = None,
) -> list[np.ndarray]:
    """A Dirichlet label skew for any number of clients, even more clients than examples (e.g. n = 100,000 on
    Fashion-MNIST's 60,000 images).

    Client ``j`` draws its label mix ``p_j ~ Dir_C(alpha)``, its class counts ``c_j ~ Multinomial(m, p_j)`` with
    ``m = examples_per_client``, and then ``c_jk`` examples of class ``k`` uniformly *with replacement*. So every
    client holds exactly ``m`` examples, clients share examples, and a client may hold an example twice: the parts are
    not disjoint, unlike the other partitioners. Smaller ``alpha`` gives more skewed label mixes.

    Args:
      labels: int [N] class labels.
      num_clients: n, any positive number.
      alpha: Dirichlet concentration over the classes, > 0.
      examples_per_client: m, >= 1.
      rng: generator or seed.
    """
    labels = _check_labels(labels)
    num_clients = _check_int("num_clients", num_clients, 1)
    alpha = _check_positive("alpha", alpha)
    m = _check_int("examples_per_client", examples_per_client, 1)
    rng = _rng(rng)
    classes = np.unique(labels)
    mix = rng.dirichlet(np.full(classes.size, alpha), size=num_clients)  # [n, C]
    mix = np.where(np.isfinite(mix), mix, 0.0)
    mix[mix.sum(axis=1) <= 0.0] = 1.0  # numerically all-zero draws (tiny alpha): uniform instead
    counts = rng.multinomial(m, mix / mix.sum(axis=1, keepdims=True))  # [n, C], each row sums to m
    owner, index = [], []
    for k, label in enumerate(classes):
        pool = np.flatnonzero(labels == label)
        owner.append(np.repeat(np.arange(num_clients), counts[:, k]))
        index.append(pool[rng.integers(0, pool.size, size=int(counts[:, k].sum()))])
    owner, index = np.concatenate(owner), np.concatenate(index)
    index = index[np.argsort(owner, kind="stable")]
    return _finish(np.split(index, np.arange(1, num_clients) * m))


_PARTITIONERS: dict[str, tuple[Callable[..., list[np.ndarray]], dict[str, Any]]] = {
    # name: (function, {option: default}); a default of ... marks a required option.
    "iid": (iid, {}),
    "dirichlet": (dirichlet, {"alpha": ..., "min_size": 10, "max_tries": 1000}),
    "shards": (shards, {"shards_per_client": 2}),
    "power_law": (power_law, {"exponent": 1.5, "min_size": 10}),
    "dirichlet_sampled": (dirichlet_sampled, {"alpha": ..., "examples_per_client": 32}),
}

PARTITIONERS: tuple[str, ...] = tuple(_PARTITIONERS)
"""Names accepted by :func:`partition`."""


def partition_options(name: str) -> dict[str, Any]:
    """The options of partitioner ``name`` with their defaults (``...`` marks a required option)."""
    return dict(_PARTITIONERS[_normalise_name(name)][1])


def _normalise_name(name: str) -> str:
    key = str(name).strip().lower().replace("-", "_")
    if key not in _PARTITIONERS:
        raise ValueError(f"unknown partition {name!r}; allowed: {', '.join(PARTITIONERS)}")
    return key


def partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    seed: np.random.Generator | int | None = 0,
    **options: Any,
) -> list[np.ndarray]:
    """Splits examples with labels ``labels`` among ``num_clients`` clients by the partitioner ``name``.

    Args:
      name: one of ``"iid"``, ``"dirichlet"``, ``"shards"``, ``"power_law"`` (``"power-law"`` also accepted),
        ``"dirichlet_sampled"``.
      labels: int [N] class labels of the training split.
      num_clients: number of clients, ``1 <= num_clients <= N`` (any number for ``dirichlet_sampled``).
      seed: an int seed or a ``np.random.Generator``.
      **options: the partitioner's options: dirichlet: ``alpha`` (required), ``min_size=10``, ``max_tries=1000``;
        shards: ``shards_per_client=2``; power_law: ``exponent=1.5``, ``min_size=10``; iid: none;
        dirichlet_sampled: ``alpha`` (required), ``examples_per_client=32``.

    Returns:
      One sorted int64 index array per client; disjoint, covering all ``N`` examples (``dirichlet_sampled``: drawn
      with replacement, ``examples_per_client`` each).

    Raises:
      ValueError: unknown ``name`` (lists the allowed names), an unknown option (names it and lists the allowed
        ones), a missing required option, or an out-of-range value (names the option).
    """
    key = _normalise_name(name)
    fn, defaults = _PARTITIONERS[key]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) if defaults else "none"
        raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for partition {key!r}; allowed: {allowed}")
    kwargs = {k: options.get(k, v) for k, v in defaults.items()}
    missing = [k for k, v in kwargs.items() if v is ...]
    if missing:
        raise ValueError(f"partition {key!r} needs option(s) {', '.join(map(repr, missing))}")
    return fn(labels, num_clients, rng=_rng(seed), **kwargs)


def _label_counts(parts: Sequence[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)[:num_classes]
                     for p in parts]) if len(parts) else np.zeros((0, num_classes), np.int64)


def partition_summary(parts: Sequence[np.ndarray], labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """Numbers describing a partition.

    Returns a dict with (plain Python types, JSON-serialisable):
      ``num_clients``; ``num_examples`` (sum of sizes); ``sizes`` (list); ``size_min``, ``size_median``,
      ``size_max``, ``size_mean``; ``label_counts`` (``[n][num_classes]`` nested list); ``classes_per_client``
      (number of distinct labels held, list); ``mean_label_entropy`` (mean over clients of the entropy, in nats, of
      the client's label distribution; ``log(num_classes)`` for perfectly balanced clients, 0 for single-label ones).
    """
    counts = _label_counts(parts, labels, num_classes)
    sizes = counts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = counts / np.maximum(sizes, 1)[:, None]
        ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)
    return {
        "num_clients": len(parts),
        "num_examples": int(sizes.sum()),
        "sizes": sizes.tolist(),
        "size_min": int(sizes.min()) if len(sizes) else 0,
        "size_median": float(np.median(sizes)) if len(sizes) else 0.0,
        "size_max": int(sizes.max()) if len(sizes) else 0,
        "size_mean": float(sizes.mean()) if len(sizes) else 0.0,
        "label_counts": counts.tolist(),
        "classes_per_client": (counts > 0).sum(axis=1).tolist(),
        "mean_label_entropy": float(ent.mean()) if len(ent) else 0.0,
    }


def plot_partition(
    parts: Sequence[np.ndarray],
    labels: np.ndarray,
    num_classes: int,
    path: str | os.PathLike | None = None,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """A picture of a partition: a stacked bar per client of its label counts, clients sorted by size (largest first).

    Works without a display: when ``ax`` is ``None`` it draws on a new ``matplotlib.figure.Figure`` (no pyplot, no
    global backend change). Returns the figure; saves it to ``path`` too when given (format from the extension).
    """
    from matplotlib.figure import Figure

    counts = _label_counts(parts, labels, num_classes)
    sizes = counts.sum(axis=1)
    order = np.argsort(-sizes, kind="stable")
    counts = counts[order]
    if ax is None:
        fig = Figure(figsize=(max(6.0, min(20.0, 0.12 * len(parts) + 4.0)), 4.0), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if num_classes <= 10 else "tab20"]
    x = np.arange(len(parts))
    bottom = np.zeros(len(parts))
    width = 0.8 if len(parts) <= 50 else 1.0
    for k in range(num_classes):
        ax.bar(x, counts[:, k], bottom=bottom, width=width, color=cmap(k % cmap.N), label=str(k), linewidth=0)
        bottom += counts[:, k]
    ax.set_xlim(-0.5 - (1.0 - width) / 2, len(parts) - 0.5 + (1.0 - width) / 2)
    ax.set_xlabel("client (sorted by size)")
    ax.set_ylabel("examples")
    if len(parts) <= 30:
        ax.set_xticks(x, [str(int(i)) for i in order], fontsize=7)
    if title is None and len(sizes):
        title = (f"{len(parts)} clients, {int(sizes.sum())} examples; size min/median/max "
                 f"{int(sizes.min())}/{np.median(sizes):g}/{int(sizes.max())}")
    if title:
        ax.set_title(title, fontsize=10)
    if num_classes <= 20:
        ax.legend(title="label", fontsize=7, title_fontsize=8, ncol=1 if num_classes <= 10 else 2,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if path is not None:
        fig.savefig(os.fspath(path), dpi=120)
    return fig
