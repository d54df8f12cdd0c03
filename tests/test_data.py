"""Tests of asyncfl_jax.data: Synthetic(α, β), IDX loading, partitioners, ClientData."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from asyncfl_jax.data import (
    PARTITIONERS,
    ClientData,
    DatasetNotFoundError,
    IdxFormatError,
    dirichlet,
    find_idx_dir,
    iid,
    load_fashion_mnist,
    load_mnist,
    partition,
    partition_summary,
    plot_partition,
    power_law,
    read_idx,
    shards,
    synthetic_leaf,
)
from asyncfl_jax.data import idx as idx_module

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def _balanced_labels(n: int = 2000, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % num_classes).astype(np.int32)


def _assert_disjoint_cover(parts, n):
    allidx = np.concatenate(parts)
    assert allidx.dtype == np.int64
    assert len(allidx) == n, "partition must cover every example exactly once"
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


# ----------------------------------------------------------------------------------------------- Synthetic(α, β)


def test_synthetic_shapes_types_and_label_range():
    ds = synthetic_leaf(num_clients=20, seed=3)
    assert ds.name == "synthetic"
    assert ds.train_x.dtype == np.float32 and ds.test_x.dtype == np.float32
    assert ds.train_y.dtype == np.int32 and ds.test_y.dtype == np.int32
    assert ds.train_x.shape[1:] == (60,) and ds.test_x.shape[1:] == (60,)
    assert ds.input_shape == (60,)
    assert len(ds.train_x) == len(ds.train_y) and len(ds.test_x) == len(ds.test_y)
    assert ds.num_classes == 10
    assert ds.train_y.min() >= 0 and ds.train_y.max() < 10
    assert ds.test_y.min() >= 0 and ds.test_y.max() < 10
    assert len(np.unique(ds.train_y)) > 3
    assert np.all(np.isfinite(ds.train_x))


def test_synthetic_deterministic_given_seed():
    a = synthetic_leaf(num_clients=10, seed=7)
    b = synthetic_leaf(num_clients=10, seed=7)
    c = synthetic_leaf(num_clients=10, seed=8)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.train_y, b.train_y)
    np.testing.assert_array_equal(a.test_x, b.test_x)
    for p, q in zip(a.natural_partition, b.natural_partition):
        np.testing.assert_array_equal(p, q)
    assert a.train_x.shape != c.train_x.shape or not np.array_equal(a.train_x, c.train_x)


def test_synthetic_natural_partition_covers_train_and_sizes():
    ds = synthetic_leaf(num_clients=30, seed=0, test_fraction=0.1, min_samples=50, max_samples=400)
    parts = ds.natural_partition
    assert len(parts) == 30
    _assert_disjoint_cover(parts, len(ds.train_y))
    n_train = np.array([len(p) for p in parts])
    # n_i in [50, 400]; train = int(0.9 n_i)
    assert n_train.min() >= int(0.9 * 50) and n_train.max() <= int(0.9 * 400)
    total = len(ds.train_y) + len(ds.test_y)
    assert 30 * 50 <= total <= 30 * 400
    assert len(ds.test_y) >= 30 * 5  # every client contributes ~10% to the pooled test set


def test_synthetic_size_cap_and_uncapped():
    capped = synthetic_leaf(num_clients=100, seed=0, test_fraction=0.0)
    uncapped = synthetic_leaf(num_clients=100, seed=0, test_fraction=0.0, max_samples=None)
    cs = np.array([len(p) for p in capped.natural_partition])
    us = np.array([len(p) for p in uncapped.natural_partition])
    assert cs.max() <= 1000 and cs.min() >= 50
    np.testing.assert_array_equal(cs, np.minimum(us, 1000))
    assert us.max() > 1000  # the LogNormal(4, 2) tail
    assert cs.max() > 4 * np.median(cs)  # still power-law-like


def test_synthetic_clients_differ_and_iid_variant():
    # Non-IID (α = β = 1): label distributions differ strongly between clients.
    ds = synthetic_leaf(num_clients=20, seed=1, max_samples=300)
    ent_noniid = partition_summary(ds.natural_partition, ds.train_y, 10)["mean_label_entropy"]
    # IID branch with β = 0 (FedProx's Synthetic-IID): the same distribution everywhere.
    ds_iid = synthetic_leaf(num_clients=20, seed=1, iid=True, beta=0.0, max_samples=300)
    ent_iid = partition_summary(ds_iid.natural_partition, ds_iid.train_y, 10)["mean_label_entropy"]
    assert ent_iid > ent_noniid
    means = np.stack([ds_iid.train_x[p].mean(axis=0) for p in ds_iid.natural_partition])
    assert np.abs(means).max() < 1.5  # v_i = 0 for all clients


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"num_clients": 0}, "num_clients"),
        ({"alpha": -1.0}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"max_samples": 10}, "max_samples"),
    ],
)
def test_synthetic_bad_options(kwargs, option):
    with pytest.raises(ValueError, match=option):
        synthetic_leaf(**kwargs)


# ------------------------------------------------------------------------------------------------------ partitions


@pytest.mark.parametrize(
    "name, options",
    [("iid", {}), ("dirichlet", {"alpha": 0.5}), ("shards", {"shards_per_client": 2}), ("power_law", {})],
)
def test_partitions_disjoint_cover_and_deterministic(name, options):
    labels = _balanced_labels(2000)
    parts = partition(name, labels, 20, seed=5, **options)
    assert len(parts) == 20
    _assert_disjoint_cover(parts, len(labels))
    assert all(len(p) >= 1 for p in parts)
    again = partition(name, labels, 20, seed=5, **options)
    for p, q in zip(parts, again):
        np.testing.assert_array_equal(p, q)
    other = partition(name, labels, 20, seed=6, **options)
    assert any(not np.array_equal(p, q) for p, q in zip(parts, other))


def test_partition_accepts_generator_and_direct_calls():
    labels = _balanced_labels(500)
    a = iid(labels, 7, np.random.default_rng(1))
    b = iid(labels, 7, 1)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p, q)
    sizes = [len(p) for p in a]
    assert max(sizes) - min(sizes) <= 1
    _assert_disjoint_cover(dirichlet(labels, 5, 1.0, 0), 500)
    _assert_disjoint_cover(shards(labels, 5, 3, 0), 500)
    _assert_disjoint_cover(power_law(labels, 5, 0), 500)


def test_dirichlet_min_size_rule():
    labels = _balanced_labels(3000)
    unconstrained = [min(len(p) for p in dirichlet(labels, 20, alpha=0.1, rng=s, min_size=0)) for s in range(5)]
    assert min(unconstrained) < 30  # so the rule below is binding
    for seed in range(5):
        parts = dirichlet(labels, 20, alpha=0.1, rng=seed, min_size=30)
        assert min(len(p) for p in parts) >= 30
        _assert_disjoint_cover(parts, 3000)


def test_dirichlet_small_alpha_more_skewed():
    labels = _balanced_labels(5000)
    ent = {}
    for alpha in (0.1, 100.0):
        parts = partition("dirichlet", labels, 20, seed=0, alpha=alpha)
        ent[alpha] = partition_summary(parts, labels, 10)["mean_label_entropy"]
    assert ent[0.1] < ent[100.0] - 0.5
    assert ent[100.0] > 0.9 * np.log(10)


def test_dirichlet_impossible_and_exhausted():
    labels = _balanced_labels(100)
    with pytest.raises(ValueError, match="min_size"):
        dirichlet(labels, 20, alpha=1.0, rng=0, min_size=10)
    with pytest.raises(ValueError, match="max_tries"):
        # min_size = N / n exactly, with tiny alpha: practically never met.
        dirichlet(labels, 10, alpha=0.01, rng=0, min_size=10, max_tries=3)


def test_shards_label_limit():
    labels = _balanced_labels(2000)  # 200 per class; 40 shards of 50
    parts = shards(labels, 20, 2, rng=0)
    per_client = partition_summary(parts, labels, 10)["classes_per_client"]
    assert max(per_client) <= 2 * 2
    assert np.mean(per_client) <= 2.5
    assert sorted(len(p) for p in parts) == [100] * 20


def test_power_law_sizes():
    labels = _balanced_labels(5000)
    parts = power_law(labels, 30, rng=0, exponent=1.5, min_size=25)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 25
    assert sizes.sum() == 5000
    assert sizes.max() > 3 * np.median(sizes)
    _assert_disjoint_cover(parts, 5000)


@pytest.mark.parametrize(
    "name, n, options, option",
    [
        ("dirichlet", 10, {"alpha": 0.0}, "alpha"),
        ("dirichlet", 10, {"alpha": -1}, "alpha"),
        ("dirichlet", 10, {}, "alpha"),
        ("dirichlet", 10, {"alpha": 1.0, "min_size": -1}, "min_size"),
        ("dirichlet", 10, {"alpha": 1.0, "max_tries": 0}, "max_tries"),
        ("dirichlet", 10, {"alpha": 1.0, "beta": 2}, "beta"),
        ("shards", 10, {"shards_per_client": 0}, "shards_per_client"),
        ("shards", 10, {"shards_per_client": 1000}, "shards_per_client"),
        ("shards", 10, {"shards_per_client": 1.5}, "shards_per_client"),
        ("power_law", 10, {"exponent": 0}, "exponent"),
        ("power_law", 10, {"alpha": 1.0}, "alpha"),
        ("iid", 10, {"alpha": 1.0}, "alpha"),
        ("iid", 0, {}, "num_clients"),
        ("iid", 10_000, {}, "num_clients"),
        ("dirichlet_sampled", 10, {}, "alpha"),
        ("dirichlet_sampled", 10, {"alpha": 0.5, "examples_per_client": 0}, "examples_per_client"),
        ("dirichlet_sampled", 0, {"alpha": 0.5}, "num_clients"),
    ],
)
def test_partition_bad_options_name_the_option(name, n, options, option):
    labels = _balanced_labels(1000)
    with pytest.raises(ValueError, match=option):
        partition(name, labels, n, seed=0, **options)


def test_partition_unknown_name_and_unknown_option_list_allowed():
    labels = _balanced_labels(100)
    with pytest.raises(ValueError) as e:
        partition("nope", labels, 5, seed=0)
    for name in PARTITIONERS:
        assert name in str(e.value)
    with pytest.raises(ValueError) as e:
        partition("dirichlet", labels, 5, seed=0, alpha=1.0, alhpa=2.0)
    assert "alhpa" in str(e.value) and "min_size" in str(e.value) and "max_tries" in str(e.value)
    # hyphenated name accepted
    _assert_disjoint_cover(partition("power-law", labels, 5, seed=0, min_size=2), 100)


def test_dirichlet_sampled_serves_more_clients_than_examples_with_the_label_skew_of_alpha():
    labels = _balanced_labels(1000)  # 10 classes
    parts = partition("dirichlet_sampled", labels, 5000, seed=3, alpha=0.1, examples_per_client=20)
    assert len(parts) == 5000 and all(p.shape == (20,) for p in parts)
    flat = np.concatenate(parts)
    assert flat.min() >= 0 and flat.max() < labels.size
    assert all(np.all(np.diff(p) >= 0) for p in parts)  # sorted
    again = partition("dirichlet_sampled", labels, 5000, seed=3, alpha=0.1, examples_per_client=20)
    assert all(np.array_equal(p, q) for p, q in zip(parts, again))

    def top_class_share(ps):
        return np.mean([np.bincount(labels[p], minlength=10).max() / p.size for p in ps])

    iid_like = partition("dirichlet_sampled", labels, 5000, seed=3, alpha=1000.0, examples_per_client=20)
    assert top_class_share(parts) > 0.6 > 0.35 > top_class_share(iid_like)  # Dir(0.1): about 2/3 from one class


def test_partition_summary_and_plot(tmp_path):
    labels = _balanced_labels(1000)
    parts = partition("dirichlet", labels, 12, seed=0, alpha=0.5)
    s = partition_summary(parts, labels, 10)
    assert s["num_clients"] == 12 and s["num_examples"] == 1000
    assert s["size_min"] <= s["size_median"] <= s["size_max"]
    counts = np.array(s["label_counts"])
    assert counts.shape == (12, 10)
    np.testing.assert_array_equal(counts.sum(axis=1), s["sizes"])
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels, minlength=10))
    out = tmp_path / "partition.png"
    fig = plot_partition(parts, labels, 10, path=out)
    assert out.exists() and out.stat().st_size > 1000
    assert fig is not None
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    assert plot_partition(parts, labels, 10, ax=ax) is ax.figure


# ------------------------------------------------------------------------------------------------------ ClientData


def test_client_data_from_partition_round_trip():
    ds = synthetic_leaf(num_clients=8, seed=2, max_samples=200)
    cd = ClientData.from_partition(ds.train_x, ds.train_y, ds.natural_partition)
    assert cd.num_clients == 8
    assert cd.max_size == max(len(p) for p in ds.natural_partition)
    for i, p in enumerate(ds.natural_partition):
        x, y = cd.client_arrays(i)
        np.testing.assert_array_equal(x, ds.train_x[p])
        np.testing.assert_array_equal(y, ds.train_y[p])
    labels = _balanced_labels(300)
    feats = np.random.default_rng(0).normal(size=(300, 3)).astype(np.float32)
    parts = partition("dirichlet", labels, 6, seed=1, alpha=0.3, min_size=5)
    cd = ClientData.from_partition(feats, labels, parts)
    for i, p in enumerate(parts):
        x, y = cd.client_arrays(i)
        np.testing.assert_array_equal(x, feats[p])
        np.testing.assert_array_equal(y, labels[p])


# ------------------------------------------------------------------------------------------------------------- IDX


def _idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, arr.ndim]) + np.array(arr.shape, dtype=">u4").tobytes()
    return header + arr.tobytes()


def _write_idx_dataset(folder, n_train=12, n_test=5, gz=True, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for stem, arr in arrays.items():
        data = _idx_bytes(arr)
        if gz:
            with gzip.open(os.path.join(folder, stem + ".gz"), "wb") as f:
                f.write(data)
        else:
            with open(os.path.join(folder, stem), "wb") as f:
                f.write(data)
    return arrays


@pytest.fixture
def no_idx_env(monkeypatch, tmp_path):
    """No environment variables and an empty system default, so only explicit paths are found."""
    for var in ("ASYNCFL_FASHION_MNIST_DIR", "ASYNCFL_MNIST_DIR", "ASYNCFL_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "system-datasets"
    empty.mkdir()
    monkeypatch.setattr(idx_module, "SYSTEM_DATA_DIR", str(empty))
    return empty


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, no_idx_env, gz):
    folder = tmp_path / "fmnist"
    arrays = _write_idx_dataset(folder, gz=gz)
    ds = load_fashion_mnist(folder)
    assert ds.name == "fashion_mnist" and ds.num_classes == 10
    assert ds.train_x.shape == (12, 28, 28, 1) and ds.test_x.shape == (5, 28, 28, 1)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
    assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
    np.testing.assert_allclose(ds.train_x[..., 0] * 255.0, arrays["train-images-idx3-ubyte"], atol=1e-3)
    np.testing.assert_array_equal(ds.train_y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
    assert ds.natural_partition is None


def test_idx_search_order(tmp_path, no_idx_env, monkeypatch):
    env_dir = tmp_path / "env"
    _write_idx_dataset(env_dir, seed=1)
    root = tmp_path / "root"
    _write_idx_dataset(root / "mnist", seed=2)
    _write_idx_dataset(no_idx_env / "mnist", seed=3)
    assert find_idx_dir("mnist") == str(no_idx_env / "mnist")
    monkeypatch.setenv("ASYNCFL_DATA_DIR", str(root))
    assert find_idx_dir("mnist") == str(root / "mnist")
    monkeypatch.setenv("ASYNCFL_MNIST_DIR", str(env_dir))
    assert find_idx_dir("mnist") == str(env_dir)
    explicit = tmp_path / "explicit"
    _write_idx_dataset(explicit, seed=4)
    assert find_idx_dir("mnist", explicit) == str(explicit)
    assert find_idx_dir("mnist", root) == str(root / "mnist")  # a parent folder with a 'mnist' subfolder
    ds = load_mnist(env_dir)
    assert ds.name == "mnist" and ds.train_x.shape == (12, 28, 28, 1)
    # the Fashion-MNIST variable does not leak into MNIST and vice versa
    monkeypatch.delenv("ASYNCFL_MNIST_DIR")
    monkeypatch.setenv("ASYNCFL_FASHION_MNIST_DIR", str(env_dir))
    assert find_idx_dir("mnist") == str(root / "mnist")


def test_idx_missing_files_error_lists_places_and_hint(tmp_path, no_idx_env, monkeypatch):
    monkeypatch.setenv("ASYNCFL_DATA_DIR", str(tmp_path / "data-root"))
    monkeypatch.setenv("ASYNCFL_FASHION_MNIST_DIR", str(tmp_path / "env-dir"))
    partial = tmp_path / "partial"
    _write_idx_dataset(partial)
    os.remove(partial / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DatasetNotFoundError) as e:
        find_idx_dir("fashion_mnist", partial)
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    # An explicit path is the only place searched: a wrong --data-dir must not fall back to another copy.
    assert str(partial) in msg and str(tmp_path / "env-dir") not in msg
    with pytest.raises(DatasetNotFoundError) as e:
        find_idx_dir("fashion_mnist")
    msg = str(e.value)
    for place in (tmp_path / "env-dir", tmp_path / "data-root" / "fashion-mnist", no_idx_env / "fashion-mnist"):
        assert str(place) in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "ASYNCFL_FASHION_MNIST_DIR" in msg and "--data-dir" in msg
    with pytest.raises(DatasetNotFoundError, match="mnist"):
        load_mnist()
    with pytest.raises(ValueError, match="unknown IDX dataset"):
        find_idx_dir("cifar10")


def test_idx_malformed_files(tmp_path, no_idx_env):
    bad_magic = tmp_path / "bad_magic"
    bad_magic.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(IdxFormatError, match="magic"):
        read_idx(bad_magic)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(_idx_bytes(np.zeros((4, 3, 3), np.uint8))[:-5])
    with pytest.raises(IdxFormatError, match="bytes"):
        read_idx(truncated)
    not_gzip = tmp_path / "not_gzip.gz"
    not_gzip.write_bytes(b"this is not gzip data")
    with pytest.raises(IdxFormatError, match="not_gzip"):
        read_idx(not_gzip)
    assert issubclass(IdxFormatError, ValueError)
    # a malformed file inside a dataset folder names that file
    folder = tmp_path / "ds"
    _write_idx_dataset(folder, gz=False)
    (folder / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x0c" + b"\x01" * 3)
    with pytest.raises(IdxFormatError, match="train-labels-idx1-ubyte"):
        load_fashion_mnist(folder)
    # mismatched numbers of images and labels
    _write_idx_dataset(folder, gz=False)
    (folder / "train-labels-idx1-ubyte").write_bytes(_idx_bytes(np.zeros(3, np.uint8)))
    with pytest.raises(IdxFormatError, match="labels"):
        load_fashion_mnist(folder)


def test_read_idx_other_types(tmp_path):
    arr = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    f = tmp_path / "ints"
    f.write_bytes(_idx_bytes(arr.astype(">i4"), type_code=0x0C))
    out = read_idx(f)
    np.testing.assert_array_equal(out, arr)
    assert out.dtype.isnative


def test_real_debian_fashion_mnist():
    if not os.path.isdir(DEBIAN_FASHION_MNIST):
        pytest.skip("Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
    ds = load_fashion_mnist(DEBIAN_FASHION_MNIST)
    assert ds.train_x.shape == (60000, 28, 28, 1) and ds.test_x.shape == (10000, 28, 28, 1)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
    assert ds.train_y.min() == 0 and ds.train_y.max() == 9
    np.testing.assert_array_equal(np.bincount(ds.train_y), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.test_y), [1000] * 10)
    assert 0.0 == ds.train_x.min() and ds.train_x.max() == 1.0


def test_client_data_padded_view_matches_index_view():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(30, 4)).astype(np.float32)
    labels = rng.integers(0, 3, size=30).astype(np.int32)
    parts = [np.array([0, 5, 7]), np.arange(10, 30), np.array([3])]
    cd = ClientData.from_partition(features, labels, parts)
    x, y, mask = cd.as_padded()
    assert x.shape == (3, 20, 4) and mask.sum(axis=1).tolist() == [3, 20, 1]
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(np.asarray(x[i])[: len(p)], features[p])
        np.testing.assert_array_equal(np.asarray(y[i])[: len(p)], labels[p])
