"""The datasets of the reproductions, found and read one way: IDX files or a prepared TFDS copy, or the embedded
LEAF Synthetic(1, 1) data; CIFAR standardized per channel.

:func:`check_dataset` is cheap (it reads no data), so a command can stop before anything runs when a dataset is
missing; :func:`load_dataset` reads it. Both say, when a dataset cannot be read, every place searched and how to get
it.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from asyncfl_jax.data import (Dataset, DatasetNotFoundError, find_idx_dir, find_tfds_dir, load_idx_dataset, load_tfds,
                              synthetic_leaf)

IDX_DATASETS = ("mnist", "fashion_mnist")  # read from IDX files first, then from TFDS
CIFAR_STATS = {  # per-channel mean and std of the training images (the papers' reference code)
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
DATASET_TITLES = {"fashion_mnist": "Fashion-MNIST", "mnist": "MNIST", "synthetic": "Synthetic(1,1)",
                  "cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def add_dataset_arguments(parser: argparse.ArgumentParser, choices: tuple[str, ...] = ("fashion_mnist", "synthetic"),
                          default: str = "fashion_mnist") -> None:
    """``--dataset`` (one of ``choices``) and ``--data-dir`` (the IDX or TFDS folder) on a command line."""
    parser.add_argument("--dataset", choices=list(choices), default=default)
    parser.add_argument("--data-dir", default=None)


class DataUnavailable(RuntimeError):
    """A dataset cannot be read; the message says where it was searched and how to get it."""


def load_dataset(name: str, idx_data_dir: str | None = None, tfds_data_dir: str | None = None,
                 synthetic_clients: int = 30) -> Dataset:
    """The dataset ``name``.

    ``synthetic``: LEAF Synthetic(1, 1) with ``synthetic_clients`` generators (seed 0), to be pooled and re-split.
    ``mnist`` and ``fashion_mnist``: IDX files in ``idx_data_dir`` (or the usual places, see
    :func:`asyncfl_jax.data.find_idx_dir`), else a prepared TFDS copy. Any other name: a prepared TFDS copy in
    ``tfds_data_dir`` (default ``$TFDS_DATA_DIR``, see :func:`asyncfl_jax.data.load_tfds`). Raises
    :class:`DataUnavailable`.
    """
    if name == "synthetic":
        return synthetic_leaf(num_clients=synthetic_clients, alpha=1.0, beta=1.0, seed=0)
    problems = []
    if name in IDX_DATASETS:
        try:
            return load_idx_dataset(name, idx_data_dir)
        except DatasetNotFoundError as e:
            problems.append(f"(IDX files) {e}")
    try:
        return load_tfds(name, tfds_data_dir)
    except ImportError as e:
        problems.append(f"(TFDS) {e}")
    except DatasetNotFoundError as e:  # TfdsNotPreparedError is one
        problems.append(f"(TFDS) {e}")
    raise DataUnavailable(f"{name} is not available.\n" + "\n".join(problems))


def check_dataset(name: str, idx_data_dir: str | None = None, tfds_data_dir: str | None = None) -> str | None:
    """None if :func:`load_dataset` can find ``name`` (without reading it), else what is missing and how to get it.

    It looks at the files on disk, so a dataset faked with ``tfds.testing.mock_data`` counts as missing."""
    if name == "synthetic":
        return None
    problems = []
    if name in IDX_DATASETS:
        try:
            find_idx_dir(name, idx_data_dir)
            return None
        except DatasetNotFoundError as e:
            problems.append(f"(IDX files) {e}")
    try:
        find_tfds_dir(name, tfds_data_dir)
        return None
    except (ImportError, DatasetNotFoundError) as e:
        problems.append(f"(TFDS) {e}")
    return f"{name} is not available.\n" + "\n".join(problems)


def standardize_channels(dataset: Dataset, stats: str) -> Dataset:
    """``dataset`` with its images standardized per channel by ``CIFAR_STATS[stats]`` (``(x - mean) / std``)."""
    mean, std = (np.asarray(v, np.float32) for v in CIFAR_STATS[stats])
    return dataclasses.replace(dataset, train_x=(dataset.train_x - mean) / std, test_x=(dataset.test_x - mean) / std)
