"""Tests of asyncfl_jax.data.tfds_data: TFDS datasets read with ``tfds.data_source``, offline and without TensorFlow.

Two ways to get data without downloading anything:

* ``tfds.testing.mock_data`` with ``MockPolicy.USE_CODE``: random examples built from the real builders' feature
  specs (so the shapes and numbers of classes are TFDS's own); it needs neither TensorFlow nor metadata files.
* a tiny *real* prepared dataset (ArrayRecord files, ``dataset_info.json``) written into a temporary ``data_dir`` by
  TFDS's own writer (:func:`_prepare_offline`), which exercises the real read path: ArrayRecord reading, tf.Example
  parsing and PNG decoding, with exact pixel values to compare.
"""

from __future__ import annotations

import importlib.resources
import importlib.resources.abc
import importlib.util
import io
import json
import os
import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from asyncfl_jax.data import (  # noqa: E402
    TFDS_DATASETS,
    DatasetNotFoundError,
    TfdsNotPreparedError,
    default_tfds_data_dir,
    find_tfds_dir,
    load_tfds,
    partition,
    tfds_name,
)
from asyncfl_jax.models import model_from_apply  # noqa: E402
from asyncfl_jax.task import make_task  # noqa: E402

# name -> (Dataset.name, TFDS name, input shape, number of classes)
EXPECTED = {
    "mnist": ("mnist", "mnist", (28, 28, 1), 10),
    "fashion_mnist": ("fashion_mnist", "fashion_mnist", (28, 28, 1), 10),
    "emnist": ("emnist_byclass", "emnist/byclass", (28, 28, 1), 62),
    "cifar10": ("cifar10", "cifar10", (32, 32, 3), 10),
    "cifar100": ("cifar100", "cifar100", (32, 32, 3), 100),
}


@pytest.fixture(autouse=True)
def _no_download(monkeypatch):
    """Any attempt of TFDS to download or extract fails the test: nothing here may reach the network."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to download")

    for method in ("download", "download_and_extract", "extract", "iter_archive", "download_kaggle_data"):
        monkeypatch.setattr(tfds.download.DownloadManager, method, refuse)


def _check_dataset(ds, name):
    ds_name, _, shape, num_classes = EXPECTED[name]
    assert ds.name == ds_name
    assert ds.num_classes == num_classes
    assert ds.input_shape == shape
    assert ds.natural_partition is None
    for x, y in ((ds.train_x, ds.train_y), (ds.test_x, ds.test_y)):
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.shape[1:] == shape and x.shape[0] == y.shape[0] > 0
        assert 0.0 <= x.min() and x.max() <= 1.0
        assert 0 <= y.min() and y.max() < num_classes


def test_supported_names_and_aliases():
    assert TFDS_DATASETS == tuple(EXPECTED)
    for name, (_, tfds_full_name, _, _) in EXPECTED.items():
        assert tfds_name(name) == tfds_full_name
    assert tfds_name("Fashion-MNIST") == "fashion_mnist"
    assert tfds_name("emnist/byclass") == tfds_name("emnist_byclass") == "emnist/byclass"
    assert tfds_name("CIFAR-10") == "cifar10" and tfds_name("cifar_100") == "cifar100"
    with pytest.raises(ValueError, match="supported: mnist, fashion_mnist, emnist, cifar10, cifar100"):
        tfds_name("femnist")
    with pytest.raises(ValueError, match="unknown TFDS dataset"):
        load_tfds("svhn")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_loads_with_mock_data_then_partitions_and_makes_a_task(name, tmp_path):
    n = 120
    with tfds.testing.mock_data(num_examples=n, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = load_tfds(name, data_dir=tmp_path)  # mock_data replaces data_dir by its own
    _check_dataset(ds, name)
    assert len(ds.train_y) == len(ds.test_y) == n
    assert ds.train_x.max() > 0.5  # random pixels in [0, 255], scaled by 1/255

    for parts in (
        partition("iid", ds.train_y, 4, seed=0),
        partition("dirichlet", ds.train_y, 4, seed=0, alpha=0.5, min_size=5),
    ):
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    # A linear model written directly (a Flax model's initialisation would take seconds per input shape).
    weights = np.zeros((int(np.prod(ds.input_shape)), ds.num_classes), np.float32)
    model = model_from_apply(lambda w, x: x.reshape(x.shape[0], -1) @ w, weights, name="linear")
    task = make_task(ds, parts, model, train_eval_size=50)
    assert task.num_clients == 4 and task.num_classes == ds.num_classes
    assert task.test_x.shape == (n, *ds.input_shape) and task.train_eval_x.shape == (50, *ds.input_shape)
    assert task.name == f"{EXPECTED[name][0]}/linear"
    assert model.apply_fn(model.init_params, task.test_x[:8]).shape == (8, ds.num_classes)


def test_unprepared_dataset_gives_a_clear_error_and_writes_nothing(tmp_path):
    for name in ("cifar10", "emnist"):
        with pytest.raises(TfdsNotPreparedError) as info:
            load_tfds(name, data_dir=tmp_path)
        msg = str(info.value)
        full = tfds_name(name)
        assert f"{full!r} is not prepared" in msg
        assert str(tmp_path) in msg and os.path.join(str(tmp_path), *full.split("/")) in msg
        assert f"tfds build {full} --file_format=array_record --data_dir={tmp_path}" in msg
        assert "download_and_prepare()" in msg and "TensorFlow" in msg
        assert isinstance(info.value, DatasetNotFoundError)
        with pytest.raises(TfdsNotPreparedError, match="not prepared"):
            find_tfds_dir(name, tmp_path)
    assert os.listdir(tmp_path) == []  # nothing downloaded or written


def test_default_data_dir_is_tfds_data_dir_env_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    assert default_tfds_data_dir() == os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    assert default_tfds_data_dir() == str(tmp_path)
    with pytest.raises(TfdsNotPreparedError, match=f"not prepared in data_dir {tmp_path}"):
        load_tfds("mnist")


def test_missing_tensorflow_datasets_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import tensorflow_datasets` fail
    with pytest.raises(ImportError, match=r"pip install -e '\.\[tfds\]'"):
        load_tfds("mnist")


# ------------------------------------------------------------------- real ArrayRecord files, written offline


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buf, format="PNG")
    return buf.getvalue()


def _prepare_offline(monkeypatch, data_dir, name, splits):
    """Writes a tiny prepared copy of TFDS dataset ``name`` (array_record format) into ``data_dir``.

    TFDS's own ``download_and_prepare`` writes it, offline and without TensorFlow: the builder's ``_split_generators``
    is replaced by one that yields the given examples (``splits``: split -> (uint8 images, labels)), with the images
    already PNG-encoded by Pillow (TFDS would encode numpy images with TensorFlow).
    """
    if importlib.util.find_spec("importlib_resources") is None:
        # tensorflow_datasets 4.9 imports it when preparing but does not declare it (tensorflow/datasets#11212).
        monkeypatch.setitem(sys.modules, "importlib_resources", importlib.resources)
    builder = tfds.builder(tfds_name(name), data_dir=data_dir, file_format="array_record")
    keys = set(builder.info.features.keys())

    def generate(split, images, labels):
        for i, (image, label) in enumerate(zip(images, labels)):
            example = {"image": _png(image), "label": int(label)}
            if "id" in keys:  # CIFAR
                example["id"] = f"{split}_{i:05d}"
            if "coarse_label" in keys:  # CIFAR-100
                example["coarse_label"] = int(label) % 20
            yield i, example

    monkeypatch.setattr(
        type(builder), "_split_generators", lambda self, dl_manager: {s: generate(s, *v) for s, v in splits.items()}
    )
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            compute_stats=tfds.download.ComputeStatsMode.SKIP, try_download_gcs=False
        )
    )
    return builder.data_dir


def _random_split(rng, n, shape, num_classes):
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8), rng.integers(0, num_classes, n)


def _sorted_examples(x, y):
    return sorted((xi.tobytes(), int(yi)) for xi, yi in zip(x, y))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_reads_real_array_record_files_exactly(name, tmp_path, monkeypatch):
    _, _, shape, num_classes = EXPECTED[name]
    rng = np.random.default_rng(0)
    train = _random_split(rng, 24, shape, num_classes)
    test = _random_split(rng, 8, shape, num_classes)
    folder = _prepare_offline(monkeypatch, tmp_path, name, {"train": train, "test": test})

    assert find_tfds_dir(name, tmp_path) == os.fspath(folder)
    ds = load_tfds(name, data_dir=tmp_path)
    _check_dataset(ds, name)
    # Every pixel is value / 255 (same float32 arithmetic as the IDX loader); TFDS stores examples in its own
    # (shuffled) order, so the splits are compared as multisets.
    for (images, labels), x, y in ((train, ds.train_x, ds.train_y), (test, ds.test_x, ds.test_y)):
        assert _sorted_examples(x, y) == _sorted_examples(images.astype(np.float32) / np.float32(255.0), labels)

    half = load_tfds(name, data_dir=tmp_path, train_split="train[:50%]", test_split="test[:2]")
    assert len(half.train_y) == 12 and len(half.test_y) == 2
    np.testing.assert_array_equal(half.train_x, ds.train_x[:12])


def test_dataset_prepared_in_tfrecord_format_gives_a_clear_error(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    split = _random_split(rng, 4, (28, 28, 1), 10)
    folder = _prepare_offline(monkeypatch, tmp_path, "mnist", {"train": split, "test": split})
    info_file = os.path.join(folder, "dataset_info.json")
    with open(info_file) as f:
        info = json.load(f)
    info["fileFormat"] = "tfrecord"  # what `tfds build` writes without --file_format=array_record
    info.pop("alternativeFileFormats", None)
    with open(info_file, "w") as f:
        json.dump(info, f)
    with pytest.raises(TfdsNotPreparedError, match="prepared in .* but in the tfrecord format") as err:
        load_tfds("mnist", data_dir=tmp_path)
    assert "--file_format=array_record" in str(err.value)


def test_the_configuration_reads_tfds_datasets_and_refuses_unprepared_ones(tmp_path):
    from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
    from asyncfl_jax.experiment import load_dataset

    raw = ExperimentConfig().to_dict()
    raw["data"].update(name="tfds/cifar10", path=str(tmp_path), partition="iid")
    with pytest.raises(ConfigError, match=r"data.name = 'tfds/cifar10': the dataset is not prepared"):
        validate(ExperimentConfig.from_dict(raw))
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        dataset = load_dataset(ExperimentConfig.from_dict(raw))
    assert dataset.input_shape == (32, 32, 3) and dataset.num_classes == 10
