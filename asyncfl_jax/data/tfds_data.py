"""Image-classification datasets from TensorFlow Datasets (TFDS), read with ``tfds.data_source``.

Supported names (:data:`TFDS_DATASETS`) and what they load:

============== ================== ============ ============= ===================
name           TFDS name          input shape  classes       ``Dataset.name``
============== ================== ============ ============= ===================
mnist          ``mnist``          28×28×1      10            ``mnist``
fashion_mnist  ``fashion_mnist``  28×28×1      10            ``fashion_mnist``
emnist         ``emnist/byclass`` 28×28×1      62            ``emnist_byclass``
cifar10        ``cifar10``        32×32×3      10            ``cifar10``
cifar100       ``cifar100``       32×32×3      100 (fine)    ``cifar100``
============== ================== ============ ============= ===================

``emnist`` is EMNIST ByClass: digits 0-9, upper-case A-Z and lower-case a-z, the 62 classes of LEAF's FEMNIST (FEMNIST
is the same NIST source split by writer; TFDS has no writer ids, so there is no natural partition, and the images are
stored as TFDS stores them: transposed, like the original EMNIST files). ``cifar100`` uses the 100 fine labels
(``label``), not the 20 coarse ones. Aliases such as ``fashion-mnist``, ``emnist/byclass``, ``cifar-10`` are accepted.

**Reading needs no TensorFlow**: ``tfds.data_source`` reads ArrayRecord files with ``array_record`` and decodes the
PNG images with Pillow (or OpenCV). It never downloads here (``download=False``): the dataset must have been prepared
beforehand **in the array_record format** in ``data_dir``, i.e. ``<data_dir>/<name>[/<config>]/<version>/`` holds
``dataset_info.json``, ``features.json`` and ``<name>-{train,test}.array_record-*`` files.

**Preparing needs TensorFlow and internet** (the TFDS builders of these datasets read and encode with TensorFlow, and
the ``tfds`` command needs it to start). On a machine with internet access::

    pip install -e ".[tfds]" tensorflow importlib_resources
    tfds build mnist --file_format=array_record --data_dir=DIR   # or fashion_mnist, emnist/byclass, cifar10, cifar100

or in Python ``tfds.builder("mnist", data_dir=DIR, file_format="array_record").download_and_prepare()``.
``importlib_resources`` is needed by ``tensorflow_datasets`` 4.9.x when preparing on Python >= 3.9 but is not declared
by it (tensorflow/datasets#11212). The default format of TFDS is ``tfrecord``, which ``tfds.data_source`` cannot read:
``--file_format=array_record`` is required. Copy ``DIR/<name>[/<config>]/<version>/`` to the machine that trains.

``data_dir`` defaults to ``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets`` (TFDS's own default), read at call time;
only that folder is searched. A missing or unreadable dataset raises :class:`TfdsNotPreparedError` (a
:class:`~asyncfl_jax.data.idx.DatasetNotFoundError`) that names the dataset, the folder searched and how to prepare it.

The examples keep the order in which TFDS stored them (TFDS shuffles when it prepares a dataset, deterministically),
so the training order, and therefore a seeded partition, differs from the IDX files' order for MNIST/Fashion-MNIST.
Fashion-MNIST and MNIST can still be read from their IDX files without TFDS (:mod:`asyncfl_jax.data.idx`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator, Sequence

import numpy as np

from asyncfl_jax.data.client_data import Dataset
from asyncfl_jax.data.idx import DatasetNotFoundError

TFDS_DATA_DIR_ENV = "TFDS_DATA_DIR"
"""Environment variable naming the default TFDS data folder (TFDS's own convention)."""

_READ_CHUNK = 4096  # examples fetched per data-source call


@dataclasses.dataclass(frozen=True)
class _TfdsSpec:
    name: str  # Dataset.name
    tfds_name: str  # name (with config) given to tfds
    input_shape: tuple[int, ...]
    num_classes: int


_SPECS = {
    "mnist": _TfdsSpec("mnist", "mnist", (28, 28, 1), 10),
    "fashion_mnist": _TfdsSpec("fashion_mnist", "fashion_mnist", (28, 28, 1), 10),
    "emnist": _TfdsSpec("emnist_byclass", "emnist/byclass", (28, 28, 1), 62),
    "cifar10": _TfdsSpec("cifar10", "cifar10", (32, 32, 3), 10),
    "cifar100": _TfdsSpec("cifar100", "cifar100", (32, 32, 3), 100),
}

TFDS_DATASETS: tuple[str, ...] = tuple(_SPECS)
"""Names accepted by :func:`load_tfds`, besides aliases such as ``"fashion-mnist"``, ``"emnist/byclass"``."""

_ALIASES = {
    **{key: key for key in _SPECS},
    "fashionmnist": "fashion_mnist",
    "emnist/byclass": "emnist",
    "emnist_byclass": "emnist",
    "cifar_10": "cifar10",
    "cifar_100": "cifar100",
}


class TfdsNotPreparedError(DatasetNotFoundError):
    """A TFDS dataset is not prepared (in a format ``tfds.data_source`` can read) in the folder searched."""


def _spec(name: str) -> _TfdsSpec:
    key = _ALIASES.get(str(name).strip().lower().replace("-", "_"))
    if key is None:
        raise ValueError(f"unknown TFDS dataset {name!r}; supported: {', '.join(TFDS_DATASETS)}")
    return _SPECS[key]


def tfds_name(name: str) -> str:
    """The TFDS name (with config) that ``name`` loads, e.g. ``"emnist"`` -> ``"emnist/byclass"``."""
    return _spec(name).tfds_name


def default_tfds_data_dir() -> str:
    """``$TFDS_DATA_DIR`` if set, else ``~/tensorflow_datasets`` (TFDS's default), read at call time."""
    return os.environ.get(TFDS_DATA_DIR_ENV) or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def _import_tfds() -> Any:
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            f"reading a TensorFlow Datasets dataset needs the package tensorflow-datasets, which is not installed "
            f"({e}): pip install tensorflow-datasets importlib_resources (in a clone of asyncfl_jax: pip install -e "
            "'.[tfds]'); reading a prepared dataset needs no TensorFlow"
        ) from e
    return tfds


def _resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
    return os.path.expanduser(os.fspath(data_dir)) if data_dir is not None else default_tfds_data_dir()


def _how_to_prepare(spec: _TfdsSpec, root: str, folder: str) -> str:
    return (
        "To prepare it (needs internet and TensorFlow; reading it afterwards needs neither):\n"
        '  pip install -e ".[tfds]" tensorflow importlib_resources\n'
        f"  tfds build {spec.tfds_name} --file_format=array_record --data_dir={root}\n"
        f'or in Python: tfds.builder("{spec.tfds_name}", data_dir="{root}", '
        'file_format="array_record").download_and_prepare()\n'
        "(on a machine without internet access, prepare it elsewhere and copy the folder "
        f"{os.path.relpath(folder, root)}{os.sep} into {root}). Pass another folder as data_dir=... or set "
        f"${TFDS_DATA_DIR_ENV}."
    )


def _check_readable(tfds: Any, spec: _TfdsSpec, root: str) -> str:
    """Returns the prepared version folder, or raises TfdsNotPreparedError saying what is wrong."""
    builder = tfds.builder(spec.tfds_name, data_dir=root)
    folder = os.fspath(builder.data_dir)
    if not builder.is_prepared():
        parent = os.path.dirname(folder)
        found = sorted(os.listdir(parent)) if os.path.isdir(parent) else []
        seen = (
            f" ({parent} holds: {', '.join(found)}; this tensorflow_datasets {tfds.__version__} reads version "
            f"{builder.version})"
            if found
            else ""
        )
        raise TfdsNotPreparedError(
            f"TFDS dataset {spec.tfds_name!r} is not prepared in data_dir {root}: no dataset_info.json in "
            f"{folder}{seen}. Nothing is downloaded when loading.\n" + _how_to_prepare(spec, root, folder)
        )
    formats = builder.info.available_file_formats()
    readable = tfds.core.FileFormat.with_random_access()
    if not formats & readable:
        names = ", ".join(sorted(f.value for f in formats)) or "unknown"
        raise TfdsNotPreparedError(
            f"TFDS dataset {spec.tfds_name!r} is prepared in {folder} but in the {names} format, which "
            f"tfds.data_source cannot read (it needs {' or '.join(sorted(f.value for f in readable))}). Prepare it "
            "again with --file_format=array_record, into another data_dir or after deleting that folder.\n"
            + _how_to_prepare(spec, root, folder)
        )
    return folder


def find_tfds_dir(name: str, data_dir: str | os.PathLike | None = None) -> str:
    """Returns the folder ``<data_dir>/<name>[/<config>]/<version>`` holding the prepared dataset ``name``.

    Cheap (reads only the metadata), so a command line can fail early, before reading or compiling anything. It checks
    the files on disk, so it does not see a dataset faked with ``tfds.testing.mock_data``.

    Raises:
      TfdsNotPreparedError: the dataset is not prepared in ``data_dir``, or only in a format ``tfds.data_source``
        cannot read; the message names the folder searched and how to prepare the dataset.
      ValueError: ``name`` is not one of :data:`TFDS_DATASETS`.
      ImportError: ``tensorflow_datasets`` is not installed.
    """
    spec = _spec(name)
    return _check_readable(_import_tfds(), spec, _resolve_data_dir(data_dir))


def _examples(source: Sequence[Any], n: int) -> Iterator[tuple[int, Sequence[Any]]]:
    """Yields ``(start, examples)`` chunks of a data source, fetched in batches where it supports ``__getitems__``."""
    getitems = getattr(source, "__getitems__", None)
    for start in range(0, n, _READ_CHUNK):
        keys = list(range(start, min(n, start + _READ_CHUNK)))
        batch = None
        if getitems is not None:
            try:
                batch = getitems(keys)
            except TypeError:
                # The data source of tfds.testing.mock_data (tensorflow_datasets 4.9) has a __getitems__ that cannot be
                # called; read such a source one example at a time.
                if start:
                    raise
                getitems = None
        if batch is None:
            batch = [source[k] for k in keys]
        if len(batch) != len(keys):
            raise ValueError(f"data source returned {len(batch)} examples for {len(keys)} keys")
        yield start, batch


def _read_split(source: Sequence[Any], spec: _TfdsSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
    info = getattr(source, "dataset_info", None)
    if info is not None:
        label_feature = info.features["label"]
        if getattr(label_feature, "num_classes", spec.num_classes) != spec.num_classes:
            raise ValueError(
                f"{spec.tfds_name}: TFDS says the label has {label_feature.num_classes} classes, expected "
                f"{spec.num_classes}"
            )
    n = len(source)
    images = np.empty((n, *spec.input_shape), dtype=np.uint8)
    labels = np.empty((n,), dtype=np.int64)
    for start, batch in _examples(source, n):
        chunk = np.stack([np.asarray(ex["image"]) for ex in batch])
        if chunk.shape[1:] != spec.input_shape or chunk.dtype != np.uint8:
            raise ValueError(
                f"{spec.tfds_name} {split}: expected uint8 images of shape {spec.input_shape}, got {chunk.dtype} "
                f"{chunk.shape[1:]}"
            )
        images[start : start + len(batch)] = chunk
        labels[start : start + len(batch)] = [int(ex["label"]) for ex in batch]
    if n and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise ValueError(
            f"{spec.tfds_name} {split}: labels must lie in [0, {spec.num_classes}), "
            f"got [{labels.min()}, {labels.max()}]"
        )
    x = images.astype(np.float32)
    x /= np.float32(255.0)
    return x, labels.astype(np.int32)


def load_tfds(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    train_split: str = "train",
    test_split: str = "test",
) -> Dataset:
    """Loads a prepared TFDS image-classification dataset with ``tfds.data_source`` (no TensorFlow, no download).

    Args:
      name: one of :data:`TFDS_DATASETS` (``"mnist"``, ``"fashion_mnist"``, ``"emnist"`` = EMNIST ByClass with 62
        classes, ``"cifar10"``, ``"cifar100"``) or an alias (``"fashion-mnist"``, ``"emnist/byclass"``,
        ``"cifar-10"``, ...).
      data_dir: the TFDS data folder (holding ``<name>[/<config>]/<version>/``); default ``$TFDS_DATA_DIR``, else
        ``~/tensorflow_datasets``. Only this folder is searched.
      train_split, test_split: the TFDS splits read as the training and test sets; slices such as
        ``"train[:10%]"`` are accepted (e.g. a smaller EMNIST).

    Returns:
      A :class:`Dataset` with float32 images ``[N, H, W, C]`` scaled to ``[0, 1]`` (pixel / 255), int32 labels in
      ``[0, num_classes)``, and ``natural_partition=None``; partition it with :func:`asyncfl_jax.data.partition`.
      The examples are in TFDS's stored order.

    Raises:
      TfdsNotPreparedError: the dataset is not prepared in ``data_dir`` in a format ``tfds.data_source`` reads
        (array_record or parquet); the message names the dataset, the folder searched and how to prepare it.
      ValueError: unknown ``name``, or data that does not match the expected shapes or number of classes.
      ImportError: ``tensorflow_datasets`` is not installed (``pip install -e '.[tfds]'`` from a clone of asyncfl_jax).
    """
    spec = _spec(name)
    tfds = _import_tfds()
    root = _resolve_data_dir(data_dir)
    try:
        train, test = tfds.data_source(
            spec.tfds_name, split=[train_split, test_split], data_dir=root, download=False, try_gcs=False
        )
    except Exception as e:
        # tfds reports a dataset that is not prepared as an unsupported "tfrecord" format; say what is wrong instead.
        try:
            _check_readable(tfds, spec, root)
        except TfdsNotPreparedError as err:
            raise err from e
        raise
    train_x, train_y = _read_split(train, spec, train_split)
    test_x, test_y = _read_split(test, spec, test_split)
    return Dataset(
        name=spec.name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=spec.num_classes,
    )
